"""Whole vLLM starts, back to back: how much of each the report attributes, how noisy
starts are, and so where ``initpipe startup report --compare``'s default thresholds sit.
``initpipe startup run`` of one configuration (the tiny model, the pipelined worker) in
every placement — in-process, the engine core in its own process, TP=2, the OpenAI server,
Model Runner V2 (in-process; on a CPU machine through Triton's interpreter, the test
device) — alternating; every start compared with every other of its placement.

Reported per placement: the wall time, the attributed fraction (median; target: at least
98% of the wall, by leaf spans, probes and named intervals) and the largest gap left, the
largest slow-down between two starts over every row ``--compare`` checks (spans by name,
phases, totals) among rows of at least the default floor, the largest absolute slow-down,
and how many rows the defaults flag (target: none).

Standalone: ``python benchmarks/startup.py [STARTS [KEEP_DIR]]`` (KEEP_DIR keeps every
start's report); ``python -m benchmarks --only startup``. Not in the suite's smoke pass
(each start is a fresh vLLM: 6-20 s here).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import Row

PLACEMENTS = {
    "in-process": ["--in-process"],
    "own-process": [],
    "TP=2": ["--tensor-parallel-size", "2"],
    "serve": ["--serve"],
    "MRv2 in-process": ["--in-process", "--model-runner", "v2"],
}
#: The least fraction of each start's wall the report must attribute.
ATTRIBUTED_TARGET = 0.98


def _start(args: list[str], out: Path) -> dict[str, Any]:
    env = {**os.environ, "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cpu")}
    res = subprocess.run(
        [sys.executable, "-m", "initpipe.cli", "startup", "run", *args, "-o", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if res.returncode != 0:
        raise RuntimeError(f"startup run {args} failed: {res.stderr[-2000:]}")
    return json.loads(out.read_text())


def run(smoke: bool = False, starts: int | None = None, keep: Path | None = None) -> list[Row]:
    """Rows for the benchmark runner (``python -m benchmarks``); ``keep``: a folder to
    keep every start's report in (``<placement>-<i>.json``)."""
    from initpipe_vllm.tools.startup_compare import DEFAULT_MIN_S, DEFAULT_RATIO, compare

    n = starts or (2 if smoke else 4)
    reports: dict[str, list[dict[str, Any]]] = {k: [] for k in PLACEMENTS}
    with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
        folder = keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(n):  # alternating: the machine's drift falls on both
            for name, args in PLACEMENTS.items():
                reports[name].append(_start(args, folder / f"{name}-{i}.json"))
    rows = []
    for name, rs in reports.items():
        worst_ratio, worst_ratio_row, worst_delta, worst_delta_row, flagged = 1.0, "", 0.0, "", 0
        pairs = list(itertools.permutations(rs, 2))  # each start against each other one
        for base, now in pairs:
            result = compare(base, now, ratio=1.0, min_s=0.0)
            for r in result["rows"]:
                if r["now_s"] is None or r["base_s"] is None:
                    continue
                if r["base_s"] >= DEFAULT_MIN_S and r["now_s"] / r["base_s"] > worst_ratio:
                    worst_ratio = r["now_s"] / r["base_s"]
                    worst_ratio_row = f"{r['source']}:{r['name']}"
                if r["delta_s"] > worst_delta:
                    worst_delta, worst_delta_row = r["delta_s"], f"{r['source']}:{r['name']}"
            flagged += len(compare(base, now)["regressions"])
        walls = [r["wall_s"] for r in rs]
        fractions = [r["attributed_fraction"] for r in rs]
        by_spans = statistics.median(r["attributed_spans_s"] / r["wall_s"] for r in rs)
        gaps = [g for r in rs for g in r["unattributed"]]
        widest = max(gaps, key=lambda g: g["end_s"] - g["start_s"], default=None)
        where = (
            f"{1e3 * (widest['end_s'] - widest['start_s']):.0f} ms inside "
            f"{', '.join(widest['inside']) or 'no span'}"
            if widest
            else "none"
        )
        rows += [
            Row(
                bench="startup",
                name=f"{name}: start to ready (median of {n})",
                value=statistics.median(walls),
                unit="s",
                detail=f"min {min(walls):.2f} max {max(walls):.2f} s",
            ),
            Row(
                bench="startup",
                name=f"{name}: share of the wall attributed (the least of {n})",
                value=min(fractions),
                unit="fraction",
                target=f">= {ATTRIBUTED_TARGET}",
                met=min(fractions) >= ATTRIBUTED_TARGET,
                detail=f"median {100 * statistics.median(fractions):.1f}%, by spans and probes "
                f"alone {100 * by_spans:.1f}%; widest gap left: {where}; "
                f"{sum(bool(r['incomplete']) for r in rs)} starts with a process unflushed",
            ),
            Row(
                bench="startup",
                name=f"{name}: largest slow-down of a row >= {DEFAULT_MIN_S} s, between two starts",
                value=worst_ratio,
                unit="x",
                detail=f"{worst_ratio_row}; largest absolute +{worst_delta:.3f} s "
                f"({worst_delta_row})",
            ),
            Row(
                bench="startup",
                name=f"{name}: rows the defaults flag ({DEFAULT_RATIO}x and +{DEFAULT_MIN_S} s)",
                value=flagged,
                unit="rows",
                target="== 0",
                met=flagged == 0,
                detail=f"{len(pairs)} comparisons (every ordered pair of starts)",
            ),
        ]
    return rows


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else None
    kept = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    for row in run(starts=count, keep=kept):
        print(f"{row.name}: {row.value:.3f} {row.unit}  {row.detail}")
