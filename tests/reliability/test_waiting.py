"""The suite's hang guard for subprocesses (``tests/waiting.py``'s ``run_watched``): it
fires on silence, never on a total, and otherwise returns what ``subprocess.run`` would."""

from __future__ import annotations

import subprocess
import sys

import pytest
from waiting import run_watched


def test_a_command_that_finishes_returns_its_status_and_both_streams() -> None:
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    proc = run_watched([sys.executable, "-c", code])
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "out\n", "err\n")


def test_a_silent_command_is_a_hang_killed_and_named() -> None:
    """A child that prints once, then waits forever for input that never comes (stdin is
    a pipe nobody writes to): a hang whatever the machine's speed."""
    code = "import sys; print('started', flush=True); sys.stdin.read()"
    with pytest.raises(AssertionError, match=r"no output for 1 s, a hang \(killed\):\nstarted"):
        run_watched([sys.executable, "-c", code], silent_s=1, stdin=subprocess.PIPE)
