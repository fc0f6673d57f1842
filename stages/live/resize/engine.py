"""The engine-core side of a resize, release and resume: check, plan, drive.

What belongs here: everything a resize does in the process that holds the scheduler —
its checks and plan with vLLM's own functions before anything changes (:func:`prepare`;
the replays are the core's :mod:`~initpipe_vllm.live.core.replay`), driving the
transaction the action names (:func:`resize`: :mod:`.steps`) and turning its failure into a
:class:`~initpipe_vllm.errors.ResizeError`, the KV cache's state now (:func:`kv_info`),
and the room's two ``EngineCore`` methods (:data:`METHODS`) on the core's entry
(:func:`~initpipe_vllm.live.core.entry.live_call`). Nothing the frontend does
(:mod:`.api`).
"""

from __future__ import annotations

import functools
import logging
import time
from concurrent.futures import Future
from typing import Any

import attrs

from ...contract.declare import vllm_uses
from ...errors import ResizeError
from ..carry.report import PrefixCacheCarry
from ..carry.steps import Resize
from ..core import rank as ranks
from ..core.entry import Method, answer, in_own_process, live_call, rank_statuses, rpc
from ..core.records import RankFailure, RankStatus
from ..core.replay import Plan, memory_shortfall, plan, plan_or_explain, refuse
from ..core.report import RankReport
from ..core.state import engine_state, failure_text, weights_version
from ..core.steps import Clock, RankStepFailed
from ..core.txn import TransactionFailed, drive
from .report import KVCacheInfo, ResizeReport
from .steps import TRANSACTIONS, WARM_RESIZE

__all__ = [
    "INFO_METHOD",
    "INFO_UTILITY",
    "METHODS",
    "RESIZE_METHOD",
    "RESIZE_UTILITY",
    "kv_info",
    "prepare",
    "resize",
]

logger = logging.getLogger("vllm.initpipe")

#: The utility methods this room adds to ``EngineCore`` (called by name).
RESIZE_METHOD = "initpipe_resize_kv_cache"
INFO_METHOD = "initpipe_kv_cache_info"


# -- the resize -----------------------------------------------------------------------------
def _failed(err: RankStepFailed, *, rolled_back: bool, action: str) -> ResizeError:
    status = err.failure
    where = f"stage {status.stage!r}" if status.stage else f"the {err.step} step"
    after = (
        "the engine went back to its previous state and keeps serving"
        if rolled_back
        else "the rollback failed too: the engine is left with its KV cache released and "
        "refuses requests; call resume_kv_cache() to retry, or restart it"
    )
    on_rank = "" if status.rank is None else f" on rank {status.rank}"
    return ResizeError(
        f"KV cache {action} failed at {where}{on_rank}: {status.error}; {after}",
        step=err.step if rolled_back else "rollback",
        stage=status.stage,
        rank=status.rank,
        reason=status.error,
        rolled_back=rolled_back,
    )


def _failure_of(failed: TransactionFailed) -> RankStepFailed:
    """The failure a ResizeError reports: a rank's, or else the engine core's own, which
    is reported at the ``scheduler`` step whichever step raised (as it always was)."""
    if isinstance(failed.cause, RankStepFailed):
        return failed.cause
    cause = f"{type(failed.cause).__name__}: {failed.cause}"
    return RankStepFailed("scheduler", RankFailure(rank=None, step="scheduler", error=cause))


@attrs.frozen
class _Prepared:
    """What a resize checked and planned before touching anything."""

    statuses: list[RankStatus]
    before: int
    old: Plan | None
    new: Plan | None
    num_blocks: int | None
    seconds: float
    keep: bool = False
    keep_refused: str | None = None


def _keep_refusal(core: Any, new: Plan) -> str | None:
    """Why this engine's prefix cache cannot be kept across a resize, known before the
    pause; None when it can be tried."""
    cache = core.vllm_config.cache_config
    if not cache.enable_prefix_caching:
        return "prefix caching is off (enable_prefix_caching=False): nothing is cached"
    if any(t.host_resident for t in new.scheduler_config.kv_cache_tensors):
        return "a host-resident (HiSparse) KV cache pool is not carried"
    now, computed = weights_version(core), engine_state(core).cache_weights
    if now != computed:
        return (
            f"the cached blocks were computed under weights version {computed!r}; the engine "
            f"now runs {now!r} (set without a refit): they would be stale"
        )
    return None


def prepare(
    core: Any,
    action: str,
    *,
    num_blocks: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    keep_prefix_cache: bool = False,
) -> _Prepared:
    """Every check and the plans, with no side effect (the refusals happen here).

    Raises:
        ResizeRefusedError: the state, the engine, the size or the memory refuses it.
    """
    start = time.perf_counter()
    st = engine_state(core)
    if action not in TRANSACTIONS:
        raise refuse("arguments", f"action {action!r}: expected one of {sorted(TRANSACTIONS)}")
    if st.state == "failed":
        raise refuse("state", f"{failure_text(st.failure)}; only a refit is accepted")
    if action == "resize" and st.state == "released":
        raise refuse("state", "the KV cache is released: call resume_kv_cache(num_blocks=...)")
    if action == "release" and st.state == "released":
        raise refuse("state", "the KV cache is already released")
    if action == "resume" and st.state != "released":
        raise refuse("state", "the KV cache is not released (resize it instead)")
    statuses = rank_statuses(core)
    before = 0 if st.state == "released" else int(core.scheduler.kv_cache_config.num_blocks)
    old = plan(core, num_blocks=before) if before else None
    new = None
    if action == "resume" and num_blocks is None and kv_cache_memory_bytes is None:
        num_blocks = st.resume_blocks
    if action != "release":
        new = plan_or_explain(
            core, num_blocks=num_blocks, kv_cache_memory_bytes=kv_cache_memory_bytes
        )
        short = memory_shortfall(statuses, new)
        if short is not None:
            raise refuse("memory", short)
    keep = action == "resize" and keep_prefix_cache
    refused = _keep_refusal(core, new) if keep and new is not None else None
    return _Prepared(
        statuses, before, old, new, num_blocks, time.perf_counter() - start, keep, refused
    )


@vllm_uses(
    "resize",
    calls=(
        "vllm.v1.core.sched.interface:PauseState",
        "vllm.v1.core.sched.scheduler:Scheduler.set_pause_state",
        "vllm.v1.core.sched.scheduler:Scheduler.pause_state",
    ),
)
def resize(
    core: Any,
    action: str,
    *,
    num_blocks: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    mode: str = "wait",
    aborted: tuple[str, ...] = (),
    prepared: _Prepared | None = None,
    prior_pause: Any = None,
    pause_s: float = 0.0,
) -> ResizeReport:
    """Resize, release or resume the engine's KV cache, synchronously. Requests holding KV
    blocks must be gone (aborted, or drained by vLLM's ``pause_scheduler``: then pass the
    pause state from before it as ``prior_pause`` and its duration as ``pause_s``).

    Raises:
        ResizeRefusedError: refused before anything changed.
        ResizeError: failed after; ``.rolled_back`` says whether the previous state is back.
    """
    from vllm.v1.core.sched.interface import PauseState

    clock = Clock()
    clock.add("pause", pause_s)
    if prepared is not None:  # planned (and paused) before this call: the total includes it
        clock.start -= pause_s + prepared.seconds
    st = engine_state(core)
    p = prepared or prepare(
        core, action, num_blocks=num_blocks, kv_cache_memory_bytes=kv_cache_memory_bytes
    )
    clock.add("plan", p.seconds)
    if prior_pause is None:
        prior_pause = core.scheduler.pause_state
    live = Resize(
        core=core,
        st=st,
        clock=clock,
        rpc=functools.partial(rpc, core),
        before=p.before,
        old=p.old,
        new=p.new,
        num_blocks=p.num_blocks,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        prior_pause=prior_pause,
        saved_pause=st.user_pause if st.state == "released" else prior_pause,
        paused_all=PauseState.PAUSED_ALL,
        ranks={s.rank: RankReport(rank=s.rank) for s in p.statuses},
        keep=p.keep,
        keep_refused=p.keep_refused,
    )
    txn = WARM_RESIZE if p.keep else TRANSACTIONS[action]
    if action == "resize" and not p.keep:
        live.prefix_cache = PrefixCacheCarry(kept=False, reason="keep_prefix_cache=False")
    try:
        drive(txn, live)  # a refusal of its pause propagates as it is
    except TransactionFailed as failed:
        err = _failed(_failure_of(failed), rolled_back=failed.rolled_back_cleanly, action=action)
        raise err from failed.cause
    ranks_out = tuple(r for _, r in sorted(live.ranks.items()))
    report = ResizeReport(
        action=action,  # type: ignore[arg-type]
        mode=mode,
        blocks_before=p.before,
        blocks_after=0 if p.new is None else p.new.num_blocks,
        bytes_freed=sum(r.bytes_freed for r in ranks_out),
        bytes_allocated=sum(r.bytes_allocated for r in ranks_out),
        total_s=time.perf_counter() - clock.start,
        steps=clock.steps,
        ranks=ranks_out,
        requests_waited=live.waited,
        requests_aborted=aborted,
        prefix_cache=live.prefix_cache,
    )
    st.last_report = report
    logger.info("initpipe: %s", report)
    return report


def kv_info(core: Any) -> KVCacheInfo:
    """The engine's KV cache now."""
    st = engine_state(core)
    cfg = core.scheduler.kv_cache_config
    released = st.state in ("released", "failed")
    per_rank = st.bytes_per_rank
    if (not released and not per_rank) or st.model_runner is None:
        statuses = rpc(core, ranks.rank_status, RankStatus)
        if not released and not per_rank:
            per_rank = tuple(s.kv_bytes if isinstance(s, RankStatus) else 0 for s in statuses)
        first = statuses[0]
        st.model_runner = first.model_runner if isinstance(first, RankStatus) else None
    return KVCacheInfo(
        state="resizing" if st.busy else st.state,
        num_blocks=0 if released else int(cfg.num_blocks),
        free_blocks=0
        if released
        else core.scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
        block_size=int(core.vllm_config.cache_config.block_size),
        bytes_per_rank=per_rank,
        resume_blocks=st.resume_blocks if released else None,
        last_report=st.last_report,
        model_runner=st.model_runner,
    )


# -- the EngineCore methods ----------------------------------------------------------------
def _resize_method(
    self: Any,
    action: str,
    num_blocks: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    mode: str = "wait",
    keep_prefix_cache: bool = False,
    aborted: list[str] | None = None,
) -> dict[str, Any] | Future[dict[str, Any]]:
    """The resize utility method (resize, release, resume) on the core's ``live_call``;
    ``aborted``: the requests the frontend aborted (in-process)."""
    kwargs: dict[str, Any] = {
        "num_blocks": num_blocks,
        "kv_cache_memory_bytes": kv_cache_memory_bytes,
    }
    in_own = in_own_process(self)

    def run(p: _Prepared, prior: Any, gone: tuple[str, ...], pause_s: float) -> ResizeReport:
        if not in_own or action == "resume":
            return resize(
                self, action, mode=mode, aborted=tuple(aborted or ()), prepared=p, **kwargs
            )
        return resize(
            self,
            action,
            mode=mode,
            aborted=gone,
            prepared=p,
            prior_pause=prior,
            pause_s=pause_s,
            **kwargs,
        )

    return live_call(
        self,
        action,
        mode=mode,
        pause_first=action != "resume",
        prepare=functools.partial(
            prepare, self, action, keep_prefix_cache=keep_prefix_cache, **kwargs
        ),
        run=run,
        answer=functools.partial(answer, self, errors=(ResizeError,)),
        refusal=refuse,
    )


def _info_method(self: Any) -> dict[str, Any]:
    return kv_info(self).to_dict()


#: The room's ``EngineCore`` methods (the frontend calls them; the plugin installs them).
RESIZE_UTILITY = Method(RESIZE_METHOD, _resize_method)
INFO_UTILITY = Method(INFO_METHOD, _info_method)
METHODS = (RESIZE_UTILITY, INFO_UTILITY)
