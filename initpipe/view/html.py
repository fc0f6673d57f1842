"""One self-contained HTML page for a graph export: inline SVG, stage table, details panel.

Nothing is fetched: the SVG (laid out by Graphviz), the CSS, the script and the export
itself (``<script type="application/json" id="initpipe-data">``) are all inline, so the file
opens from disk with no network. Hovering a stage (in the drawing or the table) shows its
inputs, outputs, effects, doc and duration; clicking pins it and highlights its lineage;
``#stage=NAME`` in the URL selects a stage on load.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

from .render import CRITICAL, PHASE_COLORS, fmt_duration

__all__ = ["render_html"]

View = dict[str, Any]

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0;
  color:#111;background:#fafafa}
header{padding:12px 20px;background:#fff;border-bottom:1px solid #ddd}
h1{font-size:18px;margin:0 0 4px}
.legend span{display:inline-block;margin-right:14px}
.chip{display:inline-block;padding:0 6px;border-radius:4px;border:1px solid;font-size:12px}
main{display:flex;gap:16px;padding:16px 20px;align-items:flex-start}
#graph{flex:1;overflow:auto;background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px}
#graph svg{max-width:100%;height:auto}
#details{width:340px;position:sticky;top:10px;background:#fff;border:1px solid #ddd;
  border-radius:6px;padding:12px;min-height:120px}
#details h2{font-size:16px;margin:0 0 6px;overflow-wrap:anywhere}
#details dt{font-weight:600;margin-top:6px}
#details dd{margin:0 0 0 10px;overflow-wrap:anywhere}
table{border-collapse:collapse;margin:0 20px 24px;background:#fff;font-size:13px}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
tbody tr{cursor:pointer}
tbody tr:hover,tr.selected{background:#eef2ff}
g.node{cursor:pointer}
g.node:hover path,g.node:hover polygon{stroke-width:3}
svg.has-selection g.node:not(.lineage),svg.has-selection g.edge:not(.lineage){opacity:.25}
g.node.selected path,g.node.selected polygon{stroke-width:4}
.muted{color:#666}
"""

_JS = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("initpipe-data").textContent);
  var byName = {}, ups = {}, downs = {};
  data.stages.forEach(function (s) { byName[s.name] = s; ups[s.name] = []; downs[s.name] = []; });
  data.edges.forEach(function (e) {
    if (byName[e.from] && byName[e.to]) { ups[e.to].push(e); downs[e.from].push(e); }
  });
  var inputPhase = {};
  Object.keys(data.inputs || {}).forEach(function (p) {
    data.inputs[p].forEach(function (k) { inputPhase[k] = p; });
  });
  var svg = document.querySelector("#graph svg");
  var panel = document.getElementById("details");
  var pinned = null;

  function text(tag, value, cls) {
    var el = document.createElement(tag);
    el.textContent = value;
    if (cls) { el.className = cls; }
    return el;
  }
  function reach(name, next) {
    var seen = {}, todo = [name];
    seen[name] = true;
    while (todo.length) {
      next[todo.pop()].forEach(function (e) {
        var m = next === ups ? e.from : e.to;
        if (!seen[m]) { seen[m] = true; todo.push(m); }
      });
    }
    return seen;
  }
  function fmt(sec) {
    if (sec === null || sec === undefined) { return "-"; }
    if (sec >= 1) { return sec.toFixed(3) + "s"; }
    if (sec >= 1e-3) { return (sec * 1e3).toFixed(1) + "ms"; }
    return Math.round(sec * 1e6) + "us";
  }
  function keyList(keys, edges, side) {
    var dd = document.createElement("dd");
    if (!keys.length) { dd.appendChild(text("span", "none", "muted")); return dd; }
    keys.forEach(function (k, i) {
      var who = edges.filter(function (e) { return e.key === k; })
        .map(function (e) { return e[side]; });
      var line = k;
      if (side === "from" && !who.length) {
        line += "  (pipeline input" + (inputPhase[k] ? ": " + inputPhase[k] : "") + ")";
      } else if (side === "from" && (who.length > 1 || who[0] !== k)) {
        line += "  \u2190 " + who.join(", ");
      } else if (side === "to" && who.length) {
        line += "  \u2192 " + who.join(", ");
      }
      if (i) { dd.appendChild(document.createElement("br")); }
      dd.appendChild(text("span", line));
    });
    return dd;
  }
  function show(name) {
    var s = byName[name];
    if (!s) { return; }
    panel.textContent = "";
    panel.dataset.stage = name;
    panel.appendChild(text("h2", s.name));
    var dl = document.createElement("dl");
    function row(label, dd) { dl.appendChild(text("dt", label)); dl.appendChild(dd); }
    row("phase", text("dd", s.phase));
    row("inputs", keyList(s.inputs, ups[name], "from"));
    row("outputs", keyList(s.outputs, downs[name], "to"));
    row("effects", text("dd", s.effects && s.effects.length ? s.effects.join(", ") : "none"));
    if ("duration" in s) { row("duration", text("dd", fmt(s.duration))); }
    row("function", text("dd", s.qualname || s.module || ""));
    row("doc", text("dd", s.doc || ""));
    Object.keys(s.meta || {}).forEach(function (key) {
      var v = s.meta[key];
      row(key, text("dd", Array.isArray(v) ? (v.length ? v.join(", ") : "none") : String(v)));
    });
    panel.appendChild(dl);
  }
  function select(name) {
    if (!byName[name]) { return; }
    pinned = name;
    show(name);
    var lineage = Object.assign({}, reach(name, ups), reach(name, downs));
    if (svg) {
      svg.classList.add("has-selection");
      svg.querySelectorAll("g.node").forEach(function (g) {
        var n = g.id.replace(/^stage-/, "");
        g.classList.toggle("lineage", !!lineage[n]);
        g.classList.toggle("selected", n === name);
      });
      var edgeIds = {};
      data.edges.forEach(function (e) {
        if (lineage[e.from] && lineage[e.to]) { edgeIds["edge-" + e.from + "-" + e.to] = true; }
      });
      svg.querySelectorAll("g.edge").forEach(function (g) {
        g.classList.toggle("lineage", !!edgeIds[g.id]);
      });
    }
    document.querySelectorAll("tbody tr").forEach(function (tr) {
      tr.classList.toggle("selected", tr.dataset.stage === name);
    });
    if (location.hash !== "#stage=" + name) { history.replaceState(null, "", "#stage=" + name); }
  }
  function stageOf(el) {
    var g = el.closest ? el.closest("g.node") : null;
    if (g) { return g.id.replace(/^stage-/, ""); }
    var tr = el.closest ? el.closest("tr[data-stage]") : null;
    return tr ? tr.dataset.stage : null;
  }
  document.addEventListener("mouseover", function (ev) {
    var n = stageOf(ev.target);
    if (n && !pinned) { show(n); }
  });
  document.addEventListener("click", function (ev) {
    var n = stageOf(ev.target);
    if (n) { ev.preventDefault(); select(n); }
  });
  var m = /^#stage=(.+)$/.exec(location.hash);
  if (m) { select(decodeURIComponent(m[1])); }
  document.body.dataset.ready = "1";
})();
"""


def _svg_body(svg: str) -> str:
    """Strip the XML prolog and DOCTYPE so the SVG can sit inside HTML."""
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def _json_for_script(view: View) -> str:
    # "</script>" or "<!--" inside a doc string must not end the script element early.
    return json.dumps(view).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _table(view: View) -> str:
    timed = "critical_path" in view
    crit = set(view.get("critical_path") or [])
    head = ["#", "stage", "phase", "inputs", "outputs", "effects"]
    head += ["duration"] if timed else []
    head += ["doc"]
    rows = []
    for i, s in enumerate(view["stages"], 1):
        fill, stroke = PHASE_COLORS.get(s["phase"], ("#eee", "#555"))
        cells = [
            str(i),
            ("<b>" if s["name"] in crit else "")
            + html.escape(s["name"])
            + ("</b> ★" if s["name"] in crit else ""),
            f'<span class="chip" style="background:{fill};border-color:{stroke}">'
            f"{html.escape(s['phase'])}</span>",
            html.escape(", ".join(s["inputs"])),
            html.escape(", ".join(s["outputs"])),
            html.escape(", ".join(s.get("effects", []))),
        ]
        cells += [fmt_duration(s.get("duration"))] if timed else []
        cells += [html.escape(s.get("doc", ""))]
        rows.append(
            f'<tr data-stage="{html.escape(s["name"])}">'
            + "".join(f"<td>{c}</td>" for c in cells)
            + "</tr>"
        )
    return (
        '<table id="stages"><thead><tr>'
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def render_html(view: View, svg: str) -> str:
    """Return a standalone HTML page for ``view`` around the Graphviz ``svg`` of it.

    Args:
        view: a graph export (optionally with trace durations and ``critical_path``).
        svg: ``render_dot(view)`` laid out by Graphviz (``dot -Tsvg``).
    """
    name = html.escape(view["name"])
    legend = "".join(
        f'<span><span class="chip" style="background:{f};border-color:{b}">{html.escape(p)}'
        f"</span> phase</span>"
        for p, (f, b) in PHASE_COLORS.items()
    )
    if "critical_path" in view:
        legend += (
            f'<span><span class="chip" style="border-color:{CRITICAL};border-width:2px">'
            f"critical path</span> {html.escape(' → '.join(view['critical_path']))}"
            f" ({fmt_duration(view.get('total'))} total stage time)</span>"
        )
    n = len(view["stages"])
    body = re.sub(r"<!--.*?-->", "", _svg_body(svg), flags=re.S)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>initpipe graph: {name}</title>
<style>{_CSS}</style></head>
<body>
<header><h1>initpipe graph: {name}</h1>
<div class="legend">{n} stage{"s" if n != 1 else ""}, {len(view["edges"])} edges &nbsp;
{legend}</div>
<div class="muted">Hover a stage for its inputs and outputs; click to pin it and highlight its
lineage.</div></header>
<main><div id="graph">{body}</div>
<aside id="details"><span class="muted">Hover or click a stage.</span></aside></main>
{_table(view)}
<script type="application/json" id="initpipe-data">{_json_for_script(view)}</script>
<script>{_JS}</script>
</body></html>
"""
