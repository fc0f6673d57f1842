"""The refit picture in the docs is what scripts/draw_refit.py draws today from the refit's
own step lists: docs/images/refit.svg (regenerate it with ``python scripts/draw_refit.py``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from cli_support import needs_dot

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "scripts" / "draw_refit.py"


def _drawing(svg: str) -> str:
    return re.sub(r"<!--.*?-->", "", svg, flags=re.S).strip()  # Graphviz's version comment


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )


def test_the_picture_names_every_step_of_the_code_in_order() -> None:
    from initpipe_vllm.resize import refit_core

    res = _run("--dot")
    assert res.returncode == 0, res.stderr
    names = ["plan", refit_core.REFIT.pause.name, *(s.name for s in refit_core.REFIT.steps)]
    found = re.findall(r'^\s*"(\w+)" \[label=<<b>(\w+)</b>', res.stdout, re.M)
    assert [n for n, _ in found] == names


@needs_dot
def test_the_refit_picture_is_current(tmp_path: Path) -> None:
    out = tmp_path / "refit.svg"
    res = _run("-o", str(out))
    assert res.returncode == 0, res.stderr
    committed = (ROOT / "docs" / "images" / "refit.svg").read_text()
    assert _drawing(out.read_text()) == _drawing(committed), (
        "docs/images/refit.svg is stale: python scripts/draw_refit.py"
    )
