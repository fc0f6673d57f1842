"""The frontend every room's public API calls through: written once.

What belongs here: what a public call does in the caller's process, whatever the room —
finding the engine behind an ``LLM`` / ``LLMEngine`` / ``AsyncLLM`` (:func:`engine_of`),
the argument checks two rooms share (:func:`check_mode`, :func:`check_size`), calling a
room's engine-core :class:`~.core.entry.Method` (:func:`call`: in this process, with the
requests in flight aborted through the engine's own ``abort_request`` when asked, or
through the engine client; :func:`call_async`, its twin for an ``AsyncLLM``;
:func:`query` / :func:`query_async` for a method that only reads), the state and figures
the engine core's answer carries applied to the frontend's copy (:func:`apply_state`), the
typed error raised from it, and the guard that refuses new requests while the KV cache is
released or the last refit failed (a synchronous ``generate`` must fail, not hang).
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, TypeVar

from ..contract.declare import vllm_uses
from ..errors import KVCacheReleasedError, RefitFailedError, ResizeRefusedError
from .core.entry import PLUGIN_NAME, Method, error_from_dict, install

__all__ = [
    "MODES",
    "apply_state",
    "call",
    "call_async",
    "check_mode",
    "check_size",
    "engine_of",
    "inproc_core",
    "query",
    "query_async",
    "refit_failed_error",
    "released_error",
]

#: What happens to requests in flight: they finish first, or they are aborted.
MODES = ("wait", "abort")

#: A room's refusal of bad input: ``refusal(step, reason)`` (the room's typed error).
Refusal = Callable[[str, str], Exception]


T = TypeVar("T")


def _resize_refusal(step: str, reason: str) -> Exception:
    return ResizeRefusedError(reason, step=step)


# -- the arguments --------------------------------------------------------------------------
def check_mode(mode: Any, refusal: Refusal = _resize_refusal) -> None:
    """Refuse a ``mode`` other than :data:`MODES`."""
    if mode not in MODES:
        raise refusal(
            "arguments", f"mode={mode!r}: expected 'wait' (let requests finish) or 'abort'"
        )


def check_size(
    num_blocks: Any,
    kv_cache_memory_bytes: Any,
    *,
    required: bool,
    refusal: Refusal = _resize_refusal,
) -> None:
    """Refuse both sizes at once, none where one is ``required``, or one that is not a
    positive int."""
    given = [
        n
        for n, v in (("num_blocks", num_blocks), ("kv_cache_memory_bytes", kv_cache_memory_bytes))
        if v is not None
    ]
    if len(given) > 1:
        which = "exactly one" if required else "at most one"
        raise refusal(
            "arguments", f"pass {which} of num_blocks= and kv_cache_memory_bytes=, not both"
        )
    if required and not given:
        raise refusal(
            "arguments",
            "pass the new size: num_blocks= (KV blocks) or kv_cache_memory_bytes= (per rank)",
        )
    for name in given:
        value = num_blocks if name == "num_blocks" else kv_cache_memory_bytes
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise refusal("arguments", f"{name}={value!r}: expected a positive int")


# -- the engine -----------------------------------------------------------------------------
def engine_of(llm: Any, refusal: Refusal = _resize_refusal) -> Any:
    """The ``LLMEngine`` (or engine-like object with ``engine_core``) behind ``llm``."""
    engine = getattr(llm, "llm_engine", llm)
    if not hasattr(engine, "engine_core"):
        raise refusal("arguments", f"{type(llm).__name__} is not a vLLM LLM, LLMEngine or AsyncLLM")
    return engine


@vllm_uses(
    "resize",
    calls=("vllm.v1.engine.core_client:InprocClient.engine_core",),
)
def inproc_core(engine: Any) -> Any | None:
    """The ``EngineCore`` object when it runs in this process, else None."""
    client = engine.engine_core
    if type(client).__name__ == "InprocClient":
        return client.engine_core
    return None


@vllm_uses(
    "resize",
    calls=(
        "vllm.v1.engine.core_client:SyncMPClient.call_utility",
        "vllm.v1.engine.core_client:AsyncMPClient.call_utility_async",
    ),
)
def _client(engine: Any, *, is_async: bool) -> Any:
    client = engine.engine_core
    if type(client).__name__ in ("DPLBAsyncMPClient", "DPAsyncMPClient"):
        raise ResizeRefusedError(
            "data parallelism (several engine cores) is not supported: resize each engine",
            step="engine",
        )
    method = "call_utility_async" if is_async else "call_utility"
    if not hasattr(client, method):
        other = "the sync API" if is_async else "the *_async API (await it)"
        raise ResizeRefusedError(
            f"{type(engine).__name__}'s engine client {type(client).__name__} has no "
            f"{method}: use {other}",
            step="engine",
        )
    return client


def _plugin_missing(err: BaseException, method: str) -> ResizeRefusedError | None:
    """The refusal to raise when ``err`` is vLLM saying the engine core lacks ``method``
    (any other failure of the call is left as it is)."""
    if f"has no attribute '{method}'" not in str(err):
        return None
    return ResizeRefusedError(
        f"the engine core process has no {method}: initpipe's vllm.general_plugins "
        f"entry point {PLUGIN_NAME!r} did not run there (VLLM_PLUGINS="
        f"{os.environ.get('VLLM_PLUGINS', '<unset>')!r}); add {PLUGIN_NAME} to VLLM_PLUGINS "
        f"or unset it, and restart the engine ({err})",
        step="engine",
    )


# -- requests refused while the engine cannot serve -----------------------------------------
@vllm_uses(
    "resize",
    calls=("vllm.exceptions:GracefulHTTPError",),
)
@functools.cache
def _unavailable(error: type[Exception]) -> type[Exception]:
    """``error`` that is also vLLM's ``GracefulHTTPError`` (503): ``AsyncLLM.generate``
    passes it through as is (it wraps other errors in ``EngineGenerateError``), and vLLM's
    server turns it into that HTTP status."""
    from vllm.exceptions import GracefulHTTPError

    def __init__(self: Any, message: str) -> None:
        GracefulHTTPError.__init__(self, message, HTTPStatus.SERVICE_UNAVAILABLE)

    name = error.__name__.removesuffix("Error")
    cls = type(
        name, (error, GracefulHTTPError), {"__init__": __init__, "__doc__": _unavailable.__doc__}
    )
    cls.__module__ = error.__module__
    return cls


def refit_failed_error(message: str) -> RefitFailedError:
    """The error a request gets while the last refit has failed."""
    return _unavailable(RefitFailedError)(message)  # type: ignore[return-value]


def released_error() -> KVCacheReleasedError:
    """The error a request gets while the KV cache is released."""
    return _unavailable(KVCacheReleasedError)(  # type: ignore[return-value]
        "the engine's KV cache is released (initpipe_vllm.release_kv_cache): resume it "
        "before generating: initpipe_vllm.resume_kv_cache(llm), or over HTTP POST "
        "/initpipe/kv_cache/resume"
    )


def _guard(engine: Any) -> None:
    """Refuse ``add_request`` while released or failed (before the frontend registers the
    request, so nothing is left waiting for an output that cannot come)."""
    if getattr(engine, "_initpipe_guarded", False):
        return
    original = engine.add_request

    def refuse() -> None:
        state = getattr(engine, "_initpipe_state", "serving")
        if state == "released":
            raise released_error()
        if state == "failed":
            raise refit_failed_error(engine._initpipe_failure)

    if inspect.iscoroutinefunction(original):

        async def add_request_async(*args: Any, **kwargs: Any) -> Any:
            refuse()
            return await original(*args, **kwargs)

        engine.add_request = add_request_async
    else:

        def add_request(*args: Any, **kwargs: Any) -> Any:
            refuse()
            return original(*args, **kwargs)

        engine.add_request = add_request
    engine._initpipe_guarded = True


# -- the answer -----------------------------------------------------------------------------
def _refresh_metrics_info(engine: Any) -> None:
    """vLLM sets the Prometheus info gauge ``vllm:cache_config_info`` once, at start:
    replace its label set with the new figures (engine 0: data parallelism is refused)."""
    try:
        from prometheus_client import REGISTRY
    except ImportError:
        return
    gauge: Any = REGISTRY._names_to_collectors.get("vllm:cache_config_info")
    if gauge is None:
        return
    info = engine.vllm_config.cache_config.metrics_info()
    info["engine"] = "0"
    gauge.clear()
    gauge.labels(**info).set(1)


def apply_state(engine: Any, answer: dict[str, Any]) -> None:
    """Apply an engine core's answer in the frontend: the figures its config copy learned
    at the handshake, and the state the guard refuses requests in (released, failed)."""
    cache = engine.vllm_config.cache_config
    for key, value in answer["cache_config"].items():
        setattr(cache, key, value)
    engine._initpipe_state = answer["state"]
    engine._initpipe_failure = answer.get("failure")


def _finish(engine: Any, answer: dict[str, Any], record: type[T]) -> T:
    """:func:`apply_state`, the metrics; the ``record`` the answer holds, or its error."""
    apply_state(engine, answer)
    _refresh_metrics_info(engine)
    if not answer["ok"]:
        raise error_from_dict(answer["error"])
    return record.from_dict(answer["result"])  # type: ignore[attr-defined, no-any-return]


# -- the calls ------------------------------------------------------------------------------
def call(engine: Any, method: Method, *args: Any, record: type[T], abort: bool = False) -> T:
    """``method`` on the engine core with ``args``, then the ids of the requests this call
    aborted (``abort``: in this process, through the engine's ``abort_request``; in its own
    process the engine core aborts them itself, and gets ``[]``); the answer's ``record``.

    Raises:
        ResizeRefusedError: the engine core's process lacks the method (the plugin did not
            run there), or the engine client cannot call it.
        ResizeError | RefitError: the typed error the engine core answered.
    """
    core = inproc_core(engine)
    if core is None:  # the engine core runs in its own process: it pauses and aborts
        client = _client(engine, is_async=False)
        _guard(engine)
        try:
            answer = client.call_utility(method.name, *args, [])
        except Exception as err:
            raise (_plugin_missing(err, method.name) or err) from err
        return _finish(engine, answer, record)
    install(method)
    _guard(engine)
    aborted: list[str] = []
    if abort:
        aborted = sorted(engine.output_processor.request_states)
        if aborted:
            engine.abort_request(aborted, internal=True)
    return _finish(engine, getattr(core, method.name)(*args, aborted), record)


async def call_async(engine: Any, method: Method, *args: Any, record: type[T]) -> T:
    """:func:`call` through an ``AsyncLLM``'s engine client (its engine core runs in its
    own process: it pauses and aborts)."""
    client = _client(engine, is_async=True)
    _guard(engine)
    try:
        answer = await client.call_utility_async(method.name, *args, [])
    except Exception as err:
        raise (_plugin_missing(err, method.name) or err) from err
    return _finish(engine, answer, record)


def query(engine: Any, method: Method) -> Any:
    """The plain answer of the engine core's no-argument ``method`` (in this process, or
    through the engine client), a missing plugin named as such."""
    core = inproc_core(engine)
    if core is not None:
        install(method)
        return getattr(core, method.name)()
    try:
        return _client(engine, is_async=False).call_utility(method.name)
    except ResizeRefusedError:
        raise
    except Exception as err:
        raise (_plugin_missing(err, method.name) or err) from err


async def query_async(engine: Any, method: Method) -> Any:
    """:func:`query` through an ``AsyncLLM``'s engine client."""
    client = _client(engine, is_async=True)
    try:
        return await client.call_utility_async(method.name)
    except Exception as err:
        raise (_plugin_missing(err, method.name) or err) from err
