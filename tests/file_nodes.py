"""Helpers for tests that write into FIFOs and device nodes made in their own temporary
folder (tests/core/test_files.py, tests/cli/test_cli_files.py)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
from waiting import HANG_S


def read_fifo(path: Path, into: list[bytes]) -> threading.Thread:
    """Start a thread that reads ``path`` (a FIFO) to its end into ``into``."""

    def read() -> None:
        with open(path, "rb") as f:
            into.append(f.read())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t


def finish(reader: threading.Thread) -> None:
    """Wait until the reader of :func:`read_fifo` read to the end (the writer closed)."""
    reader.join(HANG_S)
    assert not reader.is_alive(), f"the FIFO reader still waits after {HANG_S:.0f} s: a hang"


def null_device(tmp_path: Path) -> Path:
    """A character device like /dev/null (1, 3) inside ``tmp_path``, or skip the test.

    Needs root (CAP_MKNOD); skipped where the folder is mounted ``nodev``.
    """
    if os.geteuid() != 0:
        pytest.skip("making a character device needs root")
    node = tmp_path / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod refused here (no CAP_MKNOD)")
    try:
        with open(node, "wb") as f:
            f.write(b"probe")
    except OSError:
        pytest.skip("the temporary folder is mounted nodev: devices cannot be opened here")
    return node
