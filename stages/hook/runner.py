"""The pipelined model runner and the one adapter that writes stage outputs onto it.

What belongs here: the integration layer between an initpipe ``Run`` of the catalog and
vLLM's ``GPUModelRunner`` (``vllm/v1/worker/gpu_model_runner.py``). It replaces the runner
methods ``get_kv_cache_spec``, ``initialize_kv_cache`` and ``_cleanup_profiling_kv_cache``
(and hooks ``shutdown``); everything else — ``execute_model``, ``capture_model``,
``profile_run``, the worker — runs unchanged because :func:`apply_kv_outputs` writes the
same attributes vLLM's own methods would, in one visible place.

Phase triggers:

- model phase: when the engine first calls ``get_kv_cache_spec()`` (memoized). Not in
  ``load_model``: the executor calls ``current_platform.update_block_size_for_backend``
  only after ``load_model`` returns, and the KV specs read the final block size. If the
  block size changes after the phase ran and no KV phase is in place, the model phase is
  run again; with a KV phase in place that is an error.
- KV phase: every ``initialize_kv_cache`` call (vLLM's profiling pass included). A KV
  phase already in place is refused, as stock refuses it: tear it down first with
  ``_cleanup_profiling_kv_cache()`` (what vLLM's profiling pass does). The KV block
  zeroer is the phase's last stage; the worker's own ``_init_kv_zero_meta`` call then
  finds it built and builds no second one.

This module imports vllm lazily too (the runner classes are built on first use), so the
catalog package stays importable without it.
"""

from __future__ import annotations

import functools
import gc
import os
import threading
from collections.abc import Mapping
from typing import Any

from initpipe import KV, PhaseOrderError, Pipeline, Run, StageError
from initpipe.testing import ENV_FAULT, inject_faults_from_env

from ..contract.declare import vllm_uses
from ..errors import UnsupportedRunnerError
from ..v1.types import InputBatchGeometry, RunnerSettings
from ..vllm_names import MRV2_RUNNER as _RUNNER_V2
from ..vllm_names import PLATFORM as _PLATFORM
from ..vllm_names import V1_RUNNER as _RUNNER
from .progress import log_phase, phase_spans

__all__ = [
    "PipelineHost",
    "PipelinedRunnerMixin",
    "apply_kv_outputs",
    "apply_model_outputs",
    "clear_kv_state",
    "engine_kv_cache_config",
    "kv_inputs",
    "pipelined_runner_class",
    "platform_runner_class",
    "release_cuda_graphs",
    "start_inputs",
    "start_run",
]


# vLLM names for the declarations (``module:qualname``): v1's runner, and Model Runner V2's
# (whose methods the shared host wraps too).
_CPU_RUNNER = "vllm.v1.worker.cpu_model_runner:CPUModelRunner"
_CACHE_CONFIG = "vllm.config.cache:CacheConfig"


# -- reading the runner: the pipeline's external inputs -----------------------------------
@vllm_uses(
    "catalog_v1",
    calls=(
        f"{_RUNNER}.vllm_config",
        f"{_RUNNER}.device",
        f"{_RUNNER}.cudagraph_dispatcher",
        f"{_RUNNER}.drafter",
        # jit_warmup_registry: set on the runner by this decorator of its __init__
        "vllm.model_executor.warmup.jit_warmup:JitWarmupRegistry.capture",
    ),
)
def start_inputs(runner: Any) -> dict[str, Any]:
    """The catalog's start inputs, read from a constructed runner."""
    return {
        "vllm_config": runner.vllm_config,
        "device": runner.device,
        "runner_settings": RunnerSettings.from_runner(runner),
        "cudagraph_dispatcher": runner.cudagraph_dispatcher,
        "drafter": getattr(runner, "drafter", None),
        "jit_warmup_registry": getattr(runner, "jit_warmup_registry", None),
    }


@vllm_uses(
    "catalog_v1",
    calls=(
        f"{_RUNNER}.cache_config",
        f"{_CACHE_CONFIG}.kv_cache_layout",
        f"{_CACHE_CONFIG}.get_resolved_kv_cache_layout",
        f"{_RUNNER}.max_model_len",
        f"{_RUNNER}.input_batch",
    ),
)
def kv_inputs(
    runner: Any,
    kv_cache_config: Any,
    is_profiling: bool = False,
    kv_cache_allocation_context: Any = None,
) -> dict[str, Any]:
    """The KV-phase inputs: the engine's config plus what vLLM settled since the start."""
    cache_config = runner.cache_config
    layout = (
        cache_config.get_resolved_kv_cache_layout()
        if cache_config.kv_cache_layout is not None
        else None
    )
    return {
        "kv_cache_config": kv_cache_config,
        "is_profiling": is_profiling,
        "kv_cache_allocation_context": kv_cache_allocation_context,
        "kv_cache_layout": layout,
        "max_model_len": runner.max_model_len,
        "current_input_batch": runner.input_batch,
        "current_input_batch_geometry": InputBatchGeometry.from_runner(runner),
    }


# -- the adapter: the one place that writes onto the runner -------------------------------
@vllm_uses(
    "catalog_v1",
    mirrors=(f"{_RUNNER}.get_kv_cache_spec",),  # where stock fills shared_kv_cache_layers
    calls=(f"{_RUNNER}.shared_kv_cache_layers",),
)
def apply_model_outputs(runner: Any, outputs: Mapping[str, Any]) -> None:
    """Write the model-phase result vLLM keeps on the runner (``shared_kv_cache_layers``)."""
    runner.shared_kv_cache_layers.update(outputs["shared_kv_cache_layers"])


@vllm_uses(
    "catalog_v1",
    # the methods that set these attributes in stock's initialize_kv_cache and the worker's
    # _init_kv_zero_meta call
    mirrors=(
        f"{_RUNNER}.initialize_kv_cache",
        f"{_RUNNER}.may_add_encoder_only_layers_to_kv_cache_config",
        f"{_RUNNER}.maybe_add_kv_sharing_layers_to_kv_cache_groups",
        f"{_RUNNER}.initialize_attn_backend",
        f"{_RUNNER}.calculate_reorder_batch_threshold",
        f"{_RUNNER}.may_reinitialize_input_batch",
        f"{_RUNNER}.initialize_kv_cache_tensors",
        f"{_RUNNER}._init_kv_zero_meta",
    ),
    calls=(
        f"{_RUNNER}.kv_cache_config",
        f"{_RUNNER}._mamba_bufs",
        f"{_RUNNER}._mamba_state_copy_funcs",
        f"{_RUNNER}.runner_only_attn_layers",
        f"{_RUNNER}.kv_sharing_fast_prefill_eligible_layers",
        f"{_RUNNER}.attn_groups",
        f"{_RUNNER}._kernel_block_sizes",
        f"{_RUNNER}.reorder_batch_threshold",
        f"{_RUNNER}.input_batch",
        f"{_RUNNER}._init_block_sizes",
        f"{_RUNNER}._init_max_num_blocks",
        f"{_RUNNER}._init_slot_mapping_modes",
        f"{_RUNNER}.cp_kv_cache_interleave_size",
        f"{_RUNNER}.kv_caches",
        f"{_RUNNER}._kv_block_zeroer",
    ),
)
def apply_kv_outputs(runner: Any, model: Mapping[str, Any], kv: Mapping[str, Any]) -> None:
    """Write a completed KV phase onto the runner exactly where vLLM's methods put it."""
    runner.kv_cache_config = kv["runner_kv_cache_config"]
    runner._mamba_bufs = None
    runner._mamba_state_copy_funcs = None
    runner.runner_only_attn_layers.update(model["runner_only_attn_layers"])
    runner.kv_sharing_fast_prefill_eligible_layers.update(
        model["kv_sharing_fast_prefill_eligible_layers"]
    )
    runner.attn_groups[:] = kv["attn_groups"]
    runner._kernel_block_sizes = list(kv["kernel_block_sizes"])
    runner.reorder_batch_threshold = kv["reorder_batch_threshold"]
    geometry: InputBatchGeometry = kv["input_batch_geometry"]
    runner.input_batch = kv["input_batch"]
    runner._init_block_sizes = list(geometry.block_sizes)
    runner._init_max_num_blocks = list(geometry.max_num_blocks)
    runner._init_slot_mapping_modes = list(geometry.slot_mapping_modes)
    runner.cp_kv_cache_interleave_size = geometry.cp_kv_cache_interleave_size
    runner.kv_caches[:] = kv["runner_kv_caches"]
    if kv["kv_block_zeroer"] is not None:  # stock has no attribute when none is needed
        runner._kv_block_zeroer = kv["kv_block_zeroer"]


@vllm_uses(
    "catalog_v1",
    mirrors=(f"{_RUNNER}._cleanup_profiling_kv_cache",),
    calls=(
        f"{_RUNNER}._kv_block_zeroer",
        f"{_RUNNER}.kv_caches",
        f"{_RUNNER}.attn_groups",
        f"{_RUNNER}.kv_cache_config",
        f"{_RUNNER}.cache_config",
        f"{_CACHE_CONFIG}.num_gpu_blocks",
        f"{_RUNNER}._init_block_sizes",
    ),
)
def clear_kv_state(runner: Any) -> None:
    """Drop the runner's KV attributes as ``_cleanup_profiling_kv_cache`` does.

    Layers are reset by the binding stage's teardown; the input batch stays as a
    placeholder and ``_init_block_sizes = []`` forces the next KV phase to rebuild it.
    One deliberate difference: the KV block zeroer goes too (stock keeps it, pointing at
    the freed cache).
    """
    if hasattr(runner, "_kv_block_zeroer"):
        del runner._kv_block_zeroer
    for i in range(len(runner.kv_caches)):
        runner.kv_caches[i] = None
    runner.kv_caches.clear()
    runner.attn_groups.clear()
    if hasattr(runner, "kv_cache_config"):
        delattr(runner, "kv_cache_config")
    runner.cache_config.num_gpu_blocks = None
    runner._init_block_sizes = []


@vllm_uses(
    "catalog_v1",
    # the two steps (K1/K2) this inverts
    mirrors=(
        f"{_RUNNER}.may_add_encoder_only_layers_to_kv_cache_config",
        f"{_RUNNER}.maybe_add_kv_sharing_layers_to_kv_cache_groups",
    ),
    calls=(
        f"{_RUNNER}.kv_cache_config",
        f"{_RUNNER}.runner_only_attn_layers",
        "vllm.v1.kv_cache_interface:KVCacheConfig.kv_cache_groups",
        "vllm.v1.kv_cache_interface:KVCacheGroupSpec.layer_names",
    ),
)
def engine_kv_cache_config(runner: Any) -> Any:
    """Recover the engine's KVCacheConfig from a runner's working copy.

    The inverse of K1/K2: drop the runner-only layers (KV-sharing and encoder-only) from
    the groups and the groups they leave empty (the encoder-only group, always last).
    """
    import copy

    cfg = copy.deepcopy(runner.kv_cache_config)
    runner_only = set(runner.runner_only_attn_layers)
    groups = []
    for group in cfg.kv_cache_groups:
        group.layer_names = [n for n in group.layer_names if n not in runner_only]
        if group.layer_names:
            groups.append(group)
    cfg.kv_cache_groups = groups
    return cfg


def start_run(pipeline: Pipeline, runner: Any, inputs: Mapping[str, Any]) -> Run:
    """Start ``pipeline`` for a pipelined runner (either runner version): its per-stage log
    lines until the worker's start-up is over (naming the rank when there are several; see
    :meth:`PipelineHost.initpipe_startup_done`), its trace, and the faults a test asked
    for through ``INITPIPE_FAULT`` (spawned worker processes)."""
    from .progress import listeners, stage_line

    line = None if runner._initpipe_started else stage_line(runner._initpipe_rank())
    runner._initpipe_stage_line = line  # kept: initpipe_startup_done() removes it
    run = pipeline.start(
        listeners=[*([line] if line is not None else []), *listeners(stage_lines=False)],
        trace=runner.initpipe_trace,
        **inputs,
    )
    if os.environ.get(ENV_FAULT):
        inject_faults_from_env(run)
    return run


#: How many trace events a pipelined runner keeps (about 900 KV re-inits of the catalog).
TRACE_MAX_RECORDS = 20_000


# -- the runner classes ----------------------------------------------------------------
class PipelineHost:
    """What both runner mixins (v1 here, Model Runner V2 in :mod:`.runner_v2`) share: the
    worker's rank for log lines, the failure report, the capture span, and the KV lifecycle
    a live resize drives (:mod:`initpipe_vllm.resize.rank` calls only these):

    - :meth:`initpipe_requests` — the request ids the runner still holds state for;
    - :meth:`initpipe_kv_in_place` — whether a KV cache (or part of one) is in place;
    - :meth:`initpipe_release_cuda_graphs` — drop every captured graph (they hold the old
      KV addresses), before the teardown;
    - :meth:`initpipe_release_kv_cache` — the KV phase's teardowns in reverse, the runner
      left as vLLM's own cleanup leaves it.

    Re-initializing is vLLM's own ``Worker.initialize_from_config`` (which calls the
    runner's ``initialize_kv_cache``, the catalog) and warming up its
    ``compile_or_warm_up_model``, for both runners. The host sets ``initpipe_pipeline``
    and ``initpipe_trace``.
    """

    initpipe_pipeline: Pipeline
    initpipe_trace: Any
    #: which vLLM model runner this is: ``"v1"`` or ``"v2"`` (Model Runner V2)
    initpipe_runner_version: str
    #: whether the worker's start-up is over (:meth:`initpipe_startup_done`)
    _initpipe_started = False
    #: the current run's per-stage log line listener (None when there is none)
    _initpipe_stage_line: Any = None

    def initpipe_startup_done(self) -> None:
        """The worker's start-up is over (its first warm-up returned): from now on each
        phase logs one summary line, not one line per stage and teardown — a live
        resize's KV phase is one line (each costs about 50 µs). Idempotent."""
        self._initpipe_started = True
        line, self._initpipe_stage_line = self._initpipe_stage_line, None
        if line is not None:
            self.initpipe_run.remove_listener(line)  # type: ignore[attr-defined]

    def initpipe_requests(self) -> list[str]:
        """The ids of the requests this runner still holds state for, sorted."""
        raise NotImplementedError

    def initpipe_kv_in_place(self) -> bool:
        """Whether a KV cache, or part of one, is in place on this runner."""
        raise NotImplementedError

    def initpipe_release_cuda_graphs(self) -> int:
        """Drop every captured CUDA graph; return how many graph owners held graphs."""
        raise NotImplementedError

    def initpipe_release_kv_cache(self) -> None:
        """Tear the KV phase down and let go of the runner's KV attributes."""
        raise NotImplementedError

    def _initpipe_rank(self) -> int | None:
        """This worker's global rank when there are several (log lines name it), else None."""
        parallel = self.vllm_config.parallel_config  # type: ignore[attr-defined]
        return int(parallel.rank) if parallel.world_size > 1 else None

    def _initpipe_report(self, err: Any) -> None:
        """Log the failed stage and the completed ones, and write the failure trace."""
        from .progress import report_failure

        parallel = self.vllm_config.parallel_config  # type: ignore[attr-defined]
        report_failure(
            err,
            self.initpipe_trace,
            self.initpipe_pipeline.graph,
            parallel.rank,
            parallel.world_size,
        )

    @vllm_uses(
        ("catalog_v1", "catalog_mrv2"),
        calls=(f"{_RUNNER}.capture_model", f"{_RUNNER_V2}.capture_model"),
    )
    def capture_model(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's CUDA-graph capture, recorded as a span of the trace."""
        with self.initpipe_trace.span("capture_model (graph capture)", phase="vllm"):
            return super().capture_model(*args, **kwargs)  # type: ignore[misc]


class PipelinedRunnerMixin(PipelineHost):
    """Put before the platform's runner class: its init runs as an initpipe pipeline.

    Attributes:
        initpipe_pipeline: the Pipeline used (the catalog unless one is given).
        initpipe_run: the current Run.
        initpipe_trace: the Trace of every stage run and teardown, and of the vLLM steps
            around them (the worker records those as spans); it outlives re-created runs.
    """

    initpipe_runner_version = "v1"
    initpipe_default_pipeline: Pipeline | None = None

    @vllm_uses(
        "catalog_v1",
        calls=(
            f"{_RUNNER}.__init__",
            f"{_CPU_RUNNER}.__init__",
            "vllm.v1.worker.xpu_model_runner:XPUModelRunner.__init__",
        ),
    )
    def __init__(self, vllm_config: Any, device: Any, *, pipeline: Pipeline | None = None) -> None:
        super().__init__(vllm_config, device)  # type: ignore[call-arg]
        from initpipe import Trace

        if pipeline is None:
            from .. import catalog

            pipeline = type(self).initpipe_default_pipeline or catalog()
        self.initpipe_pipeline = pipeline
        # Bounded: a long-lived runner that re-runs its KV phase keeps the latest events.
        self.initpipe_trace = Trace(max_records=TRACE_MAX_RECORDS)
        self.initpipe_run = self._initpipe_start()
        self._initpipe_block_size: int | None = None
        self._initpipe_lock = threading.RLock()

    def _initpipe_start(self) -> Run:
        return start_run(self.initpipe_pipeline, self, start_inputs(self))

    # model phase ------------------------------------------------------------------------
    @vllm_uses(
        "catalog_v1",
        calls=(f"{_RUNNER}.cache_config", f"{_CACHE_CONFIG}.block_size", f"{_RUNNER}.model"),
    )
    def _initpipe_model_phase(self) -> Mapping[str, Any]:
        """Run the model phase once the block size is final (memoized)."""
        with self._initpipe_lock:
            run = self.initpipe_run
            block_size = self.cache_config.block_size  # type: ignore[attr-defined]
            if run.state == "loaded":
                if block_size == self._initpipe_block_size:
                    return run.outputs
                if run.completed(KV):
                    msg = (
                        f"cache_config.block_size changed from {self._initpipe_block_size} "
                        f"to {block_size} while a KV cache is in place; call "
                        f"_cleanup_profiling_kv_cache() first."
                    )
                    raise PhaseOrderError(msg)
                run.close()
                self.initpipe_run = run = self._initpipe_start()
            if getattr(self, "model", None) is None:
                raise PhaseOrderError(
                    "load_model() must be called before get_kv_cache_spec() "
                    "or initialize_kv_cache(): the model phase reads the "
                    "loaded model."
                )
            try:
                outputs = run.load(model=self.model)  # type: ignore[attr-defined]
            except StageError as err:
                self._initpipe_report(err)
                raise
            log_phase(run, "model", self._initpipe_rank())
            self._initpipe_block_size = block_size
            apply_model_outputs(self, outputs)
            return outputs

    @vllm_uses("catalog_v1", mirrors=(f"{_RUNNER}.get_kv_cache_spec",))
    def get_kv_cache_spec(self) -> dict[str, Any]:
        """The KV cache spec per layer (runs the model phase on first call)."""
        return dict(self._initpipe_model_phase()["kv_cache_spec"])

    # KV phase ---------------------------------------------------------------------------
    @vllm_uses(
        "catalog_v1",
        mirrors=(f"{_RUNNER}.initialize_kv_cache", f"{_CPU_RUNNER}.initialize_kv_cache"),
        calls=(f"{_RUNNER}.attn_groups", f"{_RUNNER}.kv_caches"),
    )
    def initialize_kv_cache(
        self,
        kv_cache_config: Any,
        is_profiling: bool = False,
        kv_cache_allocation_context: Any = None,
    ) -> None:
        """Run the KV phase (refused while one is in place, as stock refuses it)."""
        with self._initpipe_lock:
            model = self._initpipe_model_phase()
            if self.initpipe_run.completed(KV) or self.attn_groups or self.kv_caches:  # type: ignore[attr-defined]
                raise PhaseOrderError(
                    "initialize_kv_cache() called while a KV cache is in place (generation "
                    f"{self.initpipe_run.kv_generation}). Re-initializing under a live "
                    "engine would leave the scheduler's block pool, captured CUDA graphs "
                    "and KV connectors describing the old cache. Call "
                    "_cleanup_profiling_kv_cache() first (as vLLM's profiling pass does), "
                    "or resize through the engine."
                )
            inputs = kv_inputs(self, kv_cache_config, is_profiling, kv_cache_allocation_context)
            try:
                outputs = self.initpipe_run.initialize_kv_cache(**inputs)
            except StageError as err:
                self._initpipe_report(err)
                raise
            apply_kv_outputs(self, model, outputs)
            log_phase(self.initpipe_run, KV, self._initpipe_rank())

    @vllm_uses("catalog_v1", mirrors=(f"{_RUNNER}._init_kv_zero_meta",))
    def _init_kv_zero_meta(self) -> None:
        """The worker's call after ``initialize_kv_cache``: the ``kv_block_zeroer`` stage
        built the zeroer already (or the config needs none), so build no second one.

        Only if that stage did not build one while the config asks for it (a KV phase run
        with ``is_profiling=True``, then this call) does vLLM's own method build it, over
        the same live tensors; the KV teardown drops it either way.
        """
        with self._initpipe_lock:
            if not self.initpipe_run.kv_ready:
                raise PhaseOrderError(
                    "_init_kv_zero_meta() needs a KV cache in place; call "
                    "initialize_kv_cache() first."
                )
            if self.initpipe_run.outputs["kv_block_zeroer"] is None:
                super()._init_kv_zero_meta()  # type: ignore[misc]

    def _initpipe_release_kv(self) -> None:
        # The runner lets go first, so the allocation's teardown can return the memory.
        clear_kv_state(self)
        if self.initpipe_run.state != "closed":
            self.initpipe_run.teardown_kv_cache()
            phase_spans(self.initpipe_run.trace, KV, self._initpipe_rank())

    @vllm_uses("catalog_v1", mirrors=(f"{_RUNNER}._cleanup_profiling_kv_cache",))
    def _cleanup_profiling_kv_cache(self) -> None:
        """Tear the KV phase down (reverse teardowns), as vLLM's cleanup leaves the runner."""
        import torch

        torch.accelerator.synchronize()
        with self._initpipe_lock:
            self._initpipe_release_kv()
        gc.collect()
        torch.accelerator.empty_cache()

    # the KV lifecycle a live resize drives (PipelineHost) --------------------------------
    @vllm_uses("catalog_v1", calls=(f"{_RUNNER}.requests",))
    def initpipe_requests(self) -> list[str]:
        """The requests in ``self.requests`` (v1's per-request state)."""
        return sorted(self.requests)  # type: ignore[attr-defined]

    @vllm_uses("catalog_v1", calls=(f"{_RUNNER}.kv_caches",))
    def initpipe_kv_in_place(self) -> bool:
        return bool(self.kv_caches) or self.initpipe_run.kv_ready  # type: ignore[attr-defined]

    def initpipe_release_cuda_graphs(self) -> int:
        return release_cuda_graphs(self)

    @vllm_uses("catalog_v1", mirrors=(f"{_RUNNER}._cleanup_profiling_kv_cache",))
    def initpipe_release_kv_cache(self) -> None:
        self._cleanup_profiling_kv_cache()

    @vllm_uses("catalog_v1", mirrors=(f"{_RUNNER}.shutdown",))
    def shutdown(self) -> None:
        """vLLM's shutdown (which calls the cleanup above), then close the run."""
        try:
            super().shutdown()  # type: ignore[misc]
        finally:
            self.initpipe_run.close()


@vllm_uses(
    "catalog_v1",
    mirrors=(
        "vllm.distributed.elastic_ep.elastic_execute:ElasticEPScalingExecutor._release_cuda_graphs",
    ),
    calls=(
        "vllm.compilation.cuda_graph:CUDAGraphWrapper",
        "vllm.compilation.cuda_graph:CUDAGraphWrapper._all_instances",
        "vllm.compilation.cuda_graph:CUDAGraphWrapper.concrete_cudagraph_entries",
        "vllm.compilation.cuda_graph:CUDAGraphWrapper.clear_all_graphs",
        "vllm.compilation.breakable_cudagraph:BreakableCUDAGraphWrapper",
        "vllm.compilation.breakable_cudagraph:BreakableCUDAGraphWrapper._all_instances",
        "vllm.compilation.breakable_cudagraph:BreakableCUDAGraphWrapper.entries",
        "vllm.compilation.breakable_cudagraph:BreakableCUDAGraphWrapper.clear_all_graphs",
        f"{_RUNNER}.encoder_cudagraph_manager",
        "vllm.v1.worker.encoder_cudagraph:EncoderCudaGraphManager.clear",
    ),
)
def release_cuda_graphs(runner: Any) -> int:
    """The v1 runner's graph owners: every ``CUDAGraphWrapper`` and
    ``BreakableCUDAGraphWrapper`` (``clear_all_graphs()``, as vLLM's elastic-EP path does
    for v1) and the encoder's CUDA-graph manager. Returns how many wrappers held graphs; a
    no-op where none was captured (CPU, ``enforce_eager``). Never run on a GPU here: tested
    on CPU with real wrapper objects whose entries are filled by hand."""
    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
    from vllm.compilation.cuda_graph import CUDAGraphWrapper

    held = 0
    for cls in (CUDAGraphWrapper, BreakableCUDAGraphWrapper):
        for wrapper in list(cls._all_instances):
            entries = getattr(wrapper, "concrete_cudagraph_entries", None)
            if entries is None:  # the breakable wrapper names them `entries`
                entries = getattr(wrapper, "entries", None)
            held += bool(entries)
        cls.clear_all_graphs()
    encoder = getattr(runner, "encoder_cudagraph_manager", None)
    if encoder is not None:
        encoder.clear()
    return held


@vllm_uses(
    "catalog_v1",
    # which v1 runner the stock workers build
    mirrors=(
        "vllm.v1.worker.cpu_worker:CPUWorker.init_device",
        "vllm.v1.worker.gpu_worker:Worker._make_model_runner",
    ),
    calls=(
        "vllm.platforms:current_platform",
        f"{_PLATFORM}.is_cpu",
        f"{_PLATFORM}.is_cuda_alike",
        f"{_PLATFORM}.is_xpu",
        _CPU_RUNNER,
        _RUNNER,
    ),
)
def platform_runner_class() -> type:
    """The v1 runner class the current platform's stock worker builds.

    CPU: ``CPUModelRunner`` (importing ``vllm.v1.worker.cpu_worker`` first applies the CPU
    shims it relies on). CUDA/ROCm/XPU: ``GPUModelRunner``.
    """
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        import vllm.v1.worker.cpu_worker  # noqa: F401  (CPU torch shims)
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner

        return CPUModelRunner
    if current_platform.is_cuda_alike() or current_platform.is_xpu():
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        return GPUModelRunner
    raise UnsupportedRunnerError(
        f"no pipelined runner for platform {type(current_platform).__name__}"
    )


def pipelined_runner_class(base: type | None = None) -> type:
    """``Pipelined<Base>``: the mixin over ``base`` (default: the platform's runner).

    Built once per base; reachable as ``initpipe_vllm.runner.Pipelined<Base>``.
    """
    return _pipelined(base or platform_runner_class())


@functools.cache
def _pipelined(base: type) -> type:
    name = f"Pipelined{base.__name__}"
    # Named after the stable re-export module, where pickling and qualname lookups go.
    return type(
        name,
        (PipelinedRunnerMixin, base),
        {"__module__": "initpipe_vllm.runner", "__qualname__": name},
    )


@vllm_uses(
    "catalog_v1",
    calls=(
        _CPU_RUNNER,
        _RUNNER,
    ),
)
def __getattr__(name: str) -> Any:
    # Lazily built classes resolve by qualified name (pickling, vLLM's qualname lookup).
    if name == "PipelinedCPUModelRunner":
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner

        return _pipelined(CPUModelRunner)
    if name == "PipelinedGPUModelRunner":
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        return _pipelined(GPUModelRunner)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
