"""Replays of vLLM 0.32.0 code a resize needs: planning a KV cache and rebuilding the
scheduler's KV cache manager.

What belongs here: the two places where a resize must do what vLLM does once at start and
offers no function for — ``EngineCore._initialize_kv_caches`` after the specs
(:func:`plan`) and the KV-derived part of ``Scheduler.__init__`` (:func:`rebuild_scheduler_kv`),
line for line against ``vllm/v1/engine/core.py`` and ``vllm/v1/core/sched/scheduler.py``.
Nothing here decides when to resize (:mod:`.engine` does).
"""

from __future__ import annotations

from typing import Any

import attrs

from ..errors import ResizeRefusedError

__all__ = ["Plan", "plan", "rebuild_scheduler_kv", "refuse"]


def refuse(step: str, reason: str) -> ResizeRefusedError:
    """The refusal of a resize before anything changed, naming the step and the reason."""
    return ResizeRefusedError(
        f"KV cache resize refused ({step}): {reason}. Nothing changed; the engine serves on "
        "at its current size.",
        step=step,
        reason=reason,
    )


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
        get_kv_cache_configs,
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
    saved = cache.num_gpu_blocks_override
    try:
        if num_blocks is not None:
            cache.num_gpu_blocks_override = num_blocks
            available = [max(int(core.available_gpu_memory_for_kv_cache), 1)] * len(specs)
        else:
            cache.num_gpu_blocks_override = None
            available = [int(kv_cache_memory_bytes or 0)] * len(specs)
        configs = get_kv_cache_configs(vllm_config, specs, available)
    except ValueError as err:
        raise refuse("planning", str(err)) from None
    finally:
        cache.num_gpu_blocks_override = saved
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


# -- the scheduler ------------------------------------------------------------------------
def rebuild_scheduler_kv(core: Any, new: Plan) -> None:
    """Give the scheduler a new ``KVCacheManager`` for ``new``; recompute what derives from
    the KV config, exactly as ``Scheduler.__init__`` (vLLM 0.32.0) does; re-bind the
    connector; update the engine's capacity figures. Builds first, assigns last."""
    from vllm.utils.math_utils import cdiv
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import update_kv_cache_capacity
    from vllm.v1.kv_cache_interface import MambaSpec

    sched = core.scheduler
    vllm_config = core.vllm_config
    cache = vllm_config.cache_config
    cfg = new.scheduler_config
    manager = KVCacheManager(
        kv_cache_config=cfg,
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
    )
    groups = cfg.kv_cache_groups
    replay_ids = tuple(i for i, g in enumerate(groups) if g.kv_cache_spec.prefix_replay_tokens > 0)
    windows = {groups[i].kv_cache_spec.prefix_replay_tokens for i in replay_ids}
    num_spec = (
        1 + sched.num_spec_tokens + sched.num_lookahead_tokens if sched.num_spec_tokens else 0
    )
    spec_step_blocks = sum(
        cdiv(num_spec, m.block_size)
        for m in manager.coordinator.single_type_managers
        if not isinstance(m.kv_cache_spec, MambaSpec)
    )
    # -- assign (nothing above touched the scheduler) --
    sched.kv_cache_config = cfg
    sched.block_size = new.scheduler_block_size
    sched.hash_block_size = new.hash_block_size
    sched.prefix_replay_group_ids = replay_ids
    sched.prefix_replay_tokens = windows.pop() if windows else 0
    sched.kv_cache_manager = manager
    sched._spec_decode_step_blocks = spec_step_blocks
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
    # -- the engine's figures (EngineCore._initialize_kv_caches) --
    cache.num_gpu_blocks = cfg.num_blocks
    cache.block_size = new.block_size
    cache.hash_block_size = new.hash_block_size
    cache.cache_hit_alignment_tokens = cfg.cache_hit_alignment_tokens
    update_kv_cache_capacity(vllm_config, cfg)
    core._initialize_effective_attention_block_size()
