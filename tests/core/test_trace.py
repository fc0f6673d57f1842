"""Trace exports (JSON, Chrome), critical path and blame."""

import json

from initpipe import Pipeline, Trace, stage
from initpipe._trace import critical_path


def build():
    @stage(needs="model")
    def a(model):
        return 1

    @stage(needs="model")
    def b(a):
        return 2

    @stage(needs="model")
    def c(a):
        return 3

    @stage(needs="kv_cache_config")
    def d(b, c, kv_cache_config):
        return 4

    return Pipeline([a, b, c, d])


def test_critical_path_follows_the_longest_weighted_chain():
    p = build()
    durs = {"a": 1.0, "b": 5.0, "c": 2.0, "d": 1.0}
    assert critical_path(p.graph, durs) == [("a", 1.0), ("b", 5.0), ("d", 1.0)]
    durs["c"] = 9.0
    assert [n for n, _ in critical_path(p.graph, durs)] == ["a", "c", "d"]


def test_run_trace_exports_json_and_chrome(tmp_path):
    p = build()
    run = p.start()
    with run.trace.span("weight loading", phase="vllm"):
        pass
    run.load(model=0)
    run.initialize_kv_cache(1)
    run.initialize_kv_cache(2)
    events = run.trace.events
    assert [(e.name, e.kind, e.generation) for e in events] == [
        ("weight loading", "span", 0),
        ("a", "stage", 0),
        ("b", "stage", 0),
        ("c", "stage", 0),
        ("d", "stage", 1),
        ("d", "stage", 2),
    ]
    starts = [e.start for e in events]
    assert starts == sorted(starts)
    path = run.trace.write_json(tmp_path / "t.json", p.graph)
    data = json.loads(path.read_text())
    assert [e["name"] for e in data["events"]] == [e.name for e in events]
    assert [c["name"] for c in data["critical_path"]][-1] == "d"
    back = Trace.from_dict(data)
    assert [e.name for e in back.events] == [e.name for e in events]
    chrome = json.loads(run.trace.write_chrome(tmp_path / "c.json").read_text())
    xs = [e for e in chrome["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(events)
    assert {e["name"] for e in chrome["traceEvents"] if e["ph"] == "M"} == {"thread_name"}
    assert all(e["dur"] >= 0 and "ts" in e for e in xs)


def test_blame_sorts_by_self_time():
    p = build()
    run = p.start()
    run.load(model=0)
    run.initialize_kv_cache(1)
    names = [n for n, _ in run.blame()]
    assert sorted(names) == ["a", "b", "c", "d"]
    durs = [d for _, d in run.blame()]
    assert durs == sorted(durs, reverse=True)
    assert run.critical_path()[0][0] == "a"


def test_failed_stage_is_traced_with_its_error():
    @stage(needs="model")
    def boom(model):
        raise ValueError("nope")

    run = Pipeline([boom]).start()
    try:
        run.load(model=0)
    except Exception:
        pass
    (e,) = run.trace.events
    assert e.outcome == "error" and e.error == "ValueError: nope"


def test_json_round_trip_keeps_durations_exactly():
    t = Trace()
    t.record("x", "model", "stage", 10.0, 11.2, "ok")
    back = Trace.from_dict(json.loads(json.dumps(t.to_dict())))
    assert back.durations() == t.durations()
    assert abs(back.events[0].start - t.events[0].start) < 1e-9


def test_runs_can_share_one_trace_with_host_spans():
    p = build()
    shared = Trace()
    with shared.span("load weights", phase="vllm"):
        pass
    first = p.start(trace=shared)
    first.load(model=0)
    first.close()
    second = p.start(trace=shared)
    second.load(model=0)
    assert second.trace is shared
    assert [e.name for e in shared.events] == ["load weights", "a", "b", "c", "a", "b", "c"]


def test_bounded_trace_keeps_the_latest_events():
    p = build()
    run = p.start(trace=Trace(max_records=5))
    run.load(model=0)
    for i in range(10):
        run.initialize_kv_cache(i)
    events = run.trace.events
    assert len(events) == 5
    assert [e.generation for e in events] == [6, 7, 8, 9, 10]


def test_tail_returns_the_latest_events_oldest_first():
    t = Trace()
    for i in range(5):
        t.record(f"s{i}", "model", "stage", 0.0, 1.0, "ok")
    assert [e.name for e in t.tail(2)] == ["s3", "s4"]
    assert [e.name for e in t.tail(10)] == [f"s{i}" for i in range(5)]


def test_recent_durations_reads_the_latest_ok_stage_runs_of_one_phase():
    t = Trace()
    t.record("old", "kv", "stage", 0.0, 9.0, "ok")
    t.record("a", "kv", "stage", 0.0, 1.0, "ok")
    t.record("m", "model", "stage", 0.0, 2.0, "ok")
    t.record("b", "kv", "stage", 0.0, 3.0, "error", error="boom")
    t.record("a", "kv", "teardown", 0.0, 4.0, "ok")
    t.record("c", "kv", "stage", 1.0, 1.5, "ok")
    assert t.recent_durations(5, "kv") == {"a": 1.0, "c": 0.5}
    assert t.recent_durations(100, "kv") == {"old": 9.0, "a": 1.0, "c": 0.5}
    assert t.recent_durations(5, "model") == {"m": 2.0}
    assert Trace().recent_durations(3, "kv") == {}
