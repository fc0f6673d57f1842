"""Draw a graph export (see :mod:`.export`) as text, Mermaid, Graphviz DOT or JSON.

Each renderer is a small pure function ``view -> str``; a view may carry trace durations
(``stage["duration"]``) and a ``critical_path``, which every renderer shows.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

from .._stage import KV, MODEL

__all__ = [
    "CRITICAL",
    "PHASE_COLORS",
    "RENDERERS",
    "fmt_duration",
    "render_dot",
    "render_json",
    "render_mermaid",
    "render_text",
]

View = dict[str, Any]

#: Fill and border colours per phase, shared by every drawing (and the HTML page).
PHASE_COLORS = {MODEL: ("#dbeafe", "#1d4ed8"), KV: ("#fef3c7", "#b45309")}
CRITICAL = "#dc2626"
_PHASE_TITLE = {
    MODEL: "model phase (runs once the model is loaded)",
    KV: "kv_cache_config phase (re-runnable, once per KV config)",
}


def fmt_duration(seconds: float | None) -> str:
    """Format seconds the way ``systemd-analyze`` does: ``812us``, ``12.3ms``, ``1.204s``."""
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.3f}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f}ms"
    return f"{seconds * 1e6:.0f}us"


def _phases(view: View) -> list[str]:
    seen = list(PHASE_COLORS)
    seen += [s["phase"] for s in view["stages"] if s["phase"] not in seen]
    return seen


def _grouped_edges(view: View) -> Iterator[tuple[str, str, str, bool]]:
    """Yield ``(from, to, label, order_only)`` once per stage pair, keys joined."""
    pairs: dict[tuple[str, str], list[str]] = {}
    for e in view["edges"]:
        keys = pairs.setdefault((e["from"], e["to"]), [])
        if e.get("key") is not None:
            keys.append(e["key"])
    for (a, b), keys in pairs.items():
        yield a, b, ", ".join(keys) if keys else "after/before", not keys


def _critical_pairs(view: View) -> set[tuple[str, str]]:
    path = view.get("critical_path") or []
    return set(itertools.pairwise(path))


def _flow(s: dict[str, Any]) -> str:
    return f"{', '.join(s['inputs']) or '(no inputs)'} -> {', '.join(s['outputs'])}"


def render_text(view: View) -> str:
    """Stages in execution order, grouped by phase: ``inputs -> outputs [effects]``."""
    stages = view["stages"]
    timed = "critical_path" in view
    crit = set(view.get("critical_path") or [])
    counts = ", ".join(f"{p}: {sum(s['phase'] == p for s in stages)}" for p in _phases(view))
    ne = len(view["edges"])
    lines = [
        f"pipeline {view['name']!r}: {len(stages)} stage{'s' if len(stages) != 1 else ''} "
        f"({counts}), {ne} edge{'s' if ne != 1 else ''}"
    ]
    ins = "; ".join(f"{p}: {', '.join(v) or '-'}" for p, v in view.get("inputs", {}).items())
    if ins:
        lines.append(f"inputs: {ins}")
    width = max((len(s["name"]) for s in stages), default=0)
    n = 0
    for phase in _phases(view):
        group = [s for s in stages if s["phase"] == phase]
        if not group:
            continue
        lines += ["", _PHASE_TITLE.get(phase, f"{phase} phase")]
        for s in group:
            n += 1
            mark = "*" if s["name"] in crit else " "
            when = f"{fmt_duration(s.get('duration')):>9} " if timed else ""
            line = f" {mark}{n:>3}. {when}{s['name']:<{width}}  {_flow(s)}"
            if s.get("effects"):
                line += f"  [effects: {', '.join(s['effects'])}]"
            if s.get("package"):
                line += f"  [from package {s['package']}]"
            if s.get("slowest"):
                line += f"  [slowest: {s['slowest']}]"
            lines.append(line)
    if timed:
        path = view["critical_path"]
        spent = sum((s.get("duration") or 0.0) for s in stages if s["name"] in crit)
        lines += [
            "",
            f"critical path (*): {' -> '.join(path) or '(none)'} = "
            f"{fmt_duration(spent)} of {fmt_duration(view.get('total', 0.0))} "
            f"total stage time",
        ]
    return "\n".join(lines) + "\n"


def _mm(text: str) -> str:
    return text.replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")


def render_mermaid(view: View) -> str:
    """A Mermaid ``flowchart``: one subgraph per phase, data keys on the edges."""
    crit = set(view.get("critical_path") or [])
    lines = ["flowchart TD"]
    for phase in _phases(view):
        group = [s for s in view["stages"] if s["phase"] == phase]
        if not group:
            continue
        lines.append(f'  subgraph phase_{phase}["{_mm(phase)} phase"]')
        for s in group:
            label = _mm(s["name"])
            if s.get("package"):
                label += f"<br/><i>{_mm(s['package'])}</i>"
            if s.get("duration") is not None:
                label += f"<br/>{fmt_duration(s['duration'])}"
            lines.append(f'    n_{s["name"]}["{label}"]')
        lines.append("  end")
    crit_edges = _critical_pairs(view)
    red = []
    for i, (a, b, label, order) in enumerate(_grouped_edges(view)):
        arrow = "-.->" if order else "-->"
        lines.append(f'  n_{a} {arrow}|"{_mm(label)}"| n_{b}')
        if (a, b) in crit_edges:
            red.append(str(i))
    for phase in _phases(view):
        fill, stroke = PHASE_COLORS.get(phase, ("#eeeeee", "#555555"))
        lines.append(f"  classDef {phase} fill:{fill},stroke:{stroke},color:#111111")
    lines.append(f"  classDef critical stroke:{CRITICAL},stroke-width:3px")
    for s in view["stages"]:
        lines.append(f"  class n_{s['name']} {s['phase']}")
    if crit:
        lines.append(f"  class {','.join('n_' + n for n in sorted(crit))} critical")
    if red:
        lines.append(f"  linkStyle {','.join(red)} stroke:{CRITICAL},stroke-width:3px")
    return "\n".join(lines) + "\n"


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _attrs(**kw: Any) -> str:
    return "[" + ", ".join(f"{k}={_q(str(v))}" for k, v in kw.items()) + "]"


def render_dot(view: View) -> str:
    """Graphviz DOT: a cluster per phase, stage ids ``stage-NAME`` for the HTML page."""
    crit = set(view.get("critical_path") or [])
    lines = [
        f"digraph {_q(view['name'])} {{",
        '  graph [rankdir="TB", fontname="Helvetica", newrank="true", nodesep="0.3"];',
        '  node [shape="box", style="rounded,filled", fontname="Helvetica", '
        'fontsize="11", penwidth="1.2"];',
        '  edge [fontname="Helvetica", fontsize="9", color="#555555", fontcolor="#333333"];',
    ]
    for phase in _phases(view):
        group = [s for s in view["stages"] if s["phase"] == phase]
        if not group:
            continue
        fill, stroke = PHASE_COLORS.get(phase, ("#eeeeee", "#555555"))
        box = _attrs(label=f"{phase} phase", style="rounded", color=stroke, fontcolor=stroke)
        lines += [f"  subgraph {_q('cluster_' + phase)} {{", f"    graph {box};"]
        for s in group:
            label = s["name"]
            if s.get("package"):
                label += f"\n[{s['package']}]"
            if s.get("duration") is not None:
                label += "\n" + fmt_duration(s["duration"])
            extra = {"color": CRITICAL, "penwidth": "3"} if s["name"] in crit else {"color": stroke}
            lines.append(
                f"    {_q(s['name'])} "
                + _attrs(
                    label=label, id=f"stage-{s['name']}", fillcolor=fill, tooltip=_flow(s), **extra
                )
                + ";"
            )
        lines.append("  }")
    crit_edges = _critical_pairs(view)
    for a, b, label, order in _grouped_edges(view):
        extra = {"style": "dashed"} if order else {}
        if (a, b) in crit_edges:
            extra.update(color=CRITICAL, penwidth="2.5")
        lines.append(
            f"  {_q(a)} -> {_q(b)} "
            + _attrs(label=label, id=f"edge-{a}-{b}", tooltip=f"{a} -> {b}: {label}", **extra)
            + ";"
        )
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_json(view: View) -> str:
    """The export itself, indented, with a trailing newline."""
    return json.dumps(view, indent=2) + "\n"


#: Text renderers by ``--format`` name.
RENDERERS: dict[str, Callable[[View], str]] = {
    "text": render_text,
    "mermaid": render_mermaid,
    "dot": render_dot,
    "json": render_json,
}
