"""The v1 runner's adapter: the data and the few methods that are v1's own.

What belongs here: the integration layer between an initpipe ``Run`` of the catalog and
vLLM's ``GPUModelRunner`` (``vllm/v1/worker/gpu_model_runner.py``), as a
:class:`~.adapter.RunnerAdapter` (:data:`V1_ADAPTER`) over the shared mixin
(:class:`~.adapter.PipelineHost`, where the lifecycle is checked). It replaces the runner
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

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs

from initpipe import PhaseOrderError

from ..contract.declare import vllm_uses
from ..errors import UnsupportedRunnerError
from ..v1.types import InputBatchGeometry, RunnerSettings
from ..vllm_names import PLATFORM as _PLATFORM, V1_RUNNER as _RUNNER
from .adapter import (
    ENTRY_STATES,
    TRACE_MAX_RECORDS,
    Labels,
    PipelineHost,
    RunnerAdapter,
    RunnerState,
    Write,
    attr_names,
    engine_inputs,
    host_uses,
    installed_adapter,
    owned,
    pipelined_class,
    read_attrs,
    resolve_class,
    start_run,
    write_outputs,
)
from .progress import log_phase

__all__ = [
    "TRACE_MAX_RECORDS",
    "V1_ADAPTER",
    "V1_ADAPTER_0_33_0",
    "PipelineHost",
    "PipelinedRunnerMixin",
    "PipelinedRunnerMixin_0_33_0",
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


# vLLM names for the declarations (``module:qualname``).
_CPU_RUNNER = "vllm.v1.worker.cpu_model_runner:CPUModelRunner"
_CACHE_CONFIG = "vllm.config.cache:CacheConfig"


# -- reading the runner: the pipeline's external inputs -----------------------------------
#: The start inputs read as runner attributes of the same name (the optional ones: None
#: where the runner has none).
_START_ATTRS = ("vllm_config", "device", "cudagraph_dispatcher")
_START_OPTIONAL = ("drafter", "jit_warmup_registry")


@vllm_uses(
    "catalog_v1",
    calls=(
        *owned(_RUNNER, _START_ATTRS),
        f"{_RUNNER}.drafter",
        # jit_warmup_registry: set on the runner by this decorator of its __init__
        "vllm.model_executor.warmup.jit_warmup:JitWarmupRegistry.capture",
    ),
)
def start_inputs(runner: Any) -> dict[str, Any]:
    """The catalog's start inputs, read from a constructed runner."""
    inputs = read_attrs(runner, _START_ATTRS, _START_OPTIONAL)
    return inputs | {"runner_settings": RunnerSettings.from_runner(runner)}


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
    return engine_inputs(kv_cache_config, is_profiling, kv_cache_allocation_context) | {
        "kv_cache_layout": layout,
        "max_model_len": runner.max_model_len,
        "current_input_batch": runner.input_batch,
        "current_input_batch_geometry": InputBatchGeometry.from_runner(runner),
    }


# -- the adapter: the one place that writes onto the runner -------------------------------
#: Model-phase output -> the runner attribute stock's ``get_kv_cache_spec`` fills.
_MODEL_WRITES = (Write("shared_kv_cache_layers", "shared_kv_cache_layers", "update"),)

#: Phase output -> runner attribute, as stock's ``initialize_kv_cache`` and the worker's
#: ``_init_kv_zero_meta`` call assign them (the KV block zeroer only when the config needs
#: one: stock has no attribute otherwise).
_KV_WRITES = (
    Write("kv_cache_config", "runner_kv_cache_config"),
    Write("_mamba_bufs", None),
    Write("_mamba_state_copy_funcs", None),
    Write("runner_only_attn_layers", "runner_only_attn_layers", "update"),
    Write(
        "kv_sharing_fast_prefill_eligible_layers",
        "kv_sharing_fast_prefill_eligible_layers",
        "update",
    ),
    Write("attn_groups", "attn_groups", "fill"),
    Write("_kernel_block_sizes", "kernel_block_sizes", "list"),
    Write("reorder_batch_threshold", "reorder_batch_threshold"),
    Write("input_batch", "input_batch"),
    Write("_init_block_sizes", "input_batch_geometry.block_sizes", "list"),
    Write("_init_max_num_blocks", "input_batch_geometry.max_num_blocks", "list"),
    Write("_init_slot_mapping_modes", "input_batch_geometry.slot_mapping_modes", "list"),
    Write("cp_kv_cache_interleave_size", "input_batch_geometry.cp_kv_cache_interleave_size"),
    Write("kv_caches", "runner_kv_caches", "fill"),
    Write("_kv_block_zeroer", "kv_block_zeroer", "if_built"),
)


@vllm_uses(
    "catalog_v1",
    mirrors=(f"{_RUNNER}.get_kv_cache_spec",),  # where stock fills shared_kv_cache_layers
    calls=attr_names(_RUNNER, _MODEL_WRITES),
)
def apply_model_outputs(runner: Any, outputs: Mapping[str, Any]) -> None:
    """Write the model-phase result vLLM keeps on the runner (``shared_kv_cache_layers``)."""
    write_outputs(runner, _MODEL_WRITES, outputs)


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
    calls=attr_names(_RUNNER, _KV_WRITES),
)
def apply_kv_outputs(runner: Any, model: Mapping[str, Any], kv: Mapping[str, Any]) -> None:
    """Write a completed KV phase onto the runner exactly where vLLM's methods put it."""
    write_outputs(runner, _KV_WRITES, kv, model)


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


# -- the adapter as data, and the runner class ---------------------------------------------
#: The stable pipelined class names -> the v1 class each is built over.
_CLASSES = {
    "PipelinedCPUModelRunner": _CPU_RUNNER,
    "PipelinedGPUModelRunner": _RUNNER,
}


@vllm_uses(
    "catalog_v1",
    # what the shared mixin (adapter.PipelineHost) replaces and calls on a v1 runner
    mirrors=host_uses(
        _RUNNER,
        "mirrors",
        f"{_CPU_RUNNER}.initialize_kv_cache",
        f"{_RUNNER}._cleanup_profiling_kv_cache",
    ),
    calls=host_uses(
        _RUNNER,
        "calls",
        f"{_CPU_RUNNER}.__init__",
        "vllm.v1.worker.xpu_model_runner:XPUModelRunner.__init__",
        *_CLASSES.values(),
    ),
)
def _v1_adapter() -> RunnerAdapter:
    """The v1 runner's adapter on vLLM 0.32.0; its declaration is what the shared mixin
    replaces and calls on a v1 runner."""
    # the model phase runs on the first call that needs it, from loaded weights
    lazy: frozenset[RunnerState] = frozenset({"weights", "model", "released"})
    return RunnerAdapter(
        runner="v1",
        capability="catalog_v1",
        labels=Labels("v1 runner", "the v1 runner catalog", "v1 (GPUModelRunner)"),
        stock_runner=_RUNNER,
        catalog="initpipe_vllm:catalog",
        classes=MappingProxyType(_CLASSES),
        start_inputs=start_inputs,
        kv_inputs=kv_inputs,
        apply_kv=lambda runner, outputs: apply_kv_outputs(runner, outputs, outputs),
        clear_kv=clear_kv_state,
        engine_kv_cache_config=engine_kv_cache_config,
        release_cuda_graphs=release_cuda_graphs,
        teardown=("_cleanup_profiling_kv_cache()", "as vLLM's profiling pass does"),
        close_first=False,
        entry_states=MappingProxyType({**ENTRY_STATES, "initialize_kv_cache()": lazy}),
    )


V1_ADAPTER = _v1_adapter()
#: The v1 runner's adapter on vLLM 0.33.0: 0.32.0's tables (the runner methods it replaces
#: assign the same attributes there), building the 0.33.0 catalog (its ``kv_cache_spec``
#: variant, :mod:`initpipe_vllm.releases.v0_33_0`).
V1_ADAPTER_0_33_0 = attrs.evolve(V1_ADAPTER, release="0.33.0")


# -- the runner class ------------------------------------------------------------------
class PipelinedRunnerMixin(PipelineHost):
    """Put before the platform's v1 runner class: its init runs as an initpipe pipeline.

    The shared behaviour is :class:`~.adapter.PipelineHost`'s; here only what is v1's own:
    the lazy model phase (memoized by block size) and stock's cleanup method's name.

    Attributes:
        initpipe_pipeline: the Pipeline used (the catalog unless one is given).
        initpipe_run: the current Run.
        initpipe_trace: the Trace of every stage run and teardown, and of the vLLM steps
            around them (the worker records those as spans); it outlives re-created runs.
    """

    initpipe_adapter = V1_ADAPTER
    #: the block size the current model phase ran with
    _initpipe_block_size: int | None = None

    @staticmethod
    def initpipe_platform_class() -> type:
        return platform_runner_class()

    # model phase ------------------------------------------------------------------------
    @vllm_uses(
        "catalog_v1",
        calls=(f"{_RUNNER}.cache_config", f"{_CACHE_CONFIG}.block_size", f"{_RUNNER}.model"),
    )
    def _initpipe_model_outputs(self) -> Mapping[str, Any]:
        """Run the model phase once the block size is final (memoized)."""
        with self._initpipe_lock:
            state = self._initpipe_require("get_kv_cache_spec()")
            run = self.initpipe_run
            block_size = self.cache_config.block_size  # type: ignore[attr-defined]
            if state != "weights":  # the model phase ran
                if block_size == self._initpipe_block_size:
                    return run.outputs
                if state == "kv":
                    msg = (
                        f"cache_config.block_size changed from {self._initpipe_block_size} "
                        f"to {block_size} while a KV cache is in place; call "
                        f"_cleanup_profiling_kv_cache() first."
                    )
                    raise PhaseOrderError(msg)
                run = self._initpipe_restart()
            outputs = self._initpipe_phase(run.load, model=self.model)  # type: ignore[attr-defined]
            log_phase(run, "model", self._initpipe_rank())
            self._initpipe_block_size = block_size
            apply_model_outputs(self, outputs)
            return outputs  # type: ignore[no-any-return]

    @vllm_uses("catalog_v1", mirrors=(f"{_RUNNER}.get_kv_cache_spec",))
    def get_kv_cache_spec(self) -> dict[str, Any]:
        """The KV cache spec per layer (runs the model phase on first call)."""
        return dict(self._initpipe_model_outputs()["kv_cache_spec"])

    @vllm_uses("catalog_v1", mirrors=(f"{_RUNNER}._cleanup_profiling_kv_cache",))
    def _cleanup_profiling_kv_cache(self) -> None:
        """Tear the KV phase down (reverse teardowns), as vLLM's cleanup leaves the runner."""
        self.initpipe_release_kv_cache()

    @vllm_uses("catalog_v1", calls=(f"{_RUNNER}.requests",))
    def initpipe_requests(self) -> list[str]:
        """The requests in ``self.requests`` (v1's per-request state)."""
        return sorted(self.requests)  # type: ignore[attr-defined]


class PipelinedRunnerMixin_0_33_0(PipelinedRunnerMixin):
    """The v1 mixin on vLLM 0.33.0: registered under ``("v1", "0.33.0")``; its catalog is
    the 0.33.0 one, its methods 0.32.0's."""

    initpipe_adapter = V1_ADAPTER_0_33_0


def pipelined_runner_class(base: type | None = None) -> type:
    """``Pipelined<Base>``: the mixin of the installed vLLM's release (the contract's
    answer, :func:`~.adapter.installed_adapter`) over ``base`` (default: the platform's
    runner).

    Built once per base; reachable as ``initpipe_vllm.runner.Pipelined<Base>``.
    """
    return pipelined_class(installed_adapter("v1"), base)


def __getattr__(name: str) -> Any:
    # Lazily built classes resolve by qualified name (pickling, vLLM's qualname lookup).
    cls = resolve_class(name)
    if cls is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return cls
