"""The engine-core side of a resize: the one module that patches vLLM's ``EngineCore``.

What belongs here: everything a resize does in the process that holds the scheduler —
planning the new ``KVCacheConfig`` with vLLM's own functions, quiescing requests, driving
every worker rank (:mod:`.rank`), rebuilding the scheduler's KV cache manager and updating
every capacity figure vLLM keeps — and nothing the frontend does (:mod:`.api`).

Why a patch: vLLM 0.32.0 offers no extension point here. The engine core may run in its
own process, where the only code that reaches it is ``load_general_plugins()`` in
``EngineCore.__init__`` and utility calls dispatched by method name
(``vllm/v1/engine/core.py``); and the ``Scheduler`` keeps its ``KVCacheManager`` (block
pool, prefix cache) with no way to swap it. So :func:`install` adds two methods to
``EngineCore`` — :data:`RESIZE_METHOD` and :data:`INFO_METHOD` — and nothing else; it
refuses a vLLM whose replayed code differs from every locked release (the contract,
:mod:`initpipe_vllm.contract`). The scheduler is kept (its queues and finished-request ids
live on it); its ``KVCacheManager`` is replaced and every attribute ``Scheduler.__init__``
derives from the KV config is recomputed, and the new cache is planned as
``EngineCore._initialize_kv_caches`` plans it: both replays live in :mod:`.replay`. Each
worker then gets its config through vLLM's ``Worker.initialize_from_config``.

The order of a resize — pause, steps, commit, or undo in reverse — is not here: a resize, a
release and a resume are step lists (:mod:`.steps`) on the one live-transaction driver
(:mod:`.txn`); ranks answer in typed records (:mod:`.records`). This module checks and
plans (:func:`prepare`), drives the transaction the action names (:func:`resize`) and turns
its failure into a :class:`~initpipe_vllm.errors.ResizeError`.

Results are plain dicts (``{"ok": True, "report": ...}`` or ``{"ok": False, "error":
...}``): a utility call's value crosses the process boundary as plain data, and an
exception would arrive as a bare message.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, NoReturn, TypeVar

import attrs

from ..contract.declare import vllm_uses
from ..errors import (
    RefitError,
    RefitRefusedError,
    ResizeError,
    ResizeRefusedError,
    UnsupportedRunnerError,
)
from ..hook import PIPELINED_WORKER
from . import rank as ranks
from .hold import ENV_HOLD, install_from_env
from .records import RankFailure, RankRecord, RankStatus
from .replay import Plan, memory_shortfall, plan, plan_or_explain, refuse
from .report import KVCacheInfo, PrefixCacheCarry, RankReport, ResizeReport
from .steps import (
    TRANSACTIONS,
    WARM_RESIZE,
    Clock,
    Live,
    RankStepFailed,
    engine_state,
    weights_version,
)
from .txn import TransactionFailed, drive

__all__ = [
    "FRONTEND_FIGURES",
    "INFO_METHOD",
    "PLUGIN_NAME",
    "REFIT_METHOD",
    "RESIZE_METHOD",
    "WEIGHTS_METHOD",
    "error_from_dict",
    "install",
    "kv_info",
    "prepare",
    "refit_error_from_dict",
    "register",
    "resize",
]

logger = logging.getLogger("vllm.initpipe")

#: The utility methods :func:`install` adds to ``EngineCore`` (called by name).
RESIZE_METHOD = "initpipe_resize_kv_cache"
INFO_METHOD = "initpipe_kv_cache_info"
REFIT_METHOD = "initpipe_refit"
WEIGHTS_METHOD = "initpipe_weights_info"

_SCHEDULERS = (
    "vllm.v1.core.sched.scheduler.Scheduler",
    "vllm.v1.core.sched.async_scheduler.AsyncScheduler",
)
#: KV connectors whose scheduler side follows a new KV cache manager (re-bound).
_CONNECTORS = ("ExampleConnector",)
R = TypeVar("R", bound=RankRecord)
_HOW_TO_START = (
    f'start the engine with worker_cls="{PIPELINED_WORKER}" (or INITPIPE_VLLM=1 in its environment)'
)


# -- errors as plain data -----------------------------------------------------------------
def _error_dict(err: ResizeError) -> dict[str, Any]:
    return {
        "type": type(err).__name__,
        "message": str(err),
        "step": err.step,
        "stage": err.stage,
        "rank": err.rank,
        "reason": err.reason,
        "rolled_back": err.rolled_back,
    }


def error_from_dict(data: dict[str, Any]) -> ResizeError:
    """The typed error a failed utility call described."""
    cls = ResizeRefusedError if data["type"] == "ResizeRefusedError" else ResizeError
    return cls(
        data["message"],
        step=data["step"],
        reason=data["reason"],
        stage=data["stage"],
        rank=data["rank"],
        rolled_back=data["rolled_back"],
    )


# -- checks -------------------------------------------------------------------------------
def _qualname(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _check_engine(
    core: Any,
    statuses: list[RankStatus | RankFailure],
    capabilities: tuple[str, ...] = ("resize",),
) -> list[RankStatus]:
    """Refuse an engine or a rank a resize (or a refit: ``capabilities``) cannot follow;
    the ranks' statuses, checked."""
    from ..contract.report import verdict

    for capability in capabilities:
        try:
            found = verdict(capability)  # type: ignore[arg-type]
        except Exception as err:  # an unreadable install: refused, with the cause
            raise refuse(
                "engine",
                f"initpipe could not read the installed vLLM's source to check its "
                f"contract ({type(err).__name__}: {err})",
            ) from None
        if not found.ok:
            raise refuse("engine", found.describe())
    engine_state(core).release = found.release
    parallel = core.vllm_config.parallel_config
    if parallel.data_parallel_size > 1:
        raise refuse(
            "engine",
            f"data_parallel_size={parallel.data_parallel_size}: data parallelism is not "
            "supported (each DP engine has its own scheduler); resize each engine separately",
        )
    if _qualname(core.scheduler) not in _SCHEDULERS:
        raise refuse("engine", f"scheduler {_qualname(core.scheduler)} is not vLLM's own")
    connector = core.scheduler.connector
    if connector is not None and type(connector).__name__ not in _CONNECTORS:
        raise refuse(
            "engine",
            f"KV connector {type(connector).__name__} cannot follow a new KV cache (supported: "
            f"none, {', '.join(_CONNECTORS)})",
        )
    if core.batch_queue:
        raise refuse("requests", "batches are in flight in the batch queue")
    checked: list[RankStatus] = []
    for st in statuses:
        if isinstance(st, RankFailure):
            raise refuse("engine", f"rank {st.rank} could not report: {st.error}")
        if not st.pipelined:
            raise refuse(
                "engine",
                f"rank {st.rank} runs {st.worker_class} (runner {st.runner_class}), "
                f"not initpipe's pipelined worker: {_HOW_TO_START}",
            )
        checked.append(st)
    return checked


def _workers_apart(core: Any) -> bool:
    """Whether the workers run in processes of their own (not in the engine core's)."""
    return type(core.model_executor).__name__ != "UniProcExecutor"


@vllm_uses(
    "resize",
    calls=("vllm.v1.engine.core:EngineCore.collective_rpc",),
)
def _rpc(core: Any, func: Callable[..., Any], record: type[R], *args: Any) -> list[R | RankFailure]:
    """``func`` on every rank; each answer read back as a ``record`` (or its failure)."""
    return [record.from_dict(a) for a in core.model_executor.collective_rpc(func, args=args)]


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
        from .refit_core import failure_text, weights_state

        raise refuse(
            "state", f"{failure_text(weights_state(core).failure)}; only a refit is accepted"
        )
    if action == "resize" and st.state == "released":
        raise refuse("state", "the KV cache is released: call resume_kv_cache(num_blocks=...)")
    if action == "release" and st.state == "released":
        raise refuse("state", "the KV cache is already released")
    if action == "resume" and st.state != "released":
        raise refuse("state", "the KV cache is not released (resize it instead)")
    statuses = _check_engine(core, _rpc(core, ranks.rank_status, RankStatus, _workers_apart(core)))
    st.model_runner = statuses[0].model_runner
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
    live = Live(
        core=core,
        st=st,
        clock=clock,
        rpc=functools.partial(_rpc, core),
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
        statuses = _rpc(core, ranks.rank_status, RankStatus)
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


# -- the EngineCore methods -----------------------------------------------------------------
#: Capacity figures the frontend's copy of the config learns once, at the handshake.
FRONTEND_FIGURES = (
    "num_gpu_blocks",
    "num_gpu_blocks_override",
    "kv_cache_memory_bytes",
    "kv_cache_size_tokens",
    "kv_cache_max_concurrency",
    "block_size",
)


def _answer(core: Any, run: Callable[[], ResizeReport]) -> dict[str, Any]:
    """A resize's outcome as plain data, with the figures the frontend must update."""
    try:
        report = run()
    except ResizeError as err:
        answer: dict[str, Any] = {"ok": False, "error": _error_dict(err)}
    else:
        answer = {"ok": True, "report": report.to_dict()}
    cache = core.vllm_config.cache_config
    answer["cache_config"] = {k: getattr(cache, k, None) for k in FRONTEND_FIGURES}
    answer["state"] = engine_state(core).state
    _refuse_adds_while_released(core)
    return answer


def _in_own_process(core: Any) -> bool:
    """An ``EngineCoreProc`` (busy loop, output queue), not the in-process ``EngineCore``."""
    return hasattr(core, "output_queue") and hasattr(core, "_idle_state_callbacks")


@vllm_uses(
    "resize",
    mirrors=("vllm.v1.engine.core:EngineCore.add_request",),
    calls=("vllm.v1.engine.core:EngineCoreProc._send_error_outputs_to_client",),
)
def _refuse_adds_while_released(core: Any) -> None:
    """In its own process, an engine core whose KV cache is released finishes every new
    request at once with an error output (another frontend, or one that skipped the API's
    guard, must not wait forever); the instance attribute goes away on resume."""
    if not _in_own_process(core):
        return
    state = engine_state(core).state
    if state == "serving":
        core.__dict__.pop("add_request", None)
        return
    why = (
        "the KV cache is released (resume_kv_cache)"
        if state == "released"
        else "the last weight refit failed (refit again)"
    )

    def add_request(request: Any, request_wave: int = 0) -> None:
        logger.warning("initpipe: request %s refused: %s", request.request_id, why)
        core._send_error_outputs_to_client([request.request_id], request.client_index)

    core.add_request = add_request


@vllm_uses(
    "resize",
    calls=("vllm.v1.engine.core:EngineCoreProc.pause_scheduler",),
)
def _live_call(
    self: Any,
    action: str,
    *,
    mode: str,
    pause_first: bool,
    prepare: Callable[[], Any],
    run: Callable[[Any, Any, tuple[str, ...], float], Any],
    answer: Callable[[Callable[[], Any]], dict[str, Any]],
    refusal: Callable[[str, str], Exception],
) -> dict[str, Any] | Future[dict[str, Any]]:
    """Any live transaction's entry in the engine core: one at a time (a second is
    refused), checked first (``prepare``, no side effect), then run. In-process (or with
    ``pause_first`` False: no request can hold KV blocks) it runs at once. In its own
    process, vLLM's ``pause_scheduler(mode)`` drains (``wait``) or aborts requests first and
    this returns a Future the busy loop answers once the pause completed — a utility that
    blocked here would stop the loop. ``run(prepared, prior_pause, aborted, pause_s)``."""
    st = engine_state(self)
    if st.busy is not None:
        running = st.busy
        return answer(
            functools.partial(
                _raise,
                refusal(
                    "state",
                    f"another {running}{'' if running == 'refit' else ' of the KV cache'} is "
                    f"running (state 'resizing'); this {action} was not started: retry once "
                    "it has answered",
                ),
            )
        )
    st.busy = action

    def done(fn: Callable[[], Any]) -> dict[str, Any]:
        try:
            return answer(fn)
        finally:
            st.busy = None

    try:
        prepared = prepare()
    except Exception as err:
        return done(functools.partial(_raise, err))
    if not pause_first or not _in_own_process(self):
        return done(lambda: run(prepared, None, (), 0.0))
    sched = self.scheduler
    prior = sched.pause_state
    gone = (
        tuple(r for r, q in sched.requests.items() if not q.is_finished())
        if mode == "abort"
        else ()
    )
    start = time.perf_counter()

    def go() -> Any:
        return run(prepared, prior, gone, time.perf_counter() - start)

    try:
        pending = self.pause_scheduler(mode=mode, clear_cache=False)
    except Exception as err:
        sched.set_pause_state(prior)
        return done(functools.partial(_raise, refusal("requests", str(err))))
    if pending is None:
        return done(go)
    out: Future[dict[str, Any]] = Future()

    def paused(f: Future[Any]) -> None:
        try:
            f.result()
        except Exception as err:
            sched.set_pause_state(prior)
            out.set_result(done(functools.partial(_raise, refusal("requests", str(err)))))
            _wake(self)
            return
        out.set_result(done(go))
        _wake(self)

    pending.add_done_callback(paused)
    return out


@vllm_uses(
    "resize",
    mirrors=("vllm.v1.engine.core:EngineCoreProc._process_input_queue",),
    calls=("vllm.v1.engine:EngineCoreRequestType",),
)
def _wake(core: Any) -> None:
    """Wake the busy loop. The pause's callback (which ran the transaction) runs among
    vLLM's idle-state callbacks, right before the loop blocks on its input queue; it checked
    for work before, when the requests queued meanwhile were paused. Without a message they
    would wait for the next one (a hang on a quiet server): vLLM's own no-op sentinel."""
    from vllm.v1.engine import EngineCoreRequestType

    core.input_queue.put_nowait((EngineCoreRequestType.WAKEUP, None))


def _resize_method(
    self: Any,
    action: str,
    num_blocks: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    mode: str = "wait",
    aborted: list[str] | None = None,
    keep_prefix_cache: bool = False,
) -> dict[str, Any] | Future[dict[str, Any]]:
    """The resize utility method (resize, release, resume) on :func:`_live_call`."""
    kwargs: dict[str, Any] = {
        "num_blocks": num_blocks,
        "kv_cache_memory_bytes": kv_cache_memory_bytes,
    }
    in_own = _in_own_process(self)

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

    return _live_call(
        self,
        action,
        mode=mode,
        pause_first=action != "resume",
        prepare=functools.partial(
            prepare, self, action, keep_prefix_cache=keep_prefix_cache, **kwargs
        ),
        run=run,
        answer=functools.partial(_answer, self),
        refusal=refuse,
    )


# -- the refit ------------------------------------------------------------------------------
def _refit_answer(core: Any, run: Callable[[], Any]) -> dict[str, Any]:
    """A refit's outcome as plain data, with what the frontend must update."""
    from .refit_core import failed_message

    try:
        receipt = run()
    except (RefitError, ResizeError) as err:
        if isinstance(err, ResizeError):  # a resize refusal from a shared step
            err = refit_refused(err.step, err.reason)
        answer: dict[str, Any] = {"ok": False, "error": _refit_error_dict(err)}
    else:
        answer = {"ok": True, "receipt": receipt.to_dict()}
    cache = core.vllm_config.cache_config
    answer["cache_config"] = {k: getattr(cache, k, None) for k in FRONTEND_FIGURES}
    answer["state"] = engine_state(core).state
    answer["failure"] = failed_message(core)
    _refuse_adds_while_released(core)
    return answer


def _refit_error_dict(err: RefitError) -> dict[str, Any]:
    return {
        "type": type(err).__name__,
        "message": str(err),
        "step": err.step,
        "rank": err.rank,
        "reason": err.reason,
        "serving": err.serving,
    }


def refit_error_from_dict(data: dict[str, Any]) -> RefitError:
    """The typed error a failed refit call described."""
    if data["type"] == "RefitRefusedError":
        return RefitRefusedError(
            data["message"], step=data["step"], reason=data["reason"], rank=data["rank"]
        )
    return RefitError(
        data["message"],
        step=data["step"],
        reason=data["reason"],
        rank=data["rank"],
        serving=data["serving"],
    )


def refit_refused(step: str, reason: str) -> RefitRefusedError:
    from .refit_core import refused

    return refused(step, reason)


def _check_for_refit(core: Any, _capability: str) -> list[RankStatus]:
    statuses = _check_engine(
        core,
        _rpc(core, ranks.rank_status, RankStatus, _workers_apart(core)),
        ("resize", "refit"),
    )
    engine_state(core).model_runner = statuses[0].model_runner
    from .refit_core import weights_state
    from .weights import RankPrecheck, rank_precheck

    ties: set[tuple[str, ...]] = set()
    for answer in _rpc(core, rank_precheck, RankPrecheck):
        if isinstance(answer, RankFailure):
            raise refit_refused("engine", f"rank {answer.rank}: {answer.error}")
        if answer.problems:
            raise refit_refused("engine", f"rank {answer.rank}: " + "; ".join(answer.problems))
        ties.update(tuple(g) for g in answer.ties)
    weights_state(core).ties = tuple(sorted(ties))
    return statuses


def _refit_method(
    self: Any, spec: dict[str, Any], mode: str = "wait", aborted: list[str] | None = None
) -> dict[str, Any] | Future[dict[str, Any]]:
    """The refit utility method. ``spec``: ``path`` or ``tensors`` (in-process only),
    ``num_blocks``, ``kv_cache_memory_bytes``, ``expected_digest``, ``probe`` (a dict),
    ``version``, ``transport``."""
    from . import refit_core as refits
    from .probe import Probe
    from .weights import Source

    source = Source(path=spec.get("path"), tensors=spec.get("tensors"))
    serving = engine_state(self).state == "serving"
    in_own = _in_own_process(self)
    digest = spec.get("expected_digest")

    def run(p: Any, prior: Any, gone: tuple[str, ...], pause_s: float) -> Any:
        return refits.refit(
            self,
            source,
            rpc=functools.partial(_rpc, self),
            prepared=p,
            expected_digest=None if digest is None else tuple(digest),
            probe=Probe.from_dict(spec.get("probe") or {}),
            version=spec.get("version"),
            transport=spec.get("transport", "folder"),
            kind=spec.get("kind"),
            mode=mode,
            aborted=gone if in_own else tuple(aborted or ()),
            prior_pause=prior,
            pause_s=pause_s,
        )

    return _live_call(
        self,
        "refit",
        mode=mode,
        pause_first=serving,
        prepare=functools.partial(
            refits.prepare,
            self,
            source,
            num_blocks=spec.get("num_blocks"),
            kv_cache_memory_bytes=spec.get("kv_cache_memory_bytes"),
            check_engine=_check_for_refit,
        ),
        run=run,
        answer=functools.partial(_refit_answer, self),
        refusal=refit_refused,
    )


def _weights_method(self: Any) -> dict[str, Any]:
    from .refit_core import info

    return info(self).to_dict()


def _raise(err: BaseException) -> NoReturn:
    raise err


def _info_method(self: Any) -> dict[str, Any]:
    return kv_info(self).to_dict()


@vllm_uses(
    "resize",
    mirrors=("vllm.v1.engine.core:EngineCoreProc._handle_client_request",),
    calls=("vllm.v1.engine.core:EngineCore",),
)
@functools.cache
def install() -> None:
    """Add the resize utility methods to vLLM's ``EngineCore`` (idempotent). They change
    nothing until called.

    Raises:
        UnsupportedRunnerError: the installed vLLM's engine-core and scheduler code that the
            resize replays differs from every release initpipe has locked (the contract).
    """
    from ..contract.report import verdict

    found = verdict("resize")  # read from the files: nothing of vLLM imported before it
    if not found.ok:
        raise UnsupportedRunnerError(f"live KV resize is not installed: {found.describe()}")
    from vllm.v1.engine.core import EngineCore

    setattr(EngineCore, RESIZE_METHOD, _resize_method)
    setattr(EngineCore, INFO_METHOD, _info_method)
    setattr(EngineCore, REFIT_METHOD, _refit_method)
    setattr(EngineCore, WEIGHTS_METHOD, _weights_method)


#: The ``vllm.general_plugins`` entry point's name (``VLLM_PLUGINS`` must include it).
PLUGIN_NAME = "initpipe_resize"


def register() -> None:
    """``vllm.general_plugins`` entry point ``initpipe_resize``: :func:`install`, in every
    process (the engine core's own process is reached by nothing else), and the test
    facility :mod:`.hold` where ``INITPIPE_HOLD_STEPS`` is set. Never raises: on another
    vLLM it installs no resize (a resize then says why)."""
    try:
        install()
    except UnsupportedRunnerError as err:
        logger.debug("initpipe: live KV resize not installed: %s", err)
    except Exception:
        logger.warning("initpipe: live KV resize not installed", exc_info=True)
    if install_from_env():  # a test facility: INITPIPE_HOLD_STEPS (see .hold)
        logger.warning("initpipe: engine core steps held while %s exists", os.environ[ENV_HOLD])
