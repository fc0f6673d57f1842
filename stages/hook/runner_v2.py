"""The pipelined Model Runner V2 and the one adapter that writes MRv2 stage outputs onto it.

What belongs here: the integration layer between initpipe runs of the MRv2 catalog
(:mod:`initpipe_vllm.mrv2`) and vLLM's MRv2 ``GPUModelRunner``
(``vllm/v1/worker/gpu/model_runner.py``; on CPU its subclass ``CPUModelRunner`` in
``vllm/v1/worker/cpu/model_runner.py``). It replaces the runner methods ``load_model`` (the
part after the weights), ``get_kv_cache_spec``, ``initialize_kv_cache``,
``_init_kv_zero_meta`` and ``profile_cudagraph_memory``'s teardown, and hooks ``shutdown``;
``execute_model``, ``capture_model``, the warm-up and the worker run unchanged because
:func:`apply_kv_outputs_v2` writes the same attributes stock's methods would, in one place.
A separate adapter from v1's (:mod:`.runner`): MRv2 has none of ``cudagraph_dispatcher``,
``input_batch``, ``max_encoder_len``, ``uniform_decode_query_len`` or
``shared_kv_cache_layers``.

Phase triggers:

- model phase: inside ``load_model``, right after the weights are loaded and measured
  (stock's time: MRv2 reads ``cache_config.block_size`` there);
- ``get_kv_cache_spec``: the one-stage spec pipeline, on every call (as stock recomputes),
  so it reads the block size the executor settled after ``load_model``;
- KV phase: every ``initialize_kv_cache`` (profiling passes included), refused while one is
  in place; the teardown (:meth:`PipelinedRunnerV2Mixin.initpipe_teardown_profiling_state`)
  replaces vLLM's module function ``_teardown_profiling_state`` inside
  ``profile_cudagraph_memory`` — a CUDA path never run here (``CPUWorker`` overrides the
  memory profiling), tested directly on CPU.

vLLM is imported lazily (the runner classes are built on first use).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from .. import releases
from ..contract.declare import vllm_uses
from ..errors import UnsupportedRunnerError
from ..mrv2 import CATALOG as MRV2_CATALOG, INITPIPE_INPUTS as MRV2_INPUTS
from ..mrv2.model_phase import BUILT_AFTER_WEIGHTS
from ..mrv2.types import RunnerV2Settings
from ..vllm_names import (
    MODEL_STATE as _MODEL_STATE,
    MRV2_RUNNER as _RUNNER,
    MRV2_RUNNER_MODULE as _MRV2_LOGGER,
    MRV2_TEARDOWN as _TEARDOWN,
)
from . import adapter
from .progress import log_phase, phase_spans

__all__ = [
    "DELIBERATE_TEARDOWN_DIFFERENCES",
    "V2_ADAPTER",
    "V2_ADAPTER_0_33_0",
    "V2_ADAPTER_0_34_0",
    "PipelinedRunnerV2Mixin",
    "PipelinedRunnerV2Mixin_0_33_0",
    "PipelinedRunnerV2Mixin_0_34_0",
    "apply_kv_outputs_v2",
    "apply_model_outputs_v2",
    "clear_kv_state_v2",
    "engine_kv_cache_config_v2",
    "kv_inputs_v2",
    "pipelined_runner_v2_class",
    "platform_runner_v2_class",
    "release_cuda_graphs_v2",
    "start_inputs_v2",
    "start_inputs_v2_0_33_0",
]


# vLLM names for the declarations (``module:qualname``).
_CG = "vllm.v1.worker.gpu.cudagraph_utils"
_EAGLE3 = "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils"
_ENCODER_RUNNER = "vllm.v1.worker.gpu.mm.encoder_runner:EncoderRunner"
_LORA = "vllm.v1.worker.lora_model_runner_mixin:LoRAModelRunnerMixin"
_NUM_GPU_BLOCKS = "vllm.config.cache:CacheConfig.num_gpu_blocks"
_ELASTIC_RELEASE = (
    "vllm.distributed.elastic_ep.elastic_execute:ElasticEPScalingExecutor._release_cuda_graphs"
)

#: Where the pipelined MRv2 teardown leaves the runner unlike stock's
#: ``_teardown_profiling_state``: attribute -> why.
DELIBERATE_TEARDOWN_DIFFERENCES: Mapping[str, str] = {
    "fast_prefill": (
        "stock keeps its FastPrefillHelper, which holds the CUDA-graph manager the teardown "
        "just dropped; the pipelined runner drops it too (the next KV phase builds a new one)"
    ),
    "kv_block_zeroer": (
        "stock keeps its KVBlockZeroer, whose absolute addresses point into the freed KV "
        "cache; the pipelined runner disarms and drops it with the KV phase"
    ),
}


# -- reading the runner: the pipeline's external inputs -----------------------------------
#: The start inputs read as runner attributes of the same name: the catalog's start inputs
#: but ``runner_settings``, which :func:`start_inputs_v2` builds from the config.
_START_ATTRS = tuple(n for n in MRV2_INPUTS["start"] if n != "runner_settings")


@vllm_uses("catalog_mrv2", calls=adapter.owned(_RUNNER, _START_ATTRS))
def start_inputs_v2(runner: Any) -> dict[str, Any]:
    """The MRv2 catalog's start inputs, read from a constructed MRv2 runner."""
    inputs = adapter.read_attrs(runner, _START_ATTRS)
    return inputs | {"runner_settings": RunnerV2Settings.from_runner(runner)}


@vllm_uses("catalog_mrv2", calls=(f"{_RUNNER}.max_model_len",))
def kv_inputs_v2(runner: Any, *engine: Any) -> dict[str, Any]:
    """The MRv2 KV-phase inputs: the engine's (``kv_cache_config``, ``is_profiling``,
    ``kv_cache_allocation_context``: :func:`~.adapter.engine_inputs`) plus the model
    length vLLM settled since the start."""
    return adapter.engine_inputs(*engine) | {"max_model_len": runner.max_model_len}


# -- the adapter: the one place that writes onto the runner -------------------------------
#: Model-phase output -> the runner attribute stock's ``load_model`` assigns
#: (``batch_sharder`` and ``intermediate_tensors`` only when built: stock assigns them only
#: when it builds them).
_MODEL_WRITES = tuple(
    adapter.Write(
        name, name, "if_built" if name in ("batch_sharder", "intermediate_tensors") else "set"
    )
    for name in ("model_state", "decode_query_len", *BUILT_AFTER_WEIGHTS)
)

#: KV-phase output -> runner attribute, as stock's ``initialize_kv_cache`` and
#: ``_init_kv_zero_meta`` assign them (``fast_prefill``, ``aux_output_connector`` and the
#: KV block zeroer only when built: stock keeps the previous value otherwise).
_KV_WRITES = (
    adapter.Write("cp_interleave", "block_table_geometry.cp_interleave"),
    adapter.Write("kv_cache_config", "runner_kv_cache_config"),
    adapter.Write("attn_groups", "attn_groups"),
    adapter.Write("kernel_block_sizes", "kernel_block_sizes"),
    adapter.Write("adaptive_verification", "adaptive_verification"),
    adapter.Write("block_tables", "block_tables"),
    adapter.Write("pcp_manager", "pcp_manager"),
    adapter.Write("ubatch_runner", "ubatch_runner"),
    adapter.Write("cudagraph_manager", "cudagraph_manager"),
    adapter.Write("kv_caches", "runner_kv_caches"),
    adapter.Write("kv_connector", "kv_connector"),
    adapter.Write("fast_prefill", "fast_prefill", "if_built"),
    adapter.Write("aux_output_connector", "aux_output_connector", "if_built"),
    adapter.Write("kv_block_zeroer", "kv_block_zeroer", "if_built"),
)


@vllm_uses(
    "catalog_mrv2",
    mirrors=(f"{_RUNNER}.load_model",),
    calls=adapter.attr_names(_RUNNER, _MODEL_WRITES),
)
def apply_model_outputs_v2(runner: Any, outputs: Mapping[str, Any]) -> None:
    """Write a completed MRv2 model phase onto the runner where ``load_model`` puts it."""
    adapter.write_outputs(runner, _MODEL_WRITES, outputs)


@vllm_uses(
    "catalog_mrv2",
    mirrors=(f"{_RUNNER}.initialize_kv_cache", f"{_RUNNER}._init_kv_zero_meta"),
    calls=adapter.attr_names(_RUNNER, _KV_WRITES),
)
def apply_kv_outputs_v2(runner: Any, kv: Mapping[str, Any]) -> None:
    """Write a completed MRv2 KV phase onto the runner exactly where stock's methods put it."""
    adapter.write_outputs(runner, _KV_WRITES, kv)


#: What :func:`clear_kv_state_v2` reads and drops on the runner (its declaration).
_CLEARED = (
    *adapter.owned(
        _RUNNER,
        (
            "kv_caches",
            "attn_groups",
            "kv_cache_config",
            "cudagraph_manager",
            "fast_prefill",
            "kv_block_zeroer",
            "aux_output_connector",
            "cache_config",
        ),
    ),
    _NUM_GPU_BLOCKS,
)


@vllm_uses("catalog_mrv2", mirrors=(_TEARDOWN,), calls=_CLEARED)
def clear_kv_state_v2(runner: Any) -> None:
    """Drop the runner's KV attributes as ``_teardown_profiling_state`` does.

    Layers, the model state's KV state and the views are reset by the stages' teardowns.
    Stock keeps ``block_tables``, the kernel block sizes, the PCP and microbatch managers,
    the adaptive-verification manager and the KV connector: so does this. The deliberate
    differences are :data:`DELIBERATE_TEARDOWN_DIFFERENCES`; the aux-output connector,
    closed by its stage's teardown, is dropped too.
    """
    if hasattr(runner, "kv_caches"):
        runner.kv_caches.clear()
    if hasattr(runner, "attn_groups"):
        runner.attn_groups.clear()
    if hasattr(runner, "kv_cache_config"):
        del runner.kv_cache_config
    runner.cudagraph_manager = None
    runner.fast_prefill = None
    runner.kv_block_zeroer = None
    runner.aux_output_connector = None
    runner.cache_config.num_gpu_blocks = None


@vllm_uses(
    "catalog_mrv2",
    # the step of init_attn_backend this inverts
    mirrors=("vllm.v1.worker.utils:add_kv_sharing_layers_to_kv_cache_groups",),
    calls=(
        "vllm.v1.worker.gpu.attn_utils:get_shared_kv_cache_layers",
        f"{_RUNNER}.kv_cache_config",
        f"{_RUNNER}.vllm_config",
        "vllm.v1.kv_cache_interface:KVCacheConfig.kv_cache_groups",
        "vllm.v1.kv_cache_interface:KVCacheGroupSpec.layer_names",
    ),
)
def engine_kv_cache_config_v2(runner: Any) -> Any:
    """Recover the engine's KVCacheConfig from an MRv2 runner's working copy: drop the
    KV-sharing layers ``init_attn_backend`` added to their targets' groups."""
    import copy

    from vllm.v1.worker.gpu.attn_utils import get_shared_kv_cache_layers

    cfg = copy.deepcopy(runner.kv_cache_config)
    shared = set(get_shared_kv_cache_layers(runner.vllm_config))
    for group in cfg.kv_cache_groups:
        group.layer_names = [n for n in group.layer_names if n not in shared]
    return cfg


@vllm_uses(
    "catalog_mrv2",
    mirrors=(_ELASTIC_RELEASE, _TEARDOWN),
    calls=(
        f"{_CG}:CudaGraphManager",
        f"{_CG}:CudaGraphManager.graphs",
        f"{_CG}:CudaGraphManager.release_graphs",
        f"{_RUNNER}.cudagraph_manager",
        f"{_RUNNER}.speculator",
        f"{_RUNNER}.model_state",
        f"{_MODEL_STATE}.supports_mm_inputs",
        f"{_MODEL_STATE}.encoder_runner",
        f"{_ENCODER_RUNNER}.cudagraph_manager",
        f"{_ENCODER_RUNNER}.clear",
        "vllm.v1.worker.encoder_cudagraph:EncoderCudaGraphManager.budget_graphs",
    ),
)
def release_cuda_graphs_v2(runner: Any) -> int:
    """MRv2's graph owners, as vLLM's elastic-EP path releases them
    (``ElasticEPScalingExecutor._release_cuda_graphs``): the runner's ``cudagraph_manager``,
    every ``CudaGraphManager`` the speculator holds, then the model state's encoder graphs
    (``encoder_runner.clear()``, as ``_teardown_profiling_state`` does). MRv2 captures
    through these managers, not by wrapping the model. Returns how many owners held graphs.
    Never run on a GPU here (no capture on CPU): tested on CPU with real managers whose
    graph tables are filled by hand."""
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    managers = [getattr(runner, "cudagraph_manager", None)]
    speculator = getattr(runner, "speculator", None)
    if speculator is not None:
        managers += [v for v in vars(speculator).values() if isinstance(v, CudaGraphManager)]
    held = 0
    for manager in managers:
        if manager is not None:
            held += bool(manager.graphs)
            manager.release_graphs()
    model_state = getattr(runner, "model_state", None)
    if model_state is not None and model_state.supports_mm_inputs:
        encoder = model_state.encoder_runner
        graphs = getattr(encoder.cudagraph_manager, "budget_graphs", None) or {}
        held += any(bool(g) for g in graphs.values())
        encoder.clear()
    return held


@vllm_uses("catalog_mrv2", mirrors=(_TEARDOWN,))
@contextlib.contextmanager
def _teardown_through(runner: Any, module: Any) -> Iterator[None]:
    """Point ``module._teardown_profiling_state`` at the runner's pipeline teardown."""
    stock = module._teardown_profiling_state

    def teardown(r: Any) -> None:
        if r is runner:
            runner.initpipe_teardown_profiling_state()
        else:
            stock(r)

    module._teardown_profiling_state = teardown
    try:
        yield
    finally:
        module._teardown_profiling_state = stock


@vllm_uses(
    "catalog_mrv2",
    # which MRv2 runner the stock workers build
    mirrors=(
        "vllm.v1.worker.cpu_worker:CPUWorker.init_device",
        "vllm.v1.worker.gpu_worker:Worker._make_model_runner",
    ),
    calls=(
        "vllm.platforms:current_platform",
        "vllm.platforms.interface:Platform.is_cpu",
        "vllm.v1.worker.cpu.model_runner:CPUModelRunner",
        _RUNNER,
    ),
)
def platform_runner_v2_class() -> type:
    """The MRv2 runner class the current platform's stock worker builds.

    CPU: ``vllm.v1.worker.cpu.model_runner.CPUModelRunner``; CUDA/ROCm/XPU:
    ``vllm.v1.worker.gpu.model_runner.GPUModelRunner``.
    """
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        import vllm.v1.worker.cpu_worker  # noqa: F401  (CPU torch shims)
        from vllm.v1.worker.cpu.model_runner import CPUModelRunner

        return CPUModelRunner
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    return GPUModelRunner


# -- the adapter as data, and the runner class ---------------------------------------------
#: The stable names of the pipelined MRv2 classes -> the MRv2 class each is built over
#: (MRv2's own classes share their names with v1's, ``GPUModelRunner`` /
#: ``CPUModelRunner``, so the names say V2).
_CLASSES = {
    "PipelinedCPUModelRunnerV2": "vllm.v1.worker.cpu.model_runner:CPUModelRunner",
    "PipelinedGPUModelRunnerV2": _RUNNER,
    "PipelinedXPUModelRunnerV2": "vllm.v1.worker.xpu_model_runner:XPUModelRunnerV2",
}
#: vLLM's MRv2 class name -> the stable pipelined name.
V2_CLASS_NAMES = {v.rpartition(":")[2]: k for k, v in _CLASSES.items()}


@vllm_uses(
    "catalog_mrv2",
    # what the shared mixin (adapter.PipelineHost) replaces and calls on an MRv2 runner
    mirrors=adapter.host_uses(_RUNNER, "mirrors", _TEARDOWN),
    calls=adapter.host_uses(
        _RUNNER,
        "calls",
        "vllm.v1.worker.xpu_model_runner:XPUModelRunnerV2.__init__",
        *_CLASSES.values(),
    ),
)
def _v2_adapter() -> adapter.RunnerAdapter:
    """Model Runner V2's adapter on vLLM 0.32.0; its declaration is what the shared mixin
    replaces and calls on an MRv2 runner."""
    return adapter.RunnerAdapter(
        runner="v2",
        capability="catalog_mrv2",
        labels=adapter.Labels("Model Runner V2", "the MRv2 catalog", "Model Runner V2"),
        stock_runner=_RUNNER,
        catalog="initpipe_vllm.mrv2:catalog",
        classes=MappingProxyType(_CLASSES),
        class_suffix="V2",
        start_inputs=start_inputs_v2,
        kv_inputs=kv_inputs_v2,
        apply_kv=apply_kv_outputs_v2,
        clear_kv=clear_kv_state_v2,
        engine_kv_cache_config=engine_kv_cache_config_v2,
        release_cuda_graphs=release_cuda_graphs_v2,
        teardown=(
            "initpipe_teardown_profiling_state()",
            "what vLLM's CUDA-graph profiling does",
        ),
        # stock's shutdown clears the forward context and deletes the model state, which
        # the teardowns read: the run closes first
        close_first=True,
    )


V2_ADAPTER = _v2_adapter()


class PipelinedRunnerV2Mixin(adapter.PipelineHost):
    """Put before vLLM's MRv2 runner class: its initialization runs as initpipe pipelines.

    Attributes:
        initpipe_pipeline: the MRv2 Pipeline used (the catalog unless one is given).
        initpipe_run: the current Run (model phase from ``load_model``, then KV phases).
        initpipe_trace: the Trace of every stage, teardown and vLLM span around them.
    """

    initpipe_adapter = V2_ADAPTER
    #: whether the speculator registered with EPLB, once this runner loaded its weights
    _initpipe_weights: bool | None = None

    @staticmethod
    def initpipe_platform_class() -> type:
        return platform_runner_v2_class()

    # model phase ------------------------------------------------------------------------
    @vllm_uses("catalog_mrv2", mirrors=(f"{_RUNNER}.load_model",), calls=(f"{_RUNNER}.model",))
    def load_model(
        self,
        load_dummy_weights: bool = False,
        *args: Any,
        model: Any = None,
        **kwargs: Any,
    ) -> None:
        """Load and measure the weights as stock does, then run the model phase.

        After a model phase that failed, a second call is its retry: the weights this
        runner already loaded are kept (loading them again would register every layer in
        the forward context twice, which vLLM refuses) and only the model phase runs again.
        """
        with self._initpipe_lock:
            if self._initpipe_require("load_model()") in ("model", "released"):
                self._initpipe_restart()  # a reload: the weights too
                self._initpipe_weights = None
            if self._initpipe_weights is None:
                self._initpipe_weights = self._initpipe_load_weights(load_dummy_weights, model)
            run = self.initpipe_run
            outputs = self._initpipe_phase(
                run.load,
                model=self.model,  # type: ignore[attr-defined]
                eplb_models_added=self._initpipe_weights,
                load_dummy_weights=load_dummy_weights,
            )
            log_phase(run, "model", self._initpipe_rank())
            apply_model_outputs_v2(self, outputs)

    @vllm_uses(
        "catalog_mrv2",
        mirrors=(f"{_RUNNER}.load_model",),
        calls=(
            "vllm.logger:init_logger",
            "vllm.model_executor.model_loader:get_model_loader",
            "vllm.utils.mem_utils:DeviceMemoryProfiler",
            "vllm.utils.mem_utils:format_gib",
            "vllm.v1.worker.gpu.spec_decode.speculator:DraftModelSpeculator",
            "vllm.v1.worker.workspace:use_workspace_lane",
            "vllm.v1.worker.gpu.eplb_utils:EPLBController.prepare_load",
            "vllm.v1.worker.gpu.eplb_utils:EPLBController.maybe_register_speculator",
            f"{_LORA}.load_lora_model",
            f"{_RUNNER}.load_config",
            f"{_RUNNER}.eplb",
            f"{_RUNNER}.jit_warmup_registry",
            f"{_RUNNER}.model",
            f"{_RUNNER}.lora_config",
            f"{_RUNNER}.use_aux_hidden_state_outputs",
            f"{_RUNNER}.speculative_config",
            f"{_RUNNER}.speculator",
            f"{_RUNNER}._draft_workspace_lane",
            f"{_RUNNER}.model_memory_usage",
        ),
    )
    def _initpipe_load_weights(self, load_dummy_weights: bool, model: Any) -> bool:
        """The first half of stock's ``load_model``, line for line: load (or take) the
        model, LoRA, aux hidden states, the draft model; measure; log. Returns whether the
        speculator registered with EPLB."""
        import time

        from vllm.logger import init_logger
        from vllm.model_executor.model_loader import get_model_loader
        from vllm.utils.mem_utils import DeviceMemoryProfiler, format_gib
        from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator
        from vllm.v1.worker.workspace import use_workspace_lane

        s: Any = self
        logger = init_logger(_MRV2_LOGGER)
        time_before_load = time.perf_counter()
        if model is None and load_dummy_weights:
            s.load_config.load_format = "dummy"
        s.eplb.prepare_load()
        eplb_models_added = False
        with DeviceMemoryProfiler() as m:
            model_loader = get_model_loader(s.vllm_config.load_config)
            logger.info_once("Loading model from scratch...")
            with s.jit_warmup_registry.activate():
                s.model = model or model_loader.load_model(
                    vllm_config=s.vllm_config, model_config=s.vllm_config.model_config
                )
            if s.lora_config:
                s.model = s.load_lora_model(s.model, s.vllm_config, s.device)
            if s.use_aux_hidden_state_outputs:
                self._initpipe_aux_hidden_states()
            if isinstance(s.speculator, DraftModelSpeculator):
                with use_workspace_lane(s._draft_workspace_lane):
                    s.speculator.load_model(s.model)
                    eplb_models_added = s.eplb.maybe_register_speculator(
                        s.speculator, s.speculative_config, load_dummy_weights
                    )
        time_after_load = time.perf_counter()
        s.model_memory_usage = m.consumed_memory
        logger.info(
            "Model loading took %s GiB memory and %.6f seconds",
            format_gib(m.consumed_memory),
            time_after_load - time_before_load,
        )
        return bool(eplb_models_added)

    @vllm_uses(
        "catalog_mrv2",
        mirrors=(f"{_RUNNER}.load_model",),
        calls=(
            f"{_EAGLE3}:set_eagle3_aux_hidden_state_layers",
            f"{_EAGLE3}:verify_supports_aux_hidden_states_over_pp",
            "vllm.v1.worker.gpu.pp_utils:PPHandler.configure_aux_hidden_state_relay",
            f"{_RUNNER}.model",
            f"{_RUNNER}.speculative_config",
            f"{_RUNNER}.use_pp",
            f"{_RUNNER}.pp_handler",
        ),
    )
    def _initpipe_aux_hidden_states(self) -> None:
        """Stock ``load_model``'s set-up of the target's auxiliary hidden states (EAGLE-3
        style drafting), line for line: the layers, and over PP the check and the relay."""
        from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
            set_eagle3_aux_hidden_state_layers,
            verify_supports_aux_hidden_states_over_pp,
        )

        s: Any = self
        set_eagle3_aux_hidden_state_layers(s.model, s.speculative_config)
        if s.use_pp:
            verify_supports_aux_hidden_states_over_pp(s.model, s.speculative_config.method)
            s.pp_handler.configure_aux_hidden_state_relay(s.model)

    @vllm_uses(
        "catalog_mrv2",
        mirrors=(f"{_RUNNER}.get_kv_cache_spec",),
        calls=(f"{_RUNNER}.model", f"{_RUNNER}.vllm_config", f"{_RUNNER}.speculator"),
    )
    def get_kv_cache_spec(self) -> dict[str, Any]:
        """The KV cache spec per layer: the spec pipeline, over the final block size."""
        from ..mrv2 import spec_pipeline

        with self._initpipe_lock:
            self._initpipe_require("get_kv_cache_spec()")
            with spec_pipeline(release=self.initpipe_adapter.release).start(
                trace=self.initpipe_trace,
                vllm_config=self.vllm_config,  # type: ignore[attr-defined]
                speculator=self.speculator,  # type: ignore[attr-defined]
                runner_settings=RunnerV2Settings.from_runner(self),
            ) as run:
                spec = dict(self._initpipe_phase(run.load)["kv_cache_spec"])
            # its stage's span now, under the span of the step that asked for it
            phase_spans(self.initpipe_trace, "model", self._initpipe_rank())
            return spec

    @vllm_uses(
        "catalog_mrv2",
        mirrors=(_TEARDOWN,),
        calls=(
            f"{_RUNNER}.model_state",
            f"{_MODEL_STATE}.supports_mm_inputs",
            f"{_MODEL_STATE}.encoder_runner",
            f"{_ENCODER_RUNNER}.clear",
            f"{_RUNNER}.lora_config",
            f"{_LORA}.maybe_remove_all_loras",
        ),
    )
    def initpipe_teardown_profiling_state(self) -> None:
        """What vLLM's ``_teardown_profiling_state`` does, through the pipeline: the KV
        phase's teardowns in reverse, then the runner lets go of its KV attributes, the
        encoder's profiling graphs and dummy LoRAs go, and the allocator is flushed."""
        self._initpipe_flush(self._initpipe_teardown_profiling_state)

    def _initpipe_teardown_profiling_state(self) -> None:
        self._initpipe_release_kv()
        s: Any = self
        if s.model_state.supports_mm_inputs:
            s.model_state.encoder_runner.clear()
        s.maybe_remove_all_loras(s.lora_config)

    # the KV lifecycle a live resize drives (PipelineHost) --------------------------------
    @vllm_uses(
        "catalog_mrv2",
        calls=(f"{_RUNNER}.req_states", "vllm.v1.worker.gpu.states:RequestState.req_id_to_index"),
    )
    def initpipe_requests(self) -> list[str]:
        """The requests in ``req_states`` (MRv2's per-request state, sized by
        ``max_num_reqs`` and shared with the sampler, the speculator and the logits
        processors: never rebuilt, it outlives every KV phase)."""
        return sorted(self.req_states.req_id_to_index)  # type: ignore[attr-defined]

    @vllm_uses(
        "catalog_mrv2",
        # stock's method delegates to the module function, which calls the patched global
        mirrors=(
            f"{_RUNNER}.profile_cudagraph_memory",
            f"{_CG}:profile_cudagraph_memory",
            _TEARDOWN,
        ),
    )
    def profile_cudagraph_memory(self) -> int:
        """vLLM's CUDA-graph memory profiling, its teardown going through the pipeline.

        Never run here (``CPUWorker`` overrides the memory profiling; no GPU): vLLM's
        ``profile_cudagraph_memory`` calls the module function
        ``_teardown_profiling_state``, which is pointed at
        :meth:`initpipe_teardown_profiling_state` for the duration of the call.
        """
        from vllm.v1.worker.gpu import cudagraph_utils

        with _teardown_through(self, cudagraph_utils):
            return int(super().profile_cudagraph_memory())  # type: ignore[misc]


# -- vLLM 0.33.0 -------------------------------------------------------------------------
#: The runner attribute each 0.33.0 start input is read from, where the names differ.
_START_ATTR_0_33_0 = {"pcp_manager_at_init": "pcp_manager"}
#: The MRv2 catalog's start inputs on 0.33.0 (``releases.v0_33_0.INPUTS``) read as runner
#: attributes, as ``(input, attribute)``.
_START_0_33_0 = tuple(
    (name, _START_ATTR_0_33_0.get(name, name))
    for name in releases.inputs("0.33.0", MRV2_CATALOG.name)["start"]
    if name != "runner_settings"
)


@vllm_uses(
    "catalog_mrv2",
    calls=adapter.owned(_RUNNER, tuple(attr for _, attr in _START_0_33_0)),
    release=("0.33.0", "0.34.0"),
    replaces=("initpipe_vllm.hook.runner_v2:start_inputs_v2",),
)
def start_inputs_v2_0_33_0(runner: Any) -> dict[str, Any]:
    """The MRv2 catalog's start inputs on 0.33.0: 0.32.0's and the PCP manager the
    runner's ``__init__`` built there (``pcp_manager_at_init``)."""
    inputs = {name: getattr(runner, attr) for name, attr in _START_0_33_0}
    return inputs | {"runner_settings": RunnerV2Settings.from_runner(runner)}


#: Model Runner V2's adapter on vLLM 0.33.0: 0.32.0's tables but the start inputs (the
#: KV phase writes ``pcp_manager`` back unchanged: the runner's own object), building the
#: 0.33.0 catalog (:mod:`initpipe_vllm.releases.v0_33_0`).
V2_ADAPTER_0_33_0 = attrs.evolve(V2_ADAPTER, release="0.33.0", start_inputs=start_inputs_v2_0_33_0)


class PipelinedRunnerV2Mixin_0_33_0(PipelinedRunnerV2Mixin):
    """The MRv2 mixin on vLLM 0.33.0 (registered under ``("v2", "0.33.0")``): 0.33's
    ``load_model`` sets the auxiliary hidden states up in one call."""

    initpipe_adapter = V2_ADAPTER_0_33_0

    @vllm_uses(
        "catalog_mrv2",
        mirrors=(f"{_RUNNER}.load_model",),
        calls=(
            f"{_EAGLE3}:set_eagle3_aux_hidden_state_layers",
            "vllm.v1.worker.gpu.pp_utils:PPHandler.configure_aux_hidden_state_relay",
            f"{_RUNNER}.model",
            f"{_RUNNER}.speculative_config",
            f"{_RUNNER}.use_pp",
            f"{_RUNNER}.pp_handler",
        ),
        release=("0.33.0", "0.34.0"),
        replaces=(
            "initpipe_vllm.hook.runner_v2:PipelinedRunnerV2Mixin._initpipe_aux_hidden_states",
        ),
    )
    def _initpipe_aux_hidden_states(self) -> None:
        """0.33's: ``set_eagle3_aux_hidden_state_layers`` checks PP support itself
        (``use_pp``); the relay is configured wherever the runner has a PP handler."""
        from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
            set_eagle3_aux_hidden_state_layers,
        )

        s: Any = self
        set_eagle3_aux_hidden_state_layers(s.model, s.speculative_config, s.use_pp)
        if s.pp_handler is not None:
            s.pp_handler.configure_aux_hidden_state_relay(s.model)


# -- vLLM 0.34.0 -------------------------------------------------------------------------
#: 0.34.0 renamed ``XPUModelRunnerV2`` ``XPUModelRunner`` (v1's XPU runner is gone).
_XPU_0_34_0 = "vllm.v1.worker.xpu_model_runner:XPUModelRunner"
_CLASSES_0_34_0 = {**_CLASSES, "PipelinedXPUModelRunnerV2": _XPU_0_34_0}


@vllm_uses(
    "catalog_mrv2",
    calls=(f"{_RUNNER}.max_model_len", f"{_RUNNER}.aux_output_connector"),
    release="0.34.0",
    replaces=("initpipe_vllm.hook.runner_v2:kv_inputs_v2",),
)
def kv_inputs_v2_0_34_0(runner: Any, *engine: Any) -> dict[str, Any]:
    """0.32's KV-phase inputs and the runner's current aux-output connector (0.34 creates
    it once and re-initializes it per KV phase; None where there is none yet)."""
    return kv_inputs_v2(runner, *engine) | {
        "runner_aux_output_connector": getattr(runner, "aux_output_connector", None)
    }


#: 0.34's ``initialize_kv_cache`` also assigns the extensible KV cache (None: the pipelined
#: worker declines it, :mod:`.worker`), the ReplaySSM block-copy tensors, and, on a real
#: KV phase only, ``kv_caches_by_layer``.
_KV_WRITES_0_34_0 = (
    *_KV_WRITES,
    adapter.Write("extensible_kv_cache", None),
    adapter.Write("replayssm_block_copy_tensors", "replayssm_block_copy_tensors"),
    adapter.Write("kv_caches_by_layer", "runner_kv_caches_by_layer", "if_built"),
)


@vllm_uses(
    "catalog_mrv2",
    mirrors=(f"{_RUNNER}.initialize_kv_cache", f"{_RUNNER}._init_kv_zero_meta"),
    calls=adapter.attr_names(_RUNNER, _KV_WRITES_0_34_0),
    release="0.34.0",
    replaces=("initpipe_vllm.hook.runner_v2:apply_kv_outputs_v2",),
)
def apply_kv_outputs_v2_0_34_0(runner: Any, kv: Mapping[str, Any]) -> None:
    """0.34's ``initialize_kv_cache`` writes onto the runner (:data:`_KV_WRITES_0_34_0`)."""
    adapter.write_outputs(runner, _KV_WRITES_0_34_0, kv)


@vllm_uses(
    "catalog_mrv2",
    mirrors=(_TEARDOWN,),
    calls=tuple(n for n in _CLEARED if n != f"{_RUNNER}.aux_output_connector"),
    release="0.34.0",
    replaces=("initpipe_vllm.hook.runner_v2:clear_kv_state_v2",),
)
def clear_kv_state_v2_0_34_0(runner: Any) -> None:
    """0.32's, but the aux-output connector stays: 0.34's ``_teardown_profiling_state``
    keeps it (created once, its constructor binds a capturer into the model; the next KV
    phase re-initializes it). Its stage's teardown closed its store."""
    aux = getattr(runner, "aux_output_connector", None)
    clear_kv_state_v2(runner)
    runner.aux_output_connector = aux


_SWITCH_POOL = (
    "vllm.distributed.elastic_ep.elastic_execute:"
    "ElasticEPScalingExecutor._switch_to_fresh_graph_pool"
)


@vllm_uses(
    "catalog_mrv2",
    mirrors=(_ELASTIC_RELEASE, _SWITCH_POOL, _TEARDOWN),
    calls=(
        f"{_CG}:CudaGraphManager",
        f"{_CG}:CudaGraphManager.pool",
        "vllm.platforms:current_platform",
        "vllm.platforms.interface:Platform._global_graph_pool",
        "vllm.compilation.cuda_graph:CUDAGraphWrapper",
        "vllm.compilation.cuda_graph:CUDAGraphWrapper._all_instances",
        "vllm.compilation.breakable_cudagraph:BreakableCUDAGraphWrapper",
        "vllm.compilation.breakable_cudagraph:BreakableCUDAGraphWrapper._all_instances",
    ),
    release="0.34.0",
    replaces=("initpipe_vllm.hook.runner_v2:release_cuda_graphs_v2",),
)
def release_cuda_graphs_v2_0_34_0(runner: Any) -> int:
    """0.32's release, then, as 0.34's elastic EP does after releasing graphs, a fresh
    CUDA-graph pool: libraries may keep capture-time tensors alive, so capturing again into
    the old pool trips the allocator (``_switch_to_fresh_graph_pool``). Where no global pool
    exists (CPU, eager) nothing more happens. Never run on a GPU here: tested on CPU with
    real managers and a stand-in pool."""
    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.platforms import current_platform
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    held = release_cuda_graphs_v2(runner)
    platform_cls = type(current_platform)
    if platform_cls._global_graph_pool is None:
        return held
    new_pool = current_platform.graph_pool_handle()
    platform_cls._global_graph_pool = new_pool
    speculator = getattr(runner, "speculator", None)
    managers = [getattr(runner, "cudagraph_manager", None)]
    if speculator is not None:
        managers += [v for v in vars(speculator).values() if isinstance(v, CudaGraphManager)]
    for manager in managers:
        if manager is not None and manager.pool is not None:
            manager.pool = new_pool
    for wrapper in [*CUDAGraphWrapper._all_instances, *BreakableCUDAGraphWrapper._all_instances]:
        wrapper.graph_pool = new_pool
    return held


@vllm_uses(
    "catalog_mrv2",
    mirrors=adapter.host_uses(_RUNNER, "mirrors", _TEARDOWN),
    calls=adapter.host_uses(_RUNNER, "calls", f"{_XPU_0_34_0}.__init__", *_CLASSES_0_34_0.values()),
    release="0.34.0",
    replaces=("initpipe_vllm.hook.runner_v2:_v2_adapter",),
)
def _v2_adapter_0_34_0() -> adapter.RunnerAdapter:
    """Model Runner V2's adapter on vLLM 0.34.0: 0.33's, with 0.34's KV inputs, writes and
    teardown, and the XPU runner under its new name."""
    return attrs.evolve(
        V2_ADAPTER_0_33_0,
        release="0.34.0",
        classes=MappingProxyType(_CLASSES_0_34_0),
        kv_inputs=kv_inputs_v2_0_34_0,
        apply_kv=apply_kv_outputs_v2_0_34_0,
        clear_kv=clear_kv_state_v2_0_34_0,
        release_cuda_graphs=release_cuda_graphs_v2_0_34_0,
    )


V2_ADAPTER_0_34_0 = _v2_adapter_0_34_0()


class PipelinedRunnerV2Mixin_0_34_0(PipelinedRunnerV2Mixin_0_33_0):
    """The MRv2 mixin on vLLM 0.34.0 (registered under ``("v2", "0.34.0")``): 0.33's, and
    ``initialize_kv_cache`` takes 0.34's ``extensible`` flag, refusing an extensible
    (VMM-backed) KV cache, which initpipe does not mirror; the pipelined worker declines
    it before vLLM would ask (:mod:`.worker`)."""

    initpipe_adapter = V2_ADAPTER_0_34_0

    def initialize_kv_cache(
        self,
        kv_cache_config: Any,
        is_profiling: bool = False,
        kv_cache_allocation_context: Any = None,
        extensible: bool = False,
    ) -> None:
        if extensible:
            raise UnsupportedRunnerError(
                "initialize_kv_cache(extensible=True): initpipe's pipelined runner does not "
                "mirror vLLM's extensible (VMM-backed) KV cache. Its worker declines it, so "
                "vLLM turns it off at start-up; a caller asking for it directly should pass "
                "extensible=False, or run vLLM's stock worker with the extensible cache."
            )
        super().initialize_kv_cache(kv_cache_config, is_profiling, kv_cache_allocation_context)


def pipelined_runner_v2_class(base: type | None = None) -> type:
    """``Pipelined<Base>V2``: the MRv2 mixin of the installed vLLM's release
    (:func:`~.adapter.installed_adapter`) over ``base`` (default: the platform's)."""
    return adapter.pipelined_class(adapter.installed_adapter("v2"), base)


def resolve_v2_class(name: str) -> type | None:
    """The pipelined MRv2 class called ``name``, built on demand (None if not one)."""
    return adapter.resolve_class(name) if name in _CLASSES else None
