"""Cold ``initpipe graph`` vs ``python -c "import vllm"``, side by side in one run.

Each sample is a fresh interpreter (the OS file cache is warm: one discarded run of each
command first also writes the ``.pyc`` files). The commands alternate, ``repeats`` times,
and the report gives min and median wall time of each and their ratio.

Standalone: ``python benchmarks/cli_latency.py [--repeats N] [--target T] [--json]``.
Through the runner: ``python -m benchmarks --only cli_latency``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import Row, mm

#: Targets from PRODUCT.md.
MAX_SECONDS = 0.3
MAX_RATIO = 0.1


def commands(target: str | None = None) -> dict[str, list[str]]:
    """The commands compared: ``initpipe graph`` (on the catalog), ``import vllm``, baseline."""
    graph = [sys.executable, "-m", "initpipe.cli", "graph"] + ([target] if target else [])
    return {
        "initpipe graph": graph,
        "import vllm": [sys.executable, "-c", "import vllm"],
        "python -c pass": [sys.executable, "-c", "pass"],
    }


def _once(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600, check=False
    )
    elapsed = time.perf_counter() - t0
    if res.returncode != 0:
        msg = f"{' '.join(argv[1:])} exited {res.returncode}: {res.stderr.decode()[-500:]}"
        raise RuntimeError(msg)
    return elapsed


def measure(repeats: int = 5, target: str | None = None) -> dict[str, Any]:
    """Time each command ``repeats`` times, alternating; return samples and summary."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cpu")}
    cmds = commands(target)
    for argv in cmds.values():  # warm-up: .pyc files and the OS file cache
        _once(argv, env)
    samples: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(repeats):
        for name, argv in cmds.items():
            samples[name].append(_once(argv, env))
    summary = {k: dict(zip(("min", "median"), mm(v), strict=True)) for k, v in samples.items()}
    g, v = summary["initpipe graph"], summary["import vllm"]
    return {
        "target": target or "initpipe_vllm (default)",
        "repeats": repeats,
        "samples": samples,
        "summary": summary,
        "ratio_min": g["min"] / v["min"],
        "ratio_median": g["median"] / v["median"],
        "targets": {"seconds": MAX_SECONDS, "ratio": MAX_RATIO},
    }


def run(smoke: bool = False) -> list[Row]:
    """Rows for the benchmark runner (``python -m benchmarks``)."""
    res = measure(repeats=1 if smoke else 5)
    g, v = res["summary"]["initpipe graph"], res["summary"]["import vllm"]
    detail = (
        f"graph min/med {g['min']:.3f}/{g['median']:.3f} s; import vllm min/med "
        f"{v['min']:.3f}/{v['median']:.3f} s; python -c pass min "
        f"{res['summary']['python -c pass']['min']:.3f} s; {res['repeats']} alternated"
    )
    return [
        Row(
            bench="cli_latency",
            name="initpipe graph, cold (median)",
            value=g["median"],
            unit="s",
            target=f"<= {MAX_SECONDS}",
            met=g["median"] <= MAX_SECONDS,
            detail=detail,
        ),
        Row(
            bench="cli_latency",
            name="initpipe graph / import vllm (median)",
            value=res["ratio_median"],
            unit="x",
            target=f"<= {MAX_RATIO}",
            met=res["ratio_median"] <= MAX_RATIO,
            detail=detail,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    """Print the comparison (a table, or JSON with ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--target", help="graph target (default: the vLLM catalog)")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    res = measure(args.repeats, args.target)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"cold wall time, {res['repeats']} alternated fresh processes each (seconds)")
    print(f"{'command':<16} {'min':>7} {'median':>7}")
    for name, s in res["summary"].items():
        print(f"{name:<16} {s['min']:>7.3f} {s['median']:>7.3f}")
    print(
        f"initpipe graph / import vllm: {res['ratio_min']:.3f} (min), "
        f"{res['ratio_median']:.3f} (median); targets: <= {MAX_SECONDS} s and "
        f"<= {MAX_RATIO}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
