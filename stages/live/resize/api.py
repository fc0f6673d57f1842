"""The public resize API: ``resize_kv_cache``, ``release_kv_cache``, ``resume_kv_cache``,
``kv_cache_info`` and their ``*_async`` twins (re-exported at ``initpipe_vllm``'s top
level).

What belongs here (its public names are the package's: :mod:`initpipe_vllm.live`): each
call's arguments, checked, and its engine-core method called
through the one frontend (:mod:`initpipe_vllm.live.frontend`), which answers the
:class:`~.report.ResizeReport` or raises the typed error.
"""

from __future__ import annotations

from typing import Any

from ...errors import ResizeRefusedError
from ..frontend import call, call_async, check_mode, check_size, engine_of, query, query_async
from .engine import INFO_UTILITY, RESIZE_UTILITY
from .report import KVCacheInfo, ResizeReport

#: ``resize_kv_cache``'s default: keep the prefix cache (the copy costs the kept bytes at
#: memory bandwidth; dropping it costs every cached prefix's prefill again)
KEEP_PREFIX_CACHE = True


def _check_keep(keep: Any) -> None:
    if not isinstance(keep, bool):
        raise ResizeRefusedError(
            f"keep_prefix_cache={keep!r}: expected True (carry the cached prefixes into the new "
            "cache) or False (empty the prefix cache)",
            step="arguments",
        )


def _resize(
    num_blocks: Any, kv_cache_memory_bytes: Any, mode: Any, keep_prefix_cache: Any
) -> tuple[Any, ...]:
    """A resize's checked arguments, as the engine-core method takes them."""
    check_size(num_blocks, kv_cache_memory_bytes, required=True)
    check_mode(mode)
    _check_keep(keep_prefix_cache)
    return ("resize", num_blocks, kv_cache_memory_bytes, mode, keep_prefix_cache)


def _release(mode: Any) -> tuple[Any, ...]:
    check_mode(mode)
    return ("release", None, None, mode, False)


def _resume(num_blocks: Any, kv_cache_memory_bytes: Any) -> tuple[Any, ...]:
    check_size(num_blocks, kv_cache_memory_bytes, required=False)
    return ("resume", num_blocks, kv_cache_memory_bytes, "wait", False)


def _call(llm: Any, args: tuple[Any, ...]) -> ResizeReport:
    action, mode = args[0], args[3]
    abort = mode == "abort" and action != "resume"
    return call(engine_of(llm), RESIZE_UTILITY, *args, record=ResizeReport, abort=abort)


async def _call_async(llm: Any, args: tuple[Any, ...]) -> ResizeReport:
    return await call_async(engine_of(llm), RESIZE_UTILITY, *args, record=ResizeReport)


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
    return _call(llm, _resize(num_blocks, kv_cache_memory_bytes, mode, keep_prefix_cache))


def release_kv_cache(llm: Any, *, mode: str = "wait") -> ResizeReport:
    """Free all KV memory; the engine stays up. New requests are refused with
    :class:`~initpipe_vllm.errors.KVCacheReleasedError` until :func:`resume_kv_cache`."""
    return _call(llm, _release(mode))


def resume_kv_cache(
    llm: Any, *, num_blocks: int | None = None, kv_cache_memory_bytes: int | None = None
) -> ResizeReport:
    """Allocate the KV cache again: the size before the release, or the one given."""
    return _call(llm, _resume(num_blocks, kv_cache_memory_bytes))


def kv_cache_info(llm: Any) -> KVCacheInfo:
    """The engine's KV cache now: state, blocks, free blocks, bytes per rank, last report."""
    return KVCacheInfo.from_dict(query(engine_of(llm), INFO_UTILITY))


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
    args = _resize(num_blocks, kv_cache_memory_bytes, mode, keep_prefix_cache)
    return await _call_async(llm, args)


async def release_kv_cache_async(llm: Any, *, mode: str = "wait") -> ResizeReport:
    """:func:`release_kv_cache` for an ``AsyncLLM``."""
    return await _call_async(llm, _release(mode))


async def resume_kv_cache_async(
    llm: Any, *, num_blocks: int | None = None, kv_cache_memory_bytes: int | None = None
) -> ResizeReport:
    """:func:`resume_kv_cache` for an ``AsyncLLM``."""
    return await _call_async(llm, _resume(num_blocks, kv_cache_memory_bytes))


async def kv_cache_info_async(llm: Any) -> KVCacheInfo:
    """:func:`kv_cache_info` for an ``AsyncLLM``."""
    return KVCacheInfo.from_dict(await query_async(engine_of(llm), INFO_UTILITY))
