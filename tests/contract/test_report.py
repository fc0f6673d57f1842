"""The comparison's statuses and verdicts on small synthetic trees: a lock built from one
tree, read against edited copies (moved, near-equal move, ambiguous, missing, unknown,
a name the lock does not record, several locks)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from initpipe_vllm.contract.declare import Use
from initpipe_vllm.contract.lock import build
from initpipe_vllm.contract.report import compare
from initpipe_vllm.contract.source import open_source

MakeTree = Callable[..., Path]

RUN = "def run(a, b=1):\n    x = a + b\n    y = x * 2\n    z = y - 1\n    w = z + x\n    return w\n"
BASE = {"vllm/a.py": RUN, "vllm/b.py": "def other():\n    return 0\n"}
USES = (
    Use("vllm.a:run", "mirrors", ("catalog_v1",), "initpipe_vllm:s1"),
    Use("vllm.b:other", "calls", ("serve",), "initpipe_vllm.serve.routes:f"),
)


def _statuses(make_tree: MakeTree, files: dict[str, str], uses=USES) -> dict[str, tuple]:
    lock = build(open_source(make_tree(BASE)), USES)
    report = compare(open_source(make_tree(files)), uses, [lock])
    return {
        "functions": {e.name: (e.status, e.moved_to) for e in report.functions},
        "capabilities": dict(report.capabilities),
    }


def test_identical_tree_is_ok(make_tree: MakeTree) -> None:
    got = _statuses(make_tree, BASE)
    assert got["functions"] == {"vllm.a:run": ("identical", ()), "vllm.b:other": ("identical", ())}
    assert got["capabilities"] == {"catalog_v1": "ok", "serve": "ok"}


def test_a_function_moved_as_is_or_nearly(make_tree: MakeTree) -> None:
    moved = {"vllm/a.py": "", "vllm/c.py": RUN, "vllm/b.py": BASE["vllm/b.py"]}
    got = _statuses(make_tree, moved)
    assert got["functions"]["vllm.a:run"] == ("moved", ("vllm.c:run",))
    assert got["capabilities"] == {"catalog_v1": "broken", "serve": "ok"}
    near = {**moved, "vllm/c.py": RUN.replace("z = y - 1", "z = y - 2")}  # 4 of 5 statements
    assert _statuses(make_tree, near)["functions"]["vllm.a:run"] == ("moved", ("vllm.c:run",))


def test_several_candidates_are_ambiguous_and_none_alike_is_missing(make_tree: MakeTree) -> None:
    two = {"vllm/a.py": "", "vllm/c.py": RUN, "vllm/d.py": RUN, "vllm/b.py": BASE["vllm/b.py"]}
    status, where = _statuses(make_tree, two)["functions"]["vllm.a:run"]
    assert (status, where) == ("ambiguous", ("vllm.c:run", "vllm.d:run"))
    unlike = {**two, "vllm/c.py": "def run():\n    return 5\n", "vllm/d.py": ""}
    assert _statuses(make_tree, unlike)["functions"]["vllm.a:run"] == (
        "missing",
        ("vllm.c:run",),
    )
    gone = {"vllm/a.py": "", "vllm/b.py": BASE["vllm/b.py"]}
    assert _statuses(make_tree, gone)["functions"]["vllm.a:run"] == ("missing", ())


def test_unknown_and_unlocked_names_are_not_ok(make_tree: MakeTree) -> None:
    lazy = {**BASE, "vllm/b.py": "def __getattr__(name):\n    return 0\n"}
    got = _statuses(make_tree, lazy)
    assert got["functions"]["vllm.b:other"] == ("unknown", ())
    assert got["capabilities"]["serve"] == "broken"
    extra = (*USES, Use("vllm.b:other", "mirrors", ("serve",), "x:y"))
    got = _statuses(make_tree, BASE, extra)
    assert got["capabilities"]["serve"] == "broken"  # declared since the lock was written


def test_a_capability_is_ok_against_another_locked_release(make_tree: MakeTree) -> None:
    old = build(open_source(make_tree(BASE)), USES)
    new_files = {**BASE, "vllm/a.py": RUN.replace("return w", "return w + 1")}
    new = build(open_source(make_tree(new_files)), USES)
    report = compare(open_source(make_tree(new_files)), USES, [old, new])
    assert report.capabilities == {"catalog_v1": "ok", "serve": "ok"}
    assert set(report.matched) == {"catalog_v1", "serve"}


def test_a_capability_of_a_runner_the_release_lacks_is_absent_not_broken(
    make_tree: MakeTree, monkeypatch
) -> None:
    """A release without Model Runner V1 (as 0.34.0; here a stand-in release module): its
    declarations have no v1 catalog, so against its lock the v1 catalog is ``absent`` (the
    doctor's verdict stays ok) where the vLLM read has no v1 runner class either; a vLLM
    that still has one gets ``broken`` (no lock matches its v1 code); and against a release
    that has v1, the deleted runner's function is ``missing``: broken."""
    import sys
    import types

    import attrs

    from initpipe_vllm import releases
    from initpipe_vllm.contract import report as report_module
    from initpipe_vllm.tools.doctor import render

    module = types.ModuleType("initpipe_vllm.releases.v99_1_0")
    module.RELEASE, module.RUNNERS, module.OVERLAYS = "99.1.0", ("mrv2",), ()
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(releases, "RELEASES", (*releases.RELEASES, "99.1.0"))
    files = {**BASE, "vllm/a.py": "def gone():\n    return 1\n"}  # v1's function deleted
    theirs = USES[1:]  # the release's own declarations: nothing of catalog_v1
    lock = attrs.evolve(build(open_source(make_tree(files)), theirs), version="99.1.0")
    monkeypatch.setattr(
        report_module, "declarations", lambda release=None: USES if release is None else theirs
    )
    got = compare(open_source(make_tree(files)), None, [lock])
    assert got.capabilities == {"catalog_v1": "absent", "serve": "ok"}
    assert got.ok
    text = render(got)
    assert "[catalog_v1]: absent: vLLM" in text and "has no Model Runner V1" in text
    assert text.endswith("verdict: all ok")
    # the same lock, read against a vLLM that still has v1's runner class
    runner = "vllm/v1/worker/gpu_model_runner.py"
    kept = {**files, runner: "class GPUModelRunner:\n    def load_model(self):\n        pass\n"}
    mixed = compare(open_source(make_tree(kept)), None, [lock])
    assert mixed.capabilities == {"catalog_v1": "broken", "serve": "ok"}
    assert not mixed.ok
    old = build(open_source(make_tree(BASE)), USES)
    monkeypatch.setattr(report_module, "declarations", lambda release=None: USES)
    assert compare(open_source(make_tree(files)), None, [old]).capabilities == {
        "catalog_v1": "broken",
        "serve": "ok",
    }
