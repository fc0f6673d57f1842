"""The scheduler side of a resize that keeps the prefix cache (``initpipe_vllm.live.carry.pool``),
on plain ids and on vLLM's own ``BlockPool`` objects (no engine).

The engine-level proof (bytes, outputs, stock engines) is ``test_resize_warm.py``; here each
rule of the carry is pinned on a case built to break it: where the new blocks go in the
eviction order, which blocks a shrink keeps and which ids they take, a hash cached in two
blocks (the map's insertion order decides which one hits), a block's partial-prefix
entries, the KV events of the evicted blocks.
"""

from __future__ import annotations

from typing import Any

import pytest

from initpipe_vllm.live.carry.pool import CarryPlan, PoolState, apply_carry, plan_carry, read_pool


def _state(num_blocks: int, queue: list[int], cached: list[int]) -> PoolState:
    return PoolState(
        num_blocks=num_blocks,
        queue=tuple(queue),
        primary={b: (f"h{b}", 4) for b in cached},
        extras={},
        entries=tuple((f"h{b}", (b,)) for b in cached),
    )


def test_a_grow_keeps_ids_and_puts_the_new_blocks_before_the_first_cached_block() -> None:
    state = _state(8, [5, 6, 7, 1, 2, 3, 4], cached=[1, 2, 3])
    plan = plan_carry(state, 11)
    assert plan.moves == ((1, 1), (2, 2), (3, 3))
    assert plan.queue == (5, 6, 7, 8, 9, 10, 1, 2, 3, 4)
    assert plan.evicted == ()


def test_a_grow_of_a_pool_with_nothing_cached_appends_the_new_blocks() -> None:
    plan = plan_carry(_state(4, [3, 1, 2], cached=[]), 6)
    assert plan.moves == () and plan.queue == (3, 1, 2, 4, 5)


def test_a_shrink_keeps_the_most_recent_that_fit_and_compacts_their_ids() -> None:
    # eviction order: 9 and 2 oldest; 7, 3, 8 newest; room for 3 in a pool of 4
    state = _state(10, [4, 5, 6, 1, 9, 2, 7, 3, 8], cached=[9, 2, 7, 3, 8])
    plan = plan_carry(state, 4)
    assert plan.evicted == (9, 2)
    assert plan.old_ids == [7, 3, 8]
    assert plan.new_ids[1] == 3  # an id the new pool has is kept
    assert sorted(plan.new_ids) == [1, 2, 3]
    assert plan.queue[-3:] == tuple(plan.new_ids)  # newest last, in their old order
    assert sorted(plan.queue) == [1, 2, 3]


def test_a_shrink_with_room_leaves_the_hashless_blocks_first() -> None:
    state = _state(10, [4, 5, 6, 1, 9, 2, 7, 3, 8], cached=[9, 8])
    plan = plan_carry(state, 6)
    assert plan.evicted == ()
    assert plan.moves == ((9, 1), (8, 2))  # neither id exists: the lowest free ones
    assert plan.queue == (4, 5, 3, 1, 2)  # the old hash-less order, then the kept


# -- on vLLM's BlockPool --------------------------------------------------------------------
def _pool(num_blocks: int, events: bool = False) -> Any:
    from vllm.v1.core.block_pool import BlockPool

    return BlockPool(num_blocks, True, 4, enable_kv_cache_events=events)


def _key(n: int, group: int = 0) -> Any:
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    return make_block_hash_with_group_id(n.to_bytes(32, "big"), group)  # type: ignore[arg-type]


def _cache(pool: Any, owners: dict[int, Any], extra: dict[int, Any] | None = None) -> None:
    """Allocate every block, give ``owners`` their hash (and ``extra`` a partial entry),
    free them all: cached ones last (as vLLM frees), in ``owners``' order."""
    blocks = pool.get_new_blocks(pool.num_gpu_blocks - 1)
    for block in blocks:
        if block.block_id in owners:
            pool._insert_block_hash(owners[block.block_id], block, num_tokens=4)
        if extra and block.block_id in extra:
            pool._insert_block_hash(extra[block.block_id], block, num_tokens=2)
    pool.free_blocks(
        [b for b in blocks if b.block_id not in owners] + [pool.blocks[b] for b in owners]
    )


def _view(pool: Any) -> dict[str, Any]:
    state = read_pool(pool)
    assert isinstance(state, PoolState)
    return {
        "queue": state.queue,
        "primary": state.primary,
        "extras": state.extras,
        "entries": state.entries,
    }


def test_a_grow_on_vllms_pool_gives_the_same_pool_plus_the_new_blocks() -> None:
    old = _pool(6)
    same = _key(7)  # one hash cached in two blocks: the first inserted hits
    _cache(old, {3: same, 1: _key(8), 4: same}, extra={1: _key(9)})
    state = read_pool(old)
    assert isinstance(state, PoolState)
    assert old.cached_block_hash_to_block.get_one_block(same).block_id == 3
    new = _pool(9)
    assert apply_carry(new, state, plan_carry(state, 9)) == 3
    got = _view(new)
    assert got["primary"] == state.primary and got["extras"] == state.extras
    assert got["entries"] == state.entries
    assert new.cached_block_hash_to_block.get_one_block(same).block_id == 3
    assert new.cached_block_hash_to_block.get_one_block(_key(9)).block_id == 1  # partial
    q = state.queue
    assert q[2:] == (3, 1, 4)  # hash-less first, then the cached in the order freed
    assert got["queue"] == (*q[:2], 6, 7, 8, *q[2:])
    assert new.get_num_free_blocks() == 8


def test_a_shrink_on_vllms_pool_moves_hashes_to_the_new_ids_and_reports_evictions() -> None:
    from vllm.distributed.kv_events import BlockRemoved

    old = _pool(8, events=True)
    _cache(old, {5: _key(1), 2: _key(2), 7: _key(3), 6: _key(4)})
    old.take_events()
    state = read_pool(old)
    assert isinstance(state, PoolState)
    new = _pool(4, events=True)
    plan = plan_carry(state, 4)
    assert plan.evicted == (5,)
    apply_carry(new, state, plan)
    moved = {b.block_id: b.block_hash for b in new.blocks if b.block_hash is not None}
    assert sorted(moved.values()) == sorted([_key(2), _key(3), _key(4)])
    assert moved[2] == _key(2)  # block 2 exists in the new pool: it keeps its id
    removed = [e for e in new.take_events() if isinstance(e, BlockRemoved)]
    assert len(removed) == 1


def test_a_pool_with_a_held_block_is_not_read() -> None:
    pool = _pool(4)
    pool.get_new_blocks(1)
    assert read_pool(pool) == "1 block(s) are still held by requests"


def test_a_plan_for_another_size_is_refused() -> None:
    state = _state(4, [1, 2, 3], cached=[])
    with pytest.raises(ValueError, match="planned for 6 blocks; the new pool has 4"):
        apply_carry(_pool(4), state, CarryPlan(moves=(), queue=(), evicted=(), num_blocks=6))
