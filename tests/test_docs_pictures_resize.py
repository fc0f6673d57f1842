"""The resize picture in the docs is what scripts/draw_resize.py draws today from the
resize's own carry plan: docs/images/resize.svg (regenerate it with
``python scripts/draw_resize.py``)."""

from __future__ import annotations

import re
from pathlib import Path

from cli_support import needs_dot
from docs_pictures import assert_current, run_script


def test_the_picture_draws_what_the_resize_keeps() -> None:
    """Its arrows are the carry plan's moves for the picture's pool; its sizes are the
    tiny Llama's (128 KiB a float32 block of 128 tokens, as the how-to's example frees
    8 MiB for 64 blocks)."""
    from initpipe_vllm.live.carry.pool import PoolState, plan_carry

    res = run_script("draw_resize", "--dot")
    assert res.returncode == 0, res.stderr
    arrows = re.findall(r"before:b(\d+):s -> after:b(\d+):n", res.stdout)
    used = tuple(range(1, 11))
    state = PoolState(
        num_blocks=16,
        queue=tuple(range(11, 16)) + used,
        primary={b: (b, 128) for b in used},
        extras={},
        entries=tuple((b, (b,)) for b in used),
    )
    plan = plan_carry(state, 8)
    assert [(int(a), int(b)) for a, b in arrows] == list(plan.moves)
    assert plan.evicted == (1, 2, 3)
    assert "16 blocks x 128 KiB = 2 MiB per rank" in res.stdout
    assert "8 blocks = 1 MiB per rank, 7 kept, 3 evicted" in res.stdout


@needs_dot
def test_the_resize_picture_is_current(tmp_path: Path) -> None:
    assert_current("draw_resize", "resize.svg", tmp_path)
