"""Model-phase stages: facts about the loaded model's attention layers.

What belongs here: every step of vLLM 0.32.0's runner initialization that depends only on
the loaded model (``compilation_config.static_forward_context`` is filled) and on the final
``cache_config.block_size`` — never on a ``KVCacheConfig``. Each stage is a plain function
of named inputs; it returns its result instead of writing it onto the runner.

What each stage replaces of vLLM (``GPUModelRunner.get_kv_cache_spec`` and its hidden side
effect, the model-only halves of the encoder-only and KV-sharing additions, the backend
lookup in ``initialize_attn_backend``) and what it calls is declared on it (``meta``:
``mirrors`` and ``calls``; ``initpipe graph`` shows it, ``initpipe doctor`` checks it).

When the phase runs (the block-size trap): vLLM fixes ``cache_config.block_size`` only
*after* ``load_model`` returns — the executor calls
``current_platform.update_block_size_for_backend`` — and ``layer.get_kv_cache_spec`` reads
it. So the pipelined runner runs this phase when the engine first calls
``get_kv_cache_spec()`` (memoized), not inside ``load_model``. The encoder-only spec also
reads the block size, at KV time, so it is built in the KV phase
(``kv_phase.encoder_only_kv_cache_group``).

No torch or vllm import happens at module import time: they are imported inside the
stage bodies so the graph can be drawn without them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from initpipe import MODEL, stage

from ..errors import ModelPhaseError
from ..vllm_names import V1_RUNNER as _RUNNER

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.v1.attention.backend import AttentionBackend
    from vllm.v1.kv_cache_interface import KVCacheSpec

#: What :func:`_kv_cache_disabled` calls (declared by the stages that use it).
_EC_TRANSFER = (
    "vllm.distributed.ec_transfer:get_ec_transfer",
    "vllm.distributed.ec_transfer:has_ec_transfer",
)

__all__ = [
    "attention_cp_compatible",
    "attention_layers",
    "attn_backends",
    "encoder_only_layers",
    "kv_cache_spec",
    "kv_sharing_fast_prefill_eligible_layers",
    "runner_only_attn_layers",
    "shared_kv_cache_layers",
]


def _kv_cache_disabled() -> bool:
    """True when this worker is an EC-transfer producer only (vLLM then reports no KV)."""
    from vllm.distributed.ec_transfer import get_ec_transfer, has_ec_transfer

    return bool(has_ec_transfer() and not get_ec_transfer().is_consumer)


@stage(
    needs=MODEL,
    meta={
        "mirrors": (f"{_RUNNER}.get_kv_cache_spec",),
        "calls": (
            "vllm.config:get_layers_from_vllm_config",
            "vllm.model_executor.layers.attention_layer_base:AttentionLayerBase",
        ),
    },
)
def attention_layers(vllm_config: VllmConfig, model: Any) -> dict[str, AttentionLayerBase]:
    """Every attention-like layer the loaded model registered, in forward-context order.

    ``model`` is the loaded module; the layers are read from the forward context that its
    construction filled (``get_layers_from_vllm_config``), which includes Mamba and other
    ``AttentionLayerBase`` layers.
    """
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    if model is None:
        raise ModelPhaseError("attention_layers: model is None; load the model first.")
    # vLLM's own call (gpu_model_runner.py) passes the abstract base too, which its
    # signature (type[T], a concrete class) does not admit.
    base: Any = AttentionLayerBase
    return dict(get_layers_from_vllm_config(vllm_config, base))


@stage(
    needs=MODEL,
    meta={
        "mirrors": (f"{_RUNNER}.get_kv_cache_spec",),
        "calls": (
            *_EC_TRANSFER,
            "vllm.model_executor.layers.attention:Attention",
        ),
    },
)
def shared_kv_cache_layers(attention_layers: Mapping[str, AttentionLayerBase]) -> dict[str, str]:
    """Map each cross-layer KV-sharing layer to the layer whose KV cache it reuses.

    vLLM fills ``runner.shared_kv_cache_layers`` as a side effect of ``get_kv_cache_spec``;
    here it is an output. Empty for EC-transfer producers (vLLM returns early there).

    Validates what vLLM's ``validate_kv_sharing_target`` still means once every layer is
    registered — not itself, an attention layer of the model, the same attention type —
    and nothing more: the target may come after its sharer (vLLM's Gemma4 MTP drafter
    points its layers at the target model's last layers), as stock accepts.

    Raises:
        ModelPhaseError: a layer names itself, a target that is not an attention layer,
            or one of another attention type.
    """
    from vllm.model_executor.layers.attention import Attention

    if _kv_cache_disabled():
        return {}
    shared: dict[str, str] = {}
    for name, layer in attention_layers.items():
        if isinstance(layer, Attention) and (target := layer.kv_sharing_target_layer_name):
            check_sharing_target(name, target, attention_layers, ModelPhaseError)
            shared[name] = target
    return shared


def check_sharing_target(
    name: str,
    target: str,
    attention_layers: Mapping[str, Any],
    error: Callable[..., Exception],
) -> None:
    """Raise ``error(msg, layer=...)`` where vLLM's ``validate_kv_sharing_target`` would
    reject ``name`` sharing ``target``'s KV cache with every layer registered: the target
    is the layer itself, not an attention layer, or of another attention type."""
    if target == name:
        raise error(
            f"layer {name!r} names itself as its KV-sharing target; a layer can only share "
            f"the KV cache of another layer.",
            layer=name,
        )
    if target not in attention_layers:
        raise error(
            f"layer {name!r} shares the KV cache of {target!r}, which is not an attention "
            f"layer of the model.",
            layer=name,
        )
    mine = getattr(attention_layers[name], "attn_type", None)
    theirs = getattr(attention_layers[target], "attn_type", None)
    if mine != theirs:
        raise error(
            f"layer {name!r} ({mine}) shares the KV cache of {target!r} ({theirs}); "
            f"KV sharing needs layers of the same attention type.",
            layer=name,
        )


@stage(
    needs=MODEL,
    meta={
        "mirrors": (f"{_RUNNER}.get_kv_cache_spec",),
        "calls": (
            *_EC_TRANSFER,
            "vllm.v1.kv_cache_interface:AttentionSpec",
            "vllm.v1.worker.utils:customize_attention_spec",
        ),
    },
)
def kv_cache_spec(
    vllm_config: VllmConfig,
    attention_layers: Mapping[str, AttentionLayerBase],
    shared_kv_cache_layers: Mapping[str, str],
) -> dict[str, KVCacheSpec]:
    """The KV cache spec of each layer that owns a KV cache (vLLM's ``get_kv_cache_spec``).

    Sharing layers get no spec (they reuse their target's cache); encoder layers return
    None from ``layer.get_kv_cache_spec``. Attention specs pass through the backend's
    ``customize_attention_spec``. Reads the *current* ``cache_config.block_size``.
    """
    from vllm.v1.kv_cache_interface import AttentionSpec
    from vllm.v1.worker.utils import customize_attention_spec

    if _kv_cache_disabled():
        return {}
    specs: dict[str, KVCacheSpec] = {}
    for name, layer in attention_layers.items():
        if name in shared_kv_cache_layers:
            continue
        if spec := layer.get_kv_cache_spec(vllm_config):
            if isinstance(spec, AttentionSpec):
                spec = customize_attention_spec(layer.get_attn_backend(), spec)
            specs[name] = spec
    return specs


@stage(
    needs=MODEL,
    meta={
        "mirrors": (f"{_RUNNER}.may_add_encoder_only_layers_to_kv_cache_config",),
        "calls": (
            "vllm.model_executor.layers.attention:Attention",
            "vllm.v1.attention.backend:AttentionType",
        ),
    },
)
def encoder_only_layers(attention_layers: Mapping[str, AttentionLayerBase]) -> tuple[str, ...]:
    """Names of the ``ENCODER_ONLY`` attention layers (they get a runner-made KV group)."""
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.attention.backend import AttentionType

    return tuple(
        name
        for name, layer in attention_layers.items()
        if isinstance(layer, Attention) and layer.attn_type == AttentionType.ENCODER_ONLY
    )


@stage(
    needs=MODEL,
    meta={
        "mirrors": (f"{_RUNNER}.maybe_add_kv_sharing_layers_to_kv_cache_groups",),
        "calls": ("vllm.model_executor.layers.attention:Attention",),
    },
)
def kv_sharing_fast_prefill_eligible_layers(
    vllm_config: VllmConfig,
    attention_layers: Mapping[str, AttentionLayerBase],
    shared_kv_cache_layers: Mapping[str, str],
) -> frozenset[str]:
    """The trailing run of KV-sharing layers that may skip prefill (YOCO), if enabled.

    Only with ``cache_config.kv_sharing_fast_prefill``; vLLM computes this inside
    ``maybe_add_kv_sharing_layers_to_kv_cache_groups``.
    """
    from vllm.model_executor.layers.attention import Attention

    if not shared_kv_cache_layers or not vllm_config.cache_config.kv_sharing_fast_prefill:
        return frozenset()
    eligible: set[str] = set()
    attn_names = [n for n, layer in attention_layers.items() if isinstance(layer, Attention)]
    for name in reversed(attn_names):
        if name not in shared_kv_cache_layers:
            break
        eligible.add(name)
    return frozenset(eligible)


@stage(
    needs=MODEL,
    meta={
        "mirrors": (
            f"{_RUNNER}.may_add_encoder_only_layers_to_kv_cache_config",
            f"{_RUNNER}.maybe_add_kv_sharing_layers_to_kv_cache_groups",
        )
    },
)
def runner_only_attn_layers(
    encoder_only_layers: tuple[str, ...], shared_kv_cache_layers: Mapping[str, str]
) -> frozenset[str]:
    """Attention layers the runner handles itself: encoder-only and KV-sharing layers.

    The engine's KV planner never sees them; vLLM adds them to
    ``runner.runner_only_attn_layers`` during ``initialize_kv_cache`` (add-only).
    """
    return frozenset(encoder_only_layers) | frozenset(shared_kv_cache_layers)


@stage(
    needs=MODEL,
    meta={
        "mirrors": (f"{_RUNNER}.initialize_attn_backend",),
        "calls": ("vllm.v1.attention.backends.utils:create_fast_prefill_custom_backend",),
    },
)
def attn_backends(
    attention_layers: Mapping[str, AttentionLayerBase],
    kv_sharing_fast_prefill_eligible_layers: frozenset[str],
) -> dict[str, type[AttentionBackend]]:
    """The attention backend class of each layer, FastPrefill-wrapped where eligible.

    vLLM re-creates the ``create_fast_prefill_custom_backend("FastPrefill", backend)``
    subclass on every ``initialize_attn_backend`` call; here it is created once per
    underlying backend and reused by every KV phase (the KV phase groups by the class's
    full name, so one class per underlying backend groups exactly as vLLM does).
    """
    from vllm.v1.attention.backends.utils import create_fast_prefill_custom_backend

    wrapped: dict[type, type] = {}
    backends: dict[str, type[AttentionBackend]] = {}
    for name, layer in attention_layers.items():
        backend = layer.get_attn_backend()
        if name in kv_sharing_fast_prefill_eligible_layers:
            if backend not in wrapped:
                wrapped[backend] = create_fast_prefill_custom_backend("FastPrefill", backend)
            backend = wrapped[backend]
        backends[name] = backend
    return backends


@stage(
    needs=MODEL,
    meta={
        "mirrors": (f"{_RUNNER}.initialize_attn_backend",),
        "calls": ("vllm.v1.worker.cp_utils:check_attention_cp_compatibility",),
    },
)
def attention_cp_compatible(
    vllm_config: VllmConfig, attention_layers: Mapping[str, AttentionLayerBase]
) -> bool:
    """Check the layers' backends support the configured prefill/decode context parallelism.

    Calls vLLM's ``check_attention_cp_compatibility`` (it reads the same forward context
    ``attention_layers`` came from); returns True or raises its AssertionError.
    """
    from vllm.v1.worker.cp_utils import check_attention_cp_compatibility

    check_attention_cp_compatibility(vllm_config)
    return True
