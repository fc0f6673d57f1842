"""Renderings of a start-up report (:mod:`.startup_report`): text in systemd-analyze's
manner, per-process trees, JSON, a Chrome/Perfetto trace and an HTML Gantt chart.

What belongs here: drawing a report dict, nothing else (no reading, no vLLM).
"""

from __future__ import annotations

import html as _html
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

__all__ = ["FORMATS", "render", "render_compare"]

FORMATS = ("text", "tree", "json", "chrome", "html")
#: The report's sources, as the summary names them.
_SOURCES = {
    "vllm": "vLLM spans",
    "probe": "initpipe probes",
    "initpipe": "initpipe stage spans",
    "interval": "named intervals",
}
_TOP = 15


def render(report: dict[str, Any], fmt: str) -> str:
    """``report`` as ``fmt`` (one of :data:`FORMATS`)."""
    if fmt == "json":
        return json.dumps(report, indent=1)
    if fmt == "chrome":
        return json.dumps(chrome(report))
    if fmt == "html":
        return html(report)
    if fmt == "tree":
        return tree(report)
    return text(report)


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f} s"


def _placement(report: dict[str, Any]) -> str:
    p = report.get("placement") or {}
    if "mode" not in p:
        return f"spans from {p.get('source', 'a trace')}"
    runner = p.get("model_runner") or "auto"
    text = (
        f"{p['mode']}, TP={p.get('tensor_parallel_size', 1)}, {p.get('worker', '?')} worker, "
        + ("" if runner == "auto" else f"model runner {runner}, ")
        + f"model {p.get('model', '?')}"
    )
    if p.get("test_device"):
        text += f"\n  (Model Runner V2 through {p['test_device']})"
    return text


def _by_id(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["id"]: s for s in report["spans"]}


def _label(s: dict[str, Any]) -> str:
    what = "interval" if s.get("kind") == "interval" else s["source"]
    return f"{s['name']}  [{s['process']}, {what}]"


def text(report: dict[str, Any], top: int = _TOP) -> str:
    """The summary, phases, critical chain, blame and gaps."""
    wall = report["wall_s"]
    frac = report.get("attributed_fraction")
    spans_frac = report["attributed_spans_s"] / wall if wall else 0.0
    out = [
        f"initpipe startup: {_placement(report)}",
        f"ready after {_s(wall)} (the first process's start to ready)"
        + (
            f"; first token at {_s(report['first_token_s'])}" if report.get("first_token_s") else ""
        ),
        f"attributed: {100 * (frac or 0):.1f}% ({_s(report['attributed_s'])}: leaf spans and "
        f"initpipe's named intervals); by spans alone {100 * spans_frac:.1f}% "
        f"({_s(report['attributed_spans_s'])})",
        f"unattributed: {_s(report['unattributed_s'])} in {len(report['unattributed'])} gaps "
        "of 1 ms or more (time no leaf span or interval covers)",
    ]
    failed = (report.get("placement") or {}).get("failed")
    if failed:
        out.append(f"THE START FAILED: {failed}")
    for e in report.get("errors", []):
        out.append(f"error span: {e['name']} ({e['process']}): {e['message']}")
    sources = report.get("sources")
    if sources:
        out.append(
            "measured by: "
            + ", ".join(
                f"{sources[k]['count']} {what}"
                for k, what in _SOURCES.items()
                if sources.get(k, {}).get("count")
            )
        )
    for m in (report.get("probes") or {}).get("missing", []):
        where = ", ".join(m["processes"])
        out.append(f"probe {m['target']} missing in {where}: {m['error']}")
    for note in report.get("notes", []):
        out.append(f"note ({', '.join(note['processes'])}): {note['text']}")
    if report.get("incomplete"):
        out.append(
            "spans may be missing from: "
            + ", ".join(report["incomplete"])
            + " (no flush confirmed)"
        )
    out += ["", "processes"]
    for p in report["processes"]:
        created = "" if p.get("create_s") is None else f"  created @{p['create_s']:.3f} s"
        out.append(f"  {p['name']:<22} pid {p['pid']}{created}")
    out += ["", "phases (wall time of each phase's own time; parallel ranks count once)"]
    for phase, data in report["phases"].items():
        parts = ", ".join(f"{k} {v:.3f}" for k, v in list(data["by_name"].items())[:4])
        more = len(data["by_name"]) - 4
        out.append(
            f"  {phase:<26} {data['wall_s']:8.3f} s   {parts}"
            + (f", +{more} more" if more > 0 else "")
        )
    by_id = _by_id(report)
    out += ["", "critical chain (@start +duration; the chain of leaves that ends at ready)"]
    for sid in report["critical_path"]:
        s = by_id[sid]
        out.append(
            f"  @{s['start_s']:8.3f} s +{s['end_s'] - s['start_s']:7.3f} s  {_label(s)}"
            + _ancestry(s, by_id)
        )
    out += ["", f"blame (own time, the {top} largest)"]
    ranked = sorted(report["spans"], key=lambda s: -s["self_s"])[:top]
    for s in ranked:
        out.append(f"  {s['self_s']:8.3f} s  {_label(s)}")
    gaps = sorted(report["unattributed"], key=lambda g: g["start_s"] - g["end_s"])[:10]
    out += ["", f"unattributed (the {len(gaps)} longest of {len(report['unattributed'])} gaps)"]
    for g in gaps:
        where = ", ".join(g["inside"]) or "outside every span"
        out.append(f"  @{g['start_s']:8.3f} s +{g['end_s'] - g['start_s']:7.3f} s  inside: {where}")
    return "\n".join(out)


def _ancestry(s: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> str:
    names: list[str] = []
    p = by_id.get(s["parent"] or "")
    while p is not None and len(names) < 3:
        names.append(p["name"])
        p = by_id.get(p["parent"] or "")
    return ("  in " + " < ".join(names)) if names else ""


def tree(report: dict[str, Any]) -> str:
    """One tree per process: each span's start, wall and own time, indented by nesting."""
    by_id = _by_id(report)
    kids: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for s in report["spans"]:
        parent = s["parent"] if s["parent"] in by_id else None
        if parent is not None and by_id[parent]["process"] != s["process"]:
            parent = None  # a remote parent: the span roots its process's tree
        kids[parent].append(s)
    out = []
    for p in report["processes"]:
        out.append(f"{p['name']} (pid {p['pid']})")

        def walk(s: dict[str, Any], depth: int) -> None:
            mark = "  ERROR" if s["status"] == "error" else ""
            out.append(
                f"  {'  ' * depth}{s['name']}  @{s['start_s']:.3f}"
                f" +{s['end_s'] - s['start_s']:.3f} s (own {s['self_s']:.3f} s){mark}"
            )
            for c in sorted(kids.get(s["id"], []), key=lambda c: c["start_s"]):
                if c["process"] == s["process"]:
                    walk(c, depth + 1)

        for s in sorted(kids[None], key=lambda s: s["start_s"]):
            if s["process"] == p["name"]:
                walk(s, 0)
        out.append("")
    return "\n".join(out).rstrip()


def chrome(report: dict[str, Any]) -> dict[str, Any]:
    """The Trace Event Format (``chrome://tracing``, ui.perfetto.dev): one process per
    vLLM process, complete events in microseconds from the origin; the gaps in a row of
    their own."""
    pids = {p["name"]: i + 1 for i, p in enumerate(report["processes"])}
    events: list[dict[str, Any]] = []
    for name, pid in pids.items():
        events.append(
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
        )
    critical = set(report["critical_path"])
    for s in report["spans"]:
        events.append(
            {
                "ph": "X",
                "name": s["name"],
                "cat": "interval" if s.get("kind") == "interval" else s["source"],
                "pid": pids.get(s["process"], 0),
                "tid": 0,
                "ts": round(s["start_s"] * 1e6, 1),
                "dur": round((s["end_s"] - s["start_s"]) * 1e6, 1),
                "args": {
                    "id": s["id"],
                    "phase": s["phase"],
                    "self_s": s["self_s"],
                    "status": s["status"],
                    "critical": s["id"] in critical,
                },
            }
        )
    gap_pid = len(pids) + 1
    events.append(
        {
            "ph": "M",
            "name": "process_name",
            "pid": gap_pid,
            "tid": 0,
            "args": {"name": "unattributed"},
        }
    )
    for g in report["unattributed"]:
        events.append(
            {
                "ph": "X",
                "name": "unattributed",
                "cat": "gap",
                "pid": gap_pid,
                "tid": 0,
                "ts": round(g["start_s"] * 1e6, 1),
                "dur": round((g["end_s"] - g["start_s"]) * 1e6, 1),
                "args": {"inside": g["inside"]},
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"schema": report["schema"]},
    }


#: The page's template (a package file: HTML, CSS and the script that draws the chart).
_PAGE_FILE = Path(__file__).with_name("startup_page.html")


def html(report: dict[str, Any]) -> str:
    """A self-contained page: one row per span under its process, bars on one time axis
    (critical chain outlined, errors red), the unattributed gaps in a row of their own."""
    wall = report["wall_s"]
    frac = report.get("attributed_fraction") or 0.0
    summary = (
        f"ready after {wall:.3f} s; attributed {100 * frac:.1f}%; unattributed "
        f"{report['unattributed_s']:.3f} s"
        + (
            f"; first token at {report['first_token_s']:.3f} s"
            if report.get("first_token_s")
            else ""
        )
    )
    data = json.dumps(report).replace("</", "<\\/")
    return (
        _PAGE_FILE.read_text()
        .replace("__PLACEMENT__", _html.escape(_placement(report)))
        .replace("__SUMMARY__", _html.escape(summary))
        .replace("__DATA__", data)
    )


def render_compare(result: dict[str, Any], *, base_name: str, now_name: str) -> str:
    """The comparison table: every row that changed by 1 ms or more, regressions marked."""
    t = result["thresholds"]
    out = [
        f"initpipe startup: {now_name} against {base_name} (a regression: {t['ratio']}x slower "
        f"and +{t['min_s']} s or more; compared: {t['only']})",
        "",
        f"  {'':3}{'source':<9}{'name':<40}{'base':>10}{'now':>10}{'delta':>10}",
    ]
    for r in result["rows"]:
        if abs(r["delta_s"]) < 1e-3 and not r["regression"]:
            continue
        base = "-" if r["base_s"] is None else f"{r['base_s']:.3f}"
        now = "-" if r["now_s"] is None else f"{r['now_s']:.3f}"
        flag = "!! " if r["regression"] else "   "
        out.append(
            f"  {flag}{r['source']:<9}{r['name'][:39]:<40}{base:>10}{now:>10}{r['delta_s']:>+10.3f}"
        )
    regs = result["regressions"]
    out += [
        "",
        f"{len(regs)} regression(s)"
        + (": " + ", ".join(f"{r['name']} ({r['source']})" for r in regs) if regs else ""),
    ]
    return "\n".join(out)
