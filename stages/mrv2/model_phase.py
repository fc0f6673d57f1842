"""Model-phase stages of Model Runner V2: what ``load_model`` builds once the weights exist.

What belongs here: every step of ``GPUModelRunner.load_model`` in
``vllm/v1/worker/gpu/model_runner.py`` (MRv2) after the weights are loaded and measured —
the model state, ``decode_query_len``, batch sharder, samplers, prompt-logprobs and
structured-output workers, pooling runner, EPLB registration, PP intermediate tensors, the
offloader's ``post_init`` and stock torch.compile — plus :func:`kv_cache_spec`
(``GPUModelRunner.get_kv_cache_spec``), which is its own one-stage pipeline (see below).

When it runs: inside ``load_model``, at stock's time (unlike the v1 catalog, which defers
its model phase to the first ``get_kv_cache_spec``): MRv2's model states read
``cache_config.block_size`` at load time (``EncoderOnlyModelState``), and reading it later
would differ from stock. The KV cache spec, which must read the *final* block size (the
executor calls ``update_block_size_for_backend`` after ``load_model``), is the catalog's
separate :func:`spec_pipeline`, run on each ``get_kv_cache_spec`` (memoized per block size).

Process-global effects (EPLB's model registration and async loop, the offloader) are
declared; a retry of the phase that would register or start them a second time is refused.

Each stage declares the part of ``load_model`` or ``get_kv_cache_spec`` it replaces and the
vLLM names it calls (``meta``: ``mirrors`` and ``calls``, shown by ``initpipe graph``).
No torch or vllm import at module import time.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from initpipe import MODEL, stage

from ..catalogs import runner_step
from ..errors import ModelPhaseError
from ..vllm_names import MODEL_STATE as _MODEL_STATE, MRV2_RUNNER as _RUNNER, MRV2_RUNNER_MODULE

# every stage here but kv_cache_spec is a step of stock MRv2's load_model (_LOAD)
from .steps import LOAD_MODEL as _LOAD, load_step as _load_step
from .types import RunnerV2Settings

if TYPE_CHECKING:
    from vllm.config import VllmConfig


__all__ = [
    "BUILT_AFTER_WEIGHTS",
    "batch_sharder",
    "custom_logits_processors",
    "decode_query_len",
    "eplb_registration",
    "intermediate_tensors",
    "kv_cache_spec",
    "model_state",
    "offloader_post_init",
    "pooling_runner",
    "prompt_logprobs_worker",
    "samplers",
    "stock_torch_compile",
    "structured_outputs_worker",
]

#: Objects stock MRv2's ``load_model`` builds after the weights and the model state, in its
#: order, each kept as the runner attribute of the same name.
BUILT_AFTER_WEIGHTS = (
    "batch_sharder",
    "sampler",
    "rejection_sampler",
    "prompt_logprobs_worker",
    "structured_outputs_worker",
    "pooling_runner",
    "intermediate_tensors",
)

#: EPLB states and offloaders this process already registered with / post-initialized:
#: vLLM keeps them process-wide, so a second registration would double them.
_EPLB_REGISTERED: weakref.WeakSet[Any] = weakref.WeakSet()
_OFFLOADERS_POST_INITED: weakref.WeakSet[Any] = weakref.WeakSet()


def _samples(runner_settings: RunnerV2Settings) -> bool:
    """The last PP rank of a generating model samples (vLLM builds its samplers there)."""
    return runner_settings.is_last_pp_rank and not runner_settings.is_pooling_model


@_load_step(
    "vllm.v1.worker.gpu.model_states:init_model_state",
)
def model_state(vllm_config: VllmConfig, model: Any, encoder_cache: Any, device: Any) -> Any:
    """vLLM's ``init_model_state``: the per-architecture state object (reads the block size).

    Raises:
        ModelPhaseError: ``model`` is None (load the weights first).
    """
    from vllm.v1.worker.gpu.model_states import init_model_state

    if model is None:
        raise ModelPhaseError("model_state: model is None; load the model first.")
    return init_model_state(vllm_config, model, encoder_cache, device)


@_load_step(
    f"{_MODEL_STATE}.num_new_sampled_tokens_per_step",
)
def decode_query_len(runner_settings: RunnerV2Settings, model_state: Any) -> int:
    """Tokens per request in a decode step: speculative steps plus newly sampled tokens."""
    return runner_settings.num_speculative_steps + model_state.num_new_sampled_tokens_per_step


@_load_step(
    "vllm.logger:init_logger",
    "vllm.v1.worker.gpu.sample.batch_shard:BatchSharder",
)
def batch_sharder(
    vllm_config: VllmConfig,
    model: Any,
    runner_settings: RunnerV2Settings,
    decode_query_len: int,
    device: Any,
) -> Any:
    """The batch-sharded sampling helper, when enabled and the model computes local logits.

    None otherwise (vLLM warns once when the model lacks ``compute_logits_local``).
    """
    return build_batch_sharder(vllm_config, model, runner_settings, decode_query_len, device)


def build_batch_sharder(
    vllm_config: VllmConfig,
    model: Any,
    runner_settings: RunnerV2Settings,
    decode_query_len: int,
    device: Any,
    **release_kwargs: Any,
) -> Any:
    """The body of :func:`batch_sharder`; ``release_kwargs`` go to ``BatchSharder`` (what a
    later release's constructor adds: its variant passes them)."""
    from vllm.logger import init_logger
    from vllm.v1.worker.gpu.sample.batch_shard import BatchSharder

    if not vllm_config.parallel_config.enable_batch_sharded_sampling:
        return None
    logger = init_logger(MRV2_RUNNER_MODULE)
    if not hasattr(model, "compute_logits_local"):
        logger.warning_once(
            "Disabling batch-sharded sampling: %s does not implement compute_logits_local",
            type(model).__name__,
        )
        return None
    logger.info("Batch-sharded sampling enabled.")
    return BatchSharder(
        max_num_reqs=runner_settings.max_num_reqs,
        max_num_logits_per_req=decode_query_len,
        device=device,
        **release_kwargs,
    )


@_load_step(
    "vllm.v1.worker.gpu.sample.logits_processor.loader:build_custom_logits_processors",
    after=("batch_sharder",),
)
def custom_logits_processors(
    vllm_config: VllmConfig, req_states: Any, runner_settings: RunnerV2Settings
) -> Any:
    """The config's custom logits processors over the runner's request states."""
    from vllm.v1.worker.gpu.sample.logits_processor.loader import (
        build_custom_logits_processors,
    )

    config_processors = vllm_config.model_config.logits_processors or ()
    return build_custom_logits_processors(
        vllm_config, req_states, runner_settings.is_pooling_model, config_processors
    )


@_load_step(
    "vllm.platforms:current_platform",
    "vllm.platforms.interface:Platform.is_rocm",
    "vllm.v1.sample.ops.topk_topp_sampler:register_top_k_top_p_warmups",
    "vllm.model_executor.warmup.jit_warmup:JitWarmupRegistry.activate",
    "vllm.v1.watermarking.factory:create_watermarker",
    "vllm.v1.watermarking.spec_decode:create_speculative_target_watermarker",
    "vllm.v1.watermarking.spec_decode:speculative_target_watermark_key",
    "vllm.v1.watermarking.gpu_sampler:GPUWatermarkSampler",
    "vllm.v1.worker.gpu.sample.sampler:Sampler",
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler:RejectionSampler",
    f"{_MODEL_STATE}.custom_sampler",
    "vllm.config.vllm:VllmConfig._check_supports_watermarking",
    provides=("sampler", "rejection_sampler"),
)
def samplers(
    vllm_config: VllmConfig,
    device: Any,
    runner_settings: RunnerV2Settings,
    req_states: Any,
    model_state: Any,
    decode_query_len: int,
    custom_logits_processors: Any,
    jit_warmup_registry: Any,
) -> dict[str, Any]:
    """The sampler (watermarking or plain, or the model state's own) and rejection sampler.

    Only on the last PP rank of a generating model (both None elsewhere). ROCm registers
    the native top-k/top-p warm-ups first, as vLLM does.
    """
    return build_samplers(
        vllm_config,
        device,
        runner_settings,
        req_states,
        model_state,
        decode_query_len,
        custom_logits_processors,
        jit_warmup_registry,
    )


def build_samplers(
    vllm_config: VllmConfig,
    device: Any,
    runner_settings: RunnerV2Settings,
    req_states: Any,
    model_state: Any,
    decode_query_len: int,
    custom_logits_processors: Any,
    jit_warmup_registry: Any,
    check_custom: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """The body of :func:`samplers`; ``check_custom`` runs before a model state's own
    sampler is adopted (a later release's check: its variant passes it)."""
    if not _samples(runner_settings):
        return {"sampler": None, "rejection_sampler": None}
    from vllm.platforms import current_platform
    from vllm.v1.watermarking.factory import create_watermarker
    from vllm.v1.watermarking.gpu_sampler import GPUWatermarkSampler
    from vllm.v1.watermarking.spec_decode import (
        create_speculative_target_watermarker,
        speculative_target_watermark_key,
    )
    from vllm.v1.worker.gpu.sample.sampler import Sampler
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

    if current_platform.is_rocm():
        from vllm.v1.sample.ops.topk_topp_sampler import register_top_k_top_p_warmups

        with jit_warmup_registry.activate():
            register_top_k_top_p_warmups()
    model_config = vllm_config.model_config
    sampler_kwargs: dict[str, Any] = {
        "vllm_config": vllm_config,
        "max_num_reqs": runner_settings.max_num_reqs,
        "vocab_size": runner_settings.vocab_size,
        "device": device,
        "req_states": req_states,
        "logprobs_mode": model_config.logprobs_mode,
        "num_speculative_tokens": decode_query_len,
        "use_fp64_gumbel": model_config.use_fp64_gumbel,
        "enable_trace_replay": model_config.enable_trace_replay,
        "return_sampling_mask": model_config.return_sampling_mask,
        "custom_logits_processors": custom_logits_processors,
    }
    wm_config = vllm_config.watermark_config
    sampler: Any
    if wm_config is None:
        sampler = Sampler(**sampler_kwargs)
    else:
        watermarker = create_watermarker(wm_config)
        if vllm_config.speculative_config is not None:
            watermarker = create_speculative_target_watermarker(watermarker)
        sampler = GPUWatermarkSampler(
            watermarker,
            deduplicate_contexts=wm_config.deduplicate_contexts,
            deduplicate_contexts_max_history=wm_config.deduplicate_contexts_max_history,
            **sampler_kwargs,
        )
    rejection_sampler = None
    custom = model_state.custom_sampler(sampler)
    if custom:
        if check_custom is not None:
            check_custom()
        vllm_config._check_supports_watermarking(custom_sampler=True)
        sampler, rejection_sampler = custom
    elif vllm_config.speculative_config is not None:
        rejection_sampler = RejectionSampler(
            sampler,
            vllm_config.speculative_config,
            device,
            watermark_key=speculative_target_watermark_key(wm_config),
        )
    return {"sampler": sampler, "rejection_sampler": rejection_sampler}


@_load_step(
    "vllm.v1.worker.gpu.sample.prompt_logprob:PromptLogprobsWorker",
    after=("samplers",),
)
def prompt_logprobs_worker(
    vllm_config: VllmConfig, device: Any, runner_settings: RunnerV2Settings
) -> Any:
    """The prompt-logprobs worker (last PP rank of a generating model; else None)."""
    if not _samples(runner_settings):
        return None
    from vllm.v1.worker.gpu.sample.prompt_logprob import PromptLogprobsWorker

    return PromptLogprobsWorker(
        runner_settings.max_num_reqs,
        device,
        logprobs_mode=vllm_config.model_config.logprobs_mode,
    )


@_load_step(
    "vllm.v1.worker.gpu.structured_outputs:StructuredOutputsWorker",
    f"{_MODEL_STATE}.num_new_sampled_tokens_per_step",
    after=("prompt_logprobs_worker",),
)
def structured_outputs_worker(
    device: Any, runner_settings: RunnerV2Settings, model_state: Any, decode_query_len: int
) -> Any:
    """The structured-outputs (grammar mask) worker (last PP rank, generating; else None)."""
    return build_structured_outputs_worker(
        device,
        runner_settings,
        decode_query_len,
        num_bonus_tokens=model_state.num_new_sampled_tokens_per_step,
    )


def build_structured_outputs_worker(
    device: Any, runner_settings: RunnerV2Settings, decode_query_len: int, **release_kwargs: Any
) -> Any:
    """The body of :func:`structured_outputs_worker`; ``release_kwargs`` go to
    ``StructuredOutputsWorker`` (what a release's constructor takes beyond the common ones)."""
    if not _samples(runner_settings):
        return None
    from vllm.v1.worker.gpu.structured_outputs import StructuredOutputsWorker

    return StructuredOutputsWorker(
        max_num_logits=runner_settings.max_num_reqs * decode_query_len,
        vocab_size=runner_settings.vocab_size,
        device=device,
        mask_stride=decode_query_len,
        **release_kwargs,
    )


@_load_step(
    "vllm.v1.worker.gpu.pool.pooling_runner:PoolingRunner",
    after=("structured_outputs_worker",),
)
def pooling_runner(vllm_config: VllmConfig, model: Any, runner_settings: RunnerV2Settings) -> Any:
    """The pooling runner of a pooling model on the last PP rank (else None)."""
    if not (runner_settings.is_pooling_model and runner_settings.is_last_pp_rank):
        return None
    from vllm.v1.worker.gpu.pool.pooling_runner import PoolingRunner

    return PoolingRunner(model, vllm_config)


@_load_step(
    "vllm.v1.worker.gpu.eplb_utils:EPLBController.state",
    "vllm.v1.worker.gpu.eplb_utils:EPLBController.maybe_register_model",
    "vllm.v1.worker.gpu.eplb_utils:EPLBController.maybe_start_async_loop",
    after=("pooling_runner",),
    effects=("EPLB state: MoE model registered", "EPLB async rebalancing loop started"),
)
def eplb_registration(
    vllm_config: VllmConfig,
    model: Any,
    eplb: Any,
    eplb_models_added: bool,
    load_dummy_weights: bool,
) -> bool:
    """Register the MoE model with EPLB and start its async loop (where enabled).

    Returns whether any model (the speculator's, during weight loading, included) is
    registered. vLLM's EPLB state is shared with the rebalancing loop and has no
    unregister call, so no teardown; registering the same state twice would count the
    experts twice, so a second run over the same state is refused.

    Raises:
        ModelPhaseError: this EPLB state was registered by an earlier run of the stage
            (reload the weights, which creates a new state, or restart the worker).
    """
    state = eplb.state
    if state is not None and state in _EPLB_REGISTERED:
        msg = (
            "eplb_registration: this worker's EPLB state already holds the model from an "
            "earlier model phase; registering it again would double its experts. Reload the "
            "weights (load_model) or restart the worker."
        )
        raise ModelPhaseError(msg)
    added = bool(eplb.maybe_register_model(model, vllm_config.model_config))
    if state is not None and added:
        _EPLB_REGISTERED.add(state)
    added = bool(eplb_models_added) or added
    eplb.maybe_start_async_loop(added, load_dummy_weights)
    return added


@_load_step(
    "vllm.model_executor.models.interfaces:SupportsPP.make_empty_intermediate_tensors",
    after=("eplb_registration",),
)
def intermediate_tensors(
    vllm_config: VllmConfig, model: Any, runner_settings: RunnerV2Settings, device: Any
) -> Any:
    """The persistent PP receive buffers of a non-first PP rank (None on the first).

    Sized for ``max_num_tokens`` so captured graphs see fixed addresses.
    """
    if runner_settings.is_first_pp_rank:
        return None
    return model.make_empty_intermediate_tensors(
        batch_size=runner_settings.max_num_tokens,
        dtype=vllm_config.model_config.dtype,
        device=device,
    )


@runner_step(
    MODEL,
    (
        _LOAD,
        # relied on to do nothing (the stage skips it then)
        "vllm.model_executor.offloader.base:BaseOffloader.post_init",
    ),
    "vllm.model_executor.offloader.base:get_offloader",
    "vllm.model_executor.offloader.base:BaseOffloader",
    after=("intermediate_tensors",),
    effects=("the process-wide offloader: post_init",),
)
def offloader_post_init() -> str:
    """``get_offloader().post_init()`` (a process global set by the runner's ``__init__``).

    Returns the offloader's class name. An offloader whose ``post_init`` does work (it
    overrides vLLM's no-op ``BaseOffloader.post_init``: finalizes parameter storage, starts
    prefetching) is refused a second call in this process — a retry of the phase would do
    that work twice; the no-op offloader runs again freely.

    Raises:
        ModelPhaseError: a working offloader was post-initialized already.
    """
    from vllm.model_executor.offloader.base import BaseOffloader, get_offloader

    offloader = get_offloader()
    works = type(offloader).post_init is not BaseOffloader.post_init
    if works and offloader in _OFFLOADERS_POST_INITED:
        msg = (
            f"offloader_post_init: the process's {type(offloader).__name__} was "
            "post-initialized by an earlier model phase; doing it again would repeat its "
            "work. Restart the worker."
        )
        raise ModelPhaseError(msg)
    offloader.post_init()
    if works:
        _OFFLOADERS_POST_INITED.add(offloader)
    return type(offloader).__name__


@_load_step(
    "vllm.config.compilation:CompilationMode",
    "vllm.compilation.wrapper:compile_model_with_stock_torch",
    after=("offloader_post_init",),
    effects=("model compiled in place",),
)
def stock_torch_compile(vllm_config: VllmConfig, model: Any) -> bool:
    """``compile_model_with_stock_torch`` in ``STOCK_TORCH_COMPILE`` mode; else nothing."""
    from vllm.config.compilation import CompilationMode

    if vllm_config.compilation_config.mode != CompilationMode.STOCK_TORCH_COMPILE:
        return False
    from vllm.compilation.wrapper import compile_model_with_stock_torch

    compile_model_with_stock_torch(model, vllm_config)
    return True


# -- the KV cache spec: its own one-stage pipeline (see the module docstring) ------------
@stage(
    needs=MODEL,
    meta={
        "mirrors": (f"{_RUNNER}.get_kv_cache_spec",),
        "calls": (
            "vllm.v1.worker.gpu.attn_utils:get_kv_cache_spec",
            "vllm.v1.worker.gpu.spec_decode.speculator:DraftModelSpeculator",
            "vllm.v1.worker.gpu.spec_decode.speculator:DraftModelSpeculator.dcp_size",
            "vllm.v1.worker.gpu.spec_decode.speculator:DraftModelSpeculator.draft_attn_layer_names",
        ),
    },
)
def kv_cache_spec(
    vllm_config: VllmConfig, speculator: Any, runner_settings: RunnerV2Settings
) -> Any:
    """vLLM's ``attn_utils.get_kv_cache_spec`` plus MRv2's DCP draft rule.

    Reads the current (final) ``cache_config.block_size``. A draft model running at DCP=1
    under a DCP target keeps a replicated cache (``dcp_sharded=False``).
    """
    from dataclasses import replace

    from vllm.v1.worker.gpu.attn_utils import get_kv_cache_spec
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    spec = get_kv_cache_spec(vllm_config)
    if (
        isinstance(speculator, DraftModelSpeculator)
        and speculator.dcp_size == 1
        and runner_settings.dcp_size > 1
    ):
        for name in speculator.draft_attn_layer_names & spec.keys():
            spec[name] = replace(spec[name], dcp_sharded=False)
    return spec
