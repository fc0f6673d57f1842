"""The vLLM calls that move between releases are bound once (:mod:`initpipe_vllm.compat`):
no other module imports them, the binding keeps each caller's sizing rule (the block-count
override set for the call, restored after), and the contract fingerprints the call through
it.

Read from the source and on plain objects: nothing here imports vLLM.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from initpipe_vllm.compat import CLEARED, blocks_override
from initpipe_vllm.contract.declare import declarations

ROOT = Path(__file__).resolve().parents[2] / "stages"
#: The vLLM callables :mod:`initpipe_vllm.compat` binds (0.32.0's and 0.33.0's planning:
#: ``kv_cache_utils``, then ``kv_cache_planning`` through the ``KVCacheConfigBuilder``).
BOUND = {
    "get_kv_cache_configs",
    "get_kv_cache_config_from_groups",
    "get_kv_cache_groups",
    "get_global_kv_cache_groups",
    "get_kv_cache_groups_from_builder",
    "get_kv_cache_config_builder",
}


def _uses_outside_compat() -> list[str]:
    """``file:line name`` of each import or attribute naming a bound call outside compat."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path == ROOT / "compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = {a.name for a in node.names}
            elif isinstance(node, ast.Attribute):
                names = {node.attr}
            else:
                continue
            found.extend(
                f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in sorted(names & BOUND)
            )
    return found


def test_the_moved_calls_are_bound_only_in_compat() -> None:
    assert _uses_outside_compat() == [], (
        "call these through initpipe_vllm.compat (plan_kv_cache_configs, "
        "kv_cache_config_from_groups, blocks_override), so a release that moves them "
        "changes one module"
    )


@pytest.mark.parametrize(
    ("num_blocks", "during"), [(None, 5), (CLEARED, None), (9, 9)], ids=["kept", "cleared", "set"]
)
def test_blocks_override_sets_for_the_call_and_restores(num_blocks: object, during: object) -> None:
    cache = SimpleNamespace(num_gpu_blocks_override=5)
    with pytest.raises(ValueError, match="from vLLM"):
        with blocks_override(cache, num_blocks):  # type: ignore[arg-type]
            assert cache.num_gpu_blocks_override == during
            raise ValueError("from vLLM")
    assert cache.num_gpu_blocks_override == 5


def test_the_contract_fingerprints_the_planning_call_through_compat() -> None:
    (use,) = [u for u in declarations(release="0.32.0") if u.name.endswith(":get_kv_cache_configs")]
    assert use.affects == "initpipe_vllm.compat:plan_kv_cache_configs"
    assert set(use.capabilities) == {"plan", "resize"} and use.kind == "calls"


def test_each_release_fingerprints_its_own_planning_call_through_compat() -> None:
    """0.32.0 plans with ``kv_cache_utils.get_kv_cache_configs``; 0.33.0 moved planning to
    ``kv_cache_planning`` (global groups first, then each worker's config): its variant
    replaces the base declaration there, and only there."""

    def planning(release: str) -> dict[str, tuple[str, frozenset[str]]]:
        return {
            u.name: (u.affects, frozenset(u.capabilities))
            for u in declarations(release=release)
            if u.name.rpartition(":")[2] in BOUND
        }

    both = frozenset({"plan", "resize"})
    assert planning("0.32.0") == {
        "vllm.v1.core.kv_cache_utils:get_kv_cache_configs": (
            "initpipe_vllm.compat:plan_kv_cache_configs",
            both,
        )
    }
    variant = "initpipe_vllm.compat:_plan_kv_cache_configs_0_33_0"
    assert planning("0.33.0") == {
        "vllm.v1.core.kv_cache_planning:get_global_kv_cache_groups": (variant, both),
        "vllm.v1.core.kv_cache_planning:get_kv_cache_configs": (variant, both),
    }
