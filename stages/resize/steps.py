"""Resize, release and resume as step lists on the live-transaction driver (:mod:`.txn`).

What belongs here: the state a resize keeps on the engine core (:class:`EngineState`), the
context its steps share (:class:`Live`), the steps themselves — the pause (quiesce requests,
reset the prefix cache), the ranks' teardown, KV phase and warm-up (:mod:`.rank`, through
``collective_rpc``), the scheduler's rebuild (:mod:`.replay`), the restore of the previous
cache that undoes them, the two commits — and the three transactions built from them:
:data:`RESIZE`, :data:`RELEASE`, :data:`RESUME`. Checks and planning come before (and the
``EngineCore`` patch around) in :mod:`.engine`.

A new live change is a new step list: the weight refit (:mod:`.refit_core`) is one, and so
is :data:`WARM_RESIZE`, the resize that keeps the prefix cache: its pause leaves the cache
alone, its ``carry`` step sets the kept blocks aside on every rank (:mod:`.kv_copy`; the
plan is :mod:`.carry`'s), its ``unstash`` step writes them into the new cache after the
warm-up, and the scheduler step rebuilds the pool to hold them. It sets aside only the kept
blocks rather than building the new cache beside the old one (the core's
``Run.prepare_kv_cache``): the peak is the larger cache plus the kept bytes, not both caches.
No step imports vLLM: what they need of it (vLLM's ``PauseState.PAUSED_ALL``, the
``collective_rpc`` call) arrives on the context from :func:`~.engine.resize`, which
declares those uses (the contract).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal, Protocol, TypeVar

import attrs

from ..contract.declare import vllm_uses
from . import kv_copy
from . import rank as ranks
from .carry import CarryPlan, PoolState, apply_carry, plan_carry, read_pool
from .records import (
    RankAllocation,
    RankFailure,
    RankRecord,
    RankRequests,
    RankStash,
    RankTeardown,
    RankUnstash,
    RankWarmUp,
    answered,
)
from .replay import Plan, rebuild_scheduler_kv, refuse
from .report import STEPS, PrefixCacheCarry, RankReport, ResizeReport
from .txn import Step, Transaction

__all__ = [
    "RELEASE",
    "RESIZE",
    "RESUME",
    "TRANSACTIONS",
    "WARM_RESIZE",
    "Clock",
    "EngineState",
    "Live",
    "RankStepFailed",
    "check_runners_idle",
    "engine_state",
    "released_figures",
    "weights_version",
]

logger = logging.getLogger("vllm.initpipe")

R = TypeVar("R", bound=RankRecord)
#: the answers of the rank steps, each timed by the rank (``seconds``)
T = TypeVar("T", RankTeardown, RankAllocation, RankWarmUp, RankStash, RankUnstash)


# -- state kept on the engine core --------------------------------------------------------
@attrs.define
class EngineState:
    """What a resize keeps on the engine core between calls."""

    #: ``failed``: a weight refit failed; no KV cache, requests refused until one succeeds
    state: Literal["serving", "released", "failed"] = "serving"
    resume_blocks: int | None = None
    #: the pause state the user had set before a release (restored by the resume)
    user_pause: Any = None
    bytes_per_rank: tuple[int, ...] = ()
    last_report: ResizeReport | None = None
    #: the action accepted and not yet answered (a second one is refused meanwhile)
    busy: str | None = None
    #: which vLLM model runner the workers run ("v1" or "v2"), read from rank 0 once
    model_runner: str | None = None
    #: the vLLM release the contract matched (``Verdict.release``), read at each check
    release: str | None = None
    #: the weights version (vLLM's ``get_weight_version()``) the prefix cache's blocks were
    #: computed under: vLLM's start value, then the version at each transaction that
    #: emptied or kept the cache (a refit's new one)
    cache_weights: str = "default"


def engine_state(core: Any) -> EngineState:
    """``core``'s resize state (created serving on first use)."""
    st = getattr(core, "_initpipe_kv_state", None)
    if st is None:
        st = core._initpipe_kv_state = EngineState()
    return st


@vllm_uses("resize", calls=("vllm.v1.engine.core:EngineCore.get_weight_version",))
def weights_version(core: Any) -> str:
    """vLLM's weights version of the engine (``EngineCore.get_weight_version``)."""
    return str(core.get_weight_version())


def released_figures(core: Any) -> None:
    """While released the engine reports no KV capacity."""
    cache = core.vllm_config.cache_config
    cache.num_gpu_blocks = 0
    cache.kv_cache_size_tokens = 0
    cache.kv_cache_max_concurrency = 0.0


def _remember_size(core: Any, num_blocks: int | None, kv_cache_memory_bytes: int | None) -> None:
    """The engine's config now says what a fresh engine of this size would be started with."""
    cache = core.vllm_config.cache_config
    if num_blocks is not None:
        cache.num_gpu_blocks_override = num_blocks
    else:
        cache.num_gpu_blocks_override = None
        cache.kv_cache_memory_bytes = kv_cache_memory_bytes


# -- the context the steps share ----------------------------------------------------------
class Clock:
    """Seconds per report step (:data:`~.report.STEPS`) and the whole call's start."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.steps: dict[str, float] = dict.fromkeys(STEPS, 0.0)

    def add(self, step: str, seconds: float) -> None:
        self.steps[step] += seconds

    @contextlib.contextmanager
    def timed(self, step: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add(step, time.perf_counter() - t)


class Rpc(Protocol):
    """``collective_rpc`` of a rank function, its answers read as ``record``s."""

    def __call__(
        self, func: Callable[..., Any], record: type[R], *args: Any
    ) -> list[R | RankFailure]: ...


@attrs.define(kw_only=True)
class Live:
    """What one resize, release or resume works on (the context of its steps).

    Attributes:
        core: vLLM's ``EngineCore``.
        st: its :class:`EngineState`.
        clock: the report's timings.
        rpc: runs a rank function on every rank (:class:`Rpc`).
        before / old: the blocks and the plan of the cache in place (0 / None: released).
        new: the plan of the cache to build (None: a release).
        num_blocks / kv_cache_memory_bytes: the size asked for (kept on the config).
        prior_pause: the scheduler's pause state before this call paused it.
        saved_pause: the pause state to give back when the engine serves again.
        paused_all: vLLM's ``PauseState.PAUSED_ALL``.
        ranks: each rank's report so far.
        waited: requests queued during the pause (they run on the new cache).
        keep: keep the prefix cache (``keep_prefix_cache``); ``keep_refused``: why it
            cannot be, known before the pause (then it is emptied, and the report says why).
        pool: the old pool's prefix-cache state, read after the pause (a kept cache).
        carry: what the new pool keeps (None: the prefix cache is emptied).
        prefix_cache: the report's account of the prefix cache.
    """

    core: Any
    st: EngineState
    clock: Clock
    rpc: Rpc
    before: int
    old: Plan | None
    new: Plan | None
    num_blocks: int | None
    kv_cache_memory_bytes: int | None
    prior_pause: Any
    saved_pause: Any
    paused_all: Any
    ranks: dict[int, RankReport]
    waited: tuple[str, ...] = ()
    keep: bool = False
    keep_refused: str | None = None
    pool: PoolState | None = None
    carry: CarryPlan | None = None
    prefix_cache: PrefixCacheCarry | None = None

    def on_ranks(
        self,
        step: str,
        func: Callable[..., Any],
        record: type[T],
        *args: Any,
        figures: Callable[[T], dict[str, Any]],
    ) -> None:
        """Run ``func`` on every rank, time it as the slowest rank's ``seconds`` and add
        each answering rank's ``figures(answer)`` to its report.

        Raises:
            RankStepFailed: a rank failed (the first in rank order), after every answer was
                read and counted.
        """
        answers = self.rpc(func, record, *args)
        self.clock.add(step, max(a.seconds for a in answers))
        for a in answered(answers):
            self.ranks[a.rank] = attrs.evolve(self.ranks[a.rank], **figures(a))
        bad = next((a for a in answers if isinstance(a, RankFailure)), None)
        if bad is not None:
            raise RankStepFailed(step, bad)


class RankStepFailed(Exception):
    """A rank reported a failure at ``step`` (a ResizeError once rolled back).

    Attributes:
        step: the step.
        failure: the failing rank's answer (``rank`` None: the engine core's own step).
    """

    def __init__(self, step: str, failure: RankFailure) -> None:
        super().__init__(failure.error)
        self.step, self.failure = step, failure


# -- the pause ----------------------------------------------------------------------------
def _held_requests(sched: Any) -> list[str]:
    held = [r.request_id for r in sched.running]
    held += [r.request_id for r in sched.kv_holding_waiting]
    return held


def check_runners_idle(answers: list[RankRequests | RankFailure]) -> None:
    """Refuse unless every rank answered and its runner holds no request (a rank that
    could not say counts as busy: its state is unknown)."""
    for a in answers:
        if isinstance(a, RankFailure):
            raise refuse("requests", f"rank {a.rank} could not report its requests: {a.error}")
        if a.requests:
            raise refuse("requests", f"rank {a.rank}'s runner still holds requests {a.requests}")


def _flush_finished(core: Any) -> None:
    """Let the runners drop finished requests (vLLM tells them in the next step), with
    nothing scheduled: the scheduler is ``PAUSED_ALL`` here. In its own process the engine
    core's outputs go to its output queue, as its busy loop would send them."""
    sched = core.scheduler
    queue = getattr(core, "output_queue", None)
    for _ in range(4):
        if not sched.has_finished_requests():
            return
        outputs, _executed = core.step()
        if queue is not None:
            for output in (outputs or {}).items():
                queue.put_nowait(output)


def _pause(live: Live) -> None:
    """Nothing may hold KV blocks and the runners must hold no request; then the prefix
    cache (of the old cache) is reset. Refuses, with the pause lifted, when that fails."""
    sched = live.core.scheduler
    with live.clock.timed("pause"):
        held = _held_requests(sched)
        if held:
            raise refuse(
                "requests",
                f"requests {held} hold KV blocks; in-process a resize cannot wait for them: "
                "let them finish (LLM.wait_for_completion()) or pass mode='abort'",
            )
        live.waited = tuple(r.request_id for r in sched.waiting)
        sched.set_pause_state(live.paused_all)
        try:
            _flush_finished(live.core)
            check_runners_idle(live.rpc(ranks.rank_requests, RankRequests))
            if live.before and not live.keep and not sched.reset_prefix_cache():
                raise refuse("requests", "the prefix cache could not be reset")
        except BaseException:
            sched.set_pause_state(live.prior_pause)
            raise


def _unpause(live: Live) -> None:
    """After a rollback: the user's pause state back if the engine serves, else paused."""
    live.st.user_pause = live.saved_pause
    serving = live.st.state == "serving"
    live.core.scheduler.set_pause_state(live.saved_pause if serving else live.paused_all)


# -- the steps ----------------------------------------------------------------------------
def _carry(live: Live) -> None:
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
        answers = live.rpc(
            kv_copy.rank_stash, RankStash, carry.old_ids, list(live.new.bytes_per_rank())
        )
        live.clock.add("carry", max(a.seconds for a in answers))
        for a in answered(answers):
            live.ranks[a.rank] = attrs.evolve(live.ranks[a.rank], stash_bytes=a.bytes)
        bad = next((a for a in answers if isinstance(a, RankFailure)), None)
        if bad is not None:
            raise RankStepFailed("carry", bad)
        stashed = max(a.bytes for a in answered(answers))
        refused = next((a.refused for a in answered(answers) if a.refused), None)
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


def _drop_stash(live: Live) -> None:
    """Every rank forgets its stash (answers read, failures logged: nothing to undo)."""
    for a in live.rpc(kv_copy.rank_drop_stash, RankUnstash):
        if isinstance(a, RankFailure):
            logger.warning("initpipe: rank %s could not drop its KV stash: %s", a.rank, a.error)
    for r, report in live.ranks.items():
        live.ranks[r] = attrs.evolve(report, stash_bytes=0)


def _unstash(live: Live) -> None:
    """Every rank writes its kept blocks into the new cache at their new ids."""
    if live.carry is None or not live.carry.moves:
        return
    live.on_ranks(
        "carry", kv_copy.rank_unstash, RankUnstash, live.carry.new_ids, figures=lambda a: {}
    )


def _teardown(live: Live) -> None:
    """Every rank releases its KV cache."""
    live.on_ranks(
        "teardown",
        ranks.rank_teardown,
        RankTeardown,
        figures=lambda a: {
            "bytes_freed": a.bytes_freed,
            "teardown_s": a.seconds,
            "rss_before": a.rss_before,
            "rss_torn_down": a.rss_after,
            "rss_after": a.rss_after,
        },
    )


def _kv_phase(live: Live) -> None:
    """Every rank runs its KV phase for the new plan."""
    assert live.new is not None  # a step of the transactions that plan a cache
    live.on_ranks(
        "kv_phase",
        ranks.rank_initialize,
        RankAllocation,
        live.new.worker_configs,
        figures=lambda a: {"bytes_allocated": a.bytes_allocated, "kv_phase_s": a.seconds},
    )


def _warm_up(live: Live) -> None:
    """Every rank warms up on its new cache (re-captures its CUDA graphs)."""
    live.on_ranks(
        "warmup",
        ranks.rank_warm_up,
        RankWarmUp,
        figures=lambda a: {"warmup_s": a.seconds, "rss_after": a.rss_after},
    )


def _scheduler(live: Live) -> None:
    """The scheduler's KV cache manager follows the new cache; the config remembers it."""
    assert live.new is not None
    with live.clock.timed("scheduler"):
        rebuild_scheduler_kv(live.core, live.new)
        if live.carry is not None and live.pool is not None:
            pool = live.core.scheduler.kv_cache_manager.block_pool
            apply_carry(pool, live.pool, live.carry)
        _remember_size(live.core, live.num_blocks, live.kv_cache_memory_bytes)


def _restore(live: Live) -> None:
    """Back to the previous cache on every rank (or to released, when there was none).
    The scheduler is rebuilt for it (a no-op in effect when the failure came before the
    scheduler step). When that fails too, the engine is left released, and this raises."""
    core, old, st = live.core, live.old, live.st
    try:
        for torn in live.rpc(ranks.rank_teardown, RankTeardown):
            if isinstance(torn, RankFailure):
                logger.error(
                    "initpipe: rollback teardown failed on rank %s: %s", torn.rank, torn.error
                )
                raise RuntimeError(torn.error)
        if old is None:
            st.state, st.bytes_per_rank = "released", ()
            released_figures(core)
            return
        for func, record, args in (
            (ranks.rank_initialize, RankAllocation, (old.worker_configs,)),
            (ranks.rank_warm_up, RankWarmUp, ()),
        ):
            for a in live.rpc(func, record, *args):
                if isinstance(a, RankFailure):
                    logger.error("initpipe: rollback failed on rank %s: %s", a.rank, a.error)
                    raise RuntimeError(a.error)
        rebuild_scheduler_kv(core, old)
        st.state, st.bytes_per_rank = "serving", old.bytes_per_rank()
        st.cache_weights = weights_version(core)
    except Exception:
        logger.exception("initpipe: the KV cache could not be rolled back")
        released_figures(core)
        st.state, st.resume_blocks, st.bytes_per_rank = (
            "released",
            old.num_blocks if old else st.resume_blocks,
            (),
        )
        raise


def _restore_warm(live: Live) -> None:
    """:func:`_restore`, then the kept blocks back where they were, when every rank still
    holds its stash: a failed resize that kept the prefix cache loses none of what it kept
    (a shrink's evicted blocks stay evicted). Otherwise the restored cache starts empty."""
    _restore(live)
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


# -- the commits --------------------------------------------------------------------------
def _commit_serving(live: Live) -> None:
    """The new cache serves; the user's pause state is back."""
    assert live.new is not None
    with live.clock.timed("resume"):
        live.st.state, live.st.resume_blocks = "serving", None
        live.st.bytes_per_rank = live.new.bytes_per_rank()
        live.st.cache_weights = weights_version(live.core)
        live.core.scheduler.set_pause_state(live.saved_pause)


def _commit_released(live: Live) -> None:
    """Released: nothing is scheduled (``PAUSED_ALL``); the frontend refuses requests."""
    with live.clock.timed("resume"):
        st = live.st
        st.state, st.resume_blocks, st.bytes_per_rank = "released", live.before, ()
        st.user_pause = live.saved_pause
        st.cache_weights = weights_version(live.core)
        released_figures(live.core)


# -- the transactions ---------------------------------------------------------------------
PAUSE: Step[Live] = Step(name="pause", do=_pause, undo=_unpause)
#: the old cache's teardown; its undo restores it (whatever later steps did)
TEARDOWN: Step[Live] = Step(name="teardown", do=_teardown, undo=_restore)
KV_PHASE: Step[Live] = Step(name="kv_phase", do=_kv_phase)
WARMUP: Step[Live] = Step(name="warmup", do=_warm_up)
SCHEDULER: Step[Live] = Step(name="scheduler", do=_scheduler)

RESIZE: Transaction[Live] = Transaction(
    name="resize",
    pause=PAUSE,
    steps=(TEARDOWN, KV_PHASE, WARMUP, SCHEDULER),
    commit=_commit_serving,
)
RELEASE: Transaction[Live] = Transaction(
    name="release", pause=PAUSE, steps=(TEARDOWN,), commit=_commit_released
)
#: no cache to tear down: the KV phase's undo goes back to released
RESUME: Transaction[Live] = Transaction(
    name="resume",
    pause=PAUSE,
    steps=(attrs.evolve(KV_PHASE, undo=_restore), WARMUP, SCHEDULER),
    commit=_commit_serving,
)
#: a resize that keeps the prefix cache: the kept blocks are set aside before the teardown
#: and written back after the warm-up (which may write into the new cache), before the
#: scheduler's pool is rebuilt to hold them; a rollback writes them back into the old cache
WARM_RESIZE: Transaction[Live] = Transaction(
    name="resize",
    pause=PAUSE,
    steps=(
        Step(name="carry", do=_carry, undo=_drop_stash),
        attrs.evolve(TEARDOWN, undo=_restore_warm),
        KV_PHASE,
        WARMUP,
        Step(name="unstash", do=_unstash),
        SCHEDULER,
    ),
    commit=_commit_serving,
)
#: every live transaction on the KV cache, by the action that asks for it
TRANSACTIONS: dict[str, Transaction[Live]] = {t.name: t for t in (RESIZE, RELEASE, RESUME)}
