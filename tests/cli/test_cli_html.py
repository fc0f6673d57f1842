"""``--format html``: one self-contained page, opened in real headless Chromium."""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

from cli_support import MINI_CRITICAL, console_messages, needs_dot

from initpipe.cli import main
from initpipe.view.html import render_html

MINI = "cli_toys.mini_vllm"
Browser = Callable[..., CompletedProcess[str]]


def _page(tmp_path: Path, *extra: str, target: str = MINI) -> Path:
    out = tmp_path / "graph.html"
    assert main(["graph", target, "-f", "html", "-o", str(out), *extra]) == 0
    return out


def _png_colours(path: Path) -> int:
    """Distinct RGB(A) byte triples in a PNG's decoded rows (filter bytes aside)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos : pos + 4]), data[pos + 4 : pos + 8]
        if kind == b"IHDR":
            width = struct.unpack(">I", data[pos + 8 : pos + 12])[0]
        if kind == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    # Unfiltered bytes are not exact pixels, but a blank page gives only a handful of values.
    return len({raw[i : i + 3] for i in range(0, min(len(raw), 400 * width * 4), 3)})


def test_page_is_self_contained(tmp_path: Path) -> None:
    html = render_html(
        {"name": "t", "stages": [], "edges": [], "order": [], "inputs": {}}, "<svg></svg>"
    )
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    assert "<link" not in html and "@import" not in html


def test_embedded_data_cannot_close_the_script_element() -> None:
    view = {
        "name": "t",
        "inputs": {},
        "order": ["s"],
        "edges": [],
        "stages": [
            {
                "name": "s",
                "phase": "model",
                "inputs": [],
                "outputs": ["s"],
                "effects": [],
                "module": "m",
                "doc": "</script><script>alert(1)</script>",
            }
        ],
    }
    html = render_html(view, "<svg></svg>")
    data = html.split('id="initpipe-data">', 1)[1].split("</script>", 1)[0]
    assert json.loads(data)["stages"][0]["doc"] == "</script><script>alert(1)</script>"
    assert "&lt;/script&gt;&lt;script&gt;" in html  # in the table, escaped


@needs_dot
def test_chromium_renders_every_stage_without_console_errors(
    tmp_path: Path, chromium: Browser
) -> None:
    page = _page(tmp_path)
    shot = tmp_path / "shot.png"
    res = chromium(page.as_uri(), f"--screenshot={shot}")
    assert res.returncode == 0, res.stderr[-2000:]
    assert console_messages(res.stderr) == []
    assert shot.stat().st_size > 20_000
    assert _png_colours(shot) > 50
    dom = chromium(page.as_uri(), "--dump-dom")
    assert console_messages(dom.stderr) == []
    assert 'data-ready="1"' in dom.stdout  # the script ran to its end
    embedded = page.read_text().split('id="initpipe-data">')[1].split("</script>")[0]
    for name in json.loads(embedded)["order"]:
        assert f'id="stage-{name}"' in dom.stdout  # in the drawing
        assert f'<tr data-stage="{name}"' in dom.stdout  # and in the table


@needs_dot
def test_selecting_a_stage_shows_its_inputs_outputs_and_doc(
    tmp_path: Path, chromium: Browser
) -> None:
    page = _page(tmp_path)
    res = chromium(page.as_uri() + "#stage=kv_cache_spec", "--dump-dom")
    assert console_messages(res.stderr) == []
    panel = res.stdout.split('<aside id="details"', 1)[1].split("</aside>", 1)[0]
    assert 'data-stage="kv_cache_spec"' in panel
    assert "<h2>kv_cache_spec</h2>" in panel
    assert "attn_layers" in panel and "vllm_config  (pipeline input: start)" in panel
    assert "kv_cache_spec  → cudagraph, kv_caches" in panel
    assert "shared_kv_cache_layers" in panel
    assert 'Build each layer\'s KV cache spec &lt;and&gt; "record" shared layers.' in panel
    # the stage's free-form declarations, one row each
    assert "<dt>mirrors</dt><dd>toyvllm.runner:Runner.get_kv_cache_spec</dd>" in panel
    assert "<dt>since</dt><dd>0.1</dd>" in panel
    # the lineage is highlighted, the unrelated branch dimmed
    assert re.search(r'<g id="stage-kv_cache_spec" class="node[^"]*\bselected\b', res.stdout)
    assert re.search(r'<g id="stage-attn_backends" class="node"', res.stdout)
    assert re.search(r'<g id="stage-kv_caches" class="node lineage"', res.stdout)


@needs_dot
def test_trace_page_marks_the_critical_path(
    tmp_path: Path, chromium: Browser, trace_file: Path
) -> None:
    page = _page(tmp_path, "--trace", str(trace_file))
    text = page.read_text()
    assert "critical path</span> " + " → ".join(MINI_CRITICAL) in text
    res = chromium(page.as_uri() + "#stage=kv_caches", "--dump-dom")
    assert console_messages(res.stderr) == []
    panel = res.stdout.split('<aside id="details"', 1)[1].split("</aside>", 1)[0]
    assert "<dt>duration</dt><dd>1.200s</dd>" in panel


@needs_dot
def test_console_error_detection_catches_a_broken_page(tmp_path: Path, chromium: Browser) -> None:
    """Negative control: the check above would see an uncaught error."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><script>missingFunction();</script></body></html>")
    res = chromium(bad.as_uri(), "--dump-dom")
    messages = console_messages(res.stderr)
    assert any("Uncaught ReferenceError: missingFunction" in m for m in messages)
