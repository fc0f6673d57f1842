"""The engine-core entry of every live transaction: the one module that patches vLLM's
``EngineCore``.

What belongs here: what every room's utility method does in the process that holds the
scheduler, written once — the check that the engine and every rank can follow a live
change (:func:`check_engine`), ``collective_rpc`` read back as typed records (:func:`rpc`),
one transaction at a time with the pause first (:func:`live_call`), the answer as plain
data with the figures and state the frontend applies (:func:`answer`), the typed errors as
plain data and back (:func:`error_dict`, :func:`error_from_dict`), new requests refused
while the KV cache is released or a refit failed, and :func:`install`, which adds the
rooms' :class:`Method`\\ s to ``EngineCore``.

Why a patch: vLLM 0.32.0 offers no extension point here. The engine core may run in its
own process, where the only code that reaches it is ``load_general_plugins()`` in
``EngineCore.__init__`` and utility calls dispatched by method name
(``vllm/v1/engine/core.py``). So :func:`install` adds the rooms' methods to ``EngineCore``
and nothing else; it refuses a vLLM whose replayed code differs from every locked release
(the contract, :mod:`initpipe_vllm.contract`).

Results are plain dicts (``{"ok": True, "result": ...}`` or ``{"ok": False, "error":
...}``): a utility call's value crosses the process boundary as plain data, and an
exception would arrive as a bare message.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, NoReturn, TypeVar

import attrs

from ...contract.declare import vllm_uses
from ...errors import (
    RefitError,
    RefitRefusedError,
    ResizeError,
    ResizeRefusedError,
    UnsupportedRunnerError,
)
from ...hook import PIPELINED_WORKER
from . import rank as ranks
from .records import RankFailure, RankRecord, RankStatus
from .replay import refuse
from .state import engine_state, failed_message

__all__ = [
    "FRONTEND_FIGURES",
    "PLUGIN_NAME",
    "Method",
    "answer",
    "check_engine",
    "error_dict",
    "error_from_dict",
    "in_own_process",
    "install",
    "live_call",
    "rank_statuses",
    "rpc",
    "shares_process",
]

logger = logging.getLogger("vllm.initpipe")

#: The ``vllm.general_plugins`` entry point's name (``VLLM_PLUGINS`` must include it).
PLUGIN_NAME = "initpipe_resize"

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
#: The errors an answer can carry, by name.
_ERRORS: dict[str, type[ResizeError] | type[RefitError]] = {
    c.__name__: c for c in (ResizeError, ResizeRefusedError, RefitError, RefitRefusedError)
}


def error_dict(err: ResizeError | RefitError) -> dict[str, Any]:
    """A typed error as plain data: its class, message and fields (as it pickles)."""
    reduced: Any = err.__reduce__()  # (rebuild, (class, message, fields))
    _cls, message, fields = reduced[1]
    return {"type": type(err).__name__, "message": message, "fields": dict(fields)}


def error_from_dict(data: dict[str, Any]) -> ResizeError | RefitError:
    """The typed error :func:`error_dict` described."""
    return _ERRORS[data["type"]](data["message"], **data["fields"])


# -- checks -------------------------------------------------------------------------------
def _qualname(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


@vllm_uses(
    ("resize", "refit"),
    calls=("vllm.config.cache:CacheConfig.enable_extensible_kv_cache",),
    release="0.34.0",
)
def check_engine(
    core: Any,
    statuses: list[RankStatus | RankFailure],
    capabilities: tuple[str, ...] = ("resize",),
) -> list[RankStatus]:
    """Refuse an engine or a rank a resize (or a refit: ``capabilities``) cannot follow;
    the ranks' statuses, checked.

    Raises:
        ResizeRefusedError: the contract, the parallelism, the scheduler, the KV connector,
            a batch in flight or a rank that is not initpipe's pipelined worker.
    """
    from ...contract.report import verdict

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
    if getattr(core.vllm_config.cache_config, "enable_extensible_kv_cache", False):
        # 0.34.0's VMM-backed cache: pipelined workers decline it at start-up, so an engine
        # with it on runs stock workers; its size is committed by extend_kv_cache, which no
        # replay calls (written from vLLM's code: CUDA/ROCm only, never run here)
        raise refuse(
            "engine",
            "the extensible KV cache is on (vLLM's default on CUDA and ROCm from 0.34.0): a "
            "live resize or refit does not replay its sizing; start the engine with initpipe's "
            "pipelined worker (which turns it off) or with --no-enable-extensible-kv-cache",
        )
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


def rank_statuses(core: Any, capabilities: tuple[str, ...] = ("resize",)) -> list[RankStatus]:
    """Every rank's status, :func:`check_engine`-ed; the workers' model runner remembered."""
    apart = not shares_process(core)
    statuses = check_engine(core, rpc(core, ranks.rank_status, RankStatus, apart), capabilities)
    engine_state(core).model_runner = statuses[0].model_runner
    return statuses


def shares_process(core: Any) -> bool:
    """Whether the engine core's workers run in its own process: vLLM's ``UniProcExecutor``
    or a subclass (``ExecutorWithExternalLauncher``, TRL's colocate mode, torchrun), so a
    collective RPC is a call and tensors can be handed over as they are."""
    return any(c.__name__ == "UniProcExecutor" for c in type(core.model_executor).__mro__)


@vllm_uses(
    "resize",
    calls=("vllm.v1.engine.core:EngineCore.collective_rpc",),
)
def rpc(core: Any, func: Callable[..., Any], record: type[R], *args: Any) -> list[R | RankFailure]:
    """``func`` on every rank; each answer read back as a ``record`` (or its failure)."""
    return [record.from_dict(a) for a in core.model_executor.collective_rpc(func, args=args)]


# -- the answer -----------------------------------------------------------------------------
#: Capacity figures the frontend's copy of the config learns once, at the handshake.
FRONTEND_FIGURES = (
    "num_gpu_blocks",
    "num_gpu_blocks_override",
    "kv_cache_memory_bytes",
    "kv_cache_size_tokens",
    "kv_cache_max_concurrency",
    "block_size",
)


def answer(
    core: Any,
    run: Callable[[], Any],
    *,
    errors: tuple[type[Exception], ...],
    convert: Callable[[Any], ResizeError | RefitError] = lambda err: err,
) -> dict[str, Any]:
    """``run()``'s outcome as plain data: ``{"ok": True, "result": result.to_dict()}``, or the
    typed error it raised among ``errors`` (``convert``-ed) as ``{"ok": False, "error":
    ...}``; with the figures and the state the frontend must apply (:func:`.frontend.
    apply_state`). Afterwards the engine core refuses new requests while it cannot serve."""
    try:
        result = run()
    except errors as err:
        out: dict[str, Any] = {"ok": False, "error": error_dict(convert(err))}
    else:
        out = {"ok": True, "result": result.to_dict()}
    cache = core.vllm_config.cache_config
    out["cache_config"] = {k: getattr(cache, k, None) for k in FRONTEND_FIGURES}
    out["state"] = engine_state(core).state
    out["failure"] = failed_message(core)
    _refuse_adds_while_released(core)
    return out


def in_own_process(core: Any) -> bool:
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
    if not in_own_process(core):
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


# -- one transaction at a time ----------------------------------------------------------------
def _raise(err: BaseException) -> NoReturn:
    raise err


@vllm_uses(
    "resize",
    calls=("vllm.v1.engine.core:EngineCoreProc.pause_scheduler",),
)
def live_call(
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
    if not pause_first or not in_own_process(self):
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


# -- the EngineCore methods -----------------------------------------------------------------
@attrs.frozen
class Method:
    """A utility method a room adds to ``EngineCore``: its ``name`` (what a client's
    ``call_utility`` names) and the function (``self`` is the engine core)."""

    name: str
    func: Callable[..., Any]


@vllm_uses(
    "resize",
    mirrors=("vllm.v1.engine.core:EngineCoreProc._handle_client_request",),
    calls=("vllm.v1.engine.core:EngineCore",),
)
@functools.cache
def _engine_core_class() -> type:
    """vLLM's ``EngineCore``, once the contract says its code is a locked release's.

    Raises:
        UnsupportedRunnerError: the installed vLLM's engine-core and scheduler code that the
            live transactions replay differs from every release initpipe has locked.
    """
    from ...contract.report import verdict

    found = verdict("resize")  # read from the files: nothing of vLLM imported before it
    if not found.ok:
        raise UnsupportedRunnerError(f"live KV resize is not installed: {found.describe()}")
    from vllm.v1.engine.core import EngineCore

    return EngineCore


def install(*methods: Method) -> None:
    """Add ``methods`` to vLLM's ``EngineCore`` (idempotent). They change nothing until
    called.

    Raises:
        UnsupportedRunnerError: the installed vLLM differs from every locked release.
    """
    core_class = _engine_core_class()
    for method in methods:
        setattr(core_class, method.name, method.func)
