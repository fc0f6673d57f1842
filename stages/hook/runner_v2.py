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
import functools
import gc
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from initpipe import KV, PhaseOrderError, Pipeline, Run, StageError

from ..contract.declare import vllm_uses
from ..mrv2.types import BlockTableGeometry, RunnerV2Settings
from ..vllm_names import MODEL_STATE as _MODEL_STATE
from ..vllm_names import MRV2_RUNNER as _RUNNER
from ..vllm_names import MRV2_RUNNER_MODULE as _MRV2_LOGGER
from ..vllm_names import MRV2_TEARDOWN as _TEARDOWN
from .progress import log_phase, phase_spans
from .runner import TRACE_MAX_RECORDS, PipelineHost, start_run

__all__ = [
    "DELIBERATE_TEARDOWN_DIFFERENCES",
    "PipelinedRunnerV2Mixin",
    "apply_kv_outputs_v2",
    "apply_model_outputs_v2",
    "clear_kv_state_v2",
    "engine_kv_cache_config_v2",
    "kv_inputs_v2",
    "pipelined_runner_v2_class",
    "platform_runner_v2_class",
    "release_cuda_graphs_v2",
    "start_inputs_v2",
]


# vLLM names for the declarations (``module:qualname``).
_CG = "vllm.v1.worker.gpu.cudagraph_utils"
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
@vllm_uses(
    "catalog_mrv2",
    calls=(
        f"{_RUNNER}.vllm_config",
        f"{_RUNNER}.device",
        f"{_RUNNER}.encoder_cache",
        f"{_RUNNER}.req_states",
        f"{_RUNNER}.input_buffers",
        f"{_RUNNER}.speculator",
        f"{_RUNNER}.eplb",
        f"{_RUNNER}.jit_warmup_registry",
        f"{_RUNNER}.lora_capture_cases",
        f"{_RUNNER}.pcp_manager_cls",
    ),
)
def start_inputs_v2(runner: Any) -> dict[str, Any]:
    """The MRv2 catalog's start inputs, read from a constructed MRv2 runner."""
    return {
        "vllm_config": runner.vllm_config,
        "device": runner.device,
        "runner_settings": RunnerV2Settings.from_runner(runner),
        "encoder_cache": runner.encoder_cache,
        "req_states": runner.req_states,
        "input_buffers": runner.input_buffers,
        "speculator": runner.speculator,
        "eplb": runner.eplb,
        "jit_warmup_registry": runner.jit_warmup_registry,
        "lora_capture_cases": runner.lora_capture_cases,
        "pcp_manager_cls": runner.pcp_manager_cls,
    }


@vllm_uses("catalog_mrv2", calls=(f"{_RUNNER}.max_model_len",))
def kv_inputs_v2(
    runner: Any,
    kv_cache_config: Any,
    is_profiling: bool = False,
    kv_cache_allocation_context: Any = None,
) -> dict[str, Any]:
    """The MRv2 KV-phase inputs: the engine's config plus what vLLM settled since the start."""
    return {
        "kv_cache_config": kv_cache_config,
        "is_profiling": is_profiling,
        "kv_cache_allocation_context": kv_cache_allocation_context,
        "max_model_len": runner.max_model_len,
    }


# -- the adapter: the one place that writes onto the runner -------------------------------
#: Model-phase output -> the runner attribute stock's ``load_model`` assigns.
_MODEL_ATTRS = (
    "model_state",
    "decode_query_len",
    "batch_sharder",
    "sampler",
    "rejection_sampler",
    "prompt_logprobs_worker",
    "structured_outputs_worker",
    "pooling_runner",
    "intermediate_tensors",
)

#: KV-phase output -> runner attribute, as stock's ``initialize_kv_cache`` and
#: ``_init_kv_zero_meta`` assign them.
_KV_ATTRS = {
    "runner_kv_cache_config": "kv_cache_config",
    "attn_groups": "attn_groups",
    "kernel_block_sizes": "kernel_block_sizes",
    "adaptive_verification": "adaptive_verification",
    "block_tables": "block_tables",
    "pcp_manager": "pcp_manager",
    "ubatch_runner": "ubatch_runner",
    "cudagraph_manager": "cudagraph_manager",
    "runner_kv_caches": "kv_caches",
    "kv_connector": "kv_connector",
}


@vllm_uses(
    "catalog_mrv2",
    mirrors=(f"{_RUNNER}.load_model",),
    calls=tuple(f"{_RUNNER}.{name}" for name in _MODEL_ATTRS),
)
def apply_model_outputs_v2(runner: Any, outputs: Mapping[str, Any]) -> None:
    """Write a completed MRv2 model phase onto the runner where ``load_model`` puts it.

    ``batch_sharder`` and ``intermediate_tensors`` keep the runner's value when the stage
    returned None (stock assigns them only when it builds them).
    """
    for name in _MODEL_ATTRS:
        value = outputs[name]
        if value is None and name in ("batch_sharder", "intermediate_tensors"):
            continue
        setattr(runner, name, value)


@vllm_uses(
    "catalog_mrv2",
    mirrors=(f"{_RUNNER}.initialize_kv_cache", f"{_RUNNER}._init_kv_zero_meta"),
    calls=tuple(
        f"{_RUNNER}.{name}"
        for name in (
            "cp_interleave",
            *_KV_ATTRS.values(),
            "fast_prefill",
            "aux_output_connector",
            "kv_block_zeroer",
        )
    ),
)
def apply_kv_outputs_v2(runner: Any, kv: Mapping[str, Any]) -> None:
    """Write a completed MRv2 KV phase onto the runner exactly where stock's methods put it.

    ``fast_prefill`` and ``aux_output_connector`` are assigned only when built (stock keeps
    the previous value otherwise); the KV block zeroer only when the config needs one.
    """
    geometry: BlockTableGeometry = kv["block_table_geometry"]
    runner.cp_interleave = geometry.cp_interleave
    for out, attr in _KV_ATTRS.items():
        setattr(runner, attr, kv[out])
    if kv["fast_prefill"] is not None:
        runner.fast_prefill = kv["fast_prefill"]
    if kv["aux_output_connector"] is not None:
        runner.aux_output_connector = kv["aux_output_connector"]
    if kv["kv_block_zeroer"] is not None:
        runner.kv_block_zeroer = kv["kv_block_zeroer"]


@vllm_uses(
    "catalog_mrv2",
    mirrors=(_TEARDOWN,),
    calls=(
        f"{_RUNNER}.kv_caches",
        f"{_RUNNER}.attn_groups",
        f"{_RUNNER}.kv_cache_config",
        f"{_RUNNER}.cudagraph_manager",
        f"{_RUNNER}.fast_prefill",
        f"{_RUNNER}.kv_block_zeroer",
        f"{_RUNNER}.aux_output_connector",
        f"{_RUNNER}.cache_config",
        _NUM_GPU_BLOCKS,
    ),
)
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


class PipelinedRunnerV2Mixin(PipelineHost):
    """Put before vLLM's MRv2 runner class: its initialization runs as initpipe pipelines.

    Attributes:
        initpipe_pipeline: the MRv2 Pipeline used (the catalog unless one is given).
        initpipe_run: the current Run (model phase from ``load_model``, then KV phases).
        initpipe_trace: the Trace of every stage, teardown and vLLM span around them.
    """

    initpipe_runner_version = "v2"
    initpipe_default_pipeline: Pipeline | None = None

    @vllm_uses(
        "catalog_mrv2",
        calls=(
            f"{_RUNNER}.__init__",
            "vllm.v1.worker.xpu_model_runner:XPUModelRunnerV2.__init__",
        ),
    )
    def __init__(self, vllm_config: Any, device: Any, *, pipeline: Pipeline | None = None) -> None:
        super().__init__(vllm_config, device)  # type: ignore[call-arg]
        from initpipe import Trace

        if pipeline is None:
            from ..mrv2 import catalog

            pipeline = type(self).initpipe_default_pipeline or catalog()
        self.initpipe_pipeline = pipeline
        self.initpipe_trace = Trace(max_records=TRACE_MAX_RECORDS)
        self._initpipe_lock = threading.RLock()
        # Whether the speculator registered with EPLB, once this runner loaded its weights.
        self._initpipe_weights: bool | None = None
        self.initpipe_run = self._initpipe_start()

    def _initpipe_start(self) -> Run:
        return start_run(self.initpipe_pipeline, self, start_inputs_v2(self))

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
            run = self.initpipe_run
            if run.state == "loaded":
                if run.completed(KV):
                    raise PhaseOrderError(
                        "load_model() called while a KV cache is in place; shut the runner "
                        "down first."
                    )
                run.close()
                self.initpipe_run = run = self._initpipe_start()
                self._initpipe_weights = None
            if self._initpipe_weights is None:
                self._initpipe_weights = self._initpipe_load_weights(load_dummy_weights, model)
            eplb_models_added = self._initpipe_weights
            try:
                outputs = run.load(
                    model=self.model,  # type: ignore[attr-defined]
                    eplb_models_added=eplb_models_added,
                    load_dummy_weights=load_dummy_weights,
                )
            except StageError as err:
                self._initpipe_report(err)
                raise
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
            "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils:set_eagle3_aux_hidden_state_layers",
            "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils:verify_supports_aux_hidden_states_over_pp",
            "vllm.v1.worker.gpu.spec_decode.speculator:DraftModelSpeculator",
            "vllm.v1.worker.workspace:use_workspace_lane",
            "vllm.v1.worker.gpu.eplb_utils:EPLBController.prepare_load",
            "vllm.v1.worker.gpu.eplb_utils:EPLBController.maybe_register_speculator",
            "vllm.v1.worker.gpu.pp_utils:PPHandler.configure_aux_hidden_state_relay",
            f"{_LORA}.load_lora_model",
            f"{_RUNNER}.load_config",
            f"{_RUNNER}.eplb",
            f"{_RUNNER}.jit_warmup_registry",
            f"{_RUNNER}.model",
            f"{_RUNNER}.lora_config",
            f"{_RUNNER}.use_aux_hidden_state_outputs",
            f"{_RUNNER}.speculative_config",
            f"{_RUNNER}.use_pp",
            f"{_RUNNER}.pp_handler",
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
        from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
            set_eagle3_aux_hidden_state_layers,
            verify_supports_aux_hidden_states_over_pp,
        )
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
                set_eagle3_aux_hidden_state_layers(s.model, s.speculative_config)
                if s.use_pp:
                    verify_supports_aux_hidden_states_over_pp(s.model, s.speculative_config.method)
                    s.pp_handler.configure_aux_hidden_state_relay(s.model)
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
        mirrors=(f"{_RUNNER}.get_kv_cache_spec",),
        calls=(f"{_RUNNER}.model", f"{_RUNNER}.vllm_config", f"{_RUNNER}.speculator"),
    )
    def get_kv_cache_spec(self) -> dict[str, Any]:
        """The KV cache spec per layer: the spec pipeline, over the final block size."""
        from ..mrv2 import spec_pipeline

        with self._initpipe_lock:
            if getattr(self, "model", None) is None:
                raise PhaseOrderError(
                    "load_model() must be called before get_kv_cache_spec(): the spec "
                    "reads the loaded model's layers."
                )
            with spec_pipeline().start(
                trace=self.initpipe_trace,
                vllm_config=self.vllm_config,  # type: ignore[attr-defined]
                speculator=self.speculator,  # type: ignore[attr-defined]
                runner_settings=RunnerV2Settings.from_runner(self),
            ) as run:
                try:
                    return dict(run.load()["kv_cache_spec"])
                except StageError as err:
                    self._initpipe_report(err)
                    raise

    # KV phase ---------------------------------------------------------------------------
    @vllm_uses(
        "catalog_mrv2",
        mirrors=(f"{_RUNNER}.initialize_kv_cache",),
        calls=(f"{_RUNNER}.attn_groups", f"{_RUNNER}.kv_caches"),
    )
    def initialize_kv_cache(
        self,
        kv_cache_config: Any,
        is_profiling: bool = False,
        kv_cache_allocation_context: Any = None,
    ) -> None:
        """Run the MRv2 KV phase (refused while one is in place)."""
        with self._initpipe_lock:
            run = self.initpipe_run
            if run.state != "loaded":
                raise PhaseOrderError(
                    "load_model() must be called before initialize_kv_cache(): the KV phase "
                    "reads the model phase's outputs."
                )
            if (
                run.completed(KV)
                or getattr(self, "attn_groups", None)
                or getattr(self, "kv_caches", None)
            ):
                raise PhaseOrderError(
                    "initialize_kv_cache() called while a KV cache is in place (generation "
                    f"{run.kv_generation}). Tear it down first "
                    "(initpipe_teardown_profiling_state(), what vLLM's CUDA-graph profiling "
                    "does), or resize through the engine."
                )
            inputs = kv_inputs_v2(self, kv_cache_config, is_profiling, kv_cache_allocation_context)
            try:
                outputs = run.initialize_kv_cache(**inputs)
            except StageError as err:
                self._initpipe_report(err)
                raise
            apply_kv_outputs_v2(self, outputs)
            log_phase(run, KV, self._initpipe_rank())

    @vllm_uses("catalog_mrv2", mirrors=(f"{_RUNNER}._init_kv_zero_meta",))
    def _init_kv_zero_meta(self) -> None:
        """The worker's call after ``initialize_kv_cache``: the ``kv_block_zeroer`` stage
        built it already (or the config needs none); only a KV phase run with
        ``is_profiling=True`` leaves it to vLLM's own method, over the same live tensors."""
        with self._initpipe_lock:
            if not self.initpipe_run.kv_ready:
                raise PhaseOrderError(
                    "_init_kv_zero_meta() needs a KV cache in place; call "
                    "initialize_kv_cache() first."
                )
            if self.initpipe_run.outputs["kv_block_zeroer"] is None:
                super()._init_kv_zero_meta()  # type: ignore[misc]

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
        import torch

        torch.accelerator.synchronize()
        self._initpipe_release_kv()
        s: Any = self
        if s.model_state.supports_mm_inputs:
            s.model_state.encoder_runner.clear()
        s.maybe_remove_all_loras(s.lora_config)
        gc.collect()
        torch.accelerator.empty_cache()

    def _initpipe_release_kv(self) -> None:
        with self._initpipe_lock:
            # The runner lets go first, so the allocation's teardown can return the memory.
            clear_kv_state_v2(self)
            if self.initpipe_run.state != "closed":
                self.initpipe_run.teardown_kv_cache()
                phase_spans(self.initpipe_run.trace, KV, self._initpipe_rank())

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

    @vllm_uses("catalog_mrv2", calls=(f"{_RUNNER}.kv_caches",))
    def initpipe_kv_in_place(self) -> bool:
        return bool(getattr(self, "kv_caches", None)) or self.initpipe_run.kv_ready

    def initpipe_release_cuda_graphs(self) -> int:
        return release_cuda_graphs_v2(self)

    @vllm_uses("catalog_mrv2", mirrors=(_TEARDOWN,))
    def initpipe_release_kv_cache(self) -> None:
        """The resize's teardown: the KV phase's teardowns in reverse and the runner's KV
        attributes dropped, as ``_teardown_profiling_state`` leaves them — but the LoRAs
        stay (stock's profiling teardown removes its own dummy LoRAs; a live engine's are
        the user's). ``block_tables`` stays the last phase's, valid: ``execute_model``
        applies its staged writes on every step, zero-token ones included (the steps that
        tell the runner which requests finished, while the cache is released too)."""
        import torch

        torch.accelerator.synchronize()
        self._initpipe_release_kv()
        gc.collect()
        torch.accelerator.empty_cache()

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

    @vllm_uses("catalog_mrv2", mirrors=(f"{_RUNNER}.shutdown",))
    def shutdown(self) -> None:
        """Close the run first (stock's shutdown clears the forward context and deletes the
        model state, which the teardowns read), then vLLM's shutdown."""
        try:
            with self._initpipe_lock:
                self.initpipe_run.close()
        finally:
            super().shutdown()  # type: ignore[misc]


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


#: The stable names of the pipelined MRv2 classes (MRv2's own classes share their names
#: with v1's, ``GPUModelRunner`` / ``CPUModelRunner``, so the names say V2).
V2_CLASS_NAMES = {
    "CPUModelRunner": "PipelinedCPUModelRunnerV2",
    "GPUModelRunner": "PipelinedGPUModelRunnerV2",
    "XPUModelRunnerV2": "PipelinedXPUModelRunnerV2",
}


def pipelined_runner_v2_class(base: type | None = None) -> type:
    """``Pipelined<Base>V2``: the MRv2 mixin over ``base`` (default: the platform's)."""
    return _pipelined_v2(base or platform_runner_v2_class())


@functools.cache
def _pipelined_v2(base: type) -> type:
    name = V2_CLASS_NAMES.get(base.__name__, f"Pipelined{base.__name__}V2")
    return type(
        name,
        (PipelinedRunnerV2Mixin, base),
        {"__module__": "initpipe_vllm.runner", "__qualname__": name},
    )


@vllm_uses(
    "catalog_mrv2",
    calls=(
        "vllm.v1.worker.cpu.model_runner:CPUModelRunner",
        _RUNNER,
        "vllm.v1.worker.xpu_model_runner:XPUModelRunnerV2",
    ),
)
def resolve_v2_class(name: str) -> type | None:
    """The pipelined MRv2 class called ``name``, built on demand (None if not one)."""
    if name == "PipelinedCPUModelRunnerV2":
        from vllm.v1.worker.cpu.model_runner import CPUModelRunner

        return _pipelined_v2(CPUModelRunner)
    if name == "PipelinedGPUModelRunnerV2":
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner

        return _pipelined_v2(GPUModelRunner)
    if name == "PipelinedXPUModelRunnerV2":
        from vllm.v1.worker.xpu_model_runner import XPUModelRunnerV2

        return _pipelined_v2(XPUModelRunnerV2)
    return None
