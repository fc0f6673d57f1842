"""The steps every live transaction shares, on the driver (:mod:`.txn`).

What belongs here: the context a transaction's steps share (:class:`Live`, its
:class:`Clock`), the steps that change the KV cache on every rank and in the scheduler —
the pause (quiesce requests, reset the prefix cache), the ranks' teardown, KV phase and
warm-up (:mod:`.rank`, through ``collective_rpc``), the scheduler's rebuild
(:mod:`.replay`), the restore of the previous cache that undoes them — and the two commits
(serving, released). A room builds its transactions from them: the resize, release and
resume (:mod:`initpipe_vllm.live.resize.steps`), the resize that keeps the prefix cache
(its carry steps: :mod:`initpipe_vllm.live.carry.steps`) and the refit
(:mod:`initpipe_vllm.live.refit.engine`).

No step imports vLLM: what they need of it (vLLM's ``PauseState.PAUSED_ALL``, the
``collective_rpc`` call) arrives on the context from the room that drives it, which
declares those uses (the contract).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import attrs

from . import rank as ranks
from .records import (
    RankAllocation,
    RankFailure,
    RankRecord,
    RankRequests,
    RankTeardown,
    RankWarmUp,
    answered,
)
from .replay import Plan, rebuild_scheduler_kv, refuse
from .report import STEPS, RankReport
from .state import EngineState, released_figures, weights_version
from .txn import Step

__all__ = [
    "KV_PHASE",
    "PAUSE",
    "SCHEDULER",
    "TEARDOWN",
    "WARMUP",
    "Clock",
    "Live",
    "RankStepFailed",
    "check_runners_idle",
    "commit_released",
    "commit_serving",
    "flush_finished",
    "restore",
]

logger = logging.getLogger("vllm.initpipe")

R = TypeVar("R", bound=RankRecord)
#: a rank step's answer (timed by the rank where it has ``seconds``)
T = TypeVar("T", bound=RankRecord)


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
    """Seconds per step (a resize report's: :data:`~.report.STEPS`, each present; a refit's
    own steps are added as they run) and the whole call's start."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.steps: dict[str, float] = dict.fromkeys(STEPS, 0.0)

    def add(self, step: str, seconds: float) -> None:
        self.steps[step] = self.steps.get(step, 0.0) + seconds

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
    """What one live transaction works on (the context of its steps; a room adds its own).

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
        keep: the pause leaves the prefix cache alone (a resize that keeps it: the carry
            room's steps set its blocks aside); else the pause resets it.
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

    def on_ranks(
        self,
        step: str,
        func: Callable[..., Any],
        record: type[T],
        *args: Any,
        figures: Callable[[T], dict[str, Any]] | None = None,
    ) -> list[T]:
        """Run ``func`` on every rank, time it as the slowest rank's ``seconds``, add each
        answering rank's ``figures(answer)`` to its report; the answers, in rank order.

        Raises:
            RankStepFailed: a rank failed (the first in rank order), after every answer was
                read and counted.
        """
        answers = self.rpc(func, record, *args)
        self.clock.add(step, max((getattr(a, "seconds", 0.0) for a in answers), default=0.0))
        good = answered(answers)
        if figures is not None:
            for a in good:
                self.ranks[a.rank] = attrs.evolve(self.ranks[a.rank], **figures(a))
        bad = next((a for a in answers if isinstance(a, RankFailure)), None)
        if bad is not None:
            raise RankStepFailed(step, bad)
        return good


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


def flush_finished(core: Any) -> None:
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
            flush_finished(live.core)
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
        _remember_size(live.core, live.num_blocks, live.kv_cache_memory_bytes)


def restore(live: Live) -> None:
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


# -- the commits --------------------------------------------------------------------------
def commit_serving(live: Live) -> None:
    """The new cache serves; the user's pause state is back."""
    assert live.new is not None
    with live.clock.timed("resume"):
        live.st.state, live.st.resume_blocks = "serving", None
        live.st.bytes_per_rank = live.new.bytes_per_rank()
        live.st.cache_weights = weights_version(live.core)
        live.core.scheduler.set_pause_state(live.saved_pause)


def commit_released(live: Live) -> None:
    """Released: nothing is scheduled (``PAUSED_ALL``); the frontend refuses requests."""
    with live.clock.timed("resume"):
        st = live.st
        st.state, st.resume_blocks, st.bytes_per_rank = "released", live.before, ()
        st.user_pause = live.saved_pause
        st.cache_weights = weights_version(live.core)
        released_figures(live.core)


# -- the shared steps -----------------------------------------------------------------------
PAUSE: Step[Live] = Step(name="pause", do=_pause, undo=_unpause)
#: the old cache's teardown; its undo restores it (whatever later steps did)
TEARDOWN: Step[Live] = Step(name="teardown", do=_teardown, undo=restore)
KV_PHASE: Step[Live] = Step(name="kv_phase", do=_kv_phase)
WARMUP: Step[Live] = Step(name="warmup", do=_warm_up)
SCHEDULER: Step[Live] = Step(name="scheduler", do=_scheduler)
