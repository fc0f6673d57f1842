"""``initpipe graph``: load a target, then check, draw, time (``--trace``) or diff it.

Exit status: 0 done (valid / identical), 1 the pipeline is invalid or differs from
``--diff``, 2 usage error (raised as :class:`~initpipe.errors.UsageError`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from .._pipeline import Pipeline
from .._stage import PHASES
from .._trace import Trace, blame, critical_path
from ..errors import (
    ExportError,
    GraphvizError,
    PipelineValidationError,
    StageDeclarationError,
    TargetError,
    UnknownStageNameError,
    UsageError,
)
from ..files import write_file
from ..view.export import export, load_export, select, with_trace
from ..view.render import RENDERERS, fmt_duration, render_dot
from .target import DEFAULT_TARGET, load_pipeline

__all__ = ["run_graph"]

_SUFFIX_FORMATS = {
    ".txt": "text",
    ".mmd": "mermaid",
    ".mermaid": "mermaid",
    ".dot": "dot",
    ".gv": "dot",
    ".json": "json",
    ".svg": "svg",
    ".png": "png",
    ".html": "html",
    ".htm": "html",
}


class _Invalid(Exception):
    """The target loaded but is not a valid pipeline; carries the problems."""

    def __init__(self, target: str, problems: list[BaseException]) -> None:
        super().__init__(target)
        self.target = target
        self.problems = problems


def _load(target: str) -> Pipeline:
    try:
        return load_pipeline(target)
    except TargetError as err:
        raise UsageError(str(err)) from err
    except PipelineValidationError as err:
        raise _Invalid(target, list(err.problems)) from err
    except StageDeclarationError as err:
        raise _Invalid(target, [err]) from err
    except Exception as err:  # the target's own import-time bug: name it, don't trace back
        raise UsageError(
            f"importing target {target!r} failed: {type(err).__name__}: {err}"
        ) from err


def _problem_data(p: BaseException) -> dict[str, Any]:
    facts = {
        k: list(v) if isinstance(v, tuple) else v
        for k, v in vars(p).items()
        if isinstance(v, (str, int, tuple, list)) and not k.startswith("_")
    }
    return {"type": type(p).__name__, "message": str(p), **facts}


def _report_invalid(inv: _Invalid, fmt: str | None, stream: Any) -> int:
    if fmt == "json":
        data = {
            "ok": False,
            "target": inv.target,
            "problems": [_problem_data(p) for p in inv.problems],
        }
        stream.write(json.dumps(data, indent=2) + "\n")
        return 1
    n = len(inv.problems)
    lines = [f"invalid pipeline {inv.target!r}: {n} problem{'s' if n != 1 else ''}"]
    lines += [f"  {i}. {type(p).__name__}: {p}" for i, p in enumerate(inv.problems, 1)]
    stream.write("\n".join(lines) + "\n")
    return 1


def _summary(p: Pipeline) -> str:
    counts = ", ".join(f"{ph}: {len(p.phase_order(ph))}" for ph in PHASES)
    ne = len(export(p)["edges"])  # counted as in every drawing: one per data key
    return (
        f"OK: pipeline {p.name!r} is valid: {len(p)} stage{'s' if len(p) != 1 else ''} "
        f"({counts}), {ne} edge{'s' if ne != 1 else ''}"
    )


def _read_one(path: str, p: Pipeline) -> tuple[dict[str, float], dict[str, float]]:
    """(durations, start times) of the stages of ``p`` in one trace file."""
    try:
        trace = Trace.from_dict(json.loads(Path(path).read_text()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError(f"cannot read trace {path!r}: {err}") from err
    except (KeyError, TypeError, AttributeError) as err:
        raise UsageError(
            f"{path!r} is not an initpipe trace (write one with Trace.write_json): missing {err}"
        ) from err
    durations = trace.durations()
    unknown = sorted(set(durations) - set(p.specs))
    if unknown:
        print(
            f"note: {path}: the trace has stages this pipeline lacks (ignored): "
            f"{', '.join(unknown)}",
            file=sys.stderr,
        )
    durations = {n: d for n, d in durations.items() if n in p.specs}
    starts = {e.name: e.start for e in trace.events if e.kind == "stage" and e.outcome == "ok"}
    return durations, starts


def _rank_label(path: str) -> str:
    """``trace.rank1.json`` -> ``rank 1`` (how INITPIPE_TRACE names a rank's file), else the
    file's name."""
    found = re.search(r"\.rank(\d+)(?:\.|$)", Path(path).name)
    return f"rank {found.group(1)}" if found else Path(path).name


def _read_trace(
    paths: list[str], p: Pipeline
) -> tuple[dict[str, float], dict[str, float], list[str], dict[str, str]]:
    """(durations, start times, critical path, slowest file per stage) of the stages of
    ``p`` over one trace or several (one per rank): each stage's duration is its slowest
    rank's, the one a phase waits for; the slowest map is empty for one file."""
    labels = [_rank_label(path) for path in paths]
    if len(set(labels)) != len(labels):
        labels = list(paths)  # two files of the same rank name: tell them apart by path
    durations: dict[str, float] = {}
    starts: dict[str, float] = {}
    slowest: dict[str, str] = {}
    for path, label in zip(paths, labels, strict=True):
        d, st = _read_one(path, p)
        for name, seconds in d.items():
            if name not in durations or seconds > durations[name]:
                durations[name] = seconds
                slowest[name] = label
                if name in st:
                    starts[name] = st[name]
    path_ = [n for n, _ in critical_path(p.graph, durations)] if durations else []
    return durations, starts, path_, slowest if len(paths) > 1 else {}


def _blame(view: dict[str, Any], starts: dict[str, float], fmt: str) -> str:
    """``systemd-analyze blame`` then ``critical-chain``, for the stages in ``view``."""
    phase = {s["name"]: s["phase"] for s in view["stages"]}
    slowest = {s["name"]: s["slowest"] for s in view["stages"] if s.get("slowest")}
    durations = {s["name"]: s["duration"] for s in view["stages"] if s.get("duration") is not None}
    ranked = blame(durations)
    chain = view.get("critical_path", [])
    if fmt == "json":
        return (
            json.dumps(
                {
                    "blame": [
                        {"name": n, "phase": phase[n], "duration": d}
                        | ({"slowest": slowest[n]} if n in slowest else {})
                        for n, d in ranked
                    ],
                    "critical_path": [
                        {"name": n, "start": starts.get(n), "duration": durations.get(n)}
                        for n in chain
                    ],
                    "total": sum(durations.values()),
                },
                indent=2,
            )
            + "\n"
        )
    width = max((len(n) for n in durations), default=0)
    lines = [
        f"{fmt_duration(d):>9} {n:<{width}}  ({phase[n]}"
        + (f", slowest: {slowest[n]})" if n in slowest else ")")
        for n, d in ranked
    ]
    lines += ["", "critical chain (@start +duration):"]
    for i, n in enumerate(chain):
        at = f" @{fmt_duration(starts[n])}" if n in starts else ""
        lines.append(f"{'  ' * i}{'└─' if i else ''}{n}{at} +{fmt_duration(durations.get(n))}")
    lines.append(f"total stage time {fmt_duration(sum(durations.values()))}")
    return "\n".join(lines) + "\n"


def _other_view(other: str) -> dict[str, Any]:
    if other.endswith(".json") or os.path.isfile(other):
        try:
            return load_export(other)
        except ExportError as err:
            raise UsageError(str(err)) from err
    return export(_load(other))


def _render(view: dict[str, Any], fmt: str) -> bytes:
    if fmt in RENDERERS:
        return RENDERERS[fmt](view).encode()
    from ..view.graphviz import graphviz  # only svg/png/html need Graphviz

    try:
        if fmt == "html":
            from ..view.html import render_html

            svg = graphviz(render_dot(view), "svg", purpose="html").decode()
            return render_html(view, svg).encode()
        return graphviz(render_dot(view), fmt)
    except GraphvizError as err:
        raise UsageError(str(err)) from err


def _write(data: bytes, output: str | None, fmt: str) -> None:
    if output is None:
        if fmt == "png" and sys.stdout.isatty():
            raise UsageError("--format png is binary; write it to a file with -o FILE.png")
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    try:
        write_file(output, data)
    except OSError as err:
        raise UsageError(f"cannot write {output!r}: {err.strerror or err}") from err


def _format(args: argparse.Namespace) -> str:
    if args.format:
        return str(args.format)
    if args.output:
        return _SUFFIX_FORMATS.get(Path(args.output).suffix.lower(), "text")
    return "text"


def run_graph(args: argparse.Namespace) -> int:
    """Handle ``initpipe graph`` (arguments as declared by ``initpipe.cli.add_graph``)."""
    target = args.target or DEFAULT_TARGET
    fmt = _format(args)
    if args.blame and not args.trace:
        raise UsageError("--blame needs --trace FILE (a trace JSON written by Trace.write_json)")
    if args.check and (args.trace or args.diff):
        raise UsageError("--check validates only; drop --trace/--diff")
    if args.diff and args.focus:
        raise UsageError("--diff compares whole pipelines (or one --phase); drop --focus")
    try:
        p = _load(target)
        other = _other_view(args.diff) if args.diff else None
    except _Invalid as inv:
        stream = sys.stdout if args.check else sys.stderr
        return _report_invalid(inv, "json" if args.check and fmt == "json" else None, stream)
    if args.focus is not None:
        try:
            p.stage(args.focus)
        except UnknownStageNameError as err:
            raise UsageError(f"--focus: {err}") from err
    if args.check:
        out = (
            json.dumps({"ok": True, "target": target, "problems": []}) + "\n"
            if fmt == "json"
            else _summary(p) + "\n"
        )
        _write(out.encode(), args.output, "text")
        return 0
    view = export(p)
    starts: dict[str, float] = {}
    if args.trace:
        durations, starts, path, slowest = _read_trace(args.trace, p)
        view = with_trace(view, durations, path, slowest)
    view = select(view, phase=args.phase, focus=args.focus)
    if args.blame:
        _write(_blame(view, starts, fmt).encode(), args.output, "text")
        return 0
    if other is not None:
        from ..view.diff import diff_views, render_diff_text

        d = diff_views(select(other, phase=args.phase), view)
        text = (
            json.dumps(d, indent=2) + "\n"
            if fmt == "json"
            else render_diff_text(d, args.diff, target)
        )
        _write(text.encode(), args.output, "text")
        return 0 if d["identical"] else 1
    _write(_render(view, fmt), args.output, fmt)
    return 0
