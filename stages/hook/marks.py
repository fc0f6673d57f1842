"""Start-up marks: what ``initpipe startup run`` measures in each vLLM process where no
span can (interpreter start, imports, config), and a way to flush each process's spans.

What belongs here: the in-process half of ``initpipe startup run`` only. It is active only
when ``INITPIPE_STARTUP_MARKS`` names a folder (``startup run`` sets it for the process
tree it starts); the plugin's :func:`~.plugin.register`, which vLLM calls once in every
process it starts (frontend, engine core, each worker) before it builds anything, then
calls :func:`install`. Nothing here runs otherwise.

In that folder, each process writes ``marks-<pid>.jsonl`` (JSON Lines, appended one line at
a time):

- a header ``{"kind": "process", "pid", "ppid", "argv", "create_s", "plugins_s", "flush"}``:
  the process's creation time (``/proc/<pid>/stat``, 10 ms ticks, on the wall clock), the
  moment vLLM loaded its plugins, and whether a flush handler is installed;
- an ``{"kind": "interval", "name", "start_s", "end_s"}`` line per measured interval:
  ``"engine config"`` around ``EngineArgs.create_engine_config`` (a wrapper, installed
  once per process) and whatever :func:`interval` records (the ``startup run`` child's
  own: ``"interpreter start"``, ``"import vllm"``, ``"first token"``);
- a ``{"kind": "note", "text"}`` line where initpipe changed the start and says so
  (:func:`note`: the pipelined worker declining vLLM 0.34's extensible KV cache).

**Flush on request.** vLLM exports spans in batches and flushes only at exit, while it
stops workers with SIGTERM and then kills them. So, where ``SIGUSR1`` is at its default,
:func:`install` handles it: the handler starts a thread that calls the process's tracer
provider's ``force_flush`` (which returns once the exporter has sent everything ended so
far) and then writes ``flushed-<pid>.json``. ``startup run`` signals only processes whose
header says ``"flush": true`` (SIGUSR1's default action would kill the others).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..contract.declare import vllm_uses

__all__ = ["ENV_VAR", "install", "interval", "process_start_s"]

ENV_VAR = "INITPIPE_STARTUP_MARKS"
#: The named interval of installing these marks and the probes (the measurement's own cost).
PROBES_INSTALL = "initpipe start-up probes"
_CONFIG = "vllm.engine.arg_utils:EngineArgs.create_engine_config"
_installed_pid: int | None = None
#: When this process first started building its engine config (None: not yet).
config_started_s: float | None = None


def _folder() -> Path | None:
    value = os.environ.get(ENV_VAR)
    return Path(value) if value else None


def process_start_s(pid: int | str = "self") -> float | None:
    """When process ``pid`` was created, on the wall clock (``/proc``; 10 ms ticks), or
    None where ``/proc`` cannot say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rpartition(")")[2].split()[19])  # field 22, starttime
        since_boot = ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _write(record: dict[str, Any]) -> None:
    folder = _folder()
    if folder is None:
        return
    line = json.dumps({**record, "pid": os.getpid()}) + "\n"
    try:
        with open(folder / f"marks-{os.getpid()}.jsonl", "a") as f:
            f.write(line)
    except OSError:
        pass  # a measurement must never stop vLLM


def note(text: str) -> None:
    """Record what initpipe changed about this start, in words (the report lists each
    note under the processes that wrote it); nothing outside ``startup run``."""
    _write({"kind": "note", "text": text})


def interval(name: str, start_s: float, end_s: float) -> None:
    """Record a named interval of this process (wall-clock seconds)."""
    _write({"kind": "interval", "name": name, "start_s": start_s, "end_s": end_s})


def install() -> None:
    """Write this process's header, time its config building and set the flush handler
    (once per process; nothing when ``INITPIPE_STARTUP_MARKS`` is unset)."""
    global _installed_pid
    if _folder() is None or _installed_pid == os.getpid():
        return
    _installed_pid = os.getpid()
    now = time.time()
    _time_config()
    from . import probes

    probes.install(_write)
    flush = _install_flush()
    interval(PROBES_INSTALL, now, time.time())
    created = process_start_s()
    from .. import _import_time

    started, ended = _import_time.STARTED_S, _import_time.ENDED_S
    if isinstance(started, float) and isinstance(ended, float):
        if created is None or started >= created:  # not a forked parent's
            interval("import initpipe", started, ended)
    _write(
        {
            "kind": "process",
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "argv": sys.argv[:4],
            "create_s": created,
            "plugins_s": now,
            "flush": flush,
        }
    )


@vllm_uses("startup", mirrors=(_CONFIG,), calls=("vllm.engine.arg_utils:EngineArgs",))
def _time_config() -> None:
    """Wrap ``EngineArgs.create_engine_config`` so each call is an ``"engine config"``
    interval (it runs before any span: the frontend's tracer is set up from its result)."""
    try:
        from vllm.engine.arg_utils import EngineArgs
    except Exception:  # no vLLM here: nothing to time
        return
    original = EngineArgs.create_engine_config
    if getattr(original, "_initpipe_marks", False):
        return

    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        global config_started_s
        start = time.time()
        if config_started_s is None:
            config_started_s = start
        try:
            return original(self, *args, **kwargs)
        finally:
            interval("engine config", start, time.time())

    create_engine_config._initpipe_marks = True  # type: ignore[attr-defined]
    EngineArgs.create_engine_config = create_engine_config  # type: ignore[method-assign]


def _install_flush() -> bool:
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        if signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL:
            return False  # someone else's: leave it
        signal.signal(signal.SIGUSR1, _on_flush_signal)
    except (ValueError, OSError, AttributeError):
        return False
    return True


def _on_flush_signal(signum: int, frame: Any) -> None:
    threading.Thread(target=_flush, name="initpipe-startup-flush", daemon=True).start()


def _flush() -> None:
    ok = False
    try:
        from opentelemetry import trace

        from . import probes

        probes.emit_collections()  # the garbage collections timed so far
        provider = trace.get_tracer_provider()
        flush = getattr(provider, "force_flush", None)
        ok = bool(flush(30_000)) if flush is not None else True
    except Exception:  # report what happened, never raise in vLLM
        ok = False
    folder = _folder()
    if folder is None:
        return
    tmp = folder / f".flushed-{os.getpid()}.json"
    try:
        tmp.write_text(json.dumps({"pid": os.getpid(), "ok": ok, "at_s": time.time()}))
        tmp.replace(folder / f"flushed-{os.getpid()}.json")
    except OSError:
        pass
