"""Build a pipeline's networkx graph, validate all of it, and order it.

Nodes are stage names (attribute ``spec``); an edge ``a -> b`` carries ``keys`` (the data
keys ``b`` reads from ``a``) and ``order`` (True when an ``after``/``before`` made it).
Each rule is one ``_validate_*`` function returning problems; all run before anything does.
"""

from __future__ import annotations

import difflib
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import networkx as nx

from ._stage import KV, MODEL, PHASES, StageSpec, get_spec
from .errors import (
    CycleError,
    DuplicateProducerError,
    DuplicateStageError,
    GraphProblem,
    MissingInputError,
    NotAStageError,
    PhaseViolationError,
    UnknownStageError,
)

#: The phase of external inputs given to ``Pipeline.start``.
START = "start"
_RANK = {MODEL: 0, KV: 1}


class Required:
    """Marker for an external input with no default."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = Required()


def normalize_inputs(value: Sequence[str] | Mapping[str, Any]) -> dict[str, Any]:
    """Turn a sequence of names or a mapping name -> default into a dict."""
    if isinstance(value, str):
        return {value: REQUIRED}
    if isinstance(value, Mapping):
        return dict(value)
    return dict.fromkeys(value, REQUIRED)


def collect_specs(stages: Iterable[Any]) -> tuple[list[StageSpec], list[GraphProblem]]:
    """Return the specs of ``stages`` (deduplicated by function) and NotAStage problems."""
    specs: list[StageSpec] = []
    problems: list[GraphProblem] = []
    seen: set[int] = set()
    for obj in stages:
        spec = get_spec(obj)
        if spec is None:
            problems.append(NotAStageError(obj))
        elif id(spec) not in seen:
            seen.add(id(spec))
            specs.append(spec)
    return specs, problems


def _validate_names(specs: list[StageSpec]) -> tuple[dict[str, StageSpec], list[GraphProblem]]:
    by_name: dict[str, StageSpec] = {}
    problems: list[GraphProblem] = []
    for s in specs:
        other = by_name.get(s.name)
        if other is not None:
            problems.append(DuplicateStageError(s.name, (other.qualname, s.qualname)))
        else:
            by_name[s.name] = s
    return by_name, problems


def _validate_producers(
    by_name: Mapping[str, StageSpec], inputs: Mapping[str, Mapping[str, Any]]
) -> tuple[dict[str, str], list[GraphProblem]]:
    producer: dict[str, str] = {}
    problems: list[GraphProblem] = []
    for phase, keys in inputs.items():
        for k in keys:
            if k in producer:
                problems.append(DuplicateProducerError(k, (producer[k], f"input:{phase}")))
            else:
                producer[k] = f"input:{phase}"
    for s in by_name.values():
        for k in s.provides:
            if k in producer:
                first = producer[k]
                first = by_name[first].qualname if first in by_name else first
                problems.append(DuplicateProducerError(k, (first, s.qualname)))
            else:
                producer[k] = s.name
    return producer, problems


def _validate_missing(
    by_name: Mapping[str, StageSpec], producer: Mapping[str, str]
) -> list[GraphProblem]:
    consumers: dict[str, list[str]] = {}
    for s in by_name.values():
        for k in s.inputs:
            if k not in producer:
                consumers.setdefault(k, []).append(s.qualname)
    problems: list[GraphProblem] = []
    for key in sorted(consumers):
        close = difflib.get_close_matches(key, list(producer), n=3, cutoff=0.6)
        problems.append(MissingInputError(key, sorted(consumers[key]), close))
    return problems


def _validate_references(by_name: Mapping[str, StageSpec]) -> list[GraphProblem]:
    problems: list[GraphProblem] = []
    for s in by_name.values():
        for field in ("after", "before"):
            for ref in getattr(s, field):
                if ref not in by_name:
                    close = difflib.get_close_matches(ref, list(by_name), n=3, cutoff=0.6)
                    problems.append(UnknownStageError(s.qualname, field, ref, close))
    return problems


def build_graph(by_name: Mapping[str, StageSpec], producer: Mapping[str, str]) -> nx.DiGraph[str]:
    """Return the DiGraph of stages: data edges (``keys``) and ordering edges (``order``)."""
    g: nx.DiGraph[str] = nx.DiGraph()
    for name, s in by_name.items():
        g.add_node(name, spec=s)
    for name, s in by_name.items():
        for k in s.inputs:
            src = producer.get(k)
            if src is None or src not in by_name:
                continue
            if g.has_edge(src, name):
                g.edges[src, name]["keys"].append(k)
            else:
                g.add_edge(src, name, keys=[k], order=False)
        for ref in s.after:
            if ref in by_name:
                _add_order(g, ref, name)
        for ref in s.before:
            if ref in by_name:
                _add_order(g, name, ref)
    return g


def _add_order(g: nx.DiGraph[str], a: str, b: str) -> None:
    if g.has_edge(a, b):
        g.edges[a, b]["order"] = True
    else:
        g.add_edge(a, b, keys=[], order=True)


def edge_label(g: nx.DiGraph[str], a: str, b: str) -> str:
    """Return the key(s) of edge a -> b, or ``after/before`` for an ordering-only edge."""
    data = g.edges[a, b]
    return ", ".join(data["keys"]) if data["keys"] else "after/before"


def _validate_cycles(g: nx.DiGraph[str]) -> list[GraphProblem]:
    if nx.is_directed_acyclic_graph(g):
        return []
    problems: list[GraphProblem] = []
    # One report per strongly connected component, each an ordered cycle from find_cycle;
    # components are visited by their smallest name so the report is deterministic.
    comps = [
        c
        for c in nx.strongly_connected_components(g)
        if len(c) > 1 or any(g.has_edge(n, n) for n in c)
    ]
    for comp in sorted(comps, key=min):
        sub = g.subgraph(comp)
        edges = nx.find_cycle(sub, source=min(comp))
        names = [a for a, _ in edges] + [edges[0][0]]
        keys = [edge_label(g, a, b) for a, b in edges]
        problems.append(CycleError(names, keys))
    return problems


def _validate_phases(
    g: nx.DiGraph[str], by_name: Mapping[str, StageSpec], kv_inputs: Iterable[str]
) -> list[GraphProblem]:
    # Multi-source BFS from everything of the KV phase (its stages and its inputs), keeping
    # parents, so each model stage reached gets one concrete path to report.
    kv_inputs = set(kv_inputs)
    parent: dict[str, str | None] = {}
    queue: deque[str] = deque()
    for name in sorted(by_name):
        s = by_name[name]
        if s.needs == KV:
            parent[name] = None
            queue.append(name)
        elif kv_inputs.intersection(s.inputs):
            parent[name] = "input:" + sorted(kv_inputs.intersection(s.inputs))[0]
            queue.append(name)
    while queue:
        n = queue.popleft()
        for m in sorted(g.successors(n)):
            if m not in parent:
                parent[m] = n
                queue.append(m)
    problems: list[GraphProblem] = []
    for name in sorted(parent):
        if by_name[name].needs != MODEL:
            continue
        path = [name]
        cur = parent[name]
        while cur is not None and not cur.startswith("input:"):
            path.append(cur)
            cur = parent[cur]
        if cur is not None:
            path.append(cur.removeprefix("input:"))
        path.reverse()
        problems.append(PhaseViolationError(by_name[name].qualname, path))
    return problems


def order_graph(g: nx.DiGraph[str]) -> list[str]:
    """Topological order, model phase first, ties broken by name (hash-seed independent)."""
    return list(
        nx.lexicographical_topological_sort(g, key=lambda n: (_RANK[g.nodes[n]["spec"].needs], n))
    )


def validate(
    specs: list[StageSpec], inputs: Mapping[str, Mapping[str, Any]]
) -> tuple[dict[str, StageSpec], dict[str, str], nx.DiGraph[str], list[GraphProblem]]:
    """Run every validation rule; return (stages by name, producers, graph, problems)."""
    by_name, problems = _validate_names(specs)
    producer, dup = _validate_producers(by_name, inputs)
    problems += dup
    problems += _validate_missing(by_name, producer)
    problems += _validate_references(by_name)
    g = build_graph(by_name, producer)
    problems += _validate_cycles(g)
    problems += _validate_phases(g, by_name, inputs.get(KV, {}))
    return by_name, producer, g, problems


__all__ = [
    "PHASES",
    "REQUIRED",
    "START",
    "build_graph",
    "collect_specs",
    "edge_label",
    "normalize_inputs",
    "order_graph",
    "validate",
]
