"""``initpipe graph -o`` writes through devices, FIFOs and symlinks, never renames over them.

The null device is made inside the test's own temporary folder (root only; skipped where
the folder is mounted ``nodev``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from file_nodes import finish, null_device, read_fifo

from initpipe.cli import main

TOY = "cli_toys.mini_vllm"


def test_graph_output_to_a_character_device_keeps_the_device(tmp_path: Path) -> None:
    node = null_device(tmp_path)
    assert main(["graph", TOY, "-f", "json", "-o", str(node)]) == 0
    assert stat.S_ISCHR(os.lstat(node).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]


def test_graph_output_to_a_fifo_and_to_a_symlink(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = read_fifo(fifo, got)
    assert main(["graph", TOY, "-f", "text", "-o", str(fifo)]) == 0
    finish(reader)
    assert b"kv_caches" in got[0] and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    real, link = tmp_path / "g.dot", tmp_path / "link.dot"
    real.write_text("")
    link.symlink_to(real)
    assert main(["graph", TOY, "-o", str(link)]) == 0
    assert link.is_symlink() and real.read_text().startswith("digraph")
