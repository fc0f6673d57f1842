"""Compare two graph exports: added/removed stages and edges, phase and I/O changes.

The first export is the baseline (``OTHER`` of ``initpipe graph TARGET --diff OTHER``), the
second the candidate (``TARGET``): "added" means present in the candidate only, like
``diff -u OTHER TARGET``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["diff_views", "render_diff_text"]

View = dict[str, Any]
_FIELDS = ("inputs", "outputs", "effects")


def _edge_set(view: View) -> set[tuple[str, str, str | None]]:
    return {(e["from"], e["to"], e.get("key")) for e in view["edges"]}


def diff_views(old: View, new: View) -> dict[str, Any]:
    """Return the differences from ``old`` (baseline) to ``new``.

    Returns:
        ``{"identical": bool, "added_stages": [{"name", "phase"}], "removed_stages": [...],
        "phase_changes": [{"name", "from", "to"}], "changed_stages": [{"name", "field",
        "from", "to"}], "added_edges": [{"from", "to", "key"}], "removed_edges": [...]}``,
        each list sorted.
    """
    a = {s["name"]: s for s in old["stages"]}
    b = {s["name"]: s for s in new["stages"]}
    both = sorted(a.keys() & b.keys())
    ea, eb = _edge_set(old), _edge_set(new)

    def edges(found: set[tuple[str, str, str | None]]) -> list[dict[str, Any]]:
        ordered = sorted(found, key=lambda e: (e[0], e[1], e[2] or ""))
        return [{"from": f, "to": t, "key": k} for f, t, k in ordered]

    out: dict[str, Any] = {
        "added_stages": [{"name": n, "phase": b[n]["phase"]} for n in sorted(b.keys() - a.keys())],
        "removed_stages": [
            {"name": n, "phase": a[n]["phase"]} for n in sorted(a.keys() - b.keys())
        ],
        "phase_changes": [
            {"name": n, "from": a[n]["phase"], "to": b[n]["phase"]}
            for n in both
            if a[n]["phase"] != b[n]["phase"]
        ],
        "changed_stages": [
            {"name": n, "field": f, "from": a[n].get(f, []), "to": b[n].get(f, [])}
            for n in both
            for f in _FIELDS
            if sorted(a[n].get(f, [])) != sorted(b[n].get(f, []))
        ],
        "added_edges": edges(eb - ea),
        "removed_edges": edges(ea - eb),
    }
    out = {"identical": not any(out.values()), **out}
    return out


def _edge(e: dict[str, Any]) -> str:
    return f"{e['from']} -> {e['to']}" + (
        f" ({e['key']})" if e["key"] is not None else " (after/before)"
    )


def render_diff_text(d: dict[str, Any], old_name: str, new_name: str) -> str:
    """Render :func:`diff_views` output as ``+``/``-``/``~`` lines under a ``---/+++`` header."""
    lines = [f"--- {old_name} (baseline)", f"+++ {new_name}"]
    lines += [f"+ stage {s['name']} ({s['phase']})" for s in d["added_stages"]]
    lines += [f"- stage {s['name']} ({s['phase']})" for s in d["removed_stages"]]
    lines += [f"~ stage {c['name']}: phase {c['from']} -> {c['to']}" for c in d["phase_changes"]]
    lines += [
        f"~ stage {c['name']}: {c['field']} [{', '.join(c['from'])}] -> [{', '.join(c['to'])}]"
        for c in d["changed_stages"]
    ]
    lines += [f"+ edge {_edge(e)}" for e in d["added_edges"]]
    lines += [f"- edge {_edge(e)}" for e in d["removed_edges"]]
    if d["identical"]:
        lines.append("identical: same stages, phases, inputs, outputs and edges")
    else:
        n = sum(len(v) for k, v in d.items() if k != "identical")
        lines.append(f"{n} difference{'s' if n != 1 else ''}")
    return "\n".join(lines) + "\n"
