"""Suite-wide: every file the suite (and what it starts) writes stays in pytest's own
temporary folders; the modules that start engines run first.

CI runs the suite as root on a shared machine: a test that writes outside its temporary
folder can damage the machine (``initpipe graph -o /dev/null`` once replaced the null
device). For the whole session, ``TMPDIR`` (and Python's cached ``tempfile.tempdir``) and
``XDG_RUNTIME_DIR`` point into pytest's base temporary folder, so temporary files of vLLM,
torch and Chromium, and initpipe's private failure-trace folder, land there too —
including in the subprocesses tests start, which inherit the environment.
``INITPIPE_CACHE_DIR`` (the real model's conversion) is one folder all workers share:
``make test``'s ``INITPIPE_TEST_CACHE_DIR`` (``.cache/test-model`` in the checkout, converted
once before its tiers), else a folder of the run.

``make test`` runs the modules in two worker processes (pytest-xdist, ``--dist loadfile
--no-loadscope-reorder``: a module stays in one worker, so its engines start once, and the
workers take modules in collection order). :data:`SLOW_FIRST` moves the long modules to the
front, so neither worker is left with a long module at the end while the other idles
(``tests/module_order.py``).
"""

from __future__ import annotations

import gc
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from module_order import LISTED_MODULE_S, SLOW_FIRST, module_seconds
from release_tier import (
    EVERY_MRV2,
    V1_ONLY,
    mrv2_tier_only,
    names,
    parametrized_with,
    proofs,
    skips_mrv2_tier_only,
)

from initpipe_vllm.compat import v1_runner_installed

#: The suite's ``sitecustomize`` for the processes its tests start (see the fixture below).
#: Where ``make test`` converted the real model for all its tiers (unset: each run converts it
#: into its own temporary folder).
TEST_CACHE_VAR = "INITPIPE_TEST_CACHE_DIR"
SITE = Path(__file__).with_name("subprocess_site")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "proof: a proof against stock vLLM that every supported release passes "
        "(tests/release_tier.py; run on the 0.33.0 and 0.34.0 devices by make test-release)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the :data:`RELEASE_PROOFS` ``proof``; put the :data:`SLOW_FIRST` modules first,
    in that order (a stable sort: the order within a module, and of the other modules, is
    kept)."""
    has_v1 = v1_runner_installed()
    tier = proofs(has_v1)
    skip_slow_mrv2 = has_v1 and skips_mrv2_tier_only()
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        slow_mrv2 = mrv2_tier_only(item.nodeid, params)
        if any(names(item.nodeid, p) for p in tier) or (slow_mrv2 and not has_v1):
            item.add_marker(pytest.mark.proof)
        if not has_v1 and _runs_v1(item):
            item.add_marker(
                pytest.mark.skip(reason="this vLLM has no Model Runner V1 (0.34.0 removed it)")
            )
        if slow_mrv2 and skip_slow_mrv2:
            item.add_marker(
                pytest.mark.skip(
                    reason="Model Runner V2's slow proofs run on the 0.34.0 tier (make "
                    f"test-release; release_tier.MRV2_TIER_ONLY); {EVERY_MRV2}=1 runs them here"
                )
            )
    rank = {module: i for i, module in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def _runs_v1(item: pytest.Item) -> bool:
    """Whether ``item`` runs Model Runner V1: parametrized ``"v1"`` (alone or in a tuple),
    or one of the v1-only tests (:data:`release_tier.V1_ONLY`)."""
    if any(names(item.nodeid, p) for p in V1_ONLY):
        return True
    return parametrized_with(getattr(getattr(item, "callspec", None), "params", {}), "v1")


def shared_tmp(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A folder of this pytest run that every xdist worker shares (the base temporary
    folder's parent holds one folder per worker), so a worker reuses what another built."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = root / name
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session", autouse=True)
def _writes_stay_in_pytest_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    runtime = tmp_path_factory.mktemp("xdg_runtime")
    runtime.chmod(0o700)
    tmp = tmp_path_factory.mktemp("tmp")
    keys = ("TMPDIR", "XDG_RUNTIME_DIR", "INITPIPE_CACHE_DIR")
    saved = {k: os.environ.get(k) for k in keys}
    saved_tempdir = tempfile.tempdir
    os.environ["TMPDIR"] = str(tmp)
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    # the real model's conversion (initpipe_vllm.real_model): once per run, for every worker;
    # `make test` converts it once for all its tiers (INITPIPE_TEST_CACHE_DIR, in the checkout)
    os.environ["INITPIPE_CACHE_DIR"] = os.environ.get(TEST_CACHE_VAR) or str(
        shared_tmp(tmp_path_factory, "initpipe-cache")
    )
    tempfile.tempdir = str(tmp)
    try:
        yield
    finally:
        tempfile.tempdir = saved_tempdir
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _freeze_survivors(phase: str, info: dict[str, int]) -> None:
    """A ``gc.callbacks`` entry: after each full collection, freeze what survived it."""
    if phase == "stop" and info["generation"] == 2:
        gc.freeze()


@pytest.fixture(scope="session", autouse=True)
def _gc_freezes_survivors() -> Iterator[None]:
    """After each full garbage collection, the survivors are frozen (``gc.freeze()``, as
    vLLM itself does once an engine is up), in this pytest process and in every Python
    process a test starts (``tests/subprocess_site/sitecustomize.py``, first on their
    ``PYTHONPATH``). A process that imported vLLM tracks about 700,000 objects; each full
    collection walked them all (0.35 s), and vLLM collects explicitly about ten times per
    engine start and stop: the collector took 106 of the 123 s of the in-process runner
    tests, and 13 of the 44 s of a refit script. Only cyclic garbage waits longer: each
    module's teardown unfreezes and collects (:func:`_module_garbage_collected`).
    ``INITPIPE_TEST_GC_FREEZE=0`` turns it off."""
    if os.environ.get("INITPIPE_TEST_GC_FREEZE") == "0":
        yield
        return
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), saved) if p)
    gc.callbacks.append(_freeze_survivors)
    try:
        yield
    finally:
        gc.callbacks.remove(_freeze_survivors)
        gc.unfreeze()
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


@pytest.fixture(scope="module", autouse=True)
def _module_garbage_collected(_gc_freezes_survivors: None) -> Iterator[None]:
    """The cyclic garbage a module's tests left behind is freed when the module ends:
    frozen objects that became unreachable are collected (the survivors frozen again)."""
    yield
    gc.unfreeze()
    gc.collect()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """List the slowest modules (by which to keep :data:`SLOW_FIRST` in step), then the
    README's and docs' examples the suite does not run, and why (each says so on the line
    before its fence; tests/test_docs_examples.py runs the others)."""
    from doc_blocks import blocks

    reports = (r for kind in terminalreporter.stats.values() for r in kind)
    slow = {m: s for m, s in module_seconds(reports).items() if s >= LISTED_MODULE_S}
    if slow:
        terminalreporter.section("slowest modules (seconds of one worker; module_order.SLOW_FIRST)")
        for module, seconds in slow.items():
            first = "" if module in SLOW_FIRST else "  (not in SLOW_FIRST)"
            terminalreporter.write_line(f"{seconds:8.1f}  {module}{first}")

    shown = [b for b in blocks() if b.marker is not None]
    if not shown:
        return
    terminalreporter.section("documentation examples not run by test_docs_examples.py")
    for b in shown:
        terminalreporter.write_line(f"{b.where} ({b.lang}) {b.marker[0]}: {b.marker[1]}")
