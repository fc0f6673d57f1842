"""Live KV resize vs an engine restart, and the memory a shrink or a release returns.

A child process (``benchmarks/_resize_child.py``; an in-process engine mutates its
process) starts an in-process engine with the pipelined worker on the tiny Llama (dummy
weights, eager, float32) and:

- resizes it alternately to 32 and 64 blocks, generating between resizes; each
  ``ResizeReport`` gives the total and the per-step seconds (pause, teardown, KV phase,
  warm-up, scheduler, resume);
- then grows the same engine to ``kv_cache_memory_bytes`` = 1 GiB (64 MiB with
  ``--smoke``), shrinks it to a quarter, grows it back, releases and resumes; the reports
  carry the worker's RSS (this process, read after ``malloc_trim``) around the teardown.

The restart it is compared with is a stock engine start: ``LLM()`` in-process and the
whole process (interpreter, imports, engine, shutdown), from :mod:`benchmarks.engine` when
it ran earlier in this run, else measured here — side by side in one run. Goal (issue):
resize >= 20x faster than an in-process restart. Memory goals: the teardown of a
1 GiB -> 256 MiB shrink returns >= 90% of the freed KV bytes to the OS; a release >= 95%.
Untested on GPU (no GPU with vLLM on the development machines).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ._common import Row, mm

ROOT = Path(__file__).resolve().parents[1]
MIN_RESTART_RATIO = 20.0
MIN_SHRINK_RETURNED = 0.90
MIN_RELEASE_RETURNED = 0.95


def measure(repeats: int, big: int) -> dict[str, Any]:
    """Run the child; its JSON result."""
    from ._resize_child import MARK

    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cpu"),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    res = subprocess.run(
        [sys.executable, "-m", "benchmarks._resize_child", str(repeats), str(big)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(MARK)]
    if res.returncode != 0 or not lines:
        raise RuntimeError(f"resize child exited {res.returncode}: {res.stderr[-2000:]}")
    return json.loads(lines[-1][len(MARK) :])


def _returned(report: dict[str, Any]) -> float:
    """Share of the freed KV bytes the teardown gave back to the OS: the worker's RSS drop
    from before the teardown to right after it (before the new cache is allocated)."""
    rank = report["ranks"][0]
    if rank["rss_before"] is None or rank["rss_torn_down"] is None or not report["bytes_freed"]:
        return float("nan")
    return (rank["rss_before"] - rank["rss_torn_down"]) / report["bytes_freed"]


def rows(res: dict[str, Any], llm_s: list[float], wall_s: list[float], source: str) -> list[Row]:
    """Rows from a child's result and the restart samples."""
    reports = res["resize"]
    totals = [r["total_s"] for r in reports]
    t_min, t_med = mm(totals)
    steps = {k: mm([r["steps"][k] for r in reports])[1] for k in reports[0]["steps"]}
    breakdown = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in steps.items())
    out = [
        Row(
            bench="resize",
            name="KV resize, tiny model (median)",
            value=round(t_med * 1e3, 2),
            unit="ms",
            detail=f"min {t_min * 1e3:.2f} ms over {len(totals)} resizes 32<->64 blocks; "
            f"median per step (ms): {breakdown}",
        )
    ]
    for samples, what, target in (
        (llm_s, "LLM() in-process", True),
        (wall_s, "whole process", False),
    ):
        ratio = mm(samples)[1] / t_med
        out.append(
            Row(
                bench="resize",
                name=f"engine restart ({what}) / KV resize (median)",
                value=round(ratio, 1),
                unit="x",
                target=f">= {MIN_RESTART_RATIO:g}" if target else "",
                met=(ratio >= MIN_RESTART_RATIO) if target else None,
                detail=f"restart = {source}, median {mm(samples)[1]:.3f} s",
            )
        )
    mem = res["memory"]
    mib = mem["bytes"] / (1 << 20)
    shrink, release = mem["shrink"], mem["release"]
    out.append(
        Row(
            bench="resize",
            name=f"KV resize {mib:.0f} MiB -> {mib / 4:.0f} MiB (total)",
            value=round(shrink["total_s"] * 1e3, 1),
            unit="ms",
            detail=", ".join(f"{k} {v * 1e3:.1f}" for k, v in shrink["steps"].items()),
        )
    )
    for name, rep, goal in (
        (f"shrink {mib:.0f} -> {mib / 4:.0f} MiB", shrink, MIN_SHRINK_RETURNED),
        (f"release of {mib:.0f} MiB", release, MIN_RELEASE_RETURNED),
    ):
        share = _returned(rep)
        rank = rep["ranks"][0]
        out.append(
            Row(
                bench="resize",
                name=f"RSS returned by the {name} / freed KV bytes",
                value=round(share, 4),
                unit="x",
                target=f">= {goal}",
                met=share >= goal,
                detail=f"freed {rep['bytes_freed'] / (1 << 20):.1f} MiB, then allocated "
                f"{rep['bytes_allocated'] / (1 << 20):.1f} MiB; worker RSS "
                f"{rank['rss_before'] / (1 << 20):.1f} -> {rank['rss_torn_down'] / (1 << 20):.1f}"
                f" MiB across the teardown, {rank['rss_after'] / (1 << 20):.1f} MiB at the end "
                f"(after malloc_trim)",
            )
        )
    return out


def restart_seconds(smoke: bool) -> tuple[list[float], list[float], str]:
    """Stock engine starts: reused from the engine bench when it ran in this run."""
    from .kv import restart_seconds as shared

    return shared(smoke)


def run(smoke: bool = False) -> list[Row]:
    """Rows for the benchmark runner."""
    res = measure(4 if smoke else 40, (64 << 20) if smoke else (1 << 30))
    return rows(res, *restart_seconds(smoke))
