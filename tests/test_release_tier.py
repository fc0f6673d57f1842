"""The release tier (``make test-release``): every entry of ``RELEASE_PROOFS`` names a test
that exists, so a renamed test or parameter cannot drop a proof from the tier silently."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from release_tier import RELEASE_PROOFS, names

ROOT = Path(__file__).resolve().parents[1]


def _collected(*args: str) -> list[str]:
    """The node ids ``pytest --collect-only`` lists with ``args``."""
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return [line for line in res.stdout.splitlines() if "::" in line]


def test_every_release_proof_names_a_collected_test() -> None:
    marked = _collected("-m", "proof")
    assert len(set(marked)) == len(marked) > len(RELEASE_PROOFS)
    unmatched = [p for p in RELEASE_PROOFS if not any(names(n, p) for n in marked)]
    assert unmatched == [], f"RELEASE_PROOFS entries that name no test: {unmatched}"


def test_an_entry_names_its_test_its_parameters_and_nothing_else() -> None:
    node = "tests/vllm/test_x.py::test_y[kv_cache_spec-before]"
    assert names("tests/vllm/test_x.py::test_y[v1]", "tests/vllm/test_x.py::test_y[v1")
    for proof in (
        node,
        "tests/vllm/test_x.py",
        "tests/vllm/test_x.py::test_y",
        "tests/vllm/test_x.py::test_y[kv_cache_spec",
    ):
        assert names(node, proof), proof
    for other in (
        "tests/vllm/test_x",
        "tests/vllm/test_x.py::test_",
        "tests/vllm/test_x.py::test_y[kv",
    ):
        assert not names(node, other), other


def test_every_mrv2_tier_only_entry_names_a_collected_test() -> None:
    """What a release with both runners skips and the MRv2-only release proves
    (``MRV2_TIER_ONLY``) names tests that exist: a renamed one cannot drop out silently."""
    from release_tier import MRV2_TIER_ONLY, MRV2_TIER_ONLY_MODULES

    collected = _collected()
    unmatched = [p for p in MRV2_TIER_ONLY if not any(names(n, p) for n in collected)]
    assert unmatched == [], f"MRV2_TIER_ONLY entries that name no test: {unmatched}"
    for module in MRV2_TIER_ONLY_MODULES:
        assert any(n.startswith(module + "::") and "[v2" in n for n in collected), module


def test_the_slow_mrv2_rule_takes_v2_tests_of_its_modules_and_its_entries_only() -> None:
    from release_tier import mrv2_tier_only

    serve = "tests/vllm/test_serve.py::test_metrics_show_the_new_capacity"
    assert mrv2_tier_only(f"{serve}[v2]", {"servers": "v2"})
    assert mrv2_tier_only(f"{serve}[v2-x]", {"pair": ("v2", "x")})
    assert not mrv2_tier_only(f"{serve}[v1]", {"servers": "v1"})
    refit = "tests/vllm/test_refit.py::test_no_prefix_cache_block_survives_a_refit[v2]"
    assert not mrv2_tier_only(refit, {"runner": "v2"})  # in-process MRv2 runs everywhere
    harness = "tests/vllm/test_mrv2.py::test_stock_and_pipelined_mrv2_engines_are_identical"
    assert mrv2_tier_only(f"{harness}[tiny-lfm2]", {"model": "tiny-lfm2"})
    assert not mrv2_tier_only(f"{harness}[tiny-llama]", {"model": "tiny-llama"})
