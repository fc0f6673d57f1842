"""``contract.variants.by_release``: a call runs the variant of the release the contract
matched for its capability, else the base; the declarations stay visible to the contract."""

from __future__ import annotations

import sys

import pytest

from initpipe_vllm.contract import declare, report
from initpipe_vllm.contract.declare import vllm_uses
from initpipe_vllm.contract.variants import Released, by_release


@by_release("plan")
@vllm_uses("plan", calls=("vllm.v1.core.kv_cache_utils:get_kv_cache_configs",))
def planned(x: int) -> str:
    return f"base {x}"


@planned.variant("0.33.0")
def _planned_0_33_0(x: int) -> str:
    return f"0.33 {x}"


def _matched(monkeypatch: pytest.MonkeyPatch, release: str) -> list[str]:
    asked: list[str] = []

    def installed_release(capability: str) -> str:
        asked.append(capability)
        return release

    monkeypatch.setattr(report, "installed_release", installed_release)
    return asked


@pytest.mark.parametrize(("release", "runs"), [("0.32.0", "base 1"), ("0.33.0", "0.33 1")])
def test_a_call_runs_the_matched_releases_variant(
    monkeypatch: pytest.MonkeyPatch, release: str, runs: str
) -> None:
    asked = _matched(monkeypatch, release)
    assert planned(1) == runs
    assert asked == ["plan"]  # the capability the base named, asked at each call


def test_a_refusal_of_the_contract_reaches_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(capability: str) -> str:
        raise report.UnsupportedRunnerError(f"{capability}: no lock matches")

    monkeypatch.setattr(report, "installed_release", refuse)
    with pytest.raises(report.UnsupportedRunnerError, match="plan: no lock matches"):
        planned(1)


def test_the_base_keeps_its_name_and_declarations() -> None:
    assert isinstance(planned, Released)
    assert (planned.__name__, planned.__module__) == ("planned", __name__)
    assert planned.for_release("0.32.0") is planned.base
    assert planned.for_release("0.33.0") is _planned_0_33_0
    # the contract finds the base's declaration where it finds a plain function's
    assert planned in declare._functions(sys.modules[__name__])
    (use,) = declare._uses_of(planned)
    assert (use.affects, use.release) == (f"{__name__}:planned", None)


def test_a_second_variant_for_one_release_is_refused() -> None:
    with pytest.raises(ValueError, match=r"planned already has a variant for vLLM 0\.33\.0"):
        planned.variant("0.33.0")(lambda x: "again")


def test_as_a_method_it_binds_like_the_function(monkeypatch: pytest.MonkeyPatch) -> None:
    class Host:
        @by_release("resize")
        def who(self, x: int) -> tuple[object, int]:
            return (self, x)

    _matched(monkeypatch, "0.32.0")
    host = Host()
    assert host.who(2) == (host, 2)
