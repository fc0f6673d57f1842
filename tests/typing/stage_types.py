"""Typing examples checked by mypy (``make check`` and tests/typing/test_typing.py).

``@stage`` returns the decorated function unchanged, and its type says so: callers of a
stage keep their parameter and return types.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import assert_type

from initpipe import Pipeline, stage


@stage(needs="model")
def layer_count(model: dict[str, int], block_size: int) -> int:
    return len(model) * block_size


@stage(needs="kv_cache_config", provides=("total", "largest"))
def summary(layer_count: int, kv_cache_config: dict[str, int]) -> dict[str, int]:
    return {"total": layer_count * kv_cache_config["num_blocks"], "largest": layer_count}


def plain(model: str) -> str:
    return model


assert_type(layer_count({"a": 1}, 16), int)
assert_type(summary(3, {"num_blocks": 2}), dict[str, int])
same: Callable[[str], str] = stage(plain, needs="model")
assert_type(stage(needs="model")(plain)("m"), str)
pipeline = Pipeline([layer_count, summary], start_inputs=("block_size",))
assert_type(pipeline.order, list[str])
