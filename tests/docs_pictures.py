"""Helpers for the tests that keep the docs' drawn pictures current (importable: tests/
is on sys.path): run a drawing script of ``scripts/``, and compare an SVG with the
committed one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def drawing(svg: str) -> str:
    """The SVG without Graphviz's version comment."""
    return re.sub(r"<!--.*?-->", "", svg, flags=re.S).strip()


def run_script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python scripts/<name>.py ARGS``."""
    script = ROOT / "scripts" / f"{name}.py"
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=120
    )


def assert_current(name: str, picture: str, tmp_path: Path) -> None:
    """``docs/images/<picture>`` is what ``scripts/<name>.py`` draws today."""
    out = tmp_path / picture
    res = run_script(name, "-o", str(out))
    assert res.returncode == 0, res.stderr
    committed = (ROOT / "docs" / "images" / picture).read_text()
    assert drawing(out.read_text()) == drawing(committed), (
        f"docs/images/{picture} is stale: python scripts/{name}.py"
    )
