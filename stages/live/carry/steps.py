"""A resize that keeps the prefix cache, as steps on the live-transaction driver.

What belongs here: the context of a resize (:class:`Resize`: the shared one plus what the
carry works on) and the steps that carry the prefix cache — ``carry`` (read the old pool,
plan what the new size keeps: :mod:`.pool`; every rank sets those blocks' bytes aside:
:mod:`.kv_copy`), ``unstash`` (every rank writes them into the new cache after the
warm-up), the scheduler step that rebuilds the pool to hold them, and the teardown's undo
that writes them back into the old cache. It sets aside only the kept blocks rather than
building the new cache beside the old one (the core's ``Run.prepare_kv_cache``): the peak
is the larger cache plus the kept bytes, not both caches. The resize room builds its
``WARM_RESIZE`` transaction from these steps and the core's.
"""

from __future__ import annotations

import logging

import attrs

from ..core.records import RankFailure, RankStash, RankUnstash
from ..core.steps import SCHEDULER, TEARDOWN, Live, restore
from ..core.txn import Step
from . import kv_copy
from .pool import CarryPlan, PoolState, apply_carry, plan_carry, read_pool
from .report import PrefixCacheCarry

__all__ = ["CARRY", "SCHEDULER_KEEPING", "TEARDOWN_KEEPING", "UNSTASH", "Resize"]

logger = logging.getLogger("vllm.initpipe")


@attrs.define(kw_only=True)
class Resize(Live):
    """What one resize, release or resume works on: the shared context plus the carry's.

    Attributes:
        keep_refused: why the prefix cache cannot be kept, known before the pause (then it
            is emptied, and the report says why).
        pool: the old pool's prefix-cache state, read after the pause (a kept cache).
        carry: what the new pool keeps (None: the prefix cache is emptied).
        prefix_cache: the report's account of the prefix cache.
    """

    keep_refused: str | None = None
    pool: PoolState | None = None
    carry: CarryPlan | None = None
    prefix_cache: PrefixCacheCarry | None = None


def _carry(live: Resize) -> None:
    """Keep the prefix cache: read the old pool, plan what the new size keeps and have every
    rank set those blocks' bytes aside. Where that cannot be (the reason known before the
    pause, a pool that cannot be read, a rank whose memory cannot hold its stash), the
    prefix cache is emptied instead, as a plain resize empties it, and the report says why."""
    assert live.new is not None
    sched = live.core.scheduler
    reason = live.keep_refused
    with live.clock.timed("carry"):
        state = read_pool(sched.kv_cache_manager.block_pool) if reason is None else reason
        if isinstance(state, str):
            reason = state
        else:
            live.pool, live.carry = state, plan_carry(state, live.new.num_blocks)
    carry = live.carry
    stashed = 0
    if carry is not None and carry.moves:
        answers = live.on_ranks(
            "carry",
            kv_copy.rank_stash,
            RankStash,
            carry.old_ids,
            list(live.new.bytes_per_rank()),
            figures=lambda a: {"stash_bytes": a.bytes},
        )
        stashed = max(a.bytes for a in answers)
        refused = next((a.refused for a in answers if a.refused), None)
        if refused is not None:
            _drop_stash(live)
            reason, live.carry, live.pool = refused, None, None
    if live.carry is None:
        with live.clock.timed("carry"):
            if not sched.reset_prefix_cache():
                raise RuntimeError("the prefix cache could not be reset")
        live.prefix_cache = PrefixCacheCarry(kept=False, reason=reason)
        return
    assert live.pool is not None
    live.prefix_cache = PrefixCacheCarry(
        kept=True,
        cached_before=len(live.pool.cached),
        blocks_kept=len(live.carry.moves),
        blocks_evicted=len(live.carry.evicted),
        bytes_copied=stashed,
    )


def _drop_stash(live: Resize) -> None:
    """Every rank forgets its stash (answers read, failures logged: nothing to undo)."""
    for a in live.rpc(kv_copy.rank_drop_stash, RankUnstash):
        if isinstance(a, RankFailure):
            logger.warning("initpipe: rank %s could not drop its KV stash: %s", a.rank, a.error)
    for r, report in live.ranks.items():
        live.ranks[r] = attrs.evolve(report, stash_bytes=0)


def _unstash(live: Resize) -> None:
    """Every rank writes its kept blocks into the new cache at their new ids."""
    if live.carry is None or not live.carry.moves:
        return
    live.on_ranks(
        "carry", kv_copy.rank_unstash, RankUnstash, live.carry.new_ids, figures=lambda a: {}
    )


def _restore_warm(live: Resize) -> None:
    """:func:`_restore`, then the kept blocks back where they were, when every rank still
    holds its stash: a failed resize that kept the prefix cache loses none of what it kept
    (a shrink's evicted blocks stay evicted). Otherwise the restored cache starts empty."""
    restore(live)
    carry, state = live.carry, live.pool
    if carry is None or state is None or not carry.moves or live.st.state != "serving":
        return
    back = CarryPlan(
        moves=tuple((o, o) for o, _ in carry.moves),
        queue=state.queue,
        evicted=carry.evicted,
        num_blocks=state.num_blocks,
    )
    answers = live.rpc(kv_copy.rank_unstash, RankUnstash, back.new_ids)
    failed = [a for a in answers if isinstance(a, RankFailure)]
    if failed:
        logger.warning(
            "initpipe: the kept prefix cache could not be written back on rollback (rank %s: "
            "%s); the restored cache starts empty",
            failed[0].rank,
            failed[0].error,
        )
        return
    apply_carry(live.core.scheduler.kv_cache_manager.block_pool, state, back)


def _scheduler_keeping(live: Resize) -> None:
    """The core's scheduler step, then the kept blocks' state written into the new pool."""
    SCHEDULER.do(live)
    if live.carry is not None and live.pool is not None:
        with live.clock.timed("scheduler"):
            pool = live.core.scheduler.kv_cache_manager.block_pool
            apply_carry(pool, live.pool, live.carry)


CARRY: Step[Resize] = Step(name="carry", do=_carry, undo=_drop_stash)
#: the core's teardown, whose undo also writes the kept blocks back into the old cache
TEARDOWN_KEEPING: Step[Resize] = Step(name=TEARDOWN.name, do=TEARDOWN.do, undo=_restore_warm)
UNSTASH: Step[Resize] = Step(name="unstash", do=_unstash)
SCHEDULER_KEEPING: Step[Resize] = Step(name="scheduler", do=_scheduler_keeping)
