"""The start-up report: where a whole vLLM start spent its time, from the spans every
process sent (vLLM's own and initpipe's stages) and initpipe's named intervals.

What belongs here: turning received spans (:class:`~.otlp.Span`) and the processes' marks
(:mod:`initpipe_vllm.hook.marks`) into the report (a JSON-ready dict, :func:`build`).
Comparing two is :mod:`.startup_compare`'s, reading files :mod:`.otlp`'s
(:func:`~.otlp.read`), drawing :mod:`.startup_render`'s, starting vLLM :mod:`.startup`'s.
Nothing here imports vLLM or OpenTelemetry.

The report (``"schema": "initpipe.startup/1"``; every time in seconds from ``origin``, the
creation of the process the user started, on one wall clock shared by all processes):

- ``wall_s``: origin to ready (the engine constructed, or the server's ``/health`` answering);
- ``attributed_s``: the part of that window covered by a *leaf* span (one with no other
  inside it) or by one of initpipe's named intervals — an umbrella span's own time does not
  count, it is what no instrumented step explains; ``attributed_spans_s``: the same with
  vLLM's and initpipe's spans alone (no named intervals); ``attributed_fraction``:
  ``attributed_s / wall_s``;
- ``first_token_s``: origin to the first token of one request, or null;
- ``processes``: ``[{"name", "pid", "kind", "rank", "create_s"}]``;
- ``spans``: ``[{"id", "parent", "name", "source": "vllm"|"probe"|"initpipe", "kind": "span"|
  "interval", "process", "rank", "start_s", "end_s", "self_s", "status", "message",
  "phase", "initpipe"}]``; ``initpipe``: an initpipe span's attributes without their
  ``initpipe.`` prefix (``phase``, ``stage``, ``kind``: stage/teardown, ``generation``,
  ``outcome``, ``rank``), null for the others; ``parent`` is the span's own parent (across
  processes, through the trace context vLLM passes in the environment); a named
  interval's parent is the span its process was started under;
- ``critical_path``: the ids of the leaves on the chain that ends at ready, in time order
  (systemd-analyze's critical-chain: from the end, the child that ended last, then the one
  that ended last before it started, ...);
- ``unattributed``: ``[{"start_s", "end_s", "inside": [names]}]``, every gap of 1 ms or more
  in the window that no leaf covers, and where it is; ``unattributed_s`` totals every gap;
- ``phases``: ``{phase: {"wall_s", "by_name": {name: wall_s}}}`` — wall time (the union of
  the own time of the phase's spans, so parallel ranks count once) per phase of
  :data:`PHASES`;
- ``errors``: the spans whose status is error: ``[{"id", "name", "process", "message"}]``;
- ``incomplete``: processes whose spans may not all have arrived (``startup run`` names them);
- ``sources``: ``{"vllm"|"probe"|"initpipe"|"interval": {"count", "leaf_s"}}``: how many
  spans (or named intervals) of each kind, and how much of the window their leaves cover;
- ``probes``: ``{"declared", "installed", "missing": [{"target", "error", "processes"}],
  "not_loaded"}``: the start-up probes (:mod:`initpipe_vllm.hook.probes`) — declared,
  installed in some process, not found where their module loaded, never loaded.

A probe's span (source ``"probe"``) is a vLLM function initpipe wrapped, an import or a
garbage collection. The last two go under the innermost span or named interval of their
process that holds them (they are sent later, under the span current when they began), and
cover their whole time; a span whose only children are such spans is still a leaf.

A span's *timing parent* is its nearest ancestor that contains it in time (one ms of
slack): vLLM parents a worker's later spans (``Allocate KV cache``) from the trace context
inherited at spawn, i.e. from ``Executor init``, which has long ended. Self time, leaves and
the critical path use the timing parent; ``parent`` keeps the real one.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from ..contract.declare import vllm_uses
from ..hook.probes import PROBES, SCOPE as PROBE_SCOPE
from .otlp import Span

__all__ = [
    "FIRST_TOKEN",
    "PHASES",
    "SCHEMA",
    "SPAN_PHASES",
    "SPAN_SITES",
    "V1_SPAN_SITES",
    "build",
]

SCHEMA = "initpipe.startup/1"

#: The phases of a start, in the report's order.
PHASES = (
    "imports and config",
    "process start",
    "device init",
    "weights",
    "memory profiling",
    "KV planning",
    "KV init",
    "warm-up, compile, capture",
    "scheduler",
    "handshake",
    "API server",
    "first token",
    "garbage collection",
    "other",
)

#: The vLLM functions the report knows by their span name (``@instrument``'s
#: ``span_name``), declared to the contract (capability ``startup``): a release that
#: renames or moves one shows in ``initpipe doctor``. The same on 0.32.0 and 0.33.0 (0.33
#: changed eight of their bodies, none a span's name, site or what it holds: no variant).
SPAN_SITES: dict[str, str] = {
    "Overall Loading": "vllm.v1.engine.core_client:EngineCoreClient.make_async_mp_client",
    "SyncMPClient init": "vllm.v1.engine.core_client:SyncMPClient.__init__",
    "AsyncMPClient init": "vllm.v1.engine.core_client:AsyncMPClient.__init__",
    "EngineCoreProc init": "vllm.v1.engine.core:EngineCoreProc.__init__",
    "Prepare model": "vllm.v1.engine.core:EngineCore._initialize_kv_caches",
    "Executor init": "vllm.v1.executor.abstract:Executor.__init__",
    "Worker init": "vllm.v1.worker.worker_base:WorkerWrapperBase.init_worker",
    "Init device": "vllm.v1.worker.gpu_worker:Worker.init_device",
    "Load model": "vllm.model_executor.model_loader.base_loader:BaseModelLoader.load_model",
    "Load weights": (
        "vllm.model_executor.model_loader.default_loader:DefaultModelLoader.load_weights"
    ),
    "Initialize model": "vllm.model_executor.model_loader.utils:initialize_model",
    "Allocate KV cache": "vllm.v1.worker.gpu_worker:Worker.initialize_from_config",
    "Warmup (GPU)": "vllm.v1.worker.gpu_worker:Worker.compile_or_warm_up_model",
    "Compile graph": "vllm.compilation.backends:CompilerManager.compile",
    "API server setup": "vllm.entrypoints.launchers.launcher:setup_server",
}
#: The spans of Model Runner V1's runners: only the releases with that runner (0.32.0,
#: 0.33.0) emit them. 0.34.0 has no v1 runner, and Model Runner V2 has no span of its own:
#: its loading is under "Load model" (and the ``Worker.load_model`` probe), its capture
#: under "Warmup (GPU)", its CPU warm-up under the ``CPUModelRunner.warming_up_model``
#: probe (phase "warm-up, compile, capture"; the CPU worker calls it inside its memory
#: profile, when it warms up at all: not in eager mode with an explicit KV size).
V1_SPAN_SITES: dict[str, str] = {
    "Loading (GPU)": "vllm.v1.worker.gpu_model_runner:GPUModelRunner.load_model",
    "Loading (CPU)": "vllm.v1.worker.cpu_model_runner:CPUModelRunner.load_model",
    "Warmup (CPU)": "vllm.v1.worker.cpu_model_runner:CPUModelRunner.warming_up_model",
    "Capture model": "vllm.v1.worker.gpu_model_runner:GPUModelRunner.capture_model",
}

#: The phase of each vLLM span (its own time; the phase of what runs inside is its own).
SPAN_PHASES: dict[str, str] = {
    "Overall Loading": "handshake",
    "SyncMPClient init": "handshake",
    "AsyncMPClient init": "handshake",
    "EngineCoreProc init": "process start",
    "Executor init": "process start",
    "Worker init": "process start",
    "Init device": "device init",
    "Loading (GPU)": "weights",
    "Loading (CPU)": "weights",
    "Load model": "weights",
    "Load weights": "weights",
    "Initialize model": "weights",
    "Download weights - HF": "weights",
    "Prepare model": "memory profiling",
    "Allocate KV cache": "KV init",
    "Warmup (GPU)": "warm-up, compile, capture",
    "Warmup (CPU)": "warm-up, compile, capture",
    "Capture model": "warm-up, compile, capture",
    "Compile graph": "warm-up, compile, capture",
    "Inductor compilation": "warm-up, compile, capture",
    "API server setup": "API server",
    "llm_request": "first token",
}
assert set(SPAN_SITES) | set(V1_SPAN_SITES) <= set(SPAN_PHASES) and set(
    SPAN_PHASES.values()
) <= set(PHASES)

#: The phases of the probes that time what happens anywhere (not one function).
_TIMED_PHASES = {"gc": "garbage collection", "import": "imports and config"}

#: A span's source by its instrumentation scope: initpipe's stages, initpipe's probes
#: (:mod:`initpipe_vllm.hook.probes`), else vLLM's own.
_SOURCES = {"initpipe": "initpipe", PROBE_SCOPE: "probe"}

#: Named intervals (initpipe's measurements where no span exists) and their phases.
INTERVAL_PHASES = {
    "interpreter start": "imports and config",
    "import vllm": "imports and config",
    "engine config": "imports and config",
    "engine arguments": "imports and config",
    "import initpipe": "imports and config",
    "initpipe start-up probes": "other",
    "start and imports": "process start",
    "first token": "first token",
}
#: The named interval ``startup run`` records for one request's first token.
FIRST_TOKEN = "first token"
#: Spans of serving, not of starting: never where the start-up window ends.
_REQUEST = {"llm_request", FIRST_TOKEN}
_SLACK = 1e-3  # s: clocks of two processes, the ns-to-s conversions
_TICK = 0.02  # s: /proc's creation times come in 10 ms ticks
_MIN_GAP = 1e-3  # s: the gaps listed one by one (all of them count in unattributed_s)


# mirrors: their source is fingerprinted with its decorators, so a renamed span_name is a
# change the doctor reports (a signature digest would not see it)
@vllm_uses("startup", mirrors=tuple(V1_SPAN_SITES.values()), runner="v1")
@vllm_uses("startup", mirrors=tuple(SPAN_SITES.values()))
def phase_of(source: str, kind: str, name: str, attributes: Mapping[str, Any], process: str) -> str:
    """The phase a span's or interval's own time counts in."""
    if kind == "interval":
        if name == "start and imports" and process.startswith(("frontend", "api server")):
            return "imports and config"
        return INTERVAL_PHASES.get(name, "other")
    if source == "probe":
        phase = attributes.get("initpipe.probe.phase")
        timed = _TIMED_PHASES.get(str(attributes.get("initpipe.probe")), "other")
        return str(phase) if phase in PHASES else timed
    if source == "initpipe":
        phase = attributes.get("initpipe.phase")
        return {"model": "KV planning", "kv_cache_config": "KV init"}.get(str(phase), "other")
    return SPAN_PHASES.get(name, "other")


@attrs.define(eq=False)
class _Node:
    id: str
    parent: str | None
    name: str
    source: str
    kind: str
    process: str
    rank: int | None
    start: float
    end: float
    status: str = "unset"
    message: str = ""
    attributes: dict[str, Any] = attrs.Factory(dict)
    phase: str = "other"
    timing_parent: _Node | None = None
    children: list[_Node] = attrs.Factory(list)  # timing children
    own: list[tuple[float, float]] = attrs.Factory(list)  # own intervals


# -- interval arithmetic ------------------------------------------------------------------
def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(b - a for a, b in _union(intervals))


def _minus(
    whole: tuple[float, float], holes: Iterable[tuple[float, float]]
) -> list[tuple[float, float]]:
    lo, hi = whole
    out = []
    for a, b in _union(holes):
        if b <= lo or a >= hi:
            continue
        if a > lo:
            out.append((lo, a))
        lo = max(lo, b)
    if lo < hi:
        out.append((lo, hi))
    return out


def _clip(
    intervals: Iterable[tuple[float, float]], lo: float, hi: float
) -> list[tuple[float, float]]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo)]


# -- processes ----------------------------------------------------------------------------
_WORKER = re.compile(r"Worker_(\d+)")


def _process_of(
    resource: Mapping[str, Any], marks: Mapping[int, Mapping[str, Any]]
) -> tuple[str, str, int | None]:
    """(label base, kind, rank) of the process that sent a span."""
    kind = str(resource.get("vllm.process_kind") or "")
    name = str(resource.get("vllm.process_name") or "")
    if kind == "worker":
        m = _WORKER.search(name)
        rank = int(m.group(1)) if m else None
        return (f"worker {rank}" if rank is not None else "worker"), "worker", rank
    if kind == "engine_core":
        suffix = name.removeprefix("EngineCore").lstrip("_")
        return ("engine core" + (f" {suffix}" if suffix else "")), "engine_core", None
    pid = _pid(resource)
    header = marks.get(pid, {}) if pid is not None else {}
    if any("api_server" in str(a) for a in header.get("argv", ())):
        return "api server", "api_server", None
    return "frontend", kind or "frontend", None


def _pid(resource: Mapping[str, Any]) -> int | None:
    for key in ("vllm.process_id", "process.pid"):
        try:
            return int(resource[key])
        except (KeyError, TypeError, ValueError):
            continue
    return None


def _mark_kind(header: Mapping[str, Any], *, child: bool = False) -> tuple[str, str]:
    argv = " ".join(str(a) for a in header.get("argv", ()))
    if child and ("api_server" in argv or "_startup_child" in argv):
        return f"process {header.get('pid')}", "process"
    if "api_server" in argv:
        return "api server", "api_server"
    if "_startup_child" in argv:
        return "frontend", "frontend"
    first = str((header.get("argv") or [""])[0])
    if first.endswith(".py"):  # python -m pkg.mod / python path.py: name it by its module
        return f"{first.rsplit('/', 1)[-1][:-3]} subprocess", "process"
    return f"process {header.get('pid')}", "process"


# -- the report ---------------------------------------------------------------------------
def build(
    spans: Sequence[Span],
    marks: Sequence[Mapping[str, Any]] = (),
    *,
    origin_s: float | None = None,
    ready_s: float | None = None,
    placement: Mapping[str, Any] | None = None,
    incomplete: Sequence[str] = (),
) -> dict[str, Any]:
    """The report (module doc) of one start.

    Args:
        spans: every span received (any order; request spans after ready are kept, but the
            window ends at ready).
        marks: the processes' mark records (``{"kind": "process"|"interval", "pid", ...}``).
        origin_s: the wall-clock start of the window (default: the earliest process
            creation in ``marks``, else the earliest span).
        ready_s: the wall-clock end of the window (default: the last start-up span's end).
        placement: what was started (kept as is in the report).
        incomplete: processes whose spans may be missing.
    """
    headers: dict[int, dict[str, Any]] = {}
    intervals: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for rec in marks:
        mpid = int(rec["pid"])
        if rec.get("kind") == "process":
            headers[mpid] = dict(rec)
        elif rec.get("kind") == "interval":
            intervals[mpid].append(dict(rec))
    # processes: one label each (two of the same kind get their pid)
    proc_of_pid: dict[int | None, tuple[str, str, int | None]] = {}
    for s in spans:
        pid = _pid(s.resource)
        if pid not in proc_of_pid:
            proc_of_pid[pid] = _process_of(s.resource, headers)
    for pid in [*headers, *intervals]:
        if pid not in proc_of_pid:
            header = headers.get(pid, {"pid": pid})
            # a spawned child inherits its parent's argv: only a root is the frontend
            child = header.get("ppid") in headers
            label, kind = _mark_kind(header, child=child)
            proc_of_pid[pid] = (label, kind, None)
    counts: dict[str, int] = defaultdict(int)
    for label, _, _ in proc_of_pid.values():
        counts[label] += 1
    label_of = {
        pid: (f"{label} (pid {pid})" if counts[label] > 1 else label)
        for pid, (label, _, _) in proc_of_pid.items()
    }

    creates = [h["create_s"] for h in headers.values() if h.get("create_s")]
    starts = [s.start_ns / 1e9 for s in spans]
    if origin_s is None:
        candidates = creates or starts
        if not candidates:
            raise ValueError("no spans and no marks: nothing to report")
        origin_s = min(candidates)
    t0 = origin_s

    def since_origin(wall_s: float) -> float:
        """A process-clock time on the report's clock. The creation time of a process is
        read as ``time.time()`` less its age (``marks.process_start_s``: two clock reads),
        so two readings of one creation differ by the time between the reads: less than a
        tick before the origin is the origin (never ``-0.000``)."""
        d = wall_s - t0
        return 0.0 if -_TICK < d < 0 else d

    nodes: dict[str, _Node] = {}
    # vLLM re-seeds `random` in every process (and again within one), where the SDK draws
    # span ids: the same id can name spans of two workers, or two spans of one process.
    # Nodes get unique ids; parents resolve to the same process's span first.
    raw: dict[str, list[_Node]] = defaultdict(list)
    seen_spans: set[tuple[Any, ...]] = set()
    for s in spans:
        key = (_pid(s.resource), s.span_id, s.start_ns, s.name)
        if key in seen_spans:  # the same span sent twice
            continue
        seen_spans.add(key)
        pid = _pid(s.resource)
        _, _, rank = proc_of_pid[pid]
        source = _SOURCES.get(s.scope, "vllm")
        if source == "initpipe" and isinstance(s.attributes.get("initpipe.rank"), int):
            rank = rank if rank is not None else s.attributes["initpipe.rank"]
        uid = s.span_id if s.span_id not in raw else f"{s.span_id}.{len(raw[s.span_id])}"
        node = _Node(
            id=uid,
            parent=s.parent_id or None,
            name=s.name,
            source=source,
            kind="span",
            process=label_of[pid],
            rank=rank,
            start=s.start_ns / 1e9 - t0,
            end=max(s.end_ns, s.start_ns) / 1e9 - t0,
            status=s.status,
            message=s.status_message,
            attributes=dict(s.attributes),
        )
        nodes[uid] = node
        raw[s.span_id].append(node)
    for n in list(nodes.values()):
        if n.parent is not None:
            n.parent = _resolve(n, raw.get(n.parent, []))
    by_process: dict[str, list[_Node]] = defaultdict(list)
    for n in nodes.values():
        by_process[n.process].append(n)
    # named intervals: the process's own, and the start before its plugins loaded
    for pid in sorted(set(headers) | set(intervals), key=lambda p: p or 0):
        label = label_of[pid]
        own = [
            (since_origin(r["start_s"]), since_origin(r["end_s"]), r["name"])
            for r in intervals.get(pid, [])
        ]
        header = headers.get(pid, {})
        first_span = min((n.start for n in by_process.get(label, [])), default=None)
        if header.get("create_s") and header.get("plugins_s"):
            end = header["plugins_s"] - t0
            if first_span is not None:  # vLLM loads plugins inside its first span at times
                end = min(end, max(first_span, since_origin(header["create_s"])))
            whole = (since_origin(header["create_s"]), end)
            for a, b in _minus(whole, [(a, b) for a, b, _ in own]):
                if b - a >= _MIN_GAP:
                    own.append((a, b, "start and imports"))
        anchor = _spawn_parent(by_process.get(label, []), nodes)
        if anchor is not None:  # creation times are 10 ms ticks: not before the spawning span
            floor = nodes[anchor].start
            own = [(max(a, floor) if floor - a < _TICK else a, b, name) for a, b, name in own]
        made = []
        for i, (a, b, name) in enumerate(sorted(own)):
            node = _Node(
                id=f"i{pid}-{i}",
                parent=anchor if name != FIRST_TOKEN else None,
                name=name,
                source="initpipe",
                kind="interval",
                process=label,
                rank=proc_of_pid[pid][2],
                start=a,
                end=max(a, b),
            )
            nodes[node.id] = node
            made.append(node)
        for node in made:  # one interval inside another (initpipe imported at interpreter start)
            holding = [
                h
                for h in made
                if h is not node
                and h.name != FIRST_TOKEN
                and h.start <= node.start
                and node.end <= h.end
                and (h.end - h.start, h.start) > (node.end - node.start, node.start)
            ]
            if holding and node.name != FIRST_TOKEN:
                node.parent = min(holding, key=lambda h: h.end - h.start).id
    # a process started under no span (a subprocess of vLLM's own): its intervals go
    # under what its parent process was doing when it was created
    for pid, header in headers.items():
        parent_label = label_of.get(header.get("ppid"))
        mine = [
            n
            for n in nodes.values()
            if n.kind == "interval"
            and n.process == label_of[pid]
            and n.parent is None
            and n.name != FIRST_TOKEN
        ]
        if parent_label is None or not mine:
            continue
        at = min(n.start for n in mine)
        holding = [
            n
            for n in nodes.values()
            if n.process == parent_label and n.start <= at <= n.end and n.name not in _REQUEST
        ]
        if holding:
            host = min(holding, key=lambda n: n.end - n.start)
            for n in mine:
                n.parent = host.id
    _nest_probes_in_intervals(nodes)
    for n in nodes.values():
        n.phase = phase_of(n.source, n.kind, n.name, n.attributes, n.process)

    # without a ready time: the last start-up span's end (not a request's, nor initpipe's
    # teardowns and phase spans: a KV release at exit is not part of the start)
    startup_ends = [
        n.end
        for n in nodes.values()
        if n.name not in _REQUEST
        and (
            n.source == "vllm"
            or n.kind == "interval"
            or n.attributes.get("initpipe.kind") == "stage"
        )
    ]
    t_end = (ready_s - t0) if ready_s is not None else max(startup_ends, default=0.0)
    _link(nodes)
    window = (0.0, t_end)
    covered = _clip(_union((n.start, n.end) for n in nodes.values() if _covers(n)), *window)
    covered_spans = _clip(
        _union((n.start, n.end) for n in nodes.values() if n.kind == "span" and _covers(n)),
        *window,
    )
    gaps = _minus(window, covered)
    roots = [n for n in nodes.values() if n.timing_parent is None and n.name not in _REQUEST]
    path = _chain(roots, 0.0, t_end)

    phases: dict[str, dict[str, Any]] = {}
    for phase in PHASES:
        members = [n for n in nodes.values() if n.phase == phase]
        if not members:
            continue
        by_name: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for n in members:
            by_name[n.name].extend(n.own)
        phases[phase] = {
            "wall_s": _r(_length(i for n in members for i in n.own)),
            "by_name": {
                k: _r(_length(v))
                for k, v in sorted(by_name.items(), key=lambda kv: -_length(kv[1]))
            },
        }
    first = [n for n in nodes.values() if n.name == FIRST_TOKEN]
    wall = t_end
    attributed = _length(covered)
    processes = []
    for pid, label in label_of.items():
        header = headers.get(pid, {}) if pid is not None else {}
        _, kind, rank = proc_of_pid[pid]
        create = header.get("create_s")
        processes.append(
            {
                "name": label,
                "pid": pid,
                "kind": kind,
                "rank": rank,
                "create_s": _r(since_origin(create)) if create else None,
            }
        )
    processes.sort(key=lambda p: (p["create_s"] if p["create_s"] is not None else 1e9, p["name"]))
    order = {p["name"]: i for i, p in enumerate(processes)}
    ordered = sorted(nodes.values(), key=lambda n: (order.get(n.process, 0), n.start, -n.end))
    return {
        "schema": SCHEMA,
        "placement": dict(placement or {}),
        "origin_unix_s": t0,
        "wall_s": _r(wall),
        "attributed_s": _r(attributed),
        "attributed_fraction": round(attributed / wall, 4) if wall > 0 else None,
        "attributed_spans_s": _r(_length(covered_spans)),
        "first_token_s": _r(first[0].end) if first else None,
        "processes": processes,
        "spans": [_span_json(n) for n in ordered],
        "critical_path": [n.id for n in path],
        "unattributed_s": _r(_length(gaps)),
        "unattributed": [
            {"start_s": _r(a), "end_s": _r(b), "inside": _inside(nodes.values(), a, b)}
            for a, b in gaps
            if b - a >= _MIN_GAP
        ],
        "phases": phases,
        "errors": [
            {"id": n.id, "name": n.name, "process": n.process, "message": n.message}
            for n in ordered
            if n.status == "error"
        ],
        "incomplete": list(incomplete),
        "sources": _sources(nodes.values(), window),
        "probes": _probes(marks, label_of),
        "notes": _notes(marks, label_of),
    }


def _notes(marks: Sequence[Mapping[str, Any]], label_of: Mapping[Any, str]) -> list[dict[str, Any]]:
    """What initpipe changed about the start and said so (a ``note`` mark: the pipelined
    worker declining vLLM 0.34's extensible KV cache), once per text, with the processes."""
    found: dict[str, list[str]] = {}
    for rec in marks:
        if rec.get("kind") == "note":
            where = label_of.get(rec.get("pid"), f"pid {rec.get('pid')}")
            found.setdefault(str(rec.get("text", "")), []).append(where)
    return [{"text": text, "processes": sorted(set(ps))} for text, ps in found.items()]


def _timed(n: _Node) -> bool:
    """An import's or a garbage collection's span: it times what happened inside another
    step, wherever it happened; it is not a step of the start."""
    return n.source == "probe" and n.attributes.get("initpipe.probe") in _TIMED_PHASES


def _covers(n: _Node) -> bool:
    """Whether all of a node's time is attributed: a named interval, an import's or a
    garbage collection's span (what runs inside an import is the import), or a span with
    no step inside (a leaf: nothing but imports or collections inside it)."""
    return n.kind == "interval" or _timed(n) or all(_timed(c) for c in n.children)


def _sources(nodes: Iterable[_Node], window: tuple[float, float]) -> dict[str, Any]:
    """Per kind of measurement (vLLM's spans, initpipe's probes, initpipe's stages, its
    named intervals): how many, and how much of the window their leaves cover."""
    out: dict[str, Any] = {}
    for key in ("vllm", "probe", "initpipe", "interval"):
        mine = [
            n
            for n in nodes
            if (n.kind == "interval" if key == "interval" else (n.kind, n.source) == ("span", key))
        ]
        leaves = [(n.start, n.end) for n in mine if _covers(n)]
        out[key] = {"count": len(mine), "leaf_s": _r(_length(_clip(_union(leaves), *window)))}
    return out


def _nest_probes_in_intervals(nodes: Mapping[str, _Node]) -> None:
    """Where the probes' spans go, so that their time counts once.

    A garbage collection's or an import's span goes under the innermost span or named
    interval of its process that holds it (it was sent later, under the span current when
    it began: an import that started a collection holds it too, and one made where the
    process had no span, during its own imports, belongs in that interval). Any other
    probe's span without a parent in its process goes under the interval holding it."""
    mine: dict[str, list[_Node]] = defaultdict(list)
    for n in nodes.values():
        if n.name not in _REQUEST:
            mine[n.process].append(n)
    for n in nodes.values():
        if n.source != "probe":
            continue
        timed = n.attributes.get("initpipe.probe") in _TIMED_PHASES
        parent = nodes.get(n.parent) if n.parent else None
        if not timed and parent is not None and parent.process == n.process:
            continue
        holding = [
            h
            for h in mine[n.process]
            if h is not n
            and (timed or h.kind == "interval")
            and h.start - _SLACK <= n.start
            and n.end <= h.end + _SLACK
            and (h.end - h.start, h.start) > (n.end - n.start, n.start)  # no cycles
        ]
        if holding:
            n.parent = min(holding, key=lambda h: h.end - h.start).id


def _probes(marks: Sequence[Mapping[str, Any]], label_of: Mapping[Any, str]) -> dict[str, Any]:
    """What the probes did: the declared targets, those installed in some process, those
    no process could find (with why), those never loaded (their module was not imported)."""
    installed: set[str] = set()
    missing: dict[str, dict[str, Any]] = {}
    for rec in marks:
        if rec.get("kind") != "probe":
            continue
        target = str(rec.get("target"))
        if rec.get("status") == "installed":
            installed.add(target)
        else:
            entry = missing.setdefault(
                target, {"target": target, "error": str(rec.get("error", "")), "processes": []}
            )
            entry["processes"].append(label_of.get(rec.get("pid"), f"pid {rec.get('pid')}"))
    declared = [p.target for p in PROBES]
    return {
        "declared": declared,
        "installed": sorted(installed),
        "missing": sorted(missing.values(), key=lambda m: m["target"]),
        "not_loaded": [t for t in declared if t not in installed and t not in missing],
    }


def _r(x: float) -> float:
    return round(x, 6)


def _span_json(n: _Node) -> dict[str, Any]:
    return {
        "id": n.id,
        "parent": n.parent,
        "name": n.name,
        "source": n.source,
        "kind": n.kind,
        "process": n.process,
        "rank": n.rank,
        "start_s": _r(n.start),
        "end_s": _r(n.end),
        "self_s": _r(_length(n.own)),
        "status": n.status,
        "message": n.message,
        "phase": n.phase,
        "initpipe": {k[9:]: v for k, v in n.attributes.items() if k.startswith("initpipe.")}
        if n.source == "initpipe" and n.kind == "span"
        else None,
    }


def _resolve(child: _Node, candidates: list[_Node]) -> str | None:
    """The id of ``child``'s parent among the spans carrying its parent's raw id: in its
    own process first, the one holding it in time, else the latest that started before
    it; then in another process (a remote parent) likewise. None: not received."""
    if not candidates:
        return None
    local = [c for c in candidates if c.process == child.process and c is not child]
    pool = local or [c for c in candidates if c is not child]
    if not pool:
        return None
    holding = [c for c in pool if c.start - _SLACK <= child.start and child.end <= c.end + _SLACK]
    if holding:
        return min(holding, key=lambda c: c.end - c.start).id
    before = [c for c in pool if c.start <= child.start + _SLACK]
    return max(before or pool, key=lambda c: c.start).id


def _spawn_parent(process_spans: list[_Node], nodes: Mapping[str, _Node]) -> str | None:
    """The span a process was started under: the remote parent of its earliest span."""
    for n in sorted(process_spans, key=lambda n: n.start):
        if n.parent and n.parent in nodes and nodes[n.parent].process != n.process:
            return n.parent
    return None


def _link(nodes: Mapping[str, _Node]) -> None:
    """Timing parents (the nearest ancestor containing the node), timing children and each
    node's own intervals."""
    for n in nodes.values():
        p = nodes.get(n.parent) if n.parent else None
        seen = {n.id}
        while p is not None and not (p.start - _SLACK <= n.start and n.end <= p.end + _SLACK):
            seen.add(p.id)
            p = nodes.get(p.parent) if p.parent and p.parent not in seen else None
        n.timing_parent = p
        if p is not None:
            p.children.append(n)
    for n in nodes.values():
        n.own = _minus((n.start, n.end), ((c.start, c.end) for c in n.children))


def _chain(candidates: Sequence[_Node], lo: float, hi: float) -> list[_Node]:
    """The critical chain through ``candidates`` ending by ``hi`` (leaves, in time order)."""
    pool = sorted(candidates, key=lambda n: (-n.end, n.start))
    picked: list[_Node] = []
    bound = hi
    for n in pool:
        if n.end > bound + _SLACK or n.end <= lo or n.start >= bound:
            continue
        picked.append(n)
        bound = n.start
        if bound <= lo:
            break
    out: list[_Node] = []
    for n in reversed(picked):
        out.extend(_chain(n.children, n.start, n.end) if n.children else [n])
    return out


def _inside(nodes: Iterable[_Node], a: float, b: float) -> list[str]:
    """Where a gap is: the innermost spans holding it, ``"name (process)"``."""
    mid = (a + b) / 2
    holding = [n for n in nodes if n.start <= mid <= n.end and n.name not in _REQUEST]
    inner = [n for n in holding if not any(c.start <= mid <= c.end for c in n.children)]
    return sorted({f"{n.name} ({n.process})" for n in inner})
