"""``assert_same_state``'s ``ignore=``: a path hides itself and what lies below it, by whole
path components, never a sibling that merely starts with the same letters. Snapshots are
plain dicts here: no engine, no vLLM."""

from __future__ import annotations

import pytest

from initpipe_vllm.pytest_plugin import assert_same_state

BASE = {
    "kv_cache": [1, 2],
    "kv_cache_config": {"num_blocks": 8},
    "runner": {"kv_cache": 1, "kv_cache_dtype": "fp32"},
}


def _changed(**changes: object) -> dict[str, object]:
    """A deep-enough copy of :data:`BASE` with top-level keys replaced."""
    return {**BASE, **changes}


@pytest.mark.parametrize(
    ("ignore", "changes"),
    [
        ("/kv_cache", {"kv_cache": [1, 3]}),  # an index below it
        (("/kv_cache",), {"kv_cache": [1, 2, 3]}),  # the path itself (lengths differ)
        (("/runner",), {"runner": {"kv_cache": 2, "kv_cache_dtype": "bf16"}}),  # keys below
        (("/runner/kv_cache",), {"runner": {"kv_cache": 2, "kv_cache_dtype": "fp32"}}),
        (("/runner/",), {"runner": {"kv_cache": 2, "kv_cache_dtype": "fp32"}}),  # trailing /
        (("/kv_cache", "/kv_cache_config"), {"kv_cache": [0], "kv_cache_config": {}}),
    ],
)
def test_an_ignored_path_hides_itself_and_what_is_below_it(
    ignore: str | tuple[str, ...], changes: dict[str, object]
) -> None:
    assert_same_state(BASE, _changed(**changes), ignore=ignore)


@pytest.mark.parametrize(
    ("ignore", "changes", "shown"),
    [
        (("/kv_cache",), {"kv_cache_config": {"num_blocks": 9}}, "/kv_cache_config/num_blocks"),
        (
            ("/runner/kv_cache",),
            {"runner": {"kv_cache": 1, "kv_cache_dtype": "bf16"}},
            "/runner/kv_cache_dtype",
        ),
        ("/kv_cache", {"kv_cache_config": {}}, "/kv_cache_config/num_blocks: only in a"),
    ],
)
def test_an_ignored_path_does_not_hide_a_sibling_sharing_its_prefix(
    ignore: str | tuple[str, ...], changes: dict[str, object], shown: str
) -> None:
    with pytest.raises(pytest.fail.Exception, match="1 differences") as failed:
        assert_same_state(BASE, _changed(**changes), ignore=ignore)
    assert shown in str(failed.value)
