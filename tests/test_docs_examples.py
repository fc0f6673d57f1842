"""Every code example of the README and the docs runs here, or says why not.

Python examples run in a fresh interpreter, bash examples line by line in bash, both in a
temporary folder (they may write files); JSON and TOML examples must parse. An example
marked ``illustrative`` (a GPU, a server, a placeholder model...) is listed at the end of
the run (``tests/conftest.py``); one marked ``run-by`` names the test that runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from doc_blocks import ROOT, Block, blocks

RUN = [b for b in blocks() if b.marker is None]
BIN = Path(sys.executable).parent


def test_every_fence_names_its_language() -> None:
    """A fence without a language word would be neither run nor listed: refused."""
    assert [b.where for b in blocks() if not b.lang] == []


def test_every_example_is_run_or_says_why() -> None:
    known = {"python", "bash", "json", "toml"}
    assert {b.lang for b in RUN} <= known, [b.where for b in RUN if b.lang not in known]
    for b in blocks():
        if b.marker is not None and b.marker[0] == "run-by":
            assert (ROOT / b.marker[1]).is_file(), f"{b.where}: no test {b.marker[1]}"
        if b.marker is not None:
            assert len(b.marker[1]) > 8, f"{b.where}: say why it is not run here"
    assert len(RUN) >= 5


@pytest.mark.parametrize("block", RUN, ids=[b.where for b in RUN])
def test_the_example_runs(block: Block, tmp_path: Path) -> None:
    if block.lang == "json":
        json.loads(block.code)
        return
    if block.lang == "toml":
        tomllib.loads(block.code)
        return
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    if block.lang == "python":
        cmd = [sys.executable, "-c", block.code]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", block.code]
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{block.where}:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
