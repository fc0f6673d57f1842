"""The public resize API: ``resize_kv_cache``, ``release_kv_cache``, ``resume_kv_cache``,
``kv_cache_info`` (re-exported at ``initpipe_vllm``'s top level).

What belongs here: the frontend's part — finding the engine core behind an ``LLM`` /
``LLMEngine``, checking the arguments, aborting requests through the engine's own
``abort_request`` (in-process), calling the engine core (:mod:`.engine`), turning its plain
answer back into a :class:`~.report.ResizeReport` or a typed error, and refusing new
requests while the KV cache is released (a synchronous ``generate`` must fail, not hang).
"""

from __future__ import annotations

import functools
from http import HTTPStatus
from typing import Any

from ..contract.declare import vllm_uses
from ..errors import KVCacheReleasedError, RefitFailedError, ResizeRefusedError
from .engine import (
    INFO_METHOD,
    PLUGIN_NAME,
    REFIT_METHOD,
    RESIZE_METHOD,
    WEIGHTS_METHOD,
    error_from_dict,
    install,
)
from .report import KVCacheInfo, ResizeReport

__all__ = [
    "kv_cache_info",
    "kv_cache_info_async",
    "release_kv_cache",
    "release_kv_cache_async",
    "resize_kv_cache",
    "resize_kv_cache_async",
    "resume_kv_cache",
    "resume_kv_cache_async",
]

MODES = ("wait", "abort")
#: ``resize_kv_cache``'s default: keep the prefix cache (the copy costs the kept bytes at
#: memory bandwidth; dropping it costs every cached prefix's prefill again)
KEEP_PREFIX_CACHE = True


def _check_size(num_blocks: Any, kv_cache_memory_bytes: Any, *, required: bool) -> None:
    given = [
        n
        for n, v in (("num_blocks", num_blocks), ("kv_cache_memory_bytes", kv_cache_memory_bytes))
        if v is not None
    ]
    if len(given) > 1:
        raise ResizeRefusedError(
            "pass exactly one of num_blocks= and kv_cache_memory_bytes=, not both",
            step="arguments",
        )
    if required and not given:
        raise ResizeRefusedError(
            "pass the new size: num_blocks= (KV blocks) or kv_cache_memory_bytes= (per rank)",
            step="arguments",
        )
    for name in given:
        value = num_blocks if name == "num_blocks" else kv_cache_memory_bytes
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ResizeRefusedError(f"{name}={value!r}: expected a positive int", step="arguments")


def _check_keep(keep: Any) -> None:
    if not isinstance(keep, bool):
        raise ResizeRefusedError(
            f"keep_prefix_cache={keep!r}: expected True (carry the cached prefixes into the new "
            "cache) or False (empty the prefix cache)",
            step="arguments",
        )


def _check_mode(mode: Any) -> None:
    if mode not in MODES:
        raise ResizeRefusedError(
            f"mode={mode!r}: expected 'wait' (let requests finish) or 'abort'",
            step="arguments",
        )


def _engine(llm: Any) -> Any:
    """The ``LLMEngine`` (or engine-like object with ``engine_core``) behind ``llm``."""
    engine = getattr(llm, "llm_engine", llm)
    if not hasattr(engine, "engine_core"):
        raise ResizeRefusedError(
            f"{type(llm).__name__} is not a vLLM LLM, LLMEngine or AsyncLLM", step="arguments"
        )
    return engine


@vllm_uses(
    "resize",
    calls=("vllm.v1.engine.core_client:InprocClient.engine_core",),
)
def _inproc_core(engine: Any) -> Any | None:
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


def _plugin_missing(err: BaseException) -> ResizeRefusedError | None:
    """The refusal to raise when ``err`` is vLLM saying the engine core lacks our method
    (any other failure of the call is left as it is)."""
    text = str(err)
    methods = (RESIZE_METHOD, INFO_METHOD, REFIT_METHOD, WEIGHTS_METHOD)
    if not any(f"has no attribute '{m}'" in text for m in methods):
        return None
    import os

    return ResizeRefusedError(
        f"the engine core process has no {RESIZE_METHOD}: initpipe's vllm.general_plugins "
        f"entry point {PLUGIN_NAME!r} did not run there (VLLM_PLUGINS="
        f"{os.environ.get('VLLM_PLUGINS', '<unset>')!r}); add {PLUGIN_NAME} to VLLM_PLUGINS "
        f"or unset it, and restart the engine ({err})",
        step="engine",
    )


@vllm_uses(
    "resize",
    calls=("vllm.exceptions:GracefulHTTPError",),
)
@functools.cache
def _released_class() -> type[KVCacheReleasedError]:
    from vllm.exceptions import GracefulHTTPError

    class KVCacheReleased(KVCacheReleasedError, GracefulHTTPError):
        """Also vLLM's ``GracefulHTTPError`` (503): ``AsyncLLM.generate`` passes it through
        as is (it wraps other errors in ``EngineGenerateError``), and vLLM's server turns
        it into that HTTP status."""

        def __init__(self, message: str) -> None:
            GracefulHTTPError.__init__(self, message, HTTPStatus.SERVICE_UNAVAILABLE)

    KVCacheReleased.__module__ = KVCacheReleasedError.__module__
    return KVCacheReleased


@functools.cache
def _failed_class() -> type[RefitFailedError]:
    from vllm.exceptions import GracefulHTTPError

    class RefitFailed(RefitFailedError, GracefulHTTPError):
        """Also vLLM's ``GracefulHTTPError`` (503), as ``KVCacheReleased``."""

        def __init__(self, message: str) -> None:
            GracefulHTTPError.__init__(self, message, HTTPStatus.SERVICE_UNAVAILABLE)

    RefitFailed.__module__ = RefitFailedError.__module__
    return RefitFailed


def refit_failed_error(message: str) -> RefitFailedError:
    """The error a request gets while the last refit has failed."""
    return _failed_class()(message)


def released_error() -> KVCacheReleasedError:
    """The error a request gets while the KV cache is released."""
    return _released_class()(
        "the engine's KV cache is released (initpipe_vllm.release_kv_cache): resume it "
        "before generating: initpipe_vllm.resume_kv_cache(llm), or over HTTP POST "
        "/initpipe/kv_cache/resume"
    )


def _guard(engine: Any) -> None:
    """Refuse ``add_request`` while released (before the frontend registers the request, so
    nothing is left waiting for an output that cannot come)."""
    if getattr(engine, "_initpipe_guarded", False):
        return
    import inspect

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


def _finish(engine: Any, answer: dict[str, Any]) -> ResizeReport:
    """:func:`apply_state`, the metrics; return the report or raise."""
    apply_state(engine, answer)
    _refresh_metrics_info(engine)
    if not answer["ok"]:
        raise error_from_dict(answer["error"])
    return ResizeReport.from_dict(answer["report"])


def _call(
    llm: Any,
    action: str,
    *,
    num_blocks: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    mode: str = "wait",
    keep_prefix_cache: bool = False,
) -> ResizeReport:
    engine = _engine(llm)
    args = (action, num_blocks, kv_cache_memory_bytes, mode)
    core = _inproc_core(engine)
    if core is None:  # the engine core runs in its own process: it pauses and aborts
        client = _client(engine, is_async=False)
        _guard(engine)
        try:
            answer = client.call_utility(RESIZE_METHOD, *args, [], keep_prefix_cache)
        except Exception as err:
            raise (_plugin_missing(err) or err) from err
        return _finish(engine, answer)
    install()
    _guard(engine)
    aborted: list[str] = []
    if mode == "abort" and action != "resume":
        aborted = sorted(engine.output_processor.request_states)
        if aborted:
            engine.abort_request(aborted, internal=True)
    return _finish(engine, getattr(core, RESIZE_METHOD)(*args, aborted, keep_prefix_cache))


async def _call_async(
    llm: Any,
    action: str,
    *,
    num_blocks: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    mode: str = "wait",
    keep_prefix_cache: bool = False,
) -> ResizeReport:
    engine = _engine(llm)
    client = _client(engine, is_async=True)
    _guard(engine)
    try:
        answer = await client.call_utility_async(
            RESIZE_METHOD, action, num_blocks, kv_cache_memory_bytes, mode, [], keep_prefix_cache
        )
    except Exception as err:
        raise (_plugin_missing(err) or err) from err
    return _finish(engine, answer)


def resize_kv_cache(
    llm: Any,
    *,
    num_blocks: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    mode: str = "wait",
    keep_prefix_cache: bool = KEEP_PREFIX_CACHE,
) -> ResizeReport:
    """Resize a running engine's KV cache to ``num_blocks`` blocks or
    ``kv_cache_memory_bytes`` bytes per rank (exactly one).

    Afterwards the scheduler's block pool and every capacity figure follow the new size.
    With ``keep_prefix_cache`` (the default) every cached prefix still hits after a grow,
    and the most recently used ones that fit after a shrink: the engine is what an engine
    of the new size that served the same requests would be. Without it the prefix cache is
    empty: the engine is what a fresh engine started with ``num_gpu_blocks_override`` (or
    ``kv_cache_memory_bytes``) of that size would be.

    Args:
        llm: a vLLM ``LLM`` or ``LLMEngine`` using initpipe's pipelined worker.
        num_blocks: the new number of KV blocks (as ``num_gpu_blocks_override``).
        kv_cache_memory_bytes: the new KV size per rank, planned by vLLM like at start.
        mode: ``"wait"``: requests in flight finish first (vLLM's ``pause_scheduler``) while
            new ones queue; queued requests run afterwards on the new cache. In-process
            (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) a synchronous ``LLM`` cannot drain while
            this runs, so a request holding KV blocks makes it refuse. ``"abort"``: every
            request in flight is aborted first (the report's ``requests_aborted``).
        keep_prefix_cache: carry the cached blocks into the new cache (their bytes and
            vLLM's block pool state). Where it cannot (memory for the kept blocks, prefix
            caching off, blocks computed under another weights version), the cache is
            emptied and the report's ``prefix_cache.reason`` says why.

    Raises:
        ResizeRefusedError: bad arguments, a config resize cannot follow, a size that cannot
            serve ``max_model_len``, not enough memory, requests holding KV blocks in
            ``wait`` mode: nothing changed.
        ResizeError: a step failed; ``.rolled_back`` is True when the engine is back at its
            previous size and serving, ``.stage`` names the catalog stage that raised.
    """
    _check_size(num_blocks, kv_cache_memory_bytes, required=True)
    _check_mode(mode)
    _check_keep(keep_prefix_cache)
    return _call(
        llm,
        "resize",
        num_blocks=num_blocks,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        mode=mode,
        keep_prefix_cache=keep_prefix_cache,
    )


def release_kv_cache(llm: Any, *, mode: str = "wait") -> ResizeReport:
    """Free all KV memory; the engine stays up. New requests are refused with
    :class:`~initpipe_vllm.errors.KVCacheReleasedError` until :func:`resume_kv_cache`."""
    _check_mode(mode)
    return _call(llm, "release", mode=mode)


def resume_kv_cache(
    llm: Any, *, num_blocks: int | None = None, kv_cache_memory_bytes: int | None = None
) -> ResizeReport:
    """Allocate the KV cache again: the size before the release, or the one given."""
    _check_size(num_blocks, kv_cache_memory_bytes, required=False)
    return _call(llm, "resume", num_blocks=num_blocks, kv_cache_memory_bytes=kv_cache_memory_bytes)


def query(engine: Any, method: str) -> Any:
    """The plain answer of the engine core's no-argument utility ``method`` (in this
    process, or through the engine client), a missing plugin named as such."""
    core = _inproc_core(engine)
    if core is not None:
        install()
        return getattr(core, method)()
    try:
        return _client(engine, is_async=False).call_utility(method)
    except ResizeRefusedError:
        raise
    except Exception as err:
        raise (_plugin_missing(err) or err) from err


async def query_async(engine: Any, method: str) -> Any:
    """:func:`query` through an ``AsyncLLM``'s engine client."""
    client = _client(engine, is_async=True)
    try:
        return await client.call_utility_async(method)
    except Exception as err:
        raise (_plugin_missing(err) or err) from err


def kv_cache_info(llm: Any) -> KVCacheInfo:
    """The engine's KV cache now: state, blocks, free blocks, bytes per rank, last report."""
    return KVCacheInfo.from_dict(query(_engine(llm), INFO_METHOD))


# -- AsyncLLM -------------------------------------------------------------------------------
async def resize_kv_cache_async(
    llm: Any,
    *,
    num_blocks: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    mode: str = "wait",
    keep_prefix_cache: bool = KEEP_PREFIX_CACHE,
) -> ResizeReport:
    """:func:`resize_kv_cache` for an ``AsyncLLM``. ``mode="wait"`` lets requests in flight
    finish (vLLM's ``pause_scheduler``) while new ones queue, then runs them on the new
    cache; ``mode="abort"`` aborts them (their streams end with ``finish_reason="abort"``)."""
    _check_size(num_blocks, kv_cache_memory_bytes, required=True)
    _check_mode(mode)
    _check_keep(keep_prefix_cache)
    return await _call_async(
        llm,
        "resize",
        num_blocks=num_blocks,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        mode=mode,
        keep_prefix_cache=keep_prefix_cache,
    )


async def release_kv_cache_async(llm: Any, *, mode: str = "wait") -> ResizeReport:
    """:func:`release_kv_cache` for an ``AsyncLLM``."""
    _check_mode(mode)
    return await _call_async(llm, "release", mode=mode)


async def resume_kv_cache_async(
    llm: Any, *, num_blocks: int | None = None, kv_cache_memory_bytes: int | None = None
) -> ResizeReport:
    """:func:`resume_kv_cache` for an ``AsyncLLM``."""
    _check_size(num_blocks, kv_cache_memory_bytes, required=False)
    return await _call_async(
        llm, "resume", num_blocks=num_blocks, kv_cache_memory_bytes=kv_cache_memory_bytes
    )


async def kv_cache_info_async(llm: Any) -> KVCacheInfo:
    """:func:`kv_cache_info` for an ``AsyncLLM``."""
    return KVCacheInfo.from_dict(await query_async(_engine(llm), INFO_METHOD))
