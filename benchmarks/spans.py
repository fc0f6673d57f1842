"""What initpipe's stage spans cost: a KV phase of 25 trivial stages re-run (phase + its
teardown), with the span emission the adapters do (``initpipe_vllm.hook.spans.emit`` after
the phase and after the teardown) against none, tracing off and on, side by side.

- off: no SDK tracer provider in the process (the default; vLLM installs one only with
  ``otlp_traces_endpoint``): ``emit`` moves a cursor. Target: ratio <= 1.01.
- on: an SDK provider with a ``BatchSpanProcessor`` (as vLLM sets up) to an exporter that
  drops the spans: the cost per stage span, reported.

Standalone: ``python benchmarks/spans.py``; ``python -m benchmarks --only spans``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import Row, alternate, mm

STAGES = 25
MAX_OFF_RATIO = 1.01


def _pipeline() -> Any:
    from initpipe import KV, Pipeline, stage

    def make(i: int) -> Any:
        def body(kv_cache_config: int) -> int:
            return kv_cache_config + i

        body.__name__ = body.__qualname__ = f"s{i}"
        return stage(body, needs=KV, provides=f"out{i}", teardown=lambda out: None)

    return Pipeline(
        [make(i) for i in range(STAGES)],
        start_inputs=(),
        model_inputs=(),
        kv_inputs=("kv_cache_config",),
    )


def run(smoke: bool = False) -> list[Row]:
    """Rows for the benchmark runner (``python -m benchmarks``)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from initpipe_vllm.hook import spans

    class Drop(SpanExporter):
        def export(self, batch: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    pipeline = _pipeline()
    runs = {k: pipeline.start() for k in ("bare", "off", "on")}
    for r in runs.values():
        r.load()

    def cycle(r: Any, emit: Any) -> None:
        r.initialize_kv_cache(1)
        emit(r.trace)
        r.teardown_kv_cache()
        emit(r.trace)

    fns = {
        "bare": lambda: cycle(runs["bare"], lambda t: None),
        "off": lambda: cycle(runs["off"], lambda t: spans.emit(t, "kv_cache_config")),
        "on": lambda: cycle(runs["on"], lambda t: spans.emit(t, "kv_cache_config", None, provider)),
    }
    samples = alternate(fns, repeats=3 if smoke else 15, number=20 if smoke else 200)
    provider.shutdown()
    bare, off, on = (mm(samples[k]) for k in ("bare", "off", "on"))
    ratio = off[1] / bare[1]
    per_span = (on[1] - bare[1]) / (2 * STAGES) * 1e6
    return [
        Row(
            bench="spans",
            name=f"KV phase + teardown ({STAGES} stages), stage spans, tracing off / none",
            value=ratio,
            unit="x",
            target=f"<= {MAX_OFF_RATIO}",
            met=ratio <= MAX_OFF_RATIO,
            detail=f"median {off[1] * 1e6:.0f} vs {bare[1] * 1e6:.0f} µs per re-init",
        ),
        Row(
            bench="spans",
            name="cost per stage span, tracing on (SDK, batch processor)",
            value=per_span,
            unit="µs",
            detail=f"re-init {on[1] * 1e6:.0f} vs {bare[1] * 1e6:.0f} µs, {2 * STAGES} spans",
        ),
    ]


if __name__ == "__main__":
    for row in run():
        print(f"{row.name}: {row.value:.3f} {row.unit} {row.detail}")
