"""initpipe's stages as OpenTelemetry spans (``initpipe_vllm.hook.spans``), on a toy
pipeline and an SDK tracer provider with an in-memory exporter passed explicitly (the
process's global provider is never set: other tests in this worker must see tracing off).
The real engine's spans are checked in ``tests/vllm/test_stage_spans.py``."""

from __future__ import annotations

from typing import Any

import pytest
from requires import missing

from initpipe import KV, MODEL, Pipeline, StageError, stage
from initpipe_vllm.hook import spans

try:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        InMemorySpanExporter,
    )
except ImportError as err:
    missing(f"the OpenTelemetry SDK cannot be imported ({err}); the dev extra brings it")


@stage(needs=MODEL)
def shape(width: int) -> int:
    return width * 2


def _undo(out: Any) -> None:
    pass


@stage(needs=KV, teardown=_undo)
def blocks(kv_cache_config: int, shape: int) -> int:
    return kv_cache_config * shape


@stage(needs=KV)
def fails(blocks: int) -> int:
    raise OSError(f"disk on fire at {blocks}")


@pytest.fixture
def provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp, exporter


def _run(*stages: Any) -> Any:
    pipeline = Pipeline(
        stages, start_inputs=(), model_inputs=("width",), kv_inputs=("kv_cache_config",)
    )
    return pipeline.start()


def test_a_phase_under_no_span_gets_a_phase_span_holding_its_stages(provider: Any) -> None:
    tp, exporter = provider
    run = _run(shape, blocks)
    run.load(width=3)
    assert spans.emit(run.trace, MODEL, None, tp) == 1
    got = {s.name: s for s in exporter.get_finished_spans()}
    assert set(got) == {"initpipe model phase", "shape"}
    phase, stage_span = got["initpipe model phase"], got["shape"]
    assert stage_span.parent is not None and stage_span.parent.span_id == phase.context.span_id
    assert phase.start_time <= stage_span.start_time <= stage_span.end_time <= phase.end_time
    assert dict(stage_span.attributes) == {
        "initpipe.rank": 0,
        "initpipe.phase": MODEL,
        "initpipe.stage": "shape",
        "initpipe.kind": "stage",
        "initpipe.generation": 0,
        "initpipe.outcome": "ok",
    }
    assert stage_span.instrumentation_scope.name == spans.SCOPE
    assert spans.emit(run.trace, MODEL, None, tp) == 0  # emitted once


def test_under_a_current_span_the_stages_are_its_children(provider: Any) -> None:
    tp, exporter = provider
    run = _run(shape, blocks)
    run.load(width=3)
    with tp.get_tracer("vllm.test").start_as_current_span("Allocate KV cache") as parent:
        run.initialize_kv_cache(2)
        assert spans.emit(run.trace, KV, 1, tp) == 2  # the model phase's too: never sent
    got = {s.name: s for s in exporter.get_finished_spans()}
    assert "initpipe kv_cache_config phase" not in got
    for name in ("shape", "blocks"):
        assert got[name].parent.span_id == parent.get_span_context().span_id
        assert got[name].attributes["initpipe.rank"] == 1
    run.teardown_kv_cache()
    assert spans.emit(run.trace, KV, 1, tp) == 1
    (td,) = [s for s in exporter.get_finished_spans() if s.name == "blocks (teardown)"]
    assert td.attributes["initpipe.kind"] == "teardown"


def test_a_failed_stage_is_an_error_span_with_the_exception(provider: Any) -> None:
    tp, exporter = provider
    run = _run(shape, blocks, fails)
    run.load(width=3)
    with pytest.raises(StageError):
        run.initialize_kv_cache(2)
    spans.emit(run.trace, KV, None, tp)
    got = {s.name: s for s in exporter.get_finished_spans()}
    failed = got["fails"]
    assert failed.status.status_code.name == "ERROR"
    assert "disk on fire at 12" in (failed.status.description or "")
    (event,) = failed.events
    assert event.name == "exception"
    assert dict(event.attributes) == {
        "exception.type": "OSError",
        "exception.message": "disk on fire at 12",
    }
    assert got["blocks (teardown)"].attributes["initpipe.outcome"] == "ok"  # rolled back
    assert got["initpipe kv_cache_config phase"].status.status_code.name == "ERROR"


def test_with_tracing_off_nothing_is_emitted() -> None:
    from opentelemetry import trace

    assert not isinstance(trace.get_tracer_provider(), TracerProvider)  # no global SDK one
    run = _run(shape)
    run.load(width=1)
    assert not spans.tracing_on()
    assert spans.emit(run.trace, MODEL) == 0


def test_spans_sit_on_the_wall_clock_as_it_reads_after_the_phase(provider: Any) -> None:
    """A step of the wall clock between the trace's start and the phase (NTP, a VM's
    clock sync) does not move the stage spans off the spans around them, which read the
    wall clock as they start."""
    import time

    tp, exporter = provider
    run = _run(shape, blocks)
    run.trace.wall_origin -= 5.0  # the wall clock as if it stepped 5 s since the trace began
    before = time.time_ns()
    run.load(width=3)
    spans.emit(run.trace, MODEL, None, tp)
    after = time.time_ns()
    (stage_span,) = [s for s in exporter.get_finished_spans() if s.name == "shape"]
    assert before - 1_000_000 <= stage_span.start_time <= stage_span.end_time <= after + 1_000_000
