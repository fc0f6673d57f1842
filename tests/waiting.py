"""Waiting on a condition, never on the clock: the suite's one way to wait for another
thread or process.

A test that needs a state (a request in flight, a thread inside a stage) waits until the
state is observed; the deadline exists only so a hang fails instead of blocking CI — no
test passes or fails by how fast the machine is. Where a state cannot be observed, the test
makes it true instead (e.g. ``INITPIPE_HOLD_STEPS``, :mod:`initpipe_vllm.live.core.hold`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import IO, Any

__all__ = ["HANG_S", "SILENT_S", "WatchedLock", "run_watched", "until", "until_async"]

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


#: A subprocess that prints nothing for this many seconds is hung (:func:`run_watched`).
SILENT_S = 600.0


def run_watched(
    cmd: Sequence[str], *, silent_s: float = SILENT_S, **popen: Any
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True, **popen)`` guarded by progress,
    not by the total: the command may run as long as it keeps writing (vLLM logs each
    engine start, the harness each model); only ``silent_s`` seconds without a byte on
    stdout or stderr is a hang, and fails naming it after killing the command's process
    group."""
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **popen,
    )
    chunks: dict[str, list[str]] = {"stdout": [], "stderr": []}
    last = [time.monotonic()]

    def read(name: str, stream: IO[str]) -> None:
        for line in iter(stream.readline, ""):
            chunks[name].append(line)
            last[0] = time.monotonic()

    readers = [
        threading.Thread(target=read, args=(name, stream), daemon=True)
        for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr))
    ]
    for t in readers:
        t.start()
    while proc.poll() is None:
        if time.monotonic() - last[0] > silent_s:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            tail = "".join(chunks["stdout"])[-3000:] + "".join(chunks["stderr"])[-3000:]
            raise AssertionError(
                f"{' '.join(cmd[:3])} ...: no output for {silent_s:.0f} s, a hang (killed):\n{tail}"
            )
        time.sleep(0.2)
    for t in readers:
        t.join()
    return subprocess.CompletedProcess(
        list(cmd), proc.returncode, "".join(chunks["stdout"]), "".join(chunks["stderr"])
    )
