"""The pictures in the docs are what the tools draw today: docs/images/catalog.svg is
`initpipe graph --format svg` of the v1 catalog (regenerate it with that command)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cli_support import needs_dot
from docs_pictures import drawing

ROOT = Path(__file__).parents[2]


@needs_dot
def test_the_catalog_picture_is_current(tmp_path: Path) -> None:
    out = tmp_path / "catalog.svg"
    res = subprocess.run(
        [sys.executable, "-m", "initpipe.cli", "graph", "--format", "svg", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    committed = (ROOT / "docs" / "images" / "catalog.svg").read_text()
    assert drawing(out.read_text()) == drawing(committed), (
        "docs/images/catalog.svg is stale: initpipe graph --format svg -o docs/images/catalog.svg"
    )
