"""Per-stage trace: what ran, when, for how long, and how it ended.

The hot loop appends plain tuples in :class:`Record`'s field order (a named tuple's
constructor would cost about 1 µs per stage there); readers go through :class:`Record` to
:class:`TraceEvent` objects (times relative to the trace's start), never ``r[0]..r[7]``.
Exports: initpipe JSON (``to_dict``/``write_json``) and Chrome trace-event JSON
(``to_chrome``/``write_chrome``; opens in Perfetto or chrome://tracing).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple

import attrs
import networkx as nx

from .files import write_file

__all__ = [
    "EventKind",
    "Outcome",
    "RawRecord",
    "Record",
    "Trace",
    "TraceEvent",
    "blame",
    "critical_path",
]

#: What a trace event records: a stage run, a stage's teardown, or a host step (span).
EventKind = Literal["stage", "teardown", "span"]
#: How it ended.
Outcome = Literal["ok", "error"]
STAGE: EventKind = "stage"
TEARDOWN: EventKind = "teardown"
SPAN: EventKind = "span"


class Record(NamedTuple):
    """One raw trace entry (absolute ``perf_counter`` start); stored as a plain tuple in
    this field order (:data:`RawRecord`)."""

    name: str
    phase: str
    kind: EventKind
    start: float
    duration: float
    outcome: Outcome
    generation: int
    error: str | None


#: A :class:`Record` as stored: a plain tuple in the same field order.
RawRecord = tuple[str, str, EventKind, float, float, Outcome, int, str | None]


@attrs.frozen(kw_only=True)
class TraceEvent:
    """One recorded step.

    Attributes:
        name: stage (or span) name.
        phase: ``model``, ``kv_cache_config``, or a host label for spans (e.g. ``vllm``).
        kind: ``stage``, ``teardown`` or ``span``.
        start: seconds since the trace began.
        duration: seconds.
        outcome: ``ok`` or ``error``.
        generation: which run of the phase (the KV phase counts up on each re-run).
        error: ``Type: message`` when the outcome is ``error``.
    """

    name: str
    phase: str
    kind: EventKind
    start: float
    duration: float
    outcome: Outcome
    generation: int = 0
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the event as plain JSON-able data."""
        return attrs.asdict(self)


class Trace:
    """The record of a run: stage runs, teardowns and host spans, in order.

    Args:
        max_records: keep only the latest this many events (a ring buffer), so a
            long-lived process that re-runs its KV phase many times stays bounded.
            None (the default) keeps everything.
    """

    def __init__(self, max_records: int | None = None) -> None:
        self.origin = time.perf_counter()
        self.wall_origin = time.time()
        # The hot loop (_dispatch.run_steps) appends RawRecord tuples here directly.
        self._records: deque[RawRecord] = deque(maxlen=max_records)

    def record(
        self,
        name: str,
        phase: str,
        kind: EventKind,
        t0: float,
        t1: float,
        outcome: Outcome,
        generation: int = 0,
        error: str | None = None,
    ) -> None:
        """Append one event; ``t0``/``t1`` are ``time.perf_counter()`` values."""
        self._records.append((name, phase, kind, t0, t1 - t0, outcome, generation, error))

    def _event(self, raw: RawRecord) -> TraceEvent:
        r = Record._make(raw)
        return TraceEvent(
            name=r.name,
            phase=r.phase,
            kind=r.kind,
            start=r.start - self.origin,
            duration=r.duration,
            outcome=r.outcome,
            generation=r.generation,
            error=r.error,
        )

    @property
    def events(self) -> list[TraceEvent]:
        """Every event so far, in the order they ended."""
        return [self._event(r) for r in self._records]

    def __len__(self) -> int:
        return len(self._records)

    def last(self) -> TraceEvent:
        """The most recent event."""
        return self._event(self._records[-1])

    def tail(self, n: int) -> list[TraceEvent]:
        """The ``n`` most recent events, oldest first (cheap on a long trace)."""
        records = self._records
        start = max(0, len(records) - n)
        return [self._event(records[i]) for i in range(start, len(records))]

    @contextlib.contextmanager
    def span(self, name: str, phase: str = "host") -> Iterator[None]:
        """Record a host step outside the DAG (weight loading, profiling, ...) as a span."""
        t0 = time.perf_counter()
        try:
            yield
        except BaseException as err:
            self.record(
                name,
                phase,
                SPAN,
                t0,
                time.perf_counter(),
                "error",
                error=f"{type(err).__name__}: {err}",
            )
            raise
        self.record(name, phase, SPAN, t0, time.perf_counter(), "ok")

    def durations(self) -> dict[str, float]:
        """Latest successful duration of each stage (re-runs overwrite earlier ones)."""
        return {
            name: duration
            for name, _phase, kind, _start, duration, outcome, _gen, _err in self._records
            if kind == STAGE and outcome == "ok"
        }

    def recent_durations(self, n: int, phase: str) -> dict[str, float]:
        """Durations of the successful stage runs of ``phase`` among the ``n`` most recent
        events, oldest first (cheap: reads the raw records, builds no events)."""
        records = self._records
        out: dict[str, float] = {}
        for i in range(max(0, len(records) - n), len(records)):
            name, rphase, kind, _start, duration, outcome, _gen, _err = records[i]
            if kind == STAGE and rphase == phase and outcome == "ok":
                out[name] = duration
        return out

    def to_dict(self, graph: nx.DiGraph[str] | None = None) -> dict[str, Any]:
        """Return ``{"version", "wall_origin", "events", "critical_path"?}`` as plain data."""
        out: dict[str, Any] = {
            "version": 1,
            "wall_origin": self.wall_origin,
            "events": [e.to_dict() for e in self.events],
        }
        if graph is not None:
            out["critical_path"] = [
                {"name": n, "duration": d} for n, d in critical_path(graph, self.durations())
            ]
        return out

    def to_chrome(self) -> dict[str, Any]:
        """Return Chrome trace-event JSON (``traceEvents`` of complete ``X`` events, in µs)."""
        pid = os.getpid()
        lanes: dict[str, int] = {}
        events: list[dict[str, Any]] = []
        for e in self.events:
            tid = lanes.setdefault(e.phase, len(lanes) + 1)
            events.append(
                {
                    "name": e.name if e.kind != TEARDOWN else f"teardown {e.name}",
                    "cat": f"{e.phase},{e.kind}",
                    "ph": "X",
                    "pid": pid,
                    "tid": tid,
                    "ts": round(e.start * 1e6, 3),
                    "dur": round(e.duration * 1e6, 3),
                    "args": {
                        "outcome": e.outcome,
                        "generation": e.generation,
                        **({"error": e.error} if e.error else {}),
                    },
                }
            )
        meta = [
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": phase}}
            for phase, tid in lanes.items()
        ]
        return {"traceEvents": meta + events, "displayTimeUnit": "ms"}

    def write_json(
        self, path: str | os.PathLike[str], graph: nx.DiGraph[str] | None = None
    ) -> Path:
        """Write :meth:`to_dict` to ``path`` (see :func:`initpipe.files.write_file`)."""
        return _write(path, self.to_dict(graph))

    def write_chrome(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_chrome` to ``path`` (see :func:`initpipe.files.write_file`)."""
        return _write(path, self.to_chrome())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trace:
        """Rebuild a trace from :meth:`to_dict` output (or a file's parsed JSON)."""
        t = cls()
        t.wall_origin = data.get("wall_origin", t.wall_origin)
        for e in data["events"]:
            t._records.append(
                (
                    e["name"],
                    e["phase"],
                    e["kind"],
                    t.origin + e["start"],
                    e["duration"],
                    e["outcome"],
                    e.get("generation", 0),
                    e.get("error"),
                )
            )
        return t


def _write(path: str | os.PathLike[str], data: Any) -> Path:
    return write_file(path, json.dumps(data, indent=1))


def critical_path(
    graph: nx.DiGraph[str], durations: Mapping[str, float]
) -> list[tuple[str, float]]:
    """Return the longest path through ``graph`` weighted by stage duration.

    Args:
        graph: a pipeline graph (acyclic).
        durations: seconds per stage; stages without a duration count as 0.

    Returns:
        ``[(stage, duration), ...]`` from the first stage of the chain to the last.
    """
    if graph.number_of_nodes() == 0:
        return []
    # Node weights become edge weights: every edge into v weighs v's duration, and a
    # virtual source feeds every node so that the first stage's own time counts too.
    g: nx.DiGraph[object] = nx.DiGraph()
    src = object()
    for n in graph.nodes:
        g.add_edge(src, n, w=durations.get(n, 0.0))
    for a, b in graph.edges:
        g.add_edge(a, b, w=durations.get(b, 0.0))
    path = nx.dag_longest_path(
        g,
        weight="w",
        default_weight=0,  # every edge has a weight
        topo_order=[src, *nx.lexicographical_topological_sort(graph)],
    )
    return [(n, durations.get(n, 0.0)) for n in path if isinstance(n, str)]  # drop `src`


def blame(durations: Mapping[str, float]) -> list[tuple[str, float]]:
    """Return stages sorted by self time, longest first (like ``systemd-analyze blame``)."""
    return sorted(durations.items(), key=lambda kv: (-kv[1], kv[0]))
