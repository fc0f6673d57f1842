"""Engine-side planning stages: what vLLM's engine core decides between the runner's phases.

What belongs here: the steps the *engine* (not the runner) runs between ``load_model`` and
``initialize_kv_cache``, rebuilt as initpipe stages so :mod:`.plan` can replay them around
the catalog's own model and KV phases on the meta device. Nothing here allocates.

For planning only, they stand in for: the executor's
``current_platform.update_block_size_for_backend`` after ``load_model``
(:func:`planned_block_size`, ordered before the catalog's ``kv_cache_spec``); the layout
resolution in ``EngineCore._initialize_kv_caches`` (:func:`kv_cache_layout`); and
``get_kv_cache_configs`` with ``num_gpu_blocks_override`` or an explicit KV byte budget
instead of memory profiling, plus the ``max_model_len`` the engine hands back to workers
(:func:`engine_kv_cache_config`). The exact vLLM names are declared on each stage
(``meta``: ``mirrors`` and ``calls``).

torch and vllm are imported inside the stage bodies only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from initpipe import stage

from ..compat import plan_kv_cache_configs
from ..errors import KVCacheConfigError

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.backend import AttentionBackend
    from vllm.v1.kv_cache_interface import KVCacheSpec

__all__ = [
    "MRV2_PLAN_STAGES",
    "PLAN_STAGES",
    "BlockSizeChoice",
    "engine_kv_cache_config",
    "forward_context_layers",
    "kv_cache_layout",
    "planned_block_size",
]


@attrs.frozen(kw_only=True)
class BlockSizeChoice:
    """The block size the platform rules chose, and what they started from.

    Attributes:
        block_size: the final ``cache_config.block_size``.
        previous: the value before the stage ran (restored by its teardown).
        rules: the platform class whose ``update_block_size_for_backend`` ran.
        backends: names of the distinct non-SSM backends the rules looked at.
    """

    block_size: int
    previous: int
    rules: str
    backends: tuple[str, ...]


def _restore_block_size(choice: BlockSizeChoice, vllm_config: VllmConfig) -> None:
    vllm_config.cache_config.block_size = choice.previous


@stage(
    needs="model",
    before=("kv_cache_spec",),
    teardown=_restore_block_size,
    effects=("cache_config.block_size",),
    meta={
        "mirrors": (
            "vllm.platforms.interface:Platform.update_block_size_for_backend",
            "vllm.v1.executor.uniproc_executor:UniProcExecutor._init_executor",
        ),
        "calls": (
            "vllm.config.cache:CacheConfig",
            "vllm.platforms:current_platform",
        ),
    },
)
def planned_block_size(
    vllm_config: VllmConfig, target_platform: Any, attention_layers: Mapping[str, Any]
) -> BlockSizeChoice:
    """Fix ``cache_config.block_size`` with the target platform's rules, before the specs.

    ``target_platform`` is a vLLM ``Platform`` class. When it is not the running platform
    (planning CUDA backends on the CPU platform), the CPU platform's
    ``check_and_update_config`` default of 128 is undone first: CUDA keeps
    ``CacheConfig.DEFAULT_BLOCK_SIZE`` unless ``--block-size`` was given, and then its
    inherited ``Platform.update_block_size_for_backend`` asks each backend's
    ``get_preferred_block_size`` / ``get_supported_kernel_block_sizes``.
    """
    from vllm.config.cache import CacheConfig
    from vllm.platforms import current_platform

    cache_config = vllm_config.cache_config
    previous = cache_config.block_size
    if target_platform is not type(current_platform) and not cache_config.user_specified_block_size:
        cache_config.block_size = CacheConfig.DEFAULT_BLOCK_SIZE
    try:
        target_platform.update_block_size_for_backend(vllm_config)
    except Exception:
        cache_config.block_size = previous
        raise
    backends = dict.fromkeys(
        layer.get_attn_backend().get_name() for layer in attention_layers.values()
    )
    return BlockSizeChoice(
        block_size=cache_config.block_size,
        previous=previous,
        rules=target_platform.__name__,
        backends=tuple(backends),
    )


def _forget_layout(layout: Any, vllm_config: VllmConfig) -> None:
    vllm_config.cache_config.kv_cache_layout = None


@stage(
    needs="model",
    teardown=_forget_layout,
    effects=("cache_config.kv_cache_layout",),
    meta={
        "mirrors": ("vllm.v1.engine.core:EngineCore._initialize_kv_caches",),
        "calls": (
            "vllm.v1.attention.backends.utils:get_supported_kv_cache_layouts",
            "vllm.v1.attention.backends.utils:resolve_kv_cache_layout",
        ),
    },
)
def kv_cache_layout(
    vllm_config: VllmConfig,
    attn_backends: Mapping[str, type[AttentionBackend]],
    kv_cache_spec: Mapping[str, KVCacheSpec],
) -> Any:
    """The engine's one ``KVCacheLayout`` for the model (vLLM's ``resolve_kv_cache_layout``).

    The layouts every backend supports (``supported_kv_cache_layouts``, or vLLM's default
    preference for backends that accept any), narrowed by the specs' HNC shapes, then
    ``VLLM_KV_CACHE_LAYOUT``, the connector's preference, else the first candidate.
    Records the name on ``cache_config`` as the engine does (declared effect).
    """
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )

    # One worker: the distinct backends of its layers, as WorkerBase reports them.
    backends = list({b.full_cls_name(): b for b in attn_backends.values()}.values())
    supported = [layout.name for layout in get_supported_kv_cache_layouts(backends)]
    return resolve_kv_cache_layout(vllm_config, [supported], list(kv_cache_spec.values()))


@stage(
    needs="kv_cache_config",
    provides=("kv_cache_config", "max_model_len"),
    effects=("model_config.max_model_len (only when auto-fit, max_model_len=-1)",),
    meta={
        "mirrors": ("vllm.v1.engine.core:EngineCore._initialize_kv_caches",),
        "calls": ("vllm.v1.core.single_type_kv_cache_manager:register_all_kvcache_specs",),
    },
)
def engine_kv_cache_config(
    vllm_config: VllmConfig,
    kv_cache_spec: Mapping[str, KVCacheSpec],
    kv_cache_layout: Any,
    num_blocks: int | None,
    kv_bytes: int | None,
) -> dict[str, Any]:
    """The engine's ``KVCacheConfig`` for ``num_blocks`` blocks or a ``kv_bytes`` budget.

    vLLM's ``get_kv_cache_configs`` for one worker, with ``num_gpu_blocks_override`` set
    for the call when ``num_blocks`` is given (``kv_bytes`` then plays no part), else with
    ``kv_bytes`` as the worker's available memory. The layout name is copied into the
    config as ``EngineCore._initialize_kv_caches`` does. ``max_model_len`` is the value
    after vLLM's checks (auto-fit may shrink a ``-1``), the one the runner then uses.

    Raises:
        KVCacheConfigError: neither or both of ``num_blocks`` / ``kv_bytes``, or a
            non-positive value.
        ValueError: from vLLM, e.g. the budget cannot hold one ``max_model_len`` request.
    """
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs

    if (num_blocks is None) == (kv_bytes is None):
        raise KVCacheConfigError(
            "give exactly one of num_blocks and kv_bytes "
            f"(got num_blocks={num_blocks}, kv_bytes={kv_bytes}).",
            field="num_blocks",
        )
    value = num_blocks if num_blocks is not None else kv_bytes
    if value is None or value < 1:
        field = "num_blocks" if num_blocks is not None else "kv_bytes"
        raise KVCacheConfigError(f"{field}={value} must be a positive integer.", field=field)
    register_all_kvcache_specs(vllm_config)
    (cfg,) = plan_kv_cache_configs(
        vllm_config,
        [dict(kv_cache_spec)],
        [kv_bytes if kv_bytes is not None else 0],
        num_blocks=num_blocks,
    )
    cfg.kv_cache_layout = getattr(kv_cache_layout, "name", kv_cache_layout)
    return {"kv_cache_config": cfg, "max_model_len": vllm_config.model_config.max_model_len}


@stage(
    needs="model",
    provides=("attention_layers", "attn_backends", "shared_kv_cache_layers"),
    meta={
        "mirrors": ("vllm.v1.worker.worker_base:WorkerBase.get_supported_kv_cache_layouts",),
        "calls": (
            "vllm.config:get_layers_from_vllm_config",
            "vllm.model_executor.layers.attention_layer_base:AttentionLayerBase",
            "vllm.model_executor.layers.attention:Attention",
        ),
    },
)
def forward_context_layers(vllm_config: VllmConfig, model: Any) -> dict[str, Any]:
    """The model's attention-like layers, each one's backend, and the KV-sharing pairs,
    read from the forward context the model's construction filled.

    What the engine asks every worker for its layouts (``get_current_attn_backends``: one
    backend per layer, ``layer.get_attn_backend()``), as the planning pipeline of Model
    Runner V2 needs it: that runner's catalog has no stage of its own for these (the v1
    catalog's ``attention_layers``, ``attn_backends`` and ``shared_kv_cache_layers`` are
    its stages and stay out of an MRv2 plan). ``model`` only orders this after the load.
    """
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    del model
    base: Any = AttentionLayerBase  # vLLM's own call passes the abstract base too
    layers = dict(get_layers_from_vllm_config(vllm_config, base))
    shared = {
        name: target
        for name, layer in layers.items()
        if isinstance(layer, Attention) and (target := layer.kv_sharing_target_layer_name)
    }
    return {
        "attention_layers": layers,
        "attn_backends": {name: layer.get_attn_backend() for name, layer in layers.items()},
        "shared_kv_cache_layers": shared,
    }


#: The engine-side planning stages, around either runner's catalog.
PLAN_STAGES = (planned_block_size, kv_cache_layout, engine_kv_cache_config)
#: What an MRv2 plan adds: the layers and backends the v1 catalog's model phase provides.
MRV2_PLAN_STAGES = (forward_context_layers,)
