"""KV-phase stages of Model Runner V2 from the speculator's attention to the zeroer.

What belongs here: the tensor half of MRv2's ``GPUModelRunner.initialize_kv_cache``
(``vllm/v1/worker/gpu/model_runner.py``) — the draft model's attention and its CUDA-graph
manager ("HACK(woosuk)"; "after set_attn, so the speculator can size its cudagraph mode"),
``init_kv_cache`` (allocation, KV-sharing aliases, binding: "Capture warmup providers that
depend on allocated KV-cache strides"), the runner's ``kv_caches`` list, the model state's
KV hook, the runner-held KV connector and the aux-output connector — and the KV block
zeroer ``Worker.initialize_from_config`` builds right after (``_init_kv_zero_meta``).

Teardowns run in reverse and undo what MRv2's ``_teardown_profiling_state``
(``vllm/v1/worker/gpu/cudagraph_utils.py``) undoes: the model state's Mamba KV state, the
layers' ``kv_cache`` bindings (forward context and model modules), the KV views; the
runner's own references are dropped by the adapter. Each stage declares what it replaces
(``meta["mirrors"]``: ``initialize_kv_cache``, ``_init_kv_zero_meta``, and for a teardown
``_teardown_profiling_state``) and the vLLM names it calls (``meta["calls"]``), shown by
``initpipe graph``. torch and vllm are imported inside stage bodies only.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from initpipe import KV, stage

from ..catalogs import runner_step
from ..v1.kv_tensors import disarm_zeroer
from ..vllm_names import (
    DRAFT_SPECULATOR as _DRAFT,
    MRV2_RUNNER as _RUNNER,
    MRV2_TEARDOWN as _TEARDOWN,
)
from .steps import INIT_KV as _INIT_KV, kv_step as _kv_step

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

#: vLLM names only this module declares (MRv2's runner, whose ``initialize_kv_cache`` /
#: ``_init_kv_zero_meta`` the stages replace, and ``_TEARDOWN``, whose pieces the teardowns
#: reproduce, come from :mod:`initpipe_vllm.vllm_names`).
_MAMBA_STATE = "vllm.v1.worker.gpu.model_states.mamba_hybrid:MambaHybridModelState"
_ZEROER = "vllm.v1.worker.utils:KVBlockZeroer"
_FORWARD_CONTEXT = "vllm.config.compilation:CompilationConfig.static_forward_context"

__all__ = [
    "aux_output_connector",
    "kv_block_zeroer",
    "kv_caches_by_layer",
    "kv_connector",
    "model_state_kv",
    "runner_kv_caches",
    "speculator_attn",
    "speculator_cudagraph_manager",
]


def _draft_speculator(speculator: Any) -> bool:
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    return isinstance(speculator, DraftModelSpeculator)


@_kv_step(
    _DRAFT,
    f"{_DRAFT}.set_attn",
    after=("attention_cp_compatible",),
    effects=("speculator attention groups, block tables and buffers (set_attn)",),
)
def speculator_attn(
    speculator: Any,
    model_state: Any,
    runner_kv_cache_config: KVCacheConfig,
    block_tables: Any,
    input_buffers: Any,
    attn_groups: list[list[Any]],
) -> bool:
    """A draft-model speculator builds its own attention over this KV cache (``set_attn``).

    False (nothing done) without a draft model. Never run here (no speculator on the CPU
    test models): written from vLLM's code.
    """
    if not _draft_speculator(speculator):
        return False
    speculator.set_attn(
        model_state, runner_kv_cache_config, block_tables, input_buffers, attn_groups
    )
    return True


@_kv_step(
    "vllm.v1.worker.gpu.spec_decode.speculator:BaseSpeculator.init_cudagraph_manager",
    after=("speculator_attn",),
    effects=("speculator CUDA-graph managers",),
)
def speculator_cudagraph_manager(speculator: Any, cudagraph_mode: Any) -> bool:
    """The speculator sizes its CUDA-graph managers to the resolved mode (after ``set_attn``).

    False without a speculator. Never run here: written from vLLM's code.
    """
    if speculator is None:
        return False
    speculator.init_cudagraph_manager(cudagraph_mode)
    return True


def _unbind_layers(kv_caches_by_layer: dict[str, Any], vllm_config: VllmConfig, model: Any) -> None:
    """Detach every layer's KV view (forward context and the model's modules) and drop the
    views, then return the memory to the allocator, as ``_teardown_profiling_state`` does.
    """
    from vllm.v1.hisparse.binding import release_hisparse_profiling_cache

    unbind_layers(kv_caches_by_layer, vllm_config, model, release_hisparse_profiling_cache)


def unbind_layers(
    kv_caches_by_layer: dict[str, Any],
    vllm_config: VllmConfig,
    model: Any,
    unbind_hisparse: Callable[[Any], Any],
) -> None:
    """The body of :func:`kv_caches_by_layer`'s teardown, over the release's HiSparse
    unbinding (``release_hisparse_profiling_cache`` through 0.33,
    ``unbind_hisparse_caches`` from 0.34), which takes the forward context."""
    import torch
    from vllm.v1.worker.utils import clear_layer_kv_caches

    forward_context = vllm_config.compilation_config.static_forward_context
    layers: Any = forward_context.values()
    if model is not None:
        layers = itertools.chain(layers, model.modules())
    clear_layer_kv_caches(layers)
    unbind_hisparse(forward_context)
    kv_caches_by_layer.clear()
    torch.accelerator.empty_cache()


@runner_step(
    KV,
    (
        _INIT_KV,
        _TEARDOWN,
    ),
    "vllm.v1.worker.gpu.attn_utils:init_kv_cache",
    "vllm.model_executor.warmup.jit_warmup:JitWarmupRegistry.activate",
    f"{_DRAFT}.attn_groups",
    _FORWARD_CONTEXT,
    "vllm.v1.worker.utils:clear_layer_kv_caches",
    "vllm.v1.hisparse.binding:release_hisparse_profiling_cache",
    after=("speculator_cudagraph_manager",),
    teardown=_unbind_layers,
    effects=("layer.kv_cache", "attn_group kernel block views"),
)
def kv_caches_by_layer(
    vllm_config: VllmConfig,
    device: Any,
    runner_kv_cache_config: KVCacheConfig,
    kernel_block_sizes: list[int],
    block_tables: Any,
    attn_groups: list[list[Any]],
    speculator: Any,
    kv_cache_allocation_context: Any,
    jit_warmup_registry: Any,
    model: Any,
) -> dict[str, Any]:
    """vLLM's ``init_kv_cache``: allocate, alias KV-sharing layers, bind views to layers.

    Inside ``kv_cache_allocation_context`` when given, and inside the JIT warm-up capture.
    The speculator's attention groups map their views too (they build their own metadata).
    Runs after the speculator's CUDA-graph manager, as stock: warm-up providers captured
    here depend on the allocated strides. ``model`` is read by the teardown only (it
    detaches the views from the model's modules too, as stock's teardown does).
    """
    from vllm.v1.worker.gpu.attn_utils import init_kv_cache

    groups = list(attn_groups) + list(getattr(speculator, "attn_groups", []))
    with jit_warmup_registry.activate():
        return init_kv_cache(
            vllm_config.compilation_config.static_forward_context,
            runner_kv_cache_config,
            device,
            kernel_block_sizes,
            vllm_config,
            kv_cache_allocation_context=kv_cache_allocation_context,
            block_tables=block_tables,
            attn_groups=(g for gs in groups for g in gs),
        )


def _drop_list(runner_kv_caches: list[Any]) -> None:
    runner_kv_caches.clear()


@runner_step(
    KV,
    (
        _INIT_KV,
        _TEARDOWN,
    ),
    teardown=_drop_list,
)
def runner_kv_caches(kv_caches_by_layer: Mapping[str, Any], device: Any) -> list[Any]:
    """The runner's ``kv_caches``: every view on this device, in layer order (aliases kept,
    as stock keeps them)."""
    return [cache for cache in kv_caches_by_layer.values() if cache.device == device]


def _clear_model_state_kv(model_state_kv: bool, model_state: Any) -> None:
    """What ``_teardown_profiling_state`` resets on the model state: the Mamba context and
    the Mamba group metadata derived from the KV config (re-derived by the next phase)."""
    if hasattr(model_state, "_mamba_ctx"):
        model_state._mamba_ctx = None
    if hasattr(model_state, "_mamba_group_ids"):
        model_state._mamba_group_ids = []
    if hasattr(model_state, "_mamba_spec"):
        model_state._mamba_spec = None


@runner_step(
    KV,
    (
        _INIT_KV,
        _TEARDOWN,
    ),
    "vllm.v1.worker.gpu.model_states.interface:ModelState.initialize_kv_cache",
    f"{_MAMBA_STATE}._mamba_ctx",
    f"{_MAMBA_STATE}._mamba_group_ids",
    f"{_MAMBA_STATE}._mamba_spec",
    after=("runner_kv_caches",),
    teardown=_clear_model_state_kv,
    effects=("model_state KV state (Mamba context, group ids)",),
)
def model_state_kv(
    model_state: Any,
    runner_kv_cache_config: KVCacheConfig,
    block_tables: Any,
    kv_caches_by_layer: Mapping[str, Any],
) -> bool:
    """The model state's hook over the bound KV cache (``model_state.initialize_kv_cache``).

    ``kv_caches_by_layer`` orders it after binding. Returns True.
    """
    model_state.initialize_kv_cache(runner_kv_cache_config, block_tables)
    return True


@_kv_step(
    "vllm.v1.worker.gpu.kv_connector:NO_OP_KV_CONNECTOR",
    "vllm.v1.worker.gpu.kv_connector:get_kv_connector",
    after=("model_state_kv",),
)
def kv_connector(
    vllm_config: VllmConfig, kv_caches_by_layer: Mapping[str, Any], is_profiling: bool
) -> Any:
    """The runner-held KV connector over these caches (vLLM's no-op one while profiling or
    without a KV transfer group)."""
    from vllm.v1.worker.gpu.kv_connector import NO_OP_KV_CONNECTOR, get_kv_connector

    if is_profiling:
        return NO_OP_KV_CONNECTOR
    return get_kv_connector(vllm_config, dict(kv_caches_by_layer))


def _close_aux(aux_output_connector: Any) -> None:
    if aux_output_connector is not None:
        aux_output_connector.close()


@_kv_step(
    "vllm.distributed.aux_output_connector.worker:get_aux_output_connector",
    "vllm.distributed.aux_output_connector.worker:AuxOutputWorkerConnector.close",
    after=("kv_connector",),
    teardown=_close_aux,
)
def aux_output_connector(
    vllm_config: VllmConfig,
    model: Any,
    runner_kv_cache_config: KVCacheConfig,
    is_profiling: bool,
) -> Any:
    """The aux-output (R3 capture) connector, when enabled and not profiling (else None).

    Its teardown closes it: a KV phase torn down leaves no connector reading its cache.
    """
    if is_profiling or not vllm_config.aux_output_config.enabled:
        return None
    from vllm.distributed.aux_output_connector.worker import get_aux_output_connector

    return get_aux_output_connector(model, vllm_config, runner_kv_cache_config)


@stage(
    needs=KV,
    after=("aux_output_connector",),
    teardown=disarm_zeroer,
    meta={
        "mirrors": (
            f"{_RUNNER}._init_kv_zero_meta",
            "vllm.v1.worker.gpu_worker:Worker.initialize_from_config",
            # the teardown relies on it returning at once when _meta is None
            f"{_ZEROER}.zero_block_ids",
        ),
        "calls": (
            _ZEROER,
            f"{_ZEROER}._meta",
            "vllm.v1.kv_cache_interface:KVCacheConfig.needs_kv_cache_zeroing",
            _FORWARD_CONTEXT,
        ),
    },
)
def kv_block_zeroer(
    vllm_config: VllmConfig,
    device: Any,
    kv_cache_config: KVCacheConfig,
    is_profiling: bool,
    attn_groups: list[list[Any]],
    kernel_block_sizes: list[int],
    runner_kv_cache_config: KVCacheConfig,
    runner_kv_caches: list[Any],
) -> Any:
    """vLLM's ``KVBlockZeroer`` over this phase's bound tensors, as MRv2's
    ``_init_kv_zero_meta`` builds it; None when the engine's config needs no zeroing or
    while profiling (the worker builds it only after the real KV phase).

    Built outside ``kv_cache_allocation_context`` (that stage has left it), so its address
    table is ordinary allocator memory. ``runner_kv_caches`` orders it after binding.
    """
    if is_profiling or not kv_cache_config.needs_kv_cache_zeroing:
        return None
    from vllm.v1.worker.utils import KVBlockZeroer

    return KVBlockZeroer(
        device,
        attn_groups_iter=(g for gs in attn_groups for g in gs),
        kernel_block_sizes=kernel_block_sizes,
        static_forward_context=vllm_config.compilation_config.static_forward_context,
        num_blocks=runner_kv_cache_config.num_blocks,
    )
