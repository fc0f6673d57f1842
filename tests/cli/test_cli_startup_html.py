"""``initpipe startup report --format html``: the Gantt chart in real headless Chromium
(a report built from the hand-worked spans of tests/startup/spans_kit.py)."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import console_messages

sys.path.insert(0, str(Path(__file__).parents[1] / "startup"))
from spans_kit import T0, own_process_start

from initpipe_vllm.tools.startup_render import render
from initpipe_vllm.tools.startup_report import build

Browser = Callable[..., "object"]


@pytest.fixture
def page(tmp_path: Path) -> Path:
    spans, marks = own_process_start()
    report = build(spans, marks, ready_s=T0 + 10.0)
    report["spans"][0]["message"] = "</script><script>alert(1)</script>"  # must stay data
    path = tmp_path / "startup.html"
    path.write_text(render(report, "html"))
    return path


def test_every_span_and_gap_is_drawn_without_console_errors(page: Path, chromium) -> None:
    dom = chromium(page.as_uri(), "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert console_messages(dom.stderr) == []
    assert 'data-ready="1"' in dom.stdout  # the script ran to its end
    embedded = page.read_text().split('id="initpipe-data">')[1].split("</script>")[0]
    report = json.loads(embedded)
    for s in report["spans"]:
        assert f'data-span="{s["id"]}"' in dom.stdout
    critical = re.findall(r'class="bar [a-z]+ critical"[^>]*data-span="([^"]+)"', dom.stdout)
    assert sorted(critical) == sorted(report["critical_path"])
    drawn_gaps = len(re.findall(r'class="bar gap"[^>]*title="unattributed \+', dom.stdout))
    assert drawn_gaps == len(report["unattributed"]) == 5
    for p in report["processes"]:
        assert f"{p['name']} (pid {p['pid']})" in dom.stdout
    shot = page.parent / "shot.png"
    res = chromium(page.as_uri(), f"--screenshot={shot}")
    assert res.returncode == 0 and shot.stat().st_size > 10_000
