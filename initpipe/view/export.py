"""The graph export: a pipeline as plain JSON data, the one model every renderer draws.

Schema (version 1; fields may be added, never renamed or removed)::

    {
      "version": 1,
      "name": "initpipe_vllm",                       # pipeline name
      "inputs": {"start": [...], "model": [...], "kv_cache_config": [...]},
      "stages": [                                    # in execution order
        {"name": "...", "phase": "model" | "kv_cache_config",
         "inputs": ["key", ...],                     # parameter names = data keys read
         "outputs": ["key", ...],                    # keys provided
         "effects": ["...", ...],                    # external state the stage mutates
         "after": [...], "before": [...],            # ordering-only constraints
         "module": "pkg.mod", "qualname": "pkg.mod:func",
         "package": null | "dist-name",              # who brought the stage (plugins)
         "doc": "first line of the docstring",
         "meta": {"key": "value" | [...] | ...},     # free-form declarations (@stage(meta=))
         "duration": 0.0123}                         # seconds; only with a trace
      ],
      "edges": [                                     # one per data key
        {"from": "a", "to": "b", "key": "kv_cache_spec", "kind": "data"},
        {"from": "a", "to": "c", "key": null, "kind": "order"}    # after=/before= only
      ],
      "order": ["a", "b", ...],                      # execution order
      "critical_path": ["a", "b"],                   # only with a trace
      "total": 0.5                                   # only with a trace: sum of durations
    }

A saved export can be read back (:func:`load_export`) to diff against.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ExportError

if TYPE_CHECKING:
    from .._pipeline import Pipeline

__all__ = ["SCHEMA_VERSION", "export", "load_export", "select", "with_trace"]

SCHEMA_VERSION = 1
View = dict[str, Any]


def export(pipeline: Pipeline) -> View:
    """Return ``pipeline`` as schema-version-1 data (see the module docstring)."""
    stages = []
    for name, s in pipeline.specs.items():
        stages.append(
            {
                "name": name,
                "phase": s.needs,
                "inputs": list(s.inputs),
                "outputs": list(s.provides),
                "effects": list(s.effects),
                "after": list(s.after),
                "before": list(s.before),
                "module": s.module,
                "qualname": s.qualname,
                "package": s.package,
                "doc": s.doc,
                "meta": {k: list(v) if isinstance(v, tuple) else v for k, v in s.meta.items()},
            }
        )
    rank = {n: i for i, n in enumerate(pipeline.order)}
    edges = []
    for a, b, data in sorted(
        pipeline.graph.edges(data=True), key=lambda e: (rank[e[1]], rank[e[0]])
    ):
        if data["keys"]:
            edges += [{"from": a, "to": b, "key": k, "kind": "data"} for k in data["keys"]]
        else:
            edges.append({"from": a, "to": b, "key": None, "kind": "order"})
    return {
        "version": SCHEMA_VERSION,
        "name": pipeline.name,
        "inputs": {p: list(v) for p, v in pipeline.inputs.items()},
        "stages": stages,
        "edges": edges,
        "order": list(pipeline.order),
    }


def load_export(path: str | Path) -> View:
    """Read a saved export (``initpipe graph --format json`` output).

    Raises:
        ExportError: not JSON, or not an export.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ExportError(f"cannot read graph export {str(path)!r}: {err}") from err
    if not (
        isinstance(data, dict)
        and isinstance(data.get("stages"), list)
        and isinstance(data.get("edges"), list)
    ):
        raise ExportError(
            f"{str(path)!r} is not an initpipe graph export (expected an object "
            f"with 'stages' and 'edges'; write one with --format json)"
        )
    data.setdefault("order", [s["name"] for s in data["stages"]])
    data.setdefault("name", str(path))
    data.setdefault("inputs", {})
    return data


def _reach(start: str, edges: Iterable[tuple[str, str]]) -> set[str]:
    nxt: dict[str, list[str]] = {}
    for a, b in edges:
        nxt.setdefault(a, []).append(b)
    seen, todo = {start}, [start]
    while todo:
        for m in nxt.get(todo.pop(), ()):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def select(view: View, *, phase: str | None = None, focus: str | None = None) -> View:
    """Return a copy of ``view`` restricted to one phase and/or one stage's lineage.

    Args:
        phase: keep only stages of this phase.
        focus: keep this stage, its ancestors and its descendants (must exist in ``view``).
    """
    keep = {s["name"] for s in view["stages"]}
    if focus is not None:
        pairs = [(e["from"], e["to"]) for e in view["edges"]]
        keep = _reach(focus, pairs) | _reach(focus, [(b, a) for a, b in pairs])
    if phase is not None:
        keep = {s["name"] for s in view["stages"] if s["phase"] == phase and s["name"] in keep}
    out = dict(view)
    out["stages"] = [s for s in view["stages"] if s["name"] in keep]
    out["edges"] = [e for e in view["edges"] if e["from"] in keep and e["to"] in keep]
    out["order"] = [n for n in view["order"] if n in keep]
    if "critical_path" in view:
        out["critical_path"] = [n for n in view["critical_path"] if n in keep]
    return out


def with_trace(
    view: View,
    durations: Mapping[str, float],
    path: Iterable[str],
    slowest: Mapping[str, str] | None = None,
) -> View:
    """Return a copy of ``view`` with each stage's ``duration`` and the ``critical_path``.

    Args:
        durations: seconds per stage (stages absent from it get ``None``).
        path: the critical path, stage names in order.
        slowest: with several ranks' traces, the rank each stage's duration came from
            (its slowest); each such stage gets ``slowest``.
    """
    out = dict(view)
    slowest = slowest or {}
    out["stages"] = [
        {**s, "duration": durations.get(s["name"])}
        | ({"slowest": slowest[s["name"]]} if s["name"] in slowest else {})
        for s in view["stages"]
    ]
    out["critical_path"] = list(path)
    out["total"] = sum(d for n, d in durations.items() if n in {s["name"] for s in view["stages"]})
    return out
