"""Run every benchmark and write BENCHMARKS.md (a Markdown table) and benchmarks/results.json.

Usage: ``python -m benchmarks [--smoke] [--only NAME ...] [--out DIR]``. Every figure is
measured side by side in this one run (ratios, min/median over repeats); nothing here is a
pass/fail test. ``--smoke`` runs each at a tiny size (CI does this) and writes nothing
unless ``--out`` is given.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

import attrs

from ._common import Row, machine

#: benchmark module -> what it measures (the order of the report)
BENCHES = {
    "dispatch": "Dispatch overhead per stage vs direct calls, graphlib and Hamilton",
    "scaling": "Build + validate + order random graphs",
    "cli_latency": "Cold `initpipe graph` vs `python -c 'import vllm'`",
    "engine": "Engine start, stock worker vs initpipe worker",
    "kv": "KV phase and KV re-init vs stock vLLM and vs an engine restart",
    "alloc": "KV allocation at size vs stock and vs torch.zeros",
    "soak": "KV re-init soak: leaks and RSS growth",
    "resize": "Live KV resize vs an engine restart; memory a shrink or release returns",
    "serve": "KV resize over HTTP vs a server restart",
    "refit": "Weight refit vs reading the weights + KV memset, and vs an engine restart",
    "real": "SmolLM2-135M-Instruct: engine start, resize warm/cold and TTFT, refit",
    "mrv2": "Model Runner V2: engine start and KV re-init vs stock MRv2",
    "contract": "The vLLM contract: start-up gate and `initpipe doctor`",
    "spans": "initpipe's stage spans: tracing off vs none, cost per span when on",
    "startup": "Whole vLLM starts back to back: noise, attributed time, --compare defaults",
}

ROOT = Path(__file__).resolve().parents[1]


def run_all(names: list[str], smoke: bool) -> tuple[list[Row], dict[str, str]]:
    """Run the named benchmarks; return rows and the error of each that could not run."""
    rows: list[Row] = []
    errors: dict[str, str] = {}
    for name in names:
        t0 = time.perf_counter()
        print(f"[bench] {name}: {BENCHES[name]} ...", file=sys.stderr, flush=True)
        try:
            mod = importlib.import_module(f"benchmarks.{name}")
            got = mod.run(smoke=smoke)
        except ImportError as err:
            errors[name] = f"not run: {err}"
            print(f"[bench] {name}: {errors[name]}", file=sys.stderr)
            continue
        except Exception as err:  # report it and go on: one broken bench hides no others
            errors[name] = f"failed: {type(err).__name__}: {err}"
            traceback.print_exc()
            continue
        rows.extend(got)
        print(
            f"[bench] {name}: {len(got)} figures in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    return rows, errors


def markdown(rows: list[Row], errors: dict[str, str], info: dict) -> str:
    """Render the report."""
    lines = [
        "# Benchmarks",
        "",
        f"Machine: {info['platform']}, Python {info['python']}, {info['cpus']} CPUs "
        f"({info['processor']}); run {info['date']}. Regenerate with `make bench`.",
        "",
        "Every figure was measured side by side in one run; ratios compare runs "
        "alternated in the same process or back-to-back processes.",
        "",
        "| bench | figure | value | target | met | detail |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        met = {True: "yes", False: "**no**", None: ""}[r.met]
        lines.append(
            f"| {r.bench} | {r.name} | {r.value:g} {r.unit} | {r.target} | {met} | {r.detail} |"
        )
    if errors:
        lines += ["", "Not measured in this run:", ""]
        lines += [f"- {k}: {v}" for k, v in errors.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks``."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, quick (CI)")
    ap.add_argument("--only", nargs="+", choices=list(BENCHES), help="run only these")
    ap.add_argument(
        "--out",
        type=Path,
        help="directory for BENCHMARKS.md and results.json "
        "(default: the repository root, not with --smoke)",
    )
    args = ap.parse_args(argv)
    names = args.only or list(BENCHES)
    rows, errors = run_all(names, args.smoke)
    info = {
        **machine(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "smoke": args.smoke,
    }
    report = markdown(rows, errors, info)
    print(report)
    out = args.out if args.out is not None else (None if args.smoke else ROOT)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "BENCHMARKS.md").write_text(report)
        data = {"machine": info, "rows": [attrs.asdict(r) for r in rows], "errors": errors}
        (out / "benchmarks.json").write_text(json.dumps(data, indent=1))
    return 1 if any(v.startswith("failed") for v in errors.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
