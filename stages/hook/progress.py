"""Progress lines, trace files and failure reports for pipelined vLLM workers.

What belongs here: what a user sees of the pipeline while vLLM starts — one log line per
stage (phase, name, duration) until the worker's start-up is over, then one summary line
per phase (a live resize's KV phase is one line, not one per stage: each line costs about
50 µs, which a re-init of a tiny model notices), the trace written to a file on request,
and, when a stage
fails, a last log line naming it and the completed stages plus a failure trace file. vLLM's
own "Engine core initialization failed. See root cause above" is then not all a user gets,
even in multiprocess mode where the exception itself cannot cross processes.
Replaces nothing in vLLM; the worker (:mod:`.worker`) and runner (:mod:`.runner`) call it.

Environment:

- ``INITPIPE_LOG_STAGES=0``: quiet — no line per stage and the per-phase summary at DEBUG
  (each line costs about 50 µs through vLLM's logging, which a tiny model's KV re-init
  notices: 0.97x stock when quiet, about 1.15x with the summary line alone).
- ``INITPIPE_TRACE=FILE``: write the trace (initpipe JSON) to ``FILE`` and a Chrome trace
  beside it (``FILE`` with ``.chrome.json``) after each KV phase and at shutdown. With
  several workers, each writes ``FILE`` with ``.rank<N>`` before the suffix.
- Failure traces go to ``INITPIPE_TRACE``'s path with ``.failure`` before the suffix, or,
  when it is unset, to ``failure-<pid>.json`` (``failure-<pid>-rank<N>.json`` with several
  workers) in a private per-user folder
  (``initpipe.files.private_dir()``: ``$XDG_RUNTIME_DIR/initpipe``, else
  ``<tmp>/initpipe-<uid>``, mode 0700).
- ``INITPIPE_TRACE`` may name a device or FIFO (``/dev/stdout``, a pipe): the JSON trace is
  written through it, and no Chrome or failure file is made beside it.
- Files are written with ``initpipe.files.write_file``: a device, FIFO or symlink at the
  path is written through, never replaced.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from initpipe.files import private_dir

from .spans import emit as emit_spans

__all__ = [
    "ENV_LOG_STAGES",
    "ENV_TRACE",
    "add_listener",
    "emit_spans",
    "failure_trace_path",
    "failure_trace_pattern",
    "listeners",
    "log_event",
    "log_phase",
    "logger",
    "phase_spans",
    "remove_listener",
    "report_failure",
    "stage_line",
    "trace_paths",
    "write_trace",
]

#: Under vLLM's logger tree: the lines use vLLM's handler, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.initpipe")

ENV_TRACE = "INITPIPE_TRACE"
ENV_LOG_STAGES = "INITPIPE_LOG_STAGES"

_LISTENERS: list[Callable[[Any], None]] = []


def _who(rank: int | None) -> str:
    """``"initpipe"``, or ``"initpipe rank N"`` for one worker of several."""
    return "initpipe" if rank is None else f"initpipe rank {rank}"


def log_event(event: Any, rank: int | None = None) -> None:
    """Log one trace event as a single line: phase, stage, duration, outcome (and the
    worker's rank when there are several)."""
    kind = "" if event.kind == "stage" else f"{event.kind} "
    logger.info(
        "%s %-15s %s%-40s %9.3f ms %s",
        _who(rank),
        event.phase,
        kind,
        event.name,
        event.duration * 1e3,
        event.outcome,
    )


def add_listener(fn: Callable[[Any], None]) -> None:
    """Also call ``fn(event)`` for every stage of pipelined runners built in this process."""
    _LISTENERS.append(fn)


def remove_listener(fn: Callable[[Any], None]) -> None:
    """Undo :func:`add_listener`."""
    if fn in _LISTENERS:
        _LISTENERS.remove(fn)


def stage_lines_enabled() -> bool:
    """False when ``INITPIPE_LOG_STAGES`` is 0/false/no/off."""
    value = os.environ.get(ENV_LOG_STAGES, "1").strip().lower()
    return value not in {"0", "false", "no", "off"}


def stage_line(rank: int | None = None) -> Callable[[Any], None] | None:
    """The per-stage log line listener (naming ``rank`` unless it is None), or None with
    ``INITPIPE_LOG_STAGES=0``."""
    if not stage_lines_enabled():
        return None
    return log_event if rank is None else functools.partial(log_event, rank=rank)


def listeners(rank: int | None = None, *, stage_lines: bool = True) -> list[Callable[[Any], None]]:
    """The listeners a new run gets: the per-stage log line (unless ``stage_lines`` is
    False or ``INITPIPE_LOG_STAGES=0``; naming ``rank`` unless it is None), then the
    registered ones."""
    line = stage_line(rank) if stage_lines else None
    return [line, *_LISTENERS] if line is not None else list(_LISTENERS)


def log_phase(run: Any, phase: str, rank: int | None = None) -> None:
    """One summary line for a completed phase: stage count, total and slowest stage
    (INFO, or DEBUG when ``INITPIPE_LOG_STAGES=0``; naming ``rank`` unless None)."""
    phase_spans(run.trace, phase, rank)  # as spans too, when vLLM's tracing is on
    level = logging.INFO if stage_lines_enabled() else logging.DEBUG
    if not logger.isEnabledFor(level):
        return
    # The phase's stage records are the last ones (listeners add none): read only those,
    # not the whole (possibly long) trace.
    durations = run.trace.recent_durations(len(run.pipeline.phase_order(phase)), phase)
    if not durations:
        return
    slowest = max(durations, key=durations.__getitem__)
    logger.log(
        level,
        "%s %s phase: %d stages in %.3f ms (slowest: %s %.3f ms)",
        _who(rank),
        phase,
        len(durations),
        sum(durations.values()) * 1e3,
        slowest,
        durations[slowest] * 1e3,
    )


def phase_spans(trace: Any, phase: str, rank: int | None) -> None:
    """:func:`.spans.emit`, never raising: a tracing problem must not hide a stage's error
    or stop a phase (it is logged at DEBUG)."""
    try:
        emit_spans(trace, phase, rank)
    except Exception:
        logger.debug("initpipe: could not emit the stage spans", exc_info=True)


def _with_suffix(path: Path, tag: str) -> Path:
    if path.suffix == ".json":
        return path.with_name(f"{path.stem}{tag}.json")
    return path.with_name(f"{path.name}{tag}")


def _is_special(path: Path) -> bool:
    """True for an existing path that is not a regular file (a device, FIFO, socket)."""
    return path.exists() and not path.is_file() and not path.is_dir()


def trace_paths(rank: int = 0, world_size: int = 1) -> tuple[Path, Path | None] | None:
    """(JSON, Chrome) paths from ``INITPIPE_TRACE``, or None when it is unset.

    The Chrome path is None when ``INITPIPE_TRACE`` names a device or FIFO (nothing is
    created beside ``/dev/stdout``).
    """
    raw = os.environ.get(ENV_TRACE, "").strip()
    if not raw:
        return None
    path = Path(raw)
    if _is_special(path):
        return path, None
    if world_size > 1:
        path = _with_suffix(path, f".rank{rank}")
    return path, _with_suffix(path, ".chrome")


def write_trace(
    trace: Any, graph: Any, paths: tuple[Path, Path | None]
) -> tuple[Path, Path | None]:
    """Write the trace as initpipe JSON (with the critical path) and as a Chrome trace."""
    json_path, chrome_path = paths
    json_path.parent.mkdir(parents=True, exist_ok=True)
    chrome = None if chrome_path is None else trace.write_chrome(chrome_path)
    return trace.write_json(json_path, graph), chrome


def failure_trace_path(rank: int = 0, world_size: int = 1) -> Path:
    """Where a failure trace goes (see the module docstring).

    Raises:
        PermissionError: the private folder exists but is not safe to use (says why).
    """
    paths = trace_paths(rank, world_size)
    if paths is not None and paths[1] is not None:
        return _with_suffix(paths[0], ".failure")
    tag = f"-rank{rank}" if world_size > 1 else ""
    return private_dir() / f"failure-{os.getpid()}{tag}.json"


def failure_trace_pattern(world_size: int) -> str:
    """Where every rank's failure trace is, as a glob pattern (several workers)."""
    paths = trace_paths(0, 1)
    if paths is not None and paths[1] is not None:
        return str(_with_suffix(paths[0], ".rank*.failure"))
    return str(private_dir() / ("failure-*-rank*.json" if world_size > 1 else "failure-*.json"))


def report_failure(
    err: Any, trace: Any, graph: Any, rank: int = 0, world_size: int = 1
) -> Path | None:
    """Write the failure trace and log the last line naming the stage and completed ones.
    With several workers ``err``'s message also gets the rank and where every rank's
    failure trace is (only the first failing rank's error reaches the engine).

    Returns the trace path, or None if it could not be written (the line is logged anyway).
    """
    phase_spans(trace, err.phase, rank if world_size > 1 else None)  # the error span too
    path: Path | None = None
    try:
        path = failure_trace_path(rank, world_size)
        trace.write_json(path, graph)
    except OSError as os_err:
        logger.error(
            "initpipe: could not write the failure trace to %s: %s",
            path or "the private folder",
            os_err,
        )
        path = None
    logger.error(
        "%s: stage %r failed in phase %r: %s: %s; completed: %s; rolled back: "
        "%s; failure trace: %s",
        _who(rank if world_size > 1 else None),
        err.stage,
        err.phase,
        type(err.__cause__).__name__,
        err.__cause__,
        ", ".join(err.completed) or "none",
        ", ".join(err.rolled_back) or "nothing",
        path or "not written",
    )
    if world_size > 1:
        # Only the first failing rank's error reaches the engine: say which rank it is and
        # where every rank's trace (what each completed and rolled back) can be read.
        err.rank = rank
        err.args = (
            f"on rank {rank} of {world_size}: {err.args[0]}\n"
            f"  failure trace of this rank: {path or 'not written'}; every rank's: "
            f"{failure_trace_pattern(world_size)}",
        )
    return path
