"""Waiting on a condition, never on the clock: the suite's one way to wait for another
thread or process.

A test that needs a state (a request in flight, a thread inside a stage) waits until the
state is observed; the deadline exists only so a hang fails instead of blocking CI — no
test passes or fails by how fast the machine is. Where a state cannot be observed, the test
makes it true instead (e.g. ``INITPIPE_HOLD_STEPS``, :mod:`initpipe_vllm.resize.hold`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["HANG_S", "WatchedLock", "until", "until_async"]

#: A wait on a condition gives up after this many seconds: only a hang takes so long.
HANG_S = 300.0
_POLL_S = 0.02


def until(what: str, check: Callable[[], bool], hang_s: float = HANG_S) -> None:
    """Return once ``check()`` is true; fail naming ``what`` after ``hang_s`` (a hang)."""
    deadline = time.monotonic() + hang_s
    while not check():
        assert time.monotonic() < deadline, f"still not {what} after {hang_s:.0f} s: a hang"
        time.sleep(_POLL_S)


async def until_async(
    what: str, check: Callable[[], Awaitable[bool]], hang_s: float = HANG_S
) -> None:
    """:func:`until` for an asynchronous ``check``."""
    deadline = time.monotonic() + hang_s
    while not await check():
        assert time.monotonic() < deadline, f"still not {what} after {hang_s:.0f} s: a hang"
        await asyncio.sleep(_POLL_S)


class WatchedLock:
    """A lock (plain or re-entrant) that counts the threads blocked on it, so a test can
    wait until a racing thread really waits — put in place of the code's own lock."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self._count = threading.Lock()
        self.blocked = 0

    def __enter__(self) -> None:
        if self._lock.acquire(blocking=False):  # free, or held by this thread (re-entrant)
            return
        with self._count:
            self.blocked += 1
        self._lock.acquire()
        with self._count:
            self.blocked -= 1

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
