"""Run every benchmark and write BENCHMARKS.md (a Markdown table) and benchmarks/results.json.

Usage: ``python -m benchmarks [--smoke] [--only NAME ...] [--out DIR]``. Every figure is
measured side by side in this one run (ratios, min/median over repeats); nothing here is a
pass/fail test. ``--smoke`` runs each at a tiny size (CI does this) and writes nothing
unless ``--out`` is given. ``--only`` replaces those benchmarks' rows in the report already
there and keeps the others, each with the date of the run that measured it
(:func:`merged`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

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


def merged(
    previous: dict[str, Any] | None,
    names: list[str],
    rows: list[Row],
    errors: dict[str, str],
    info: dict[str, Any],
) -> dict[str, Any]:
    """The report's data after a run of ``names``: their rows and errors replace those
    benchmarks' in ``previous`` (the report already written; None: none), the other
    benchmarks keep theirs, and ``runs`` says which run measured each benchmark."""
    data: dict[str, Any] = {"machine": info, "rows": [], "errors": {}, "runs": {}}
    if previous is not None:
        before = previous.get("runs") or {r["bench"]: previous["machine"] for r in previous["rows"]}
        data["rows"] = [r for r in previous["rows"] if r["bench"] not in names]
        data["errors"] = {k: v for k, v in previous.get("errors", {}).items() if k not in names}
        data["runs"] = {k: v for k, v in before.items() if k not in names}
    data["rows"] += [attrs.asdict(r) for r in rows]
    data["errors"].update(errors)
    data["runs"].update({r.bench: info for r in rows})
    order = {name: i for i, name in enumerate(BENCHES)}
    data["rows"].sort(key=lambda r: order.get(r["bench"], len(order)))  # stable: in-bench order
    return data


def markdown(data: dict[str, Any]) -> str:
    """Render the report (:func:`merged`'s data)."""
    info = data["machine"]
    dates = {bench: run["date"] for bench, run in data.get("runs", {}).items()}
    if len(set(dates.values())) > 1:
        by_date: dict[str, list[str]] = {}
        for bench, date in dates.items():
            by_date.setdefault(date, []).append(bench)
        when = "; ".join(f"{', '.join(b)} {d}" for d, b in sorted(by_date.items()))
        runs = f"benchmarks run at different times (`--only`): {when}"
    else:
        runs = f"run {info['date']}"
    lines = [
        "# Benchmarks",
        "",
        f"Machine: {info['platform']}, Python {info['python']}, {info['cpus']} CPUs "
        f"({info['processor']}); {runs}. Regenerate with `make bench`.",
        "",
        "Every figure of a benchmark was measured side by side in one run; ratios compare "
        "runs alternated in the same process or back-to-back processes.",
        "",
        "| bench | figure | value | target | met | detail |",
        "|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        met = {True: "yes", False: "**no**", None: ""}[r["met"]]
        value = f"{r['value']:g} {r['unit']}"
        lines.append(
            f"| {r['bench']} | {r['name']} | {value} | {r['target']} | {met} | {r['detail']} |"
        )
    errors = data["errors"]
    if errors:
        lines += ["", "Not measured:", ""]
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
    out = args.out if args.out is not None else (None if args.smoke else ROOT)
    previous = None
    if out is not None and args.only and (out / "benchmarks.json").exists():
        previous = json.loads((out / "benchmarks.json").read_text())
    data = merged(previous, names, rows, errors, info)
    report = markdown(data)
    print(report)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "BENCHMARKS.md").write_text(report)
        (out / "benchmarks.json").write_text(json.dumps(data, indent=1))
    return 1 if any(v.startswith("failed") for v in errors.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
