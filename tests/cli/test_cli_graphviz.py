"""``--format svg|png`` through Graphviz's dot, and the error when dot is missing."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from cli_support import needs_dot

from initpipe.cli import main
from initpipe.errors import GraphvizError
from initpipe.view.graphviz import graphviz

MINI = "cli_toys.mini_vllm"


@needs_dot
def test_svg_has_one_node_per_stage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "g.svg"
    assert main(["graph", MINI, "-o", str(out)]) == 0
    svg = out.read_text()
    assert svg.lstrip().startswith("<?xml") and "</svg>" in svg
    ids = re.findall(r'<g id="stage&#45;(\w+)" class="node"', svg)
    assert sorted(ids) == sorted(
        [
            "attn_layers",
            "attn_backends",
            "kv_cache_spec",
            "cudagraph",
            "kv_caches",
            "metadata_builders",
            "warm_up",
        ]
    )
    assert "model phase" in svg and "kv_cache_config phase" in svg


@needs_dot
def test_png_is_a_png(tmp_path: Path) -> None:
    out = tmp_path / "g.png"
    assert main(["graph", MINI, "-f", "png", "-o", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 5000


@pytest.mark.parametrize("fmt", ["svg", "png", "html"])
def test_missing_dot_gives_the_install_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    real_which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **k: None if name == "dot" else real_which(name, *a, **k)
    )
    out = tmp_path / f"g.{fmt}"
    assert main(["graph", MINI, "-f", fmt, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"Error: --format {fmt} needs Graphviz's dot program")
    assert "apt-get install graphviz" in err
    assert not out.exists()


@needs_dot
def test_dot_failure_is_reported() -> None:
    with pytest.raises(GraphvizError, match="exited with"):
        graphviz("digraph { this is not dot", "svg")
