"""A resize that keeps the prefix cache, the scheduler's side: which cached blocks survive
the new size, which block ids they take, and the new block pool rebuilt to match.

What belongs here: reading the old ``BlockPool`` once nothing holds a block (:func:`read_pool`),
choosing what the new pool keeps (:func:`plan_carry`: pure, on plain ids) and writing it
into the new pool vLLM built (:func:`apply_carry`); nothing that touches KV bytes (the
ranks copy them: :mod:`.kv_copy`) and nothing about when (:mod:`.steps`).

What is kept is exactly vLLM's own prefix-cache state, so vLLM's rules for every KV cache
group kind apply unchanged afterwards (full attention, sliding window, MLA, Mamba's cached
states, hybrid models): a block is *cached* when the pool maps a hash to it (its primary
hash or a partial-prefix entry); a block of a group vLLM does not cache never has one, so
nothing is kept for it. The pool's eviction order is the free queue (front: evicted first).

- **Grow** (or the same size): every block keeps its id and its hashes; the free queue keeps
  its order, and the new blocks go right before the first cached block, where never-used
  blocks sit in a pool that never wrapped (vLLM prepends hash-less blocks and appends
  cached ones). After a history that never evicted, the pool is the one a fresh engine of
  the new size has after the same history: same ids, hashes, order.
- **Shrink**: the most recently used cached blocks that fit (the back of the queue) are kept;
  the others are evicted as vLLM evicts (from the front), with its ``BlockRemoved`` events
  when KV events are on. A kept block keeps its id when it exists in the new pool, else it
  takes the lowest id no kept block uses. The queue is the hash-less blocks, then the kept
  ones in their old order.

The hash → block map is rebuilt in its old insertion order, so a hash cached in two blocks
hits the same one as before. KV events still pending in the old pool move to the new one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from ...contract.declare import vllm_uses
from ...contract.variants import by_release

__all__ = ["CarryPlan", "PoolState", "apply_carry", "map_entries", "plan_carry", "read_pool"]


@attrs.frozen(kw_only=True)
class PoolState:
    """An idle block pool's prefix-cache state, as plain ids plus vLLM's hash keys.

    Attributes:
        num_blocks: the pool's blocks (block 0 is vLLM's null block).
        queue: the free queue, front (evicted first) to back.
        primary: block id -> (hash key, tokens it covers), for blocks with a primary hash.
        extras: block id -> further hash keys pointing to it (partial-prefix entries).
        entries: the hash -> block map as ``(key, block ids)`` in insertion order.
        events: KV events not yet taken from the old pool.
    """

    num_blocks: int
    queue: tuple[int, ...]
    primary: dict[int, tuple[Any, int | None]]
    extras: dict[int, frozenset[Any]]
    entries: tuple[tuple[Any, tuple[int, ...]], ...]
    events: tuple[Any, ...] = ()

    @property
    def cached(self) -> tuple[int, ...]:
        """Cached block ids in eviction order (front first)."""
        return tuple(b for b in self.queue if b in self.primary or b in self.extras)


@attrs.frozen(kw_only=True)
class CarryPlan:
    """What a resize that keeps the prefix cache moves.

    Attributes:
        moves: ``(old id, new id)`` per kept block, in eviction order.
        queue: the new pool's free queue (new ids, front first; every block but 0).
        evicted: old ids of cached blocks that did not fit (evicted front first).
        num_blocks: the new pool's blocks.
    """

    moves: tuple[tuple[int, int], ...]
    queue: tuple[int, ...]
    evicted: tuple[int, ...]
    num_blocks: int

    @property
    def old_ids(self) -> list[int]:
        return [o for o, _ in self.moves]

    @property
    def new_ids(self) -> list[int]:
        return [n for _, n in self.moves]


@vllm_uses(
    "resize",
    calls=(
        "vllm.v1.core.block_pool:BlockHashToBlockMap",
        "vllm.v1.core.block_pool:BlockPool",
        "vllm.v1.core.kv_cache_utils:FreeKVCacheBlockQueue.get_all_free_blocks",
        "vllm.v1.core.kv_cache_utils:KVCacheBlock",
    ),
)
def read_pool(pool: Any) -> PoolState | str:
    """``pool``'s prefix-cache state, or why it cannot be carried (a block is still held,
    or blocks wait for a KV connector to stop reading them)."""
    held = pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()
    if held:
        return f"{held} block(s) are still held by requests"
    if getattr(pool, "_reuse_watchers", None):
        return "blocks released to a KV connector are still being read"
    primary: dict[int, tuple[Any, int | None]] = {}
    for block in pool.blocks:
        if block.block_hash is not None and not block.is_null:
            primary[block.block_id] = (block.block_hash, block.block_hash_num_tokens)
    extras = {b: frozenset(keys) for b, keys in pool.cached_block_hashes_by_block.items() if keys}
    entries = map_entries(pool.cached_block_hash_to_block)
    return PoolState(
        num_blocks=pool.num_gpu_blocks,
        queue=tuple(b.block_id for b in pool.free_block_queue.get_all_free_blocks()),
        primary=primary,
        extras=extras,
        entries=tuple(entries),
        events=tuple(getattr(pool, "kv_event_queue", ())),
    )


@by_release("resize")
@vllm_uses("resize", mirrors=("vllm.v1.core.block_pool:BlockHashToBlockMap.insert",))
def map_entries(table: Any) -> list[tuple[Any, tuple[int, ...]]]:
    """The prefix cache's hash map as (key, block ids in insertion order): through 0.33 a
    key maps to its block, or to a dict of its blocks by id where several hold it."""
    entries = []
    for key, value in table._cache.items():
        ids = (value.block_id,) if hasattr(value, "block_id") else tuple(value)
        entries.append((key, ids))
    return entries


@map_entries.variant("0.34.0")
@vllm_uses(
    "resize",
    mirrors=(
        "vllm.v1.core.block_pool:BlockHashToBlockMap.__init__",
        "vllm.v1.core.block_pool:BlockHashToBlockMap.insert",
        "vllm.v1.core.block_pool:BlockHashToBlockMap.pop",
    ),
    release="0.34.0",
    replaces=("initpipe_vllm.live.carry.pool:map_entries",),
)
def _map_entries_0_34_0(table: Any) -> list[tuple[Any, tuple[int, ...]]]:
    """0.34's map holds a block id per key (``_cache``) and, for a key several blocks hold,
    all their ids in insertion order (``_dup_ids``, the first being ``_cache``'s; a pop
    promotes the next): re-inserting the ids in that order rebuilds the same map."""
    return [
        (key, tuple(table._dup_ids[key]) if key in table._dup_ids else (block_id,))
        for key, block_id in table._cache.items()
    ]


def plan_carry(state: PoolState, num_blocks: int) -> CarryPlan:
    """What a pool of ``num_blocks`` keeps of ``state`` (see the module's rules)."""
    cached = state.cached
    if num_blocks >= state.num_blocks:
        fresh = tuple(range(state.num_blocks, num_blocks))
        is_cached = set(cached)
        first = next((i for i, b in enumerate(state.queue) if b in is_cached), len(state.queue))
        queue = state.queue[:first] + fresh + state.queue[first:]
        return CarryPlan(
            moves=tuple((b, b) for b in cached), queue=queue, evicted=(), num_blocks=num_blocks
        )
    room = num_blocks - 1
    kept = cached[len(cached) - min(len(cached), room) :]
    evicted = cached[: len(cached) - len(kept)]
    stay = {b for b in kept if b < num_blocks}
    spare = iter(b for b in range(1, num_blocks) if b not in stay)
    moves = tuple((b, b if b in stay else next(spare)) for b in kept)
    taken = {n for _, n in moves}
    old_order = [b for b in state.queue if b < num_blocks and b not in taken]
    rest = sorted(set(range(1, num_blocks)) - taken - set(old_order))
    queue = (*old_order, *rest, *(n for _, n in moves))
    return CarryPlan(moves=moves, queue=queue, evicted=evicted, num_blocks=num_blocks)


@vllm_uses(
    "resize",
    calls=(
        "vllm.v1.core.block_pool:BlockPool._emit_block_removed_events",
        "vllm.v1.core.kv_cache_utils:FreeKVCacheBlockQueue",
        "vllm.v1.core.kv_cache_utils:KVCacheBlock.set_block_hash",
    ),
)
def apply_carry(pool: Any, state: PoolState, plan: CarryPlan) -> int:
    """Write ``plan`` into ``pool``, a new idle pool of ``plan.num_blocks`` blocks that
    vLLM just built; the number of cached blocks it holds afterwards."""
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue

    if pool.num_gpu_blocks != plan.num_blocks:
        raise ValueError(
            f"the carry was planned for {plan.num_blocks} blocks; the new pool has "
            f"{pool.num_gpu_blocks}"
        )
    blocks = pool.blocks
    to_new = dict(plan.moves)
    for old, new in plan.moves:
        if old in state.primary:
            key, tokens = state.primary[old]
            blocks[new].set_block_hash(key, num_tokens=tokens)
        if old in state.extras:
            pool.cached_block_hashes_by_block[new] = set(state.extras[old])
    for key, ids in state.entries:
        for old in ids:
            if old in to_new:
                pool.cached_block_hash_to_block.insert(key, blocks[to_new[old]])
    pool.free_block_queue = FreeKVCacheBlockQueue([blocks[b] for b in plan.queue])
    if getattr(pool, "enable_kv_cache_events", False):
        pool.kv_event_queue = list(state.events)
        pool._emit_block_removed_events(list(_evicted_keys(state, plan.evicted)))
    return len(plan.moves)


def _evicted_keys(state: PoolState, evicted: Iterable[int]) -> Iterable[Any]:
    for b in evicted:
        if b in state.primary:
            yield state.primary[b][0]
        yield from state.extras.get(b, ())
