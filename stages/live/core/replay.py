"""Replays of vLLM code a resize needs: planning a KV cache and rebuilding the
scheduler's KV cache manager.

What belongs here: the two places where a resize must do what vLLM does once at start and
offers no function for — ``EngineCore._initialize_kv_caches`` after the specs
(:func:`plan`) and the KV-derived part of ``Scheduler.__init__`` (:func:`rebuild_scheduler_kv`),
line for line against ``vllm/v1/engine/core.py`` and ``vllm/v1/core/sched/scheduler.py``.
Nothing here decides when to resize (the rooms' engine modules do).
"""

from __future__ import annotations

from typing import Any, TypeVar

import attrs

from ...compat import CLEARED, plan_kv_cache_configs
from ...contract.declare import vllm_uses
from ...contract.variants import by_release
from ...errors import RefitRefusedError, ResizeRefusedError

__all__ = ["Plan", "plan", "plan_or_explain", "rebuild_scheduler_kv", "refusal", "refuse"]


E = TypeVar("E", ResizeRefusedError, RefitRefusedError)


def refusal(error: type[E], what: str, step: str, reason: str, serves_on: str) -> E:
    """A live change refused before anything changed: ``error`` naming the step and the
    reason, and how the engine serves on (``serves_on``)."""
    return error(
        f"{what} refused ({step}): {reason.rstrip('. ')}. Nothing changed; the engine serves "
        f"on {serves_on}.",
        step=step,
        reason=reason,
    )


def refuse(step: str, reason: str) -> ResizeRefusedError:
    """The refusal of a resize before anything changed, naming the step and the reason."""
    return refusal(ResizeRefusedError, "KV cache resize", step, reason, "at its current size")


# -- planning -----------------------------------------------------------------------------
@attrs.frozen
class Plan:
    """A planned KV cache: every worker's config and the scheduler's."""

    worker_configs: list[Any]
    scheduler_config: Any
    block_size: int
    scheduler_block_size: int
    hash_block_size: int

    @property
    def num_blocks(self) -> int:
        return int(self.scheduler_config.num_blocks)

    def bytes_per_rank(self) -> tuple[int, ...]:
        return tuple(sum(int(t.size) for t in c.kv_cache_tensors) for c in self.worker_configs)


def memory_shortfall(statuses: Any, new: Plan) -> str | None:
    """Why ``new`` does not fit a rank (its bytes, less what its current cache frees, over
    its available memory), or None when it fits every rank."""
    for status, need in zip(statuses, new.bytes_per_rank(), strict=True):
        room = status.available_memory
        if room is not None and need - status.kv_bytes > room:
            return (
                f"rank {status.rank} needs {need:,} bytes for {new.num_blocks} blocks; "
                f"{status.kv_bytes:,} are freed first and {room:,} are available"
            )
    return None


@vllm_uses(
    "resize",
    mirrors=("vllm.v1.engine.core:EngineCore._initialize_kv_caches",),
    calls=(
        "vllm.v1.core.kv_cache_utils:generate_scheduler_kv_cache_config",
        "vllm.v1.core.kv_cache_utils:resolve_cache_hit_alignment_tokens",
        "vllm.v1.core.kv_cache_utils:resolve_kv_cache_block_sizes",
    ),
)
def plan(
    core: Any, *, num_blocks: int | None = None, kv_cache_memory_bytes: int | None = None
) -> Plan:
    """Plan a KV cache of ``num_blocks`` blocks or ``kv_cache_memory_bytes`` bytes per rank
    with vLLM's own functions, as ``EngineCore._initialize_kv_caches`` does at start.

    Raises:
        ResizeRefusedError: the size cannot serve ``max_model_len`` (vLLM's message), or
            the engine's ``max_model_len`` was auto-fitted (planning would change it).
    """
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
        resolve_cache_hit_alignment_tokens,
        resolve_kv_cache_block_sizes,
    )

    vllm_config = core.vllm_config
    cache = vllm_config.cache_config
    if vllm_config.model_config.original_max_model_len == -1:
        raise refuse(
            "planning",
            "max_model_len was auto-fitted to the KV cache at start (max_model_len=-1); a new "
            "size would silently change it. Start the engine with an explicit max_model_len",
        )
    specs = core.model_executor.get_kv_cache_specs()
    if num_blocks is not None:
        available = [max(int(core.available_gpu_memory_for_kv_cache), 1)] * len(specs)
    else:
        available = [int(kv_cache_memory_bytes or 0)] * len(specs)
    try:  # by bytes: the engine's own block-count override must not apply
        configs = plan_kv_cache_configs(
            vllm_config, specs, available, num_blocks=CLEARED if num_blocks is None else num_blocks
        )
    except ValueError as err:
        raise refuse("planning", str(err)) from None
    for cfg in configs:
        cfg.kv_cache_layout = cache.kv_cache_layout
    sched_cfg = generate_scheduler_kv_cache_config(configs)
    groups = sched_cfg.kv_cache_groups
    if not groups:
        raise refuse("planning", "the model has no KV cache (attention-free or encoder-only)")
    participating = [g.kv_cache_spec.block_size for g in groups if g.kv_cache_spec.prefix_cacheable]
    block_size = min(participating or [g.kv_cache_spec.block_size for g in groups])
    if block_size != cache.block_size:
        raise refuse(
            "planning",
            f"the new plan has block size {block_size}, the engine {cache.block_size}; a resize "
            "keeps the block size",
        )
    if sched_cfg.num_blocks < 2:
        raise refuse("planning", f"{sched_cfg.num_blocks} block(s): vLLM needs at least 2")
    scheduler_block_size, hash_block_size = resolve_kv_cache_block_sizes(sched_cfg, vllm_config)
    alignment = resolve_cache_hit_alignment_tokens(
        sched_cfg, vllm_config, scheduler_block_size, hash_block_size
    )
    for cfg in (*configs, sched_cfg):
        cfg.hash_block_size = hash_block_size
        cfg.cache_hit_alignment_tokens = alignment
    return Plan(configs, sched_cfg, block_size, scheduler_block_size, hash_block_size)


def _smallest(core: Any, *, limit: int = 1 << 24) -> Plan | None:
    """The smallest plan (in blocks) vLLM accepts for this engine, by doubling then
    bisecting ``num_blocks`` (planning is pure and takes milliseconds); None if none up to
    ``limit`` blocks is accepted."""

    def attempt(n: int) -> Plan | None:
        try:
            return plan(core, num_blocks=n)
        except ResizeRefusedError:
            return None

    low, high = 1, 2
    found = attempt(high)
    while found is None:
        low, high = high, high * 2
        if high > limit:
            return None
        found = attempt(high)
    while high - low > 1:
        mid = (low + high) // 2
        p = attempt(mid)
        if p is None:
            low = mid
        else:
            high, found = mid, p
    return found


def plan_or_explain(
    core: Any, *, num_blocks: int | None = None, kv_cache_memory_bytes: int | None = None
) -> Plan:
    """:func:`plan`; when vLLM refuses a size as too small, the refusal also names the
    smallest size that would work (vLLM's own message says only what it needs in GiB,
    rounded: "0.0 GiB" on a small model, or "No available memory")."""
    try:
        return plan(core, num_blocks=num_blocks, kv_cache_memory_bytes=kv_cache_memory_bytes)
    except ResizeRefusedError as err:
        if err.step != "planning" or (num_blocks is None and kv_cache_memory_bytes is None):
            raise
        least = _smallest(core)
        if least is None:
            raise
        need = least.bytes_per_rank()[0]
        if num_blocks is not None:
            if num_blocks >= least.num_blocks:
                raise
            asked = f"num_blocks={num_blocks}"
        else:
            if kv_cache_memory_bytes is not None and kv_cache_memory_bytes >= need:
                raise
            asked = f"kv_cache_memory_bytes={kv_cache_memory_bytes:,}"
        model_len = core.vllm_config.model_config.max_model_len
        raise refuse(
            "planning",
            f"{asked} is too small: the smallest KV cache that serves max_model_len="
            f"{model_len} is num_blocks={least.num_blocks} ({need:,} bytes per rank). "
            f"vLLM says: {err.reason}",
        ) from None


# -- the scheduler ------------------------------------------------------------------------
def _kv_cache_manager(core: Any, new: Plan, **more: Any) -> Any:
    """The ``KVCacheManager`` ``Scheduler.__init__`` builds, for ``new`` (``more``: the
    arguments a later release adds)."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    sched = core.scheduler
    vllm_config = core.vllm_config
    cache = vllm_config.cache_config
    return KVCacheManager(
        kv_cache_config=new.scheduler_config,
        max_model_len=sched.max_model_len,
        max_in_flight_tokens=vllm_config.max_in_flight_tokens,
        enable_caching=cache.enable_prefix_caching,
        use_eagle=sched.use_eagle_block_drop,
        num_prefill_lookahead=sched.num_prefill_lookahead,
        log_stats=sched.log_stats,
        enable_kv_cache_events=sched.enable_kv_cache_events,
        dcp_world_size=sched.dcp_world_size,
        pcp_world_size=1,
        scheduler_block_size=new.scheduler_block_size,
        hash_block_size=new.hash_block_size,
        metrics_collector=sched.kv_metrics_collector,
        watermark=sched.scheduler_config.watermark,
        enable_mamba_shared_prefix_checkpoint=cache.enable_mamba_shared_prefix_checkpoint,
        **more,
    )


def _spec_decode_step_blocks(sched: Any, manager: Any) -> int:
    """``Scheduler._spec_decode_step_blocks`` for ``manager`` (Mamba managers already
    account for their speculative state blocks)."""
    from vllm.utils.math_utils import cdiv
    from vllm.v1.kv_cache_interface import MambaSpec

    num_spec = (
        1 + sched.num_spec_tokens + sched.num_lookahead_tokens if sched.num_spec_tokens else 0
    )
    return sum(
        cdiv(num_spec, m.block_size)
        for m in manager.coordinator.single_type_managers
        if not isinstance(m.kv_cache_spec, MambaSpec)
    )


def _assign(core: Any, new: Plan, manager: Any, spec_step_blocks: int, **more: Any) -> None:
    """Give the scheduler ``manager`` and every attribute ``Scheduler.__init__`` derives
    from the KV config in every release (``more``: the scheduler attributes a later
    release also derives, already built); re-bind the connector; update the engine's
    capacity figures. Reads only before the first assignment."""
    from vllm.v1.core.kv_cache_utils import update_kv_cache_capacity
    from vllm.v1.kv_cache_interface import MambaSpec

    sched = core.scheduler
    vllm_config = core.vllm_config
    cache = vllm_config.cache_config
    cfg = new.scheduler_config
    groups = cfg.kv_cache_groups
    replay_ids = tuple(i for i, g in enumerate(groups) if g.kv_cache_spec.prefix_replay_tokens > 0)
    windows = {groups[i].kv_cache_spec.prefix_replay_tokens for i in replay_ids}
    # -- assign (nothing above touched the scheduler) --
    sched.kv_cache_config = cfg
    sched.block_size = new.scheduler_block_size
    sched.hash_block_size = new.hash_block_size
    sched.prefix_replay_group_ids = replay_ids
    sched.prefix_replay_tokens = windows.pop() if windows else 0
    sched.kv_cache_manager = manager
    sched._spec_decode_step_blocks = spec_step_blocks
    for name, value in more.items():
        setattr(sched, name, value)
    if sched.connector is not None:
        sched.connector.bind_kv_cache_manager(manager)
    sched.has_mamba_layers = cfg.has_mamba_layers
    sched.needs_kv_cache_zeroing = cfg.needs_kv_cache_zeroing
    sched.need_mamba_block_aligned_split = (
        sched.has_mamba_layers and cache.mamba_cache_mode == "align"
    )
    sched.mamba_prefill_checkpoint_alignment = next(
        (
            g.kv_cache_spec.prefill_checkpoint_alignment
            for g in groups
            if isinstance(g.kv_cache_spec, MambaSpec)
        ),
        None,
    )
    sched.mamba_has_prefill_checkpoint_blocks = sched.has_mamba_layers and all(
        not isinstance(g.kv_cache_spec, MambaSpec)
        or g.kv_cache_spec.num_prefill_checkpoint_blocks > 0
        for g in groups
    )
    sched.mamba_partial_cache_hit = (
        sched.need_mamba_block_aligned_split
        and sched.hash_block_size < sched.block_size
        and manager.coordinator.enable_partial_hash_hits
    )
    sched.mamba_shared_prefix_checkpoint = (
        sched.mamba_partial_cache_hit and manager.mamba_shared_prefix_checkpoint
    )
    # -- the engine's figures (EngineCore._initialize_kv_caches). Not hash_block_size or
    # cache_hit_alignment_tokens: vLLM's worker sets those on ITS config in
    # initialize_from_config (the engine core's own only when a worker shares it) --
    cache.num_gpu_blocks = cfg.num_blocks
    cache.block_size = new.block_size
    update_kv_cache_capacity(vllm_config, cfg)
    core._initialize_effective_attention_block_size()


@by_release("resize")
@vllm_uses(
    "resize",
    mirrors=("vllm.v1.core.sched.scheduler:Scheduler.__init__",),
    calls=(
        "vllm.utils.math_utils:cdiv",
        "vllm.v1.core.kv_cache_manager:KVCacheManager",
        "vllm.v1.core.kv_cache_utils:update_kv_cache_capacity",
        "vllm.v1.kv_cache_interface:MambaSpec",
    ),
)
def rebuild_scheduler_kv(core: Any, new: Plan) -> None:
    """Give the scheduler a new ``KVCacheManager`` for ``new``; recompute what derives from
    the KV config, exactly as ``Scheduler.__init__`` (vLLM 0.32.0) does; re-bind the
    connector; update the engine's capacity figures. Builds first, assigns last."""
    manager = _kv_cache_manager(core, new)
    _assign(core, new, manager, _spec_decode_step_blocks(core.scheduler, manager))


@rebuild_scheduler_kv.variant("0.33.0", "0.34.0")
@vllm_uses(
    "resize",
    mirrors=("vllm.v1.core.sched.scheduler:Scheduler.__init__",),
    calls=(
        "vllm.distributed.aux_output_connector.connector:AuxOutputSchedulerConnector",
        "vllm.utils.math_utils:cdiv",
        "vllm.v1.core.kv_cache_manager:KVCacheManager",
        "vllm.v1.core.kv_cache_utils:update_kv_cache_capacity",
        "vllm.v1.kv_cache_interface:KVCacheConfig",
        "vllm.v1.kv_cache_interface:MambaSpec",
    ),
    release=("0.33.0", "0.34.0"),
    replaces=("initpipe_vllm.live.core.replay:rebuild_scheduler_kv",),
)
def _rebuild_scheduler_kv_0_33_0(core: Any, new: Plan) -> None:
    """vLLM 0.33.0's ``Scheduler.__init__``, its KV-derived part: as 0.32.0's, plus the
    manager's ``num_hash_lookahead_tokens`` (the scheduler's, from the config), the auxiliary
    output connector rebuilt on the new manager (it holds the manager, its block pool and
    the pool's size), and ``defer_async_loads`` (HiSparse: from the new config's
    ``hisparse_host_num_blocks``). Builds first, assigns last."""
    sched = core.scheduler
    manager = _kv_cache_manager(
        core, new, num_hash_lookahead_tokens=sched.num_hash_lookahead_tokens
    )
    spec_step_blocks = _spec_decode_step_blocks(sched, manager)
    aux = None
    if core.vllm_config.aux_output_config.enabled:
        from vllm.distributed.aux_output_connector.connector import AuxOutputSchedulerConnector

        aux = AuxOutputSchedulerConnector(manager, sched.connector)
    defer_async_loads = (
        sched.defer_block_free and new.scheduler_config.hisparse_host_num_blocks is not None
    )
    _assign(
        core,
        new,
        manager,
        spec_step_blocks,
        aux_output_connector=aux,
        defer_async_loads=defer_async_loads,
    )
