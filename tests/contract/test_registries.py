"""No registry of the contract can forget: the declaring modules are found, not listed,
every stage the package defines is in a catalog the contract reads, and declarations are
scoped by release, so one release's variant cannot break another release's lock.

The package is walked (every module imported) in a fresh interpreter where importing vLLM
or torch fails: the walk itself proves "read, never imported" for every module.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from unimported import run_unimported

from initpipe_vllm.contract import declare, lock
from initpipe_vllm.contract.declare import Use
from initpipe_vllm.contract.source import open_source

_WALK = """
import importlib, pkgutil
import initpipe_vllm
from initpipe import get_spec
from initpipe_vllm.contract import declare

names = ["initpipe_vllm"] + [
    m.name for m in pkgutil.walk_packages(initpipe_vllm.__path__, "initpipe_vllm.")
]
declaring, stages = set(), set()
for name in names:
    module = importlib.import_module(name)
    declaring.update(f.__module__ for f in declare._functions(module))
    for value in vars(module).values():
        spec = get_spec(value)
        if spec is not None and spec.func.__module__ == name:
            stages.add(f"{name}:{spec.func.__qualname__}")
cataloged = {
    f"{spec.func.__module__}:{spec.func.__qualname__}"
    for cap, factories in declare.STAGE_CATALOGS.items()
    for factory in factories
    for release in declare.releases()
    if cap not in declare.absent_capabilities(release)
    for spec in declare._pipeline(factory, release).specs.values()
}
result = {
    "modules": len(names),
    "declaring": sorted(declaring),
    "discovered": list(declare.use_modules()),
    "stages": sorted(stages),
    "cataloged": sorted(cataloged),
}
"""


@pytest.fixture(scope="module")
def walked() -> dict[str, Any]:
    return run_unimported(_WALK)  # type: ignore[no-any-return]


def test_every_module_that_declares_is_found(walked: dict[str, Any]) -> None:
    declaring, found = set(walked["declaring"]), set(walked["discovered"])
    assert sorted(declaring - found) == [], (
        "these modules declare with @vllm_uses but use_modules() does not find them, so "
        f"nothing they declare is fingerprinted: {sorted(declaring - found)}"
    )
    assert sorted(found - declaring) == [], (
        f"use_modules() finds modules whose declarations are never collected "
        f"(a vllm_uses call not at module or class level?): {sorted(found - declaring)}"
    )
    assert walked["modules"] > 50 and len(declaring) >= 13  # the walk saw the package


def test_every_stage_the_package_defines_is_in_a_catalog(walked: dict[str, Any]) -> None:
    orphans = sorted(set(walked["stages"]) - set(walked["cataloged"]))
    assert orphans == [], (
        f"stages in no pipeline of STAGE_CATALOGS (never run, never fingerprinted): {orphans}; "
        "add each to its catalog's STAGES"
    )
    assert len(walked["stages"]) > 50


def test_the_old_name_still_answers() -> None:
    assert declare.USE_MODULES == declare.use_modules()
    assert "initpipe_vllm.hook.worker" in declare.USE_MODULES


# -- declarations per release ---------------------------------------------------------------
BASE = "initpipe_vllm.compat:plan_kv_cache_configs"
VARIANT = "initpipe_vllm.releases.v0_33_0:plan_kv_cache_configs"


@pytest.fixture
def two_releases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(declare, "releases", lambda: ("0.32.0", "0.33.0"))


def _uses() -> list[Use]:
    return [
        Use("vllm.a:plan", "calls", ("plan",), BASE),
        Use("vllm.a:other", "calls", ("plan",), "initpipe_vllm.x:other"),
        Use("vllm.b:planning", "calls", ("plan",), VARIANT, "0.33.0", (BASE,)),
    ]


def test_a_release_variant_replaces_the_base_declaration_in_its_release_only(
    two_releases: None,
) -> None:
    base, other, variant = _uses()
    assert declare._scoped(_uses(), "0.32.0") == [base, other]
    assert declare._scoped(_uses(), "0.33.0") == [other, variant]


def test_a_lock_is_built_from_its_release_s_declarations(
    two_releases: None, make_tree: Callable[..., Path]
) -> None:
    # a 0.32-like tree: the variant's vLLM name does not exist there
    source = open_source(
        make_tree({"vllm/a.py": "def plan(x):\n    pass\n\ndef other():\n    pass\n"})
    )
    with pytest.raises(lock.LockError, match=r"vllm\.b:planning"):
        lock.build(source, _uses())  # all releases' declarations at once: today's failure
    built = lock.build(source, declare._scoped(_uses(), "0.32.0"))
    assert sorted(built.entries) == ["calls vllm.a:other", "calls vllm.a:plan"]


def test_a_declaration_for_an_unknown_release_is_refused_by_name() -> None:
    uses = [Use("vllm.b:planning", "calls", ("plan",), VARIANT, "0.99.0", ())]
    with pytest.raises(ValueError, match=r"v0_33_0:plan_kv_cache_configs \(release='0.99.0'\)"):
        declare._scoped(uses, "0.32.0")


def test_replacing_nothing_is_refused_by_name(two_releases: None) -> None:
    uses = [Use("vllm.b:planning", "calls", ("plan",), VARIANT, "0.33.0", ("m:gone",))]
    with pytest.raises(ValueError, match=r"m:gone \(replaced by .*v0_33_0"):
        declare._scoped(uses, "0.33.0")


def test_vllm_uses_records_the_release_and_refuses_a_base_replacing() -> None:
    @declare.vllm_uses("plan", calls=("vllm.b:planning",), release="0.32.0", replaces=(BASE,))
    def variant() -> None: ...

    (use,) = declare._uses_of(variant)
    assert (use.release, use.replaces) == ("0.32.0", (BASE,))
    with pytest.raises(ValueError, match="needs release="):
        declare.vllm_uses("plan", calls=("vllm.b:planning",), replaces=(BASE,))
    with pytest.raises(ValueError, match="module:qualname"):
        declare.vllm_uses("plan", calls=("vllm.b:planning",), release="0.32.0", replaces=("x",))


def test_the_doctor_writes_a_lock_from_the_source_s_release(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from initpipe_vllm.tools import doctor

    asked: list[Any] = []

    def fake(capability: Any = None, *, release: Any = None) -> tuple[Use, ...]:
        asked.append(release)
        return ()

    monkeypatch.setattr(declare, "declarations", fake)
    assert doctor.main(["--write-lock", str(tmp_path)]) == 0
    assert asked == [open_source(None).version]
