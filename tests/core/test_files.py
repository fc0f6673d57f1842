"""Files initpipe writes never replace a device, FIFO or symlink; regular files stay atomic.

The bug this pins: ``initpipe graph -o /dev/null`` run as root renamed a temporary file over
``/dev/null``, turning the machine's null device into a regular file. Every node here is
made inside the test's own temporary folder.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from file_nodes import finish, null_device, read_fifo

from initpipe import Pipeline, Trace, stage
from initpipe.files import private_dir, write_file


def test_a_fifo_is_written_through_and_stays_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = read_fifo(fifo, got)
    write_file(fifo, "through the pipe")
    finish(reader)
    assert got == [b"through the pipe"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]  # no temporary left


def test_a_symlink_writes_its_target_and_stays_a_link(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text("old")
    os.chmod(target, 0o600)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_file(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600  # the file keeps its permissions


def test_a_symlink_to_a_fifo_writes_through_both(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "out"
    link.symlink_to(fifo)
    got: list[bytes] = []
    reader = read_fifo(fifo, got)
    write_file(link, b"x")
    finish(reader)
    assert got == [b"x"] and link.is_symlink() and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_character_device_is_written_through_and_stays_a_device(tmp_path: Path) -> None:
    node = null_device(tmp_path)
    write_file(node, "discarded")
    st = os.lstat(node)
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)


def test_a_regular_file_is_replaced_atomically(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "t.json"
    out.write_text("complete old content")
    real_replace = os.replace

    def failing_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space"):
        write_file(out, "new")
    assert out.read_text() == "complete old content"  # never half-written
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]  # temporary removed
    monkeypatch.setattr(os, "replace", real_replace)
    write_file(out, "new")
    assert out.read_text() == "new"


def test_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError, match="is a folder"):
        write_file(tmp_path, "x")


def test_trace_files_go_through_the_same_rules(tmp_path: Path) -> None:
    @stage(needs="model")
    def a(model: int) -> int:
        return model

    run = Pipeline([a]).start(trace=Trace())
    run.load(model=1)
    fifo = tmp_path / "trace"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = read_fifo(fifo, got)
    run.trace.write_json(fifo)
    finish(reader)
    assert b'"events"' in got[0] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_private_dir_is_created_closed_to_others(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    folder = private_dir()
    assert folder == tmp_path / "initpipe"
    assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700
    assert private_dir() == folder  # reused


def test_private_dir_refuses_a_symlink_or_an_open_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "initpipe").symlink_to(elsewhere)
    with pytest.raises(PermissionError, match="not a folder \\(or is a symlink\\)"):
        private_dir()
    (tmp_path / "initpipe").unlink()
    (tmp_path / "initpipe").mkdir()
    os.chmod(tmp_path / "initpipe", 0o777)
    with pytest.raises(PermissionError, match="open to other users \\(mode 777\\)"):
        private_dir()


def test_private_dir_defaults_to_a_per_user_folder_in_tmp(tmp_path: Path, monkeypatch) -> None:
    import tempfile

    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert private_dir() == tmp_path / f"initpipe-{os.getuid()}"
