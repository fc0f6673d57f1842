"""initpipe's stages as OpenTelemetry spans, when vLLM's tracing is on.

What belongs here: turning a pipelined runner's trace records (stage runs and teardowns)
into spans once each phase has ended (:func:`emit`), and nothing else. The adapters call it
where a phase ends — the summary line (:func:`.progress.log_phase`), a failure report, a
KV teardown — so the span of the vLLM step running the phase (``Allocate KV cache``,
``Load model``...) is still the current span: the stage spans become its children. Where
no span is current (the v1 model phase runs in ``get_kv_cache_spec``, which vLLM does not
instrument), one phase span of initpipe's own (``initpipe <phase> phase``) holds them,
parented like vLLM's own spans from the ``traceparent`` in the environment.

Span: name the stage's (``"<stage> (teardown)"`` for a teardown), the stage's own start and
end (the trace's ``perf_counter`` times on the wall clock as it reads at :func:`emit`),
attributes ``initpipe.phase``, ``initpipe.stage``, ``initpipe.kind`` (stage/teardown),
``initpipe.rank``, ``initpipe.generation``, ``initpipe.outcome``; a failed stage has status
ERROR and an ``exception`` event (type, message). Instrumentation scope: ``initpipe``.

"Tracing on" means an SDK ``TracerProvider`` is installed in the process (vLLM installs one
when ``otlp_traces_endpoint`` is set; ``@instrument`` alone wraps functions whenever
OpenTelemetry imports). Off, :func:`emit` costs one dictionary lookup and moves its cursor:
OpenTelemetry is not even imported.
"""

from __future__ import annotations

import os
import sys
import time
import weakref
from typing import Any

__all__ = ["SCOPE", "emit", "tracing_on"]

#: The instrumentation scope of initpipe's spans (``report`` tells them from vLLM's by it).
SCOPE = "initpipe"
_SDK = "opentelemetry.sdk.trace"
#: Per trace: the perf_counter start of the last record already emitted (or skipped).
_CURSORS: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def tracing_on(provider: Any = None) -> bool:
    """True when an OpenTelemetry SDK tracer provider is installed in this process (or
    ``provider`` is one)."""
    if _SDK not in sys.modules:  # no SDK imported: no provider can be installed
        return False
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    return isinstance(provider or trace.get_tracer_provider(), TracerProvider)


def _new_records(trace: Any) -> list[tuple[Any, ...]]:
    """The trace's records after the cursor (stage runs and teardowns; host spans are
    vLLM's own steps, which vLLM traces itself), and the cursor moved past them."""
    records = trace._records
    if not records:
        return []
    last = _CURSORS.get(trace, float("-inf"))
    new = []
    for raw in reversed(records):
        if raw[3] <= last:
            break
        new.append(raw)
    _CURSORS[trace] = max(last, records[-1][3])
    new.reverse()
    return [r for r in new if r[2] != "span"]


def emit(trace: Any, phase: str, rank: int | None = None, provider: Any = None) -> int:
    """Emit the records added to ``trace`` (a run's :class:`initpipe.Trace`) since the last
    call as spans (see the module doc); returns how many. With tracing off, only the cursor
    moves (nothing is imported). ``provider``: a tracer provider to use instead of the
    process's (tests)."""
    if not tracing_on(provider):
        if trace._records:
            _CURSORS[trace] = trace._records[-1][3]
        return 0
    records = _new_records(trace)
    if not records:
        return 0
    from opentelemetry import trace as otel
    from opentelemetry.propagate import extract
    from opentelemetry.trace import Status, StatusCode

    tracer = otel.get_tracer(SCOPE, tracer_provider=provider)
    if hasattr(tracer, "id_generator"):  # the SDK's Tracer
        tracer.id_generator = _os_random_ids()
    # perf_counter onto the wall clock as it reads now, just after the phase, like the
    # wall-clock start vLLM's spans read: not the trace's creation-time origin, which a
    # step of the wall clock since then (NTP, a VM's clock sync) would leave milliseconds
    # off the spans around them (seen: a stage 5 ms before its parent span began).
    offset = time.time() - time.perf_counter()

    def ns(perf: float) -> int:
        return int((perf + offset) * 1e9)

    base: dict[str, Any] = {"initpipe.rank": rank if rank is not None else 0}
    ctx = None
    phase_span = None
    if not otel.get_current_span().get_span_context().is_valid:
        carrier = {k.lower(): v for k, v in os.environ.items() if k.lower() in _HEADERS}
        phase_span = tracer.start_span(
            f"initpipe {phase} phase",
            context=extract(carrier) if carrier else None,
            start_time=ns(records[0][3]),
            attributes={**base, "initpipe.phase": phase},
        )
        ctx = otel.set_span_in_context(phase_span)
    end = records[0][3]
    for name, rec_phase, kind, start, duration, outcome, generation, error in records:
        span = tracer.start_span(
            name if kind == "stage" else f"{name} (teardown)",
            context=ctx,
            start_time=ns(start),
            attributes={
                **base,
                "initpipe.phase": rec_phase,
                "initpipe.stage": name,
                "initpipe.kind": kind,
                "initpipe.generation": generation,
                "initpipe.outcome": outcome,
            },
        )
        if outcome == "error":
            kind_name, _, message = (error or "").partition(": ")
            span.add_event("exception", {"exception.type": kind_name, "exception.message": message})
            span.set_status(Status(StatusCode.ERROR, error or ""))
        span.end(end_time=ns(start + duration))
        end = max(end, start + duration)
    if phase_span is not None:
        if any(r[5] == "error" for r in records):
            phase_span.set_status(Status(StatusCode.ERROR, "a stage failed"))
        phase_span.end(end_time=ns(end))
    return len(records)


def _os_random_ids() -> Any:
    """Span and trace ids from ``os.urandom``. The SDK's default generator draws them from
    the global ``random`` module, which vLLM re-seeds (``seed=0`` at worker start): spans
    made after each re-seed get the same ids again (seen: a worker's ``Loading (CPU)`` and
    a later span with one id), which breaks the tree. initpipe's spans never draw there."""
    from opentelemetry.sdk.trace.id_generator import IdGenerator

    class OsRandomIds(IdGenerator):
        def generate_span_id(self) -> int:
            return int.from_bytes(os.urandom(8), "big") or 1

        def generate_trace_id(self) -> int:
            return int.from_bytes(os.urandom(16), "big") or 1

    global _IDS
    if _IDS is None:
        _IDS = OsRandomIds()
    return _IDS


_IDS: Any = None

#: W3C trace-context keys vLLM propagates to child processes through the environment.
_HEADERS = ("traceparent", "tracestate")
