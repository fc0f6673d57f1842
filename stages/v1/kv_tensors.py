"""KV-phase stages that allocate, alias, bind and register the KV cache tensors.

What belongs here: the tensor half of the KV phase — everything after the builders exist.
Replaces ``GPUModelRunner.initialize_kv_cache_tensors`` (K8a allocate, K8b alias, K8c bind)
and the tail of ``GPUModelRunner.initialize_kv_cache`` (K9 extract-hidden-states check,
K10 KV connector registration) in ``vllm/v1/worker/gpu_model_runner.py``, and the KV block
zeroer the worker builds right after it (``Worker.initialize_from_config`` ->
``GPUModelRunner._init_kv_zero_meta``, ``vllm/v1/worker/gpu_worker.py``). The math is
vLLM's ``allocate_kv_cache``, ``map_kv_caches_to_kernel_blocks`` and ``bind_kv_cache``
(``vllm/v1/worker/utils.py``).

Teardowns run in reverse: unbind the layers, drop the aliases, then drop the views and
empty the allocator's cache, so KV memory is back at baseline after a KV teardown.

The device always comes from the ``device`` input and the layout from the
``kv_cache_layout`` KV input (the engine resolves it between the phases). torch and vllm
are imported inside the stage bodies only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from initpipe import KV, stage

from ..errors import KVCacheConfigError
from ..vllm_names import V1_RUNNER as _RUNNER
from .kv_phase import _jit

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.worker.utils import AttentionGroup


__all__ = [
    "allocated_kv_caches",
    "disarm_zeroer",
    "extract_hidden_states_check",
    "kv_block_zeroer",
    "kv_caches",
    "kv_connector_registration",
    "runner_kv_caches",
]


def resolve_layout(kv_cache_layout: Any, vllm_config: VllmConfig) -> Any:
    """A ``KVCacheLayout`` from the KV input (enum or name), else the config's resolved one."""
    from vllm.v1.kv_cache_layout import KVCacheLayout

    if kv_cache_layout is None:
        return vllm_config.cache_config.get_resolved_kv_cache_layout()
    if isinstance(kv_cache_layout, KVCacheLayout):
        return kv_cache_layout
    try:
        return KVCacheLayout[str(kv_cache_layout)]
    except KeyError:
        msg = (
            f"kv_cache_layout={kv_cache_layout!r} is not a KVCacheLayout; valid: "
            f"{[m.name for m in KVCacheLayout]}."
        )
        raise KVCacheConfigError(msg, field="kv_cache_layout") from None


def _release_allocation(allocated_kv_caches: dict[str, Any]) -> None:
    """Drop the views; once layers and runner let go too, return the memory to the pool.

    No ``gc.collect()`` here: the views are freed by reference counting, and the runner's
    cleanup collects once, as vLLM's does (a second full collection doubled the cost).
    """
    import torch

    allocated_kv_caches.clear()
    torch.accelerator.empty_cache()


@stage(
    needs=KV,
    teardown=_release_allocation,
    after=("reinitialize_input_batch",),
    meta={
        "mirrors": (
            f"{_RUNNER}.initialize_kv_cache_tensors",
            f"{_RUNNER}._cleanup_profiling_kv_cache",
        ),
        "calls": (
            "vllm.v1.kv_cache_layout:KVCacheLayout",
            "vllm.v1.worker.utils:allocate_kv_cache",
        ),
    },
)
def allocated_kv_caches(
    vllm_config: VllmConfig,
    device: Any,
    runner_kv_cache_config: KVCacheConfig,
    kernel_block_sizes: list[int],
    kv_cache_layout: Any,
    kv_cache_allocation_context: Any,
    jit_warmup_registry: Any,
) -> dict[str, Any]:
    """One zeroed int8 buffer on ``device``, viewed per layer in the resolved layout.

    vLLM's ``allocate_kv_cache``, inside ``kv_cache_allocation_context`` when given (the
    connector's or CuMem's memory pool). The views address manager blocks. Runs after
    the builders and the input batch (stock's K6 -> K7 -> K8), so on a GPU their buffers
    are allocated before the KV cache that takes the profiled budget.
    """
    from vllm.v1.worker.utils import allocate_kv_cache

    layout = resolve_layout(kv_cache_layout, vllm_config)
    alloc_ctx = kv_cache_allocation_context or contextlib.nullcontext()
    with _jit(jit_warmup_registry), alloc_ctx:
        return allocate_kv_cache(runner_kv_cache_config, device, layout, kernel_block_sizes)


def _release_aliases(kv_caches: dict[str, Any]) -> None:
    kv_caches.clear()


@stage(
    needs=KV,
    teardown=_release_aliases,
    meta={
        "mirrors": (
            f"{_RUNNER}.initialize_kv_cache_tensors",
            f"{_RUNNER}._cleanup_profiling_kv_cache",
        )
    },
)
def kv_caches(
    allocated_kv_caches: Mapping[str, Any], shared_kv_cache_layers: Mapping[str, str]
) -> dict[str, Any]:
    """The per-layer KV views with each KV-sharing layer aliased to its target's view."""
    out = dict(allocated_kv_caches)
    for name, target in shared_kv_cache_layers.items():
        if target not in out:
            raise KVCacheConfigError(
                f"layer {name!r} shares the KV cache of {target!r}, which got no KV cache tensor.",
                field="kv_cache_tensors",
                layer=target,
            )
        out[name] = out[target]
    return out


def _unbind_layers(runner_kv_caches: list[Any], vllm_config: VllmConfig) -> None:
    """Reset every layer's ``kv_cache`` as ``_cleanup_profiling_kv_cache`` does."""
    from vllm.v1.worker.utils import clear_layer_kv_caches

    clear_layer_kv_caches(vllm_config.compilation_config.static_forward_context.values())
    runner_kv_caches.clear()


@stage(
    needs=KV,
    teardown=_unbind_layers,
    effects=("layer.kv_cache", "attn_group.kernel_block_stride"),
    meta={
        "mirrors": (
            f"{_RUNNER}.initialize_kv_cache_tensors",
            f"{_RUNNER}._cleanup_profiling_kv_cache",
        ),
        "calls": (
            "vllm.v1.worker.utils:bind_kv_cache",
            "vllm.v1.worker.utils:clear_layer_kv_caches",
            "vllm.v1.worker.utils:map_kv_caches_to_kernel_blocks",
        ),
    },
)
def runner_kv_caches(
    vllm_config: VllmConfig,
    kv_caches: Mapping[str, Any],
    runner_kv_cache_config: KVCacheConfig,
    attn_groups: list[list[AttentionGroup]],
    drafter_attn_groups: list[Any],
    jit_warmup_registry: Any,
) -> list[Any]:
    """Bind the views to the layers; return the runner's list in layer-index order.

    vLLM's ``bind_kv_cache``: layers get kernel-block views
    (``map_kv_caches_to_kernel_blocks``), the runner list keeps the manager-block views.
    """
    from vllm.v1.worker.utils import bind_kv_cache, map_kv_caches_to_kernel_blocks

    hf_config = vllm_config.model_config.hf_config
    num_attn_module = 2 if getattr(hf_config, "model_type", None) == "longcat_flash" else 1
    groups = [g for gs in attn_groups for g in gs] + list(drafter_attn_groups)
    runner_list: list[Any] = []
    with _jit(jit_warmup_registry):
        bind_kv_cache(
            dict(kv_caches),
            vllm_config.compilation_config.static_forward_context,
            runner_list,
            num_attn_module,
            kv_cache_groups=runner_kv_cache_config.kv_cache_groups,
            layer_kv_caches=map_kv_caches_to_kernel_blocks(dict(kv_caches), groups),
        )
    return runner_list


@stage(
    needs=KV,
    after=("runner_kv_caches",),
    meta={"mirrors": (f"{_RUNNER}.initialize_kv_cache",)},
)
def extract_hidden_states_check(
    vllm_config: VllmConfig, drafter: Any, runner_kv_cache_config: KVCacheConfig
) -> bool:
    """With an extract-hidden-states drafter, check its layers share one KV cache group."""
    spec = vllm_config.speculative_config
    if spec and spec.uses_extract_hidden_states():
        drafter.validate_same_kv_cache_group(runner_kv_cache_config)
        return True
    return False


@stage(
    needs=KV,
    effects=("kv_transfer_group registered caches",),
    after=("extract_hidden_states_check",),
    meta={
        "mirrors": (f"{_RUNNER}.initialize_kv_cache",),
        "calls": (
            "vllm.distributed.kv_transfer.kv_connector.utils:copy_kv_blocks",
            "vllm.distributed.kv_transfer:get_kv_transfer_group",
            "vllm.distributed.kv_transfer:has_kv_transfer_group",
        ),
    },
)
def kv_connector_registration(
    kv_caches: Mapping[str, Any], is_profiling: bool, runner_kv_caches: list[Any]
) -> bool:
    """Register the KV caches with the KV connector, if any (skipped while profiling).

    No teardown: vLLM's connectors have no unregister call; a later KV phase registers
    the new caches again. ``runner_kv_caches`` orders this after binding.
    """
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group
    from vllm.distributed.kv_transfer.kv_connector.utils import copy_kv_blocks

    if is_profiling or not has_kv_transfer_group():
        return False
    group = get_kv_transfer_group()
    group.register_kv_caches(dict(kv_caches))
    group.set_host_xfer_buffer_ops(copy_kv_blocks)
    return True


def disarm_zeroer(kv_block_zeroer: Any) -> None:
    """Drop the zeroer's address table: anyone still holding it gets a no-op
    (``zero_block_ids`` returns when ``_meta`` is None), never a write into freed memory.

    The run drops the output and the runner its ``_kv_block_zeroer`` (stock's cleanup
    leaves a zeroer over the freed cache). The teardown of MRv2's zeroer too.
    """
    if kv_block_zeroer is not None:
        kv_block_zeroer._meta = None


@stage(
    needs=KV,
    teardown=disarm_zeroer,
    after=("kv_connector_registration",),
    meta={
        "mirrors": (
            f"{_RUNNER}._init_kv_zero_meta",
            "vllm.v1.worker.gpu_worker:Worker.initialize_from_config",
            f"{_RUNNER}._cleanup_profiling_kv_cache",
        ),
        "calls": ("vllm.v1.worker.utils:KVBlockZeroer",),
    },
)
def kv_block_zeroer(
    vllm_config: VllmConfig,
    device: Any,
    kv_cache_config: KVCacheConfig,
    is_profiling: bool,
    runner_kv_cache_config: KVCacheConfig,
    attn_groups: list[list[AttentionGroup]],
    kernel_block_sizes: list[int],
    runner_only_attn_layers: frozenset[str],
    runner_kv_caches: list[Any],
) -> Any:
    """vLLM's ``KVBlockZeroer`` over the KV tensors this phase bound; None when not needed.

    Built exactly as ``Worker.initialize_from_config`` builds it (``_init_kv_zero_meta``):
    only when the engine's ``kv_cache_config.needs_kv_cache_zeroing`` (Mamba layers or
    mixed KV precisions) and not in a profiling pass (the worker builds it only after the
    real ``initialize_kv_cache``). It runs after the allocation stage has left
    ``kv_cache_allocation_context``, as the worker does, so its address table is ordinary
    allocator memory that sleep/wake never discards. It stores absolute byte addresses of
    the bound layer views (``runner_kv_caches`` orders it after binding), so it belongs to
    this KV phase: a re-run builds a new one over the new tensors.
    """
    if is_profiling or not kv_cache_config.needs_kv_cache_zeroing:
        return None
    from vllm.v1.worker.utils import KVBlockZeroer

    groups = [g for gs in attn_groups for g in gs] if runner_kv_cache_config.kv_cache_groups else []
    return KVBlockZeroer(
        device,
        attn_groups_iter=groups,
        kernel_block_sizes=kernel_block_sizes,
        runner_only_attn_layers=set(runner_only_attn_layers),
        static_forward_context=vllm_config.compilation_config.static_forward_context,
        num_blocks=runner_kv_cache_config.num_blocks,
    )
