"""Start-up probes: spans around the vLLM steps vLLM does not trace itself, and around
every garbage collection, so ``initpipe startup run`` can name where the time went.

What belongs here: the in-process half of the probes, and their list. Like
:mod:`.marks`, this runs only under ``initpipe startup run`` (``INITPIPE_STARTUP_MARKS``
set): :func:`.marks.install` calls :func:`install` in every process vLLM starts. A
production start never wraps anything.

Two kinds of probe:

- **Function probes** (:data:`PROBES`): a declared vLLM function is wrapped, in place, in
  a span named after it (``CPUWorker.init_device``). The wrapper opens the span as vLLM's
  ``@instrument`` does: a child of the current span, else of the ``traceparent`` vLLM
  passes in the environment. A module not yet imported is patched when it is (a
  ``sys.meta_path`` finder wraps its loader), so no module is imported earlier than vLLM
  would. The targets are declared to the contract (capability ``startup``), so a release
  that renames or moves one shows in ``initpipe doctor``. A target that cannot be found
  in a running process is written to the marks as ``{"kind": "probe", "status":
  "missing"}`` and skipped: a probe never stops vLLM.
- **The garbage-collection probe**: ``gc.callbacks`` times every collection. Each one of
  1 ms or more becomes a span ``garbage collection`` under the span that was current when
  it started (attributes: generation, objects collected). They are sent when the process
  flushes (:func:`emit_collections`), since a collection can start anywhere, even inside
  the tracing SDK's own locked code.

Span scope: ``initpipe.probe``; attribute ``initpipe.probe``: the target (or ``gc``).
"""

from __future__ import annotations

import functools
import gc
import importlib.abc
import importlib.machinery
import inspect
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import attrs

from ..contract.declare import vllm_uses

__all__ = ["GC_SPAN", "PROBES", "SCOPE", "Probe", "emit_collections", "install"]

#: The instrumentation scope of the probes' spans (the report tells them apart by it).
SCOPE = "initpipe.probe"
#: The name of a garbage collection's span.
GC_SPAN = "garbage collection"
#: Collections shorter than this are not sent (most are microseconds).
GC_MIN_NS = 1_000_000
#: The name of an import's span is this and the module's name.
IMPORT_SPAN = "import "
#: Imports shorter than this are not sent.
IMPORT_MIN_NS = 1_000_000


@attrs.frozen
class Probe:
    """One probed vLLM function.

    Attributes:
        target: ``module:qualname`` of the attribute replaced: a method, or a module
            global where vLLM calls a function imported by name (the caller's module).
        phase: the start-up report's phase its own time counts in.
        why: what it names, for the docs and the doctor.
    """

    target: str
    phase: str
    why: str

    @property
    def name(self) -> str:
        """The span's name: the qualname (``CPUWorker.init_device``)."""
        return self.target.partition(":")[2]

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]


_CORE = "vllm.v1.engine.core"
_WORKER = "vllm.v1.worker.gpu_worker:Worker"
_CPU = "vllm.v1.worker.cpu_worker:CPUWorker"
_API = "vllm.entrypoints.launchers.api_server.entry"
_STANDALONE_WARM_UP = (
    "vllm.v1.worker.cpu.standalone_model_runner:StandaloneCPUModelRunner.warming_up_model"
)

#: The probed functions: the steps of a start that run under no span of vLLM's own.
PROBES: tuple[Probe, ...] = (
    Probe(
        f"{_CPU}.init_device",
        "device init",
        "the CPU worker's device set-up and runner construction (vLLM traces "
        "Worker.init_device on GPUs only)",
    ),
    Probe(
        "vllm.platforms.cpu:CpuPlatform.register_triton_kernel_overrides",
        "process start",
        "the CPU platform's kernel registrations in each worker's init",
    ),
    Probe(
        "vllm.triton_utils.dispatcher:_rebind_kernels",
        "process start",
        "the kernel registrations' scan of every loaded module for kernels to rebind",
    ),
    Probe(
        f"{_WORKER}.load_model",
        "weights",
        "the worker's load_model: Model Runner V2's runner has no span of its own",
    ),
    Probe(
        f"{_WORKER}.get_kv_cache_spec",
        "KV planning",
        "the worker's KV cache spec (the v1 runner's model phase runs here)",
    ),
    Probe(
        f"{_CPU}.determine_available_memory",
        "memory profiling",
        "the CPU worker's memory profile",
    ),
    Probe(
        "vllm.v1.worker.cpu.model_runner:CPUModelRunner.warming_up_model",
        "warm-up, compile, capture",
        "Model Runner V2's CPU warm-up (a profile run that compiles), which the CPU worker "
        "calls inside its memory profile; v1's is vLLM's own span, Warmup (CPU)",
    ),
    Probe(
        _STANDALONE_WARM_UP,
        "warm-up, compile, capture",
        "the standalone CPU runner's warm-up (vLLM 0.34.0 on non-x86 CPUs without Triton)",
    ),
    Probe(
        f"{_WORKER}.determine_available_memory",
        "memory profiling",
        "the GPU worker's memory profile",
    ),
    Probe(f"{_CORE}:freeze_gc_heap", "garbage collection", "the engine core's GC freeze"),
    Probe(
        f"{_API}:build_app",
        "API server",
        "the OpenAI server's FastAPI app and its routers",
    ),
    Probe(
        f"{_API}:init_app_state",
        "API server",
        "the OpenAI server's serving objects (models, renderers, handlers)",
    ),
    Probe(
        "vllm.entrypoints.launchers.launcher:NoSignalServer.startup",
        "API server",
        "uvicorn's start-up (the app's lifespan, then listening), until it accepts requests",
    ),
    Probe(
        "vllm.entrypoints.launchers.utils.server_utils:freeze_gc_heap",
        "garbage collection",
        "the OpenAI server's GC freeze when its app starts",
    ),
    Probe(
        "vllm.v1.core.sched.scheduler:Scheduler.__init__",
        "scheduler",
        "the scheduler and its KV cache manager",
    ),
    Probe(
        "vllm.v1.structured_output:StructuredOutputManager.__init__",
        "scheduler",
        "the structured-output manager",
    ),
)

_lock = threading.RLock()
_installed_pid: int | None = None
#: module name -> the probes waiting for it to be imported
_waiting: dict[str, list[Probe]] = {}


def _ignore(record: dict[str, Any]) -> None:
    """Where probe records go until :func:`install` is given a writer."""


_record: Callable[[dict[str, Any]], None] = _ignore


# -- function probes ----------------------------------------------------------------------
def _tracer() -> Any:
    """The probes' tracer, or None while no SDK tracer provider is installed (vLLM
    installs one when ``otlp_traces_endpoint`` is set)."""
    from .spans import _os_random_ids, tracing_on

    if not tracing_on():
        return None
    from opentelemetry import trace

    tracer = trace.get_tracer(SCOPE)
    if hasattr(tracer, "id_generator"):  # the SDK's Tracer: ids from os.urandom
        tracer.id_generator = _os_random_ids()
    return tracer


def _parent() -> Any:
    """vLLM's rule: the current span, else the ``traceparent`` in the environment."""
    from opentelemetry import trace
    from opentelemetry.propagate import extract

    if trace.get_current_span().get_span_context().is_valid:
        return None
    from .spans import _HEADERS

    carrier = {k.lower(): v for k, v in os.environ.items() if k.lower() in _HEADERS}
    return extract(carrier) if carrier else None


def _wrap(fn: Callable[..., Any], probe: Probe) -> Callable[..., Any]:
    attributes = {"initpipe.probe": probe.target, "initpipe.probe.phase": probe.phase}

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def probed_async(*args: Any, **kwargs: Any) -> Any:
            tracer = _tracer()
            if tracer is None:
                return await fn(*args, **kwargs)
            with tracer.start_as_current_span(probe.name, context=_parent(), attributes=attributes):
                return await fn(*args, **kwargs)

        wrapped: Callable[..., Any] = probed_async
    else:

        @functools.wraps(fn)
        def probed(*args: Any, **kwargs: Any) -> Any:
            tracer = _tracer()
            if tracer is None:
                return fn(*args, **kwargs)
            with tracer.start_as_current_span(probe.name, context=_parent(), attributes=attributes):
                return fn(*args, **kwargs)

        wrapped = probed
    wrapped.__initpipe_probe__ = probe.target  # type: ignore[attr-defined]
    return wrapped


def _patch(module: ModuleType, probe: Probe) -> None:
    """Wrap ``probe``'s target in ``module``; a target that is not there is recorded."""
    *owners, attr = probe.name.split(".")
    try:
        owner: Any = module
        for part in owners:
            owner = getattr(owner, part)
        raw = inspect.getattr_static(owner, attr)
    except AttributeError as err:
        _record({"kind": "probe", "target": probe.target, "status": "missing", "error": str(err)})
        return
    fn = raw.__func__ if isinstance(raw, staticmethod | classmethod) else raw
    if getattr(fn, "__initpipe_probe__", None) == probe.target:
        return  # already wrapped
    if not callable(fn):
        _record(
            {
                "kind": "probe",
                "target": probe.target,
                "status": "missing",
                "error": f"{probe.target} is a {type(fn).__name__}, not a function",
            }
        )
        return
    wrapped: Any = _wrap(fn, probe)
    if isinstance(raw, staticmethod):
        wrapped = staticmethod(wrapped)
    elif isinstance(raw, classmethod):
        wrapped = classmethod(wrapped)
    setattr(owner, attr, wrapped)
    _record({"kind": "probe", "target": probe.target, "status": "installed"})


def _patch_module(module: ModuleType) -> None:
    with _lock:
        probes = _waiting.pop(module.__name__, [])
    for probe in probes:
        try:
            _patch(module, probe)
        except Exception as err:  # a probe never stops vLLM
            _record(
                {"kind": "probe", "target": probe.target, "status": "missing", "error": repr(err)}
            )


#: The loaders made one per module (wrapping one's ``exec_module`` touches that module only).
_FILE_LOADERS = (
    importlib.machinery.SourceFileLoader,
    importlib.machinery.SourcelessFileLoader,
    importlib.machinery.ExtensionFileLoader,
)


class _Finder(importlib.abc.MetaPathFinder):
    """Times each import and patches a waiting module right after it is imported.

    The spec comes from the finders after this one, as the import system would get it;
    where its loader is a file loader (one instance per module), that instance's
    ``exec_module`` is wrapped: the import is timed (the outermost of nested imports, per
    thread) and the module's probes are installed once it has run. Any other loader
    (built-in, frozen, a package's own importer) is left alone.
    """

    def __init__(self) -> None:
        self._depth = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        try:
            return self._find_spec(fullname, path, target)
        except Exception:  # the finders after this one answer again, as without it
            return None

    def _find_spec(self, fullname: str, path: Any, target: Any) -> Any:
        after = False
        for finder in list(sys.meta_path):
            if finder is self:
                after = True
                continue
            find = getattr(finder, "find_spec", None)
            if not after or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if isinstance(loader, _FILE_LOADERS):
            loader.exec_module = self._timed(loader.exec_module)  # type: ignore[method-assign,assignment]
        return spec

    def _timed(self, exec_module: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
        def exec_timed(module: ModuleType) -> None:
            depth = getattr(self._depth, "n", 0)
            self._depth.n = depth + 1
            wall, perf = time.time_ns(), time.perf_counter_ns()
            ctx = _current_context() if depth == 0 else None
            try:
                exec_module(module)
            finally:
                self._depth.n = depth
                took = time.perf_counter_ns() - perf
                if depth == 0 and took >= IMPORT_MIN_NS:
                    _imports.append((os.getpid(), wall, wall + took, module.__name__, ctx))
            if module.__name__ in _waiting:
                _patch_module(module)  # records, never raises

        return exec_timed


#: Probes of a vLLM function only some releases have: those releases (a probe whose module
#: a release lacks is never installed there; one whose module it has records "missing").
#: ``_rebind_kernels``: 0.34.0 renamed it ``_rebind_impls``, and its CPU platform no longer
#: registers kernel overrides (nothing calls it there): no probe on 0.34. The standalone
#: CPU runner (0.34.0 on, non-x86 CPUs without Triton) warms up by itself.
_ONLY_IN = {
    "vllm.triton_utils.dispatcher:_rebind_kernels": ("0.32.0", "0.33.0"),
    _STANDALONE_WARM_UP: ("0.34.0",),
}


@vllm_uses("startup", calls=(_STANDALONE_WARM_UP,), release="0.34.0")
@vllm_uses(
    "startup", calls=("vllm.triton_utils.dispatcher:_rebind_kernels",), release=("0.32.0", "0.33.0")
)
@vllm_uses("startup", calls=tuple(p.target for p in PROBES if p.target not in _ONLY_IN))
def install(
    record: Callable[[dict[str, Any]], None] | None = None,
    probes: Sequence[Probe] = PROBES,
) -> None:
    """Install the probes in this process, once (a no-op after the first call).

    ``record`` writes one marks record (:func:`.marks._write`); each probe writes
    ``{"kind": "probe", "target", "status": "installed"|"missing"}`` when its module loads.
    ``probes``: :data:`PROBES` (tests give others).
    """
    global _installed_pid, _record
    with _lock:
        if _installed_pid == os.getpid():
            return
        _installed_pid = os.getpid()
        if record is not None:
            _record = record
        _waiting.clear()
        for probe in probes:
            _waiting.setdefault(probe.module, []).append(probe)
        loaded = [m for m in _waiting if m in sys.modules]
        if not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())
        if _on_gc not in gc.callbacks:
            gc.callbacks.append(_on_gc)
    for name in loaded:
        _patch_module(sys.modules[name])
    import atexit

    atexit.register(emit_collections)  # before vLLM's own atexit shuts its provider down


# -- the garbage-collection probe ---------------------------------------------------------
#: the collection under way: (wall ns, perf ns, the current span's context or None)
_gc_start: list[Any] = []
#: finished collections not yet sent: (pid, start ns, end ns, generation, collected, context)
#: (the pid: a forked child inherits its parent's list, and must not send its entries)
_collections: list[tuple[int, int, int, int, int, Any]] = []
#: finished outermost imports not yet sent: (pid, start ns, end ns, module, context)
_imports: list[tuple[int, int, int, str, Any]] = []


def _current_context() -> Any:
    """The current span's context, or None (none, or OpenTelemetry not imported yet, or
    being imported right now)."""
    trace = sys.modules.get("opentelemetry.trace")
    try:
        ctx = trace.get_current_span().get_span_context()  # type: ignore[union-attr]
    except Exception:  # a measurement must never stop vLLM
        return None
    return ctx if ctx.is_valid else None


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    """``gc.callbacks`` entry: only timestamps here (no span, no lock)."""
    try:
        if phase == "start":
            _gc_start[:] = [time.time_ns(), time.perf_counter_ns(), _current_context()]
        elif _gc_start:
            wall, perf, ctx = _gc_start
            took = time.perf_counter_ns() - perf
            if took >= GC_MIN_NS:
                generation = int(info.get("generation", -1))
                collected = int(info.get("collected", 0))
                _collections.append((os.getpid(), wall, wall + took, generation, collected, ctx))
            _gc_start.clear()
    except Exception:  # a measurement must never stop vLLM
        pass


def emit_collections() -> int:
    """Send the garbage collections and imports timed so far as spans; returns how many.
    Each goes under the span that was current when it started (else under the
    environment's ``traceparent``)."""
    tracer = _tracer()
    if tracer is None:
        return 0
    from opentelemetry import trace

    def send(name: str, start: int, end: int, ctx: Any, attributes: dict[str, Any]) -> None:
        parent = trace.set_span_in_context(trace.NonRecordingSpan(ctx)) if ctx else _parent()
        span = tracer.start_span(name, context=parent, start_time=start, attributes=attributes)
        span.end(end_time=end)

    sent, pid = 0, os.getpid()
    while _collections:
        owner, start, end, generation, collected, ctx = _collections.pop(0)
        if owner != pid:
            continue
        send(
            GC_SPAN,
            start,
            end,
            ctx,
            {"initpipe.probe": "gc", "gc.generation": generation, "gc.collected": collected},
        )
        sent += 1
    while _imports:
        owner, start, end, module, ctx = _imports.pop(0)
        if owner != pid:
            continue
        send(IMPORT_SPAN + module, start, end, ctx, {"initpipe.probe": "import"})
        sent += 1
    return sent
