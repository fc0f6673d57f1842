"""Synthetic spans and marks for the report's unit tests: a start whose every number is
worked out by hand in test_report.py (seconds from T0, one wall clock)."""

from __future__ import annotations

from typing import Any

from initpipe_vllm.tools.otlp import Span

T0 = 1_800_000_000.0  # s, the wall clock of the start
TRACE = "ab" * 16

FRONTEND = {"vllm.process_id": "1", "vllm.instrumenting_module_name": "vllm.llm_engine"}
CORE = {
    "vllm.process_id": "2",
    "vllm.process_kind": "engine_core",
    "vllm.process_name": "EngineCore",
}


def worker(rank: int, pid: int) -> dict[str, str]:
    return {
        "vllm.process_id": str(pid),
        "vllm.process_kind": "worker",
        "vllm.process_name": f"Worker_{rank}",
    }


def span(
    name: str,
    start: float,
    end: float,
    sid: str,
    parent: str = "",
    resource: dict[str, str] | None = None,
    *,
    initpipe: dict[str, Any] | None = None,
    status: str = "unset",
    message: str = "",
) -> Span:
    """A span of ``start``..``end`` seconds after T0; ``sid``/``parent`` short names padded
    to 16 hex digits; ``initpipe``: an initpipe stage span's attributes."""
    return Span(
        name=name,
        scope="initpipe" if initpipe is not None else "vllm.x",
        trace_id=TRACE,
        span_id=sid.ljust(16, "0"),
        parent_id=parent.ljust(16, "0") if parent else "",
        start_ns=round((T0 + start) * 1e9),
        end_ns=round((T0 + end) * 1e9),
        attributes=dict(initpipe or {}),
        resource=dict(resource or FRONTEND),
        status=status,
        status_message=message,
    )


def sid(short: str) -> str:
    return short.ljust(16, "0")


def own_process_start() -> tuple[list[Span], list[dict[str, Any]]]:
    """A frontend (pid 1), an engine core (pid 2) and one worker (pid 3)."""
    spans = [
        span("SyncMPClient init", 1.2, 10.0, "c1"),
        span("EngineCoreProc init", 3.9, 9.9, "e1", "c1", CORE),
        span("Executor init", 4.05, 8.0, "e2", "e1", CORE),
        span("Prepare model", 8.1, 9.0, "e3", "e1", CORE),
        span("Worker init", 6.0, 7.5, "a1", "e2", worker(0, 3)),
        span("Load model", 6.2, 7.4, "a2", "a1", worker(0, 3)),
        span("Load weights", 6.3, 7.0, "a3", "a2", worker(0, 3)),
        # parented from the environment inherited at spawn: Executor init, long ended
        span("Allocate KV cache", 8.2, 8.5, "a4", "e2", worker(0, 3)),
        span(
            "kv_caches",
            8.25,
            8.4,
            "b1",
            "a4",
            worker(0, 3),
            initpipe={
                "initpipe.phase": "kv_cache_config",
                "initpipe.kind": "stage",
                "initpipe.rank": 0,
            },
        ),
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
        {
            "kind": "interval",
            "pid": 1,
            "name": "interpreter start",
            "start_s": T0,
            "end_s": T0 + 0.1,
        },
        {
            "kind": "interval",
            "pid": 1,
            "name": "import vllm",
            "start_s": T0 + 0.1,
            "end_s": T0 + 0.9,
        },
        {
            "kind": "interval",
            "pid": 1,
            "name": "engine config",
            "start_s": T0 + 1.0,
            "end_s": T0 + 1.2,
        },
        # vLLM loads the engine core's plugins inside its first span: the interval stops there
        {
            "kind": "process",
            "pid": 2,
            "ppid": 1,
            "argv": ["-c"],
            "create_s": T0 + 1.25,
            "plugins_s": T0 + 4.0,
            "flush": True,
        },
        {
            "kind": "process",
            "pid": 3,
            "ppid": 2,
            "argv": ["-c"],
            "create_s": T0 + 4.1,
            "plugins_s": T0 + 6.0,
            "flush": True,
        },
    ]
    return spans, marks
