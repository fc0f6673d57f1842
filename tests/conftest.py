"""Suite-wide: every file the suite (and what it starts) writes stays in pytest's own
temporary folders.

CI runs the suite as root on a shared machine: a test that writes outside its temporary
folder can damage the machine (``initpipe graph -o /dev/null`` once replaced the null
device). For the whole session, ``TMPDIR`` (and Python's cached ``tempfile.tempdir``) and
``XDG_RUNTIME_DIR`` point into pytest's base temporary folder, so temporary files of vLLM,
torch and Chromium, and initpipe's private failure-trace folder, land there too —
including in the subprocesses tests start, which inherit the environment.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def _writes_stay_in_pytest_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    runtime = tmp_path_factory.mktemp("xdg_runtime")
    runtime.chmod(0o700)
    tmp = tmp_path_factory.mktemp("tmp")
    saved = {k: os.environ.get(k) for k in ("TMPDIR", "XDG_RUNTIME_DIR")}
    saved_tempdir = tempfile.tempdir
    os.environ["TMPDIR"] = str(tmp)
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    tempfile.tempdir = str(tmp)
    try:
        yield
    finally:
        tempfile.tempdir = saved_tempdir
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
