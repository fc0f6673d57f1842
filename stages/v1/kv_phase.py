"""KV-phase stages: everything that needs the engine's ``KVCacheConfig``.

What belongs here: the steps of ``GPUModelRunner.initialize_kv_cache`` that read the KV
cache config or the values the engine settles between the phases (resolved KV layout,
``max_model_len`` after auto-fit). The phase is re-runnable: a stage that mutates state
outside its own return value declares that ``effect``, and a teardown undoes exactly what
vLLM's ``_cleanup_profiling_kv_cache`` undoes, so after ``run.teardown_kv_cache()`` the
runner and the process globals are as stock's cleanup leaves them — except that nothing
points at freed KV memory (README: "Differences from stock cleanup"). The declared graph
forces stock's order (K3 -> K4 -> K5 -> K6 -> K7 -> K8), with ordering-only edges where no
data edge does.

Each stage declares the part of ``GPUModelRunner.initialize_kv_cache``
(``vllm/v1/worker/gpu_model_runner.py``) it replaces and the vLLM functions it calls
(``meta``: ``mirrors`` and ``calls``; ``initpipe doctor`` checks them against the installed
vLLM). The tensor half (K8 allocation, aliasing, binding; K9; K10) is in :mod:`.kv_tensors`.

The math is vLLM's: ``AttentionGroup``, ``prepare_kernel_block_sizes``,
``allocate_kv_cache``, ``bind_kv_cache``, ``add_kv_sharing_layers_to_kv_cache_groups``
(``vllm/v1/worker/utils.py``) and the backends' own builders. torch and vllm are imported
inside the stage bodies only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from initpipe import KV, stage

from ..errors import KVCacheConfigError
from ..vllm_names import V1_RUNNER as _RUNNER
from .types import InputBatchGeometry, RunnerSettings

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.v1.attention.backend import AttentionBackend
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.worker.utils import AttentionGroup


__all__ = [
    "attention_groups",
    "cudagraph_mode",
    "drafter_attn_groups",
    "encoder_only_kv_cache_group",
    "kernel_block_sizes",
    "mamba_ssu_backend",
    "metadata_builders",
    "reinitialize_input_batch",
    "reorder_batch_threshold",
    "runner_kv_cache_config",
]


def _jit(registry: Any) -> contextlib.AbstractContextManager[Any]:
    """vLLM's JIT warm-up capture context, or a null context without a registry."""
    return registry.activate() if registry is not None else contextlib.nullcontext()


def _uses_drafter_backend(vllm_config: VllmConfig) -> bool:
    spec = vllm_config.speculative_config
    return bool(spec and (spec.use_eagle() or spec.uses_draft_model()))


# -- K1 / K2: the runner's working copy of the config ------------------------------------
@stage(
    needs=KV,
    meta={
        "mirrors": (f"{_RUNNER}.may_add_encoder_only_layers_to_kv_cache_config",),
        "calls": (
            "vllm.v1.kv_cache_interface:EncoderOnlyAttentionSpec",
            "vllm.v1.kv_cache_interface:KVCacheGroupSpec",
        ),
    },
)
def encoder_only_kv_cache_group(
    vllm_config: VllmConfig,
    runner_settings: RunnerSettings,
    attention_layers: Mapping[str, AttentionLayerBase],
    encoder_only_layers: tuple[str, ...],
) -> KVCacheGroupSpec | None:
    """The KV cache group the runner adds for encoder-only layers (None without them).

    Its spec reads ``cache_config.block_size`` now, at KV time, as vLLM does.

    Raises:
        KVCacheConfigError: the encoder-only layers need more than one spec.
    """
    from vllm.v1.kv_cache_interface import EncoderOnlyAttentionSpec, KVCacheGroupSpec

    if not encoder_only_layers:
        return None
    block_size = vllm_config.cache_config.block_size
    by_spec: dict[Any, list[str]] = {}
    for name in encoder_only_layers:
        # Encoder-only layers are ``Attention`` layers (the model phase checked attn_type).
        layer = cast("Attention", attention_layers[name])
        spec = EncoderOnlyAttentionSpec(
            block_size=block_size,
            num_kv_heads=layer.num_kv_heads,
            head_size=layer.head_size,
            dtype=runner_settings.kv_cache_dtype,
        )
        by_spec.setdefault(spec, []).append(name)
    if len(by_spec) != 1:
        firsts = [names[0] for names in by_spec.values()]
        msg = (
            f"encoder-only layers need {len(by_spec)} different KV specs (e.g. "
            f"{firsts[0]!r} vs {firsts[1]!r}); vLLM supports one encoder-only spec."
        )
        raise KVCacheConfigError(msg, field="kv_cache_groups", layer=firsts[1])
    spec, names = by_spec.popitem()
    return KVCacheGroupSpec(layer_names=names, kv_cache_spec=spec)


def _validate_kv_cache_config(
    cfg: Any,
    attention_layers: Mapping[str, Any],
    shared: Mapping[str, str],
    runner_added: set[str],
    layer_specs: Mapping[str, Any],
) -> None:
    import difflib

    from .model_phase import check_sharing_target

    for attr in ("num_blocks", "kv_cache_tensors", "kv_cache_groups"):
        if not hasattr(cfg, attr):
            raise KVCacheConfigError(
                f"kv_cache_config {type(cfg).__name__} has no {attr!r}; pass a vllm KVCacheConfig.",
                field=attr,
            )
    grouped: dict[str, Any] = {}  # layer -> its spec in the config
    for gid, group in enumerate(cfg.kv_cache_groups):
        for name in group.layer_names:
            if name not in attention_layers:
                close = difflib.get_close_matches(name, list(attention_layers), n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise KVCacheConfigError(
                    f"kv_cache_config group {gid} names layer {name!r}, "
                    f"which is not an attention layer of the loaded "
                    f"model.{hint}",
                    field="kv_cache_groups",
                    layer=name,
                )
            if name in shared or name in runner_added:
                raise KVCacheConfigError(
                    f"kv_cache_config group {gid} already holds runner-only "
                    f"layer {name!r}; pass the engine's KVCacheConfig, not a "
                    f"runner's working copy.",
                    field="kv_cache_groups",
                    layer=name,
                )
            spec = group.kv_cache_spec
            grouped[name] = getattr(spec, "kv_cache_specs", {}).get(name, spec)
            _check_spec_matches(gid, name, grouped[name], layer_specs.get(name))
    if cfg.kv_cache_groups and cfg.num_blocks < 1:
        raise KVCacheConfigError(
            f"kv_cache_config.num_blocks is {cfg.num_blocks}; the KV cache "
            f"needs at least one block.",
            field="num_blocks",
        )
    sizes = {t.size for t in cfg.kv_cache_tensors}
    if len(sizes) > 1:
        raise KVCacheConfigError(
            f"kv_cache_config.kv_cache_tensors have sizes {sorted(sizes)}; "
            f"they must share one backing allocation (one size).",
            field="kv_cache_tensors",
        )
    held: set[str] = set()
    for t in cfg.kv_cache_tensors:
        for index, name in enumerate(t.layers):
            if name not in grouped:
                raise KVCacheConfigError(
                    f"a KVCacheTensor holds layer {name!r}, which no KV cache group names.",
                    field="kv_cache_tensors",
                    layer=name,
                )
            held.add(name)
            _check_tensor_fits(cfg, t, index, name, grouped[name])
    if cfg.kv_cache_tensors:
        for name in grouped:
            if name not in held:
                raise KVCacheConfigError(
                    f"layer {name!r} is in a KV cache group but no "
                    f"KVCacheTensor holds it, so it would get no KV cache.",
                    field="kv_cache_tensors",
                    layer=name,
                )
    for name, target in shared.items():
        if target not in grouped and target != name:
            raise KVCacheConfigError(
                f"layer {name!r} shares the KV cache of {target!r}, which no KV cache group names.",
                field="kv_cache_groups",
                layer=target,
            )
        check_sharing_target(name, target, attention_layers, _sharing_error)


def _sharing_error(msg: str, *, layer: str) -> KVCacheConfigError:
    return KVCacheConfigError(msg, field="kv_cache_groups", layer=layer)


def _check_spec_matches(gid: int, name: str, planned: Any, actual: Any) -> None:
    """The group's spec for a layer must describe the same KV page as the model's spec
    (the block size may differ: the engine unifies page sizes)."""
    if actual is None or type(planned) is not type(actual):
        return
    for field in ("num_kv_heads", "head_size", "head_size_v", "dtype"):
        a, b = getattr(planned, field, None), getattr(actual, field, None)
        if a != b:
            raise KVCacheConfigError(
                f"kv_cache_config group {gid} plans layer {name!r} with {field}={a}, but the "
                f"loaded model's layer has {field}={b}: the config was planned for another "
                f"model. Plan it from this runner's get_kv_cache_spec().",
                field="kv_cache_groups",
                layer=name,
            )


def _check_tensor_fits(cfg: Any, tensor: Any, index: int, name: str, spec: Any) -> None:
    """Block ``num_blocks - 1`` of layer ``index`` must end inside the tensor."""
    page = getattr(spec, "page_size_bytes", None)
    if not isinstance(page, int) or getattr(tensor, "block_stride", None) is None:
        return
    num_blocks = cfg.num_blocks_of(tensor) if hasattr(cfg, "num_blocks_of") else cfg.num_blocks
    end = (
        getattr(tensor, "offset", 0)
        + index * tensor.layer_stride
        + (num_blocks - 1) * tensor.block_stride
        + page
    )
    if end > tensor.size:
        raise KVCacheConfigError(
            f"layer {name!r} needs {end:,} bytes of its KVCacheTensor ({num_blocks} blocks of "
            f"{page:,} bytes, block_stride {tensor.block_stride:,}, layer_stride "
            f"{tensor.layer_stride:,}) but the tensor has {tensor.size:,}: num_blocks, the "
            f"strides or the group's block size do not match the tensor.",
            field="kv_cache_tensors",
            layer=name,
        )


@stage(
    needs=KV,
    meta={
        "mirrors": (
            f"{_RUNNER}.initialize_kv_cache",
            f"{_RUNNER}.maybe_add_kv_sharing_layers_to_kv_cache_groups",
        ),
        "calls": ("vllm.v1.worker.utils:add_kv_sharing_layers_to_kv_cache_groups",),
    },
)
def runner_kv_cache_config(
    kv_cache_config: KVCacheConfig,
    attention_layers: Mapping[str, AttentionLayerBase],
    shared_kv_cache_layers: Mapping[str, str],
    encoder_only_kv_cache_group: KVCacheGroupSpec | None,
    kv_cache_spec: Mapping[str, Any] | None = None,
) -> KVCacheConfig:
    """The runner's working copy of the engine's config, with its own layers added.

    A deep copy (the engine and KV connector keep the original), then the encoder-only
    group is appended and each KV-sharing layer joins its target's group — vLLM's K0-K2,
    which it applies by mutating ``self.kv_cache_config``.

    Raises:
        KVCacheConfigError: the config names an unknown layer, has no blocks, tensors of
            different sizes or too small for their blocks, a grouped layer no tensor holds,
            a spec that does not match the model's layer, a KV-sharing target that is
            missing, the sharer itself or of another attention type, or already holds
            runner-only layers.
    """
    import copy

    from vllm.v1.worker.utils import add_kv_sharing_layers_to_kv_cache_groups

    runner_added = set(
        encoder_only_kv_cache_group.layer_names if encoder_only_kv_cache_group else ()
    )
    _validate_kv_cache_config(
        kv_cache_config, attention_layers, shared_kv_cache_layers, runner_added, kv_cache_spec or {}
    )
    cfg = copy.deepcopy(kv_cache_config)
    if encoder_only_kv_cache_group is not None:
        cfg.kv_cache_groups.append(copy.deepcopy(encoder_only_kv_cache_group))
    add_kv_sharing_layers_to_kv_cache_groups(dict(shared_kv_cache_layers), cfg.kv_cache_groups)
    return cfg


# -- K3: attention groups and the cudagraph mode ---------------------------------------
@stage(
    needs=KV,
    meta={
        "mirrors": (f"{_RUNNER}.initialize_attn_backend",),
        "calls": (
            "vllm.v1.kv_cache_interface:UniformTypeKVCacheSpecs",
            "vllm.v1.worker.utils:AttentionGroup",
        ),
    },
)
def attention_groups(
    runner_kv_cache_config: KVCacheConfig,
    attention_layers: Mapping[str, AttentionLayerBase],
    attn_backends: Mapping[str, type[AttentionBackend]],
) -> list[list[AttentionGroup]]:
    """Attention groups per KV cache group, keyed as vLLM does (no builders yet).

    Layers of one KV cache group share an ``AttentionGroup`` when their backend's full
    class name, their per-layer spec and their query-head count are equal.
    """
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs
    from vllm.v1.worker.utils import AttentionGroup

    out: list[list[AttentionGroup]] = []
    for gid, group in enumerate(runner_kv_cache_config.kv_cache_groups):
        keyed: dict[tuple[Any, ...], tuple[Any, Any, list[str]]] = {}
        for name in group.layer_names:
            backend = attn_backends[name]
            spec = group.kv_cache_spec
            if isinstance(spec, UniformTypeKVCacheSpecs):
                spec = spec.kv_cache_specs[name]
            num_heads_q = getattr(attention_layers[name], "num_heads", 0)
            key = (backend.full_cls_name(), spec, num_heads_q)
            names = keyed[key][2] if key in keyed else []
            names.append(name)
            keyed[key] = (backend, spec, names)  # vLLM keeps the last layer's class
        out.append([AttentionGroup(b, names, spec, gid) for b, spec, names in keyed.values()])
    return out


@stage(
    needs=KV,
    effects=("compilation_config.cudagraph_mode", "cudagraph_dispatcher keys"),
    meta={
        "mirrors": (f"{_RUNNER}._check_and_update_cudagraph_mode",),
        "calls": ("vllm.v1.attention.backend:AttentionCGSupport",),
    },
)
def cudagraph_mode(
    vllm_config: VllmConfig,
    runner_kv_cache_config: KVCacheConfig,
    attention_groups: list[list[AttentionGroup]],
    runner_settings: RunnerSettings,
    is_profiling: bool,
    cudagraph_dispatcher: Any,
    drafter: Any,
) -> Any:
    """Resolve the cudagraph mode from the backends' support, then set dispatcher keys.

    Must precede the metadata builders: FlashAttention and Triton read the resolved mode
    and capture sizes in ``__init__``. vLLM's ``resolve_cudagraph_mode_and_sizes`` writes
    ``compilation_config.cudagraph_mode`` (declared effect).

    No teardown, as in stock: ``_cleanup_profiling_kv_cache`` leaves the resolved mode and
    the dispatcher keys (vLLM's profiling pass clears the keys itself before it calls the
    cleanup); the next KV phase starts from the resolved mode, and resolving a resolved
    mode gives the same mode.
    """
    from vllm.v1.attention.backend import AttentionCGSupport

    min_support, min_backend = AttentionCGSupport.ALWAYS, None
    for groups, kv_group in zip(
        attention_groups, runner_kv_cache_config.kv_cache_groups, strict=True
    ):
        for backend in dict.fromkeys(g.backend for g in groups):
            support = backend.get_builder_cls().get_cudagraph_support(
                vllm_config, kv_group.kv_cache_spec
            )
            if support.value < min_support.value:
                min_support, min_backend = support, backend.__name__
    uniform = runner_settings.uniform_decode_query_len
    mode = vllm_config.compilation_config.resolve_cudagraph_mode_and_sizes(
        min_support,
        min_backend,
        uniform,
        use_v2_model_runner=False,
        kv_cache_config=runner_kv_cache_config,
        max_num_reqs=runner_settings.max_num_reqs,
        is_profiling=is_profiling,
    )
    cudagraph_dispatcher.initialize_cudagraph_keys(mode, uniform)
    spec = vllm_config.speculative_config
    if spec and (spec.use_eagle() or spec.uses_draft_model() or spec.uses_extract_hidden_states()):
        drafter.initialize_cudagraph_keys(mode)
    return mode


# -- K4 / K5: Mamba SSU and kernel block sizes --------------------------------------------
@stage(
    needs=KV,
    after=("cudagraph_mode",),
    effects=("mamba ssu_dispatch globals",),
    meta={
        "mirrors": (f"{_RUNNER}.initialize_kv_cache",),
        "calls": (
            "vllm.model_executor.layers.mamba.ops.ssu_dispatch:_mamba_ssu_backend",
            "vllm.model_executor.layers.mamba.ops.ssu_dispatch:initialize_mamba_ssu_backend",
        ),
    },
)
def mamba_ssu_backend(vllm_config: VllmConfig, runner_kv_cache_config: KVCacheConfig) -> Any:
    """Pick the Mamba SSU backend (a module global in vLLM); no-op without Mamba layers.

    Returns the backend now selected. No teardown, as in stock: vLLM's cleanup leaves the
    global in place (it points at no KV memory), so Mamba forwards keep working until the
    next KV phase selects again.
    """
    from vllm.model_executor.layers.mamba.ops import ssu_dispatch

    ssu_dispatch.initialize_mamba_ssu_backend(
        vllm_config.mamba_config,
        runner_kv_cache_config,
        use_replayssm=vllm_config.cache_config.use_replayssm,
    )
    return ssu_dispatch._mamba_ssu_backend


@stage(
    needs=KV,
    after=("mamba_ssu_backend",),
    meta={
        "mirrors": (f"{_RUNNER}.initialize_kv_cache",),
        "calls": ("vllm.v1.worker.utils:prepare_kernel_block_sizes",),
    },
)
def kernel_block_sizes(
    runner_kv_cache_config: KVCacheConfig, attention_groups: list[list[AttentionGroup]]
) -> list[int]:
    """Kernel block size per KV cache group (encoder-only groups excluded).

    vLLM's ``prepare_kernel_block_sizes``: the manager block size if every backend of the
    group accepts it, else the largest size they all accept that divides it.
    """
    from vllm.v1.worker.utils import prepare_kernel_block_sizes

    return prepare_kernel_block_sizes(runner_kv_cache_config, attention_groups)


# -- K6: metadata builders ----------------------------------------------------------------
def _drop_builders(attn_groups: list[list[AttentionGroup]]) -> None:
    """Release the builders and kernel block tables (device buffers) of this pass."""
    for groups in attn_groups:
        for group in groups:
            group.metadata_builders = []
            group.kernel_block_table = group.kernel_block_offsets = None


@stage(
    needs=KV,
    provides="attn_groups",
    teardown=_drop_builders,
    after=("mamba_ssu_backend",),
    effects=("layer.isa (set by CPU_ATTN builders)",),
    meta={
        "mirrors": (
            f"{_RUNNER}.initialize_metadata_builders",
            f"{_RUNNER}._cleanup_profiling_kv_cache",
        )
    },
)
def metadata_builders(
    vllm_config: VllmConfig,
    device: Any,
    runner_kv_cache_config: KVCacheConfig,
    attention_groups: list[list[AttentionGroup]],
    kernel_block_sizes: list[int],
    cudagraph_mode: Any,
) -> list[list[AttentionGroup]]:
    """Copies of the attention groups with their metadata builders built on ``device``.

    ``AttentionGroup.create_metadata_builders`` (vLLM) narrows the kernel block size per
    backend and constructs ``builder_cls(spec, layer_names, vllm_config, device)``. It
    needs the resolved ``cudagraph_mode`` (an input here for that ordering). The groups
    of :func:`attention_groups` stay builder-free; the copies are ``attn_groups``.
    """
    import dataclasses

    ubatches = vllm_config.parallel_config
    n_builders = ubatches.num_ubatches if ubatches.use_ubatching else 1
    out = []
    for gid, groups in enumerate(attention_groups):
        built = []
        for group in groups:
            group = dataclasses.replace(
                group, layer_names=list(group.layer_names), metadata_builders=[]
            )
            group.create_metadata_builders(
                vllm_config,
                device,
                kernel_block_sizes[gid] if gid < len(kernel_block_sizes) else None,
                num_metadata_builders=n_builders,
            )
            built.append(group)
        out.append(built)
    return out


@stage(
    needs=KV,
    meta={"mirrors": (f"{_RUNNER}.calculate_reorder_batch_threshold",)},
)
def reorder_batch_threshold(attn_groups: list[list[AttentionGroup]]) -> int | None:
    """The smallest reorder threshold any builder asks for (None: no reordering).

    Read after the builders exist, because some set it in ``__init__`` (vLLM's
    ``calculate_reorder_batch_threshold``).
    """
    values = [
        g.get_metadata_builder().reorder_batch_threshold for groups in attn_groups for g in groups
    ]
    present = [v for v in values if v is not None]
    return min(present) if present else None


@stage(
    needs=KV,
    after=("metadata_builders",),
    effects=("drafter attention groups",),
    meta={"mirrors": (f"{_RUNNER}.initialize_metadata_builders",)},
)
def drafter_attn_groups(
    vllm_config: VllmConfig,
    drafter: Any,
    runner_kv_cache_config: KVCacheConfig,
    kernel_block_sizes: list[int],
) -> list[Any]:
    """Let an EAGLE / draft-model drafter build its attention groups; [] otherwise.

    vLLM calls ``drafter.initialize_attn_backend`` at the end of
    ``initialize_metadata_builders``; the drafter keeps the groups on itself. No teardown,
    as in stock: vLLM's cleanup leaves the drafter's groups (they hold no KV memory; the
    layers' KV views are unbound by the binding stage's teardown).
    """
    if not _uses_drafter_backend(vllm_config):
        return []
    drafter.initialize_attn_backend(runner_kv_cache_config, kernel_block_sizes)
    return list(getattr(drafter, "draft_attn_groups", []))


# -- K7: the input batch -----------------------------------------------------------------
# Stock order (K6 -> K7 -> K8): the builders, then the input batch, then the KV tensors, so
# on a GPU the builders' buffers and the new batch are allocated before the KV cache that
# takes the profiled budget. Ordering-only edges where no data edge forces it.
@stage(
    needs=KV,
    provides=("input_batch", "input_batch_geometry"),
    after=("metadata_builders", "reorder_batch_threshold", "drafter_attn_groups"),
    meta={
        "mirrors": (f"{_RUNNER}.may_reinitialize_input_batch",),
        "calls": (
            "vllm.v1.kv_cache_interface:KVCacheSpecKind",
            "vllm.v1.kv_cache_interface:get_kv_cache_spec_kind",
            "vllm.v1.worker.block_table:SlotMappingMode",
            "vllm.v1.worker.gpu_input_batch:InputBatch",
        ),
    },
)
def reinitialize_input_batch(
    vllm_config: VllmConfig,
    device: Any,
    runner_settings: RunnerSettings,
    runner_kv_cache_config: KVCacheConfig,
    max_model_len: int,
    current_input_batch: Any,
    current_input_batch_geometry: InputBatchGeometry,
    jit_warmup_registry: Any,
) -> dict[str, Any]:
    """The InputBatch for the final block sizes: the current one if it fits, else a new one.

    vLLM's ``may_reinitialize_input_batch``: one block table per non-encoder-only group;
    Mamba groups use no slot mapping. ``max_model_len`` is the runner's value at KV time
    (the engine may have shrunk it by auto-fit).
    """
    from vllm.v1.kv_cache_interface import KVCacheSpecKind, get_kv_cache_spec_kind
    from vllm.v1.worker.block_table import SlotMappingMode
    from vllm.v1.worker.gpu_input_batch import InputBatch

    block_sizes, max_blocks, modes = [], [], []
    max_len = max(max_model_len, runner_settings.max_encoder_len)
    for group in runner_kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        kind = get_kv_cache_spec_kind(spec)
        if kind == KVCacheSpecKind.ENCODER_ONLY_ATTENTION:
            continue
        block_sizes.append(spec.block_size)
        modes.append(
            SlotMappingMode.NONE
            if kind == KVCacheSpecKind.MAMBA
            else SlotMappingMode.TOKEN_TO_KV_SLOT
        )
        max_blocks.append(spec.max_num_blocks_per_req(vllm_config, max_len))
    interleave = vllm_config.parallel_config.cp_kv_cache_interleave_size
    geometry = InputBatchGeometry(
        block_sizes=block_sizes,
        max_num_blocks=max_blocks,
        slot_mapping_modes=modes,
        cp_kv_cache_interleave_size=interleave,
    )
    if geometry == current_input_batch_geometry:
        return {"input_batch": current_input_batch, "input_batch_geometry": geometry}
    s = runner_settings
    with _jit(jit_warmup_registry):
        batch = InputBatch(
            max_num_reqs=s.max_num_reqs,
            max_model_len=max_len,
            max_num_batched_tokens=s.max_num_tokens,
            device=device,
            vocab_size=vllm_config.model_config.get_vocab_size(),
            block_sizes=block_sizes,
            max_num_blocks_per_req=max_blocks,
            num_spec_tokens=s.num_spec_tokens,
            logitsprocs=current_input_batch.logitsprocs,
            logitsprocs_need_output_token_ids=current_input_batch.logitsprocs_need_output_token_ids,
            is_pooling_model=s.is_pooling_model,
            cp_kv_cache_interleave_size=interleave,
            reasoning_config=vllm_config.reasoning_config,
            use_replayssm=vllm_config.cache_config.use_replayssm,
            slot_mapping_modes=modes,
        )
    return {"input_batch": batch, "input_batch_geometry": geometry}
