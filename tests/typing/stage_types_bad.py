"""Must NOT type-check: proves the typing test can fail (see test_typing.py)."""

from __future__ import annotations

from initpipe import stage


@stage(needs="model")
def layer_count(model: dict[str, int], block_size: int) -> int:
    return len(model) * block_size


layer_count({"a": 1}, "sixteen")  # the stage kept its signature: a str is refused here
stage(layer_count, needs="modle")  # an unknown phase is refused by the Literal type
