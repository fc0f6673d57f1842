"""The start-up report on spans whose every number is worked out by hand: trees across
processes, own time, leaves, gaps and where they are, the critical chain, phases, the
named intervals, ids that repeat, and ``--compare``'s thresholds."""

from __future__ import annotations

import pytest
from attrs import evolve as attrs_evolve
from spans_kit import CORE, T0, own_process_start, sid, span, worker

from initpipe_vllm.hook import probes
from initpipe_vllm.tools.startup_compare import compare
from initpipe_vllm.tools.startup_render import render
from initpipe_vllm.tools.startup_report import build


@pytest.fixture
def report() -> dict:
    spans, marks = own_process_start()
    return build(spans, marks, ready_s=T0 + 10.0)


def _by_name(report: dict, name: str, process: str | None = None) -> dict:
    (s,) = [s for s in report["spans"] if s["name"] == name and process in (None, s["process"])]
    return s


def test_the_window_and_its_accounting(report: dict) -> None:
    assert report["wall_s"] == 10.0
    # leaves: the four frontend intervals (0-1.2), the engine core's start (1.25-3.9), the
    # worker's (4.1-6.0), Load weights (6.3-7.0), Prepare model (8.1-9.0; kv_caches inside)
    assert report["attributed_s"] == pytest.approx(7.35)
    assert report["attributed_spans_s"] == pytest.approx(1.6)  # Load weights, Prepare model
    assert report["attributed_fraction"] == pytest.approx(0.735)
    assert report["unattributed_s"] == pytest.approx(2.65)
    gaps = report["unattributed"]
    assert [g["start_s"] for g in gaps] == pytest.approx([1.2, 3.9, 6.0, 7.0, 9.0])
    assert [g["end_s"] for g in gaps] == pytest.approx([1.25, 4.1, 6.3, 8.1, 10.0])
    assert [g["inside"] for g in gaps] == [
        ["SyncMPClient init (frontend)"],
        ["EngineCoreProc init (engine core)"],
        ["Worker init (worker 0)"],
        ["Executor init (engine core)"],
        ["EngineCoreProc init (engine core)"],
    ]
    assert report["first_token_s"] is None and report["errors"] == []


def test_processes_and_named_intervals(report: dict) -> None:
    assert [(p["name"], p["pid"], p["create_s"]) for p in report["processes"]] == [
        ("frontend", 1, 0.0),
        ("engine core", 2, 1.25),
        ("worker 0", 3, 4.1),
    ]
    intervals = [s for s in report["spans"] if s["kind"] == "interval"]
    assert [(s["process"], s["name"]) for s in intervals] == [
        ("frontend", "interpreter start"),
        ("frontend", "import vllm"),
        ("frontend", "start and imports"),  # to its plugins, what the others leave
        ("frontend", "engine config"),
        ("engine core", "start and imports"),  # stops where its first span starts
        ("worker 0", "start and imports"),
    ]
    assert [(s["start_s"], s["end_s"]) for s in intervals] == [
        pytest.approx(x)
        for x in [(0, 0.1), (0.1, 0.9), (0.9, 1.0), (1.0, 1.2), (1.25, 3.9), (4.1, 6.0)]
    ]
    # a spawned process's start lies under the span that spawned it
    assert _by_name(report, "start and imports", "engine core")["parent"] == sid("c1")
    assert _by_name(report, "start and imports", "worker 0")["parent"] == sid("e2")
    assert all(s["source"] == "initpipe" for s in report["spans"] if s["kind"] == "interval")


def test_own_time_uses_the_parent_that_holds_the_span_in_time(report: dict) -> None:
    assert _by_name(report, "Load model")["self_s"] == pytest.approx(0.5)  # 6.2-6.3, 7.0-7.4
    assert _by_name(report, "Worker init")["self_s"] == pytest.approx(0.3)
    # the worker's start interval and Worker init are inside Executor init
    assert _by_name(report, "Executor init")["self_s"] == pytest.approx(0.55)
    # Allocate KV cache names Executor init (ended at 8.0) as its parent: it counts in
    # EngineCoreProc init, the nearest ancestor that holds it, and keeps its real parent
    assert _by_name(report, "Allocate KV cache")["parent"] == sid("e2")
    assert _by_name(report, "EngineCoreProc init")["self_s"] == pytest.approx(0.15 + 0.1 + 0.9)
    assert _by_name(report, "Allocate KV cache")["self_s"] == pytest.approx(0.15)
    assert _by_name(report, "kv_caches")["rank"] == 0


def test_the_critical_chain_crosses_processes(report: dict) -> None:
    names = {s["id"]: (s["name"], s["process"]) for s in report["spans"]}
    assert [names[i] for i in report["critical_path"]] == [
        ("interpreter start", "frontend"),
        ("import vllm", "frontend"),
        ("start and imports", "frontend"),
        ("engine config", "frontend"),
        ("start and imports", "engine core"),
        ("start and imports", "worker 0"),
        ("Load weights", "worker 0"),
        ("Prepare model", "engine core"),
    ]


def test_phases_are_wall_time_of_own_time(report: dict) -> None:
    phases = {k: v["wall_s"] for k, v in report["phases"].items()}
    assert phases == pytest.approx(
        {
            "imports and config": 1.2,
            "process start": 4.95 + 0.7 + 0.9,
            "weights": 1.2,
            "memory profiling": 0.9,
            "KV init": 0.3,
            "handshake": 0.15,
        }
    )
    assert report["phases"]["KV init"]["by_name"] == pytest.approx(
        {"Allocate KV cache": 0.15, "kv_caches": 0.15}
    )
    assert list(report["phases"]) == [
        "imports and config",
        "process start",
        "weights",
        "memory profiling",
        "KV init",
        "handshake",
    ]


def test_repeated_ids_resolve_within_their_process() -> None:
    """vLLM re-seeds ``random`` in each worker: two workers send spans with one id."""
    spans = [
        span("Executor init", 0.0, 5.0, "e2", resource=CORE),
        span("Load model", 1.0, 2.0, "d1", "e2", worker(0, 3)),
        span("Load weights", 1.1, 1.5, "d2", "d1", worker(0, 3)),
        span("Load model", 1.2, 3.0, "d1", "e2", worker(1, 4)),
        span("Load weights", 1.3, 2.9, "d2", "d1", worker(1, 4)),
        span("Load weights", 1.3, 2.9, "d2", "d1", worker(1, 4)),  # sent twice: one span
    ]
    r = build(spans)
    assert len(r["spans"]) == 5
    ids = [s["id"] for s in r["spans"]]
    assert len(set(ids)) == 5
    by_id = {s["id"]: s for s in r["spans"]}
    for w in ("worker 0", "worker 1"):
        (weights,) = [s for s in r["spans"] if s["name"] == "Load weights" and s["process"] == w]
        parent = by_id[weights["parent"]]
        assert (parent["name"], parent["process"]) == ("Load model", w)
    assert _by_name(r, "Load model", "worker 1")["self_s"] == pytest.approx(0.2)
    assert r["origin_unix_s"] == T0  # no marks: the earliest span


def test_first_token_and_request_spans_stay_out_of_the_window() -> None:
    spans, marks = own_process_start()
    spans.append(span("llm_request", 10.01, 10.4, "f1"))
    marks.append(
        {
            "kind": "interval",
            "pid": 1,
            "name": "first token",
            "start_s": T0 + 10.0,
            "end_s": T0 + 10.4,
        }
    )
    r = build(spans, marks, ready_s=T0 + 10.0)
    assert r["first_token_s"] == pytest.approx(10.4)
    assert r["wall_s"] == 10.0 and r["unattributed_s"] == pytest.approx(2.65)
    assert r["phases"]["first token"]["wall_s"] == pytest.approx(0.4)
    # without ready_s, the window ends with the last start-up span, not the request
    assert build(spans, marks)["wall_s"] == pytest.approx(10.0)


def test_an_error_span_is_named() -> None:
    spans, marks = own_process_start()
    spans.append(
        span(
            "runner_kv_caches",
            8.41,
            8.45,
            "b2",
            "a4",
            worker(0, 3),
            status="error",
            message="OSError: disk on fire",
            initpipe={"initpipe.phase": "kv_cache_config", "initpipe.kind": "stage"},
        )
    )
    r = build(spans, marks, ready_s=T0 + 10.0)
    assert [(e["name"], e["process"], e["message"]) for e in r["errors"]] == [
        ("runner_kv_caches", "worker 0", "OSError: disk on fire")
    ]


def test_nothing_to_report_is_refused() -> None:
    with pytest.raises(ValueError, match="nothing to report"):
        build([])


# -- compare ------------------------------------------------------------------------------
def _with_stage(seconds: float) -> dict:
    spans, marks = own_process_start()
    spans.append(
        span(
            "my_probe",
            8.5,
            8.5 + seconds,
            "b3",
            "a4",
            worker(0, 3),
            initpipe={"initpipe.phase": "kv_cache_config", "initpipe.kind": "stage"},
        )
    )
    return build(spans, marks, ready_s=T0 + 10.0)


def test_a_new_slow_stage_is_the_regression(report: dict) -> None:
    now = _with_stage(0.3)
    result = compare(report, now, only="initpipe")
    assert result["regressions"] == [
        {"name": "my_probe", "source": "initpipe", "base_s": None, "now_s": pytest.approx(0.3)}
    ]
    # over everything, the phase it lengthened shows too (the window, 10 s, does not move)
    every = compare(report, now)
    assert {(r["source"], r["name"]) for r in every["regressions"]} == {
        ("initpipe", "my_probe"),
        ("phase", "KV init"),
    }
    assert compare(report, report)["regressions"] == []


def test_the_thresholds_are_a_ratio_and_a_floor(report: dict) -> None:
    assert compare(report, _with_stage(0.2))["regressions"] == []  # under the 0.25 s floor
    assert compare(report, _with_stage(0.2), min_s=0.1, only="initpipe")["regressions"]
    slower = _with_stage(0.3)
    base = _with_stage(0.25)  # 1.2x: over the floor? no: +0.05 s; and under the ratio
    assert compare(base, slower, min_s=0.0, only="initpipe")["regressions"] == []
    assert compare(base, slower, min_s=0.0, ratio=1.1, only="initpipe")["regressions"]
    with pytest.raises(ValueError, match="only must be"):
        compare(report, report, only="mine")
    with pytest.raises(ValueError, match="ratio must be 1 or more"):
        compare(report, report, ratio=0.5)


# -- probes -------------------------------------------------------------------------------
def _probe(name: str, start: float, end: float, short: str, parent: str, **attrs: object):
    """A span of initpipe's probes (scope ``initpipe.probe``)."""
    return attrs_evolve(
        span(name, start, end, short, parent), scope=probes.SCOPE, attributes=dict(attrs)
    )


def _probed_start() -> dict:
    """One process: interpreter start 0-0.1 holding initpipe's import 0.05-0.08; import vllm
    0.1-1.0 holding a collection 0.5-0.6 made under no span; Executor init 1.0-3.0 holding
    the probe Worker.load_model 1.1-2.1, itself holding Load model 1.2-2.0, which holds a
    collection 1.5-1.7; an import 2.2-2.5 holding a collection 2.3-2.4 that was parented
    (when it was sent) to Executor init. Ready at 3.0."""
    gc_attrs = {"initpipe.probe": "gc", "gc.generation": 2}
    spans = [
        span("Executor init", 1.0, 3.0, "e1"),
        _probe(
            "Worker.load_model",
            1.1,
            2.1,
            "p1",
            "e1",
            **{"initpipe.probe": "m:Worker.load_model", "initpipe.probe.phase": "weights"},
        ),
        span("Load model", 1.2, 2.0, "l1", "p1"),
        _probe(probes.GC_SPAN, 0.5, 0.6, "g1", "", **gc_attrs),
        _probe(probes.GC_SPAN, 1.5, 1.7, "g2", "l1", **gc_attrs),
        _probe(probes.IMPORT_SPAN + "vllm.x", 2.2, 2.5, "i1", "e1", **{"initpipe.probe": "import"}),
        _probe(probes.GC_SPAN, 2.3, 2.4, "g3", "e1", **gc_attrs),
    ]
    marks = [
        {
            "kind": "process",
            "pid": 1,
            "ppid": 0,
            "argv": ["_startup_child.py"],
            "create_s": T0,
            "plugins_s": T0 + 1.0,
            "flush": True,
        },
        *(
            {"kind": "interval", "pid": 1, "name": name, "start_s": T0 + a, "end_s": T0 + b}
            for name, a, b in [
                ("interpreter start", 0.0, 0.1),
                ("import initpipe", 0.05, 0.08),
                ("import vllm", 0.1, 1.0),
            ]
        ),
        {"kind": "probe", "pid": 1, "target": "m:Worker.load_model", "status": "installed"},
        {"kind": "probe", "pid": 1, "target": "m:gone", "status": "missing", "error": "no gone"},
    ]
    return build(spans, marks, ready_s=T0 + 3.0)


def test_probes_nest_where_their_time_was_spent_and_count_once() -> None:
    r = _probed_start()
    by_id = {s["id"]: s for s in r["spans"]}
    parent = {
        (s["name"], s["start_s"]): by_id[s["parent"]]["name"] if s["parent"] else None
        for s in r["spans"]
    }
    assert parent[(probes.GC_SPAN, 0.5)] == "import vllm"  # made under no span
    assert parent[(probes.GC_SPAN, 1.5)] == "Load model"
    assert parent[(probes.GC_SPAN, 2.3)] == probes.IMPORT_SPAN + "vllm.x"  # inside the import
    assert parent[("import initpipe", 0.05)] == "interpreter start"  # an interval in another
    probed = {s["source"] for s in r["spans"] if s["name"] in (probes.GC_SPAN, "Worker.load_model")}
    assert probed == {"probe"}
    # covered: 0-1.0 (intervals), 1.2-2.0 (Load model: only a collection inside it),
    # 2.2-2.5 (the import); not: Executor init's and the probe's own time, 2.5-3.0
    assert r["wall_s"] == pytest.approx(3.0)
    assert r["attributed_s"] == pytest.approx(2.1)
    assert r["unattributed_s"] == pytest.approx(0.9)
    assert r["attributed_s"] + r["unattributed_s"] == pytest.approx(r["wall_s"])
    phases = {k: v["wall_s"] for k, v in r["phases"].items()}
    assert phases["garbage collection"] == pytest.approx(0.4)
    assert phases["imports and config"] == pytest.approx(0.07 + 0.03 + 0.8 + 0.2)
    assert phases["weights"] == pytest.approx(0.6 + 0.2)  # Load model's own, the probe's own
    assert r["sources"]["probe"]["count"] == 5 and r["sources"]["vllm"]["count"] == 2
    assert r["sources"]["interval"]["count"] == 3


def test_the_report_lists_what_each_probe_did() -> None:
    r = _probed_start()
    assert r["probes"]["installed"] == ["m:Worker.load_model"]
    assert r["probes"]["missing"] == [
        {"target": "m:gone", "error": "no gone", "processes": ["frontend"]}
    ]
    assert r["probes"]["declared"] == [p.target for p in probes.PROBES]
    assert r["probes"]["not_loaded"] == [p.target for p in probes.PROBES]
    text = render(r, "text")
    assert "probe m:gone missing in frontend: no gone" in text


def test_compare_can_take_the_probes_alone() -> None:
    base = _probed_start()
    rows = compare(base, base, only="probe")["rows"]
    assert {r["source"] for r in rows} == {"probe"}
    assert {r["name"] for r in rows} == {
        "Worker.load_model",
        probes.GC_SPAN,
        probes.IMPORT_SPAN + "vllm.x",
    }


def test_a_note_of_what_initpipe_changed_is_listed_once_with_its_processes() -> None:
    """The pipelined worker declining vLLM 0.34's extensible KV cache writes a ``note`` mark
    in each worker (``marks.note``): the report lists the text once, naming the processes,
    in the JSON and in the text."""
    from initpipe_vllm.hook.worker import EXTENSIBLE_KV_CACHE_DECLINED

    said = f"the extensible KV cache is off: {EXTENSIBLE_KV_CACHE_DECLINED}"
    marks = [
        {"kind": "process", "pid": 1, "ppid": 0, "argv": ["python"], "create_s": T0},
        {"kind": "note", "pid": 1, "text": said},
        {"kind": "note", "pid": 1, "text": said},
    ]
    r = build([span("Executor init", 1.0, 2.0, "e1")], marks, origin_s=T0, ready_s=T0 + 2.0)
    assert r["notes"] == [{"text": said, "processes": ["frontend"]}]
    assert f"note (frontend): {said}" in render(r, "text")
    assert build([span("Executor init", 1.0, 2.0, "e1")], marks[:1])["notes"] == []


def test_a_creation_read_just_before_the_origin_is_the_origin() -> None:
    """``initpipe startup run`` takes the child's creation time as the origin, and the child
    reads its own again (``marks.process_start_s``: wall clock less the process's age, two
    clock reads): under load the second reading can fall microseconds before the first. The
    report puts it at the origin; it printed ``created @-0.000 s`` and a critical chain from
    ``@  -0.000 s`` (a docs example failed on it)."""
    early = T0 - 0.0004
    marks = [
        {"kind": "process", "pid": 1, "ppid": 0, "argv": ["python"], "create_s": early},
        {
            "kind": "interval",
            "pid": 1,
            "name": "interpreter start",
            "start_s": early,
            "end_s": T0 + 0.5,
        },
    ]
    r = build([span("Executor init", 1.0, 2.0, "e1")], marks, origin_s=T0, ready_s=T0 + 2.0)
    assert r["processes"][0]["create_s"] == 0.0
    (start,) = [s for s in r["spans"] if s["name"] == "interpreter start"]
    assert start["start_s"] == 0.0
    text = render(r, "text")
    assert "-0.000" not in text and "created @0.000 s" in text
    # a tick or more before the origin stays where it was read
    marks[0]["create_s"] = T0 - 0.05
    assert build([span("Executor init", 1.0, 2.0, "e1")], marks, origin_s=T0)["processes"][0][
        "create_s"
    ] == pytest.approx(-0.05)
