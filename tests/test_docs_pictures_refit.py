"""The refit picture in the docs is what scripts/draw_refit.py draws today from the refit's
own step lists: docs/images/refit.svg (regenerate it with ``python scripts/draw_refit.py``)."""

from __future__ import annotations

import re
from pathlib import Path

from cli_support import needs_dot
from docs_pictures import assert_current, run_script


def test_the_picture_names_every_step_of_the_code_in_order() -> None:
    from initpipe_vllm.live.refit import engine as refit_core

    res = run_script("draw_refit", "--dot")
    assert res.returncode == 0, res.stderr
    names = ["plan", refit_core.REFIT.pause.name, *(s.name for s in refit_core.REFIT.steps)]
    found = re.findall(r'^\s*"(\w+)" \[label=<<b>(\w+)</b>', res.stdout, re.M)
    assert [n for n, _ in found] == names


@needs_dot
def test_the_refit_picture_is_current(tmp_path: Path) -> None:
    assert_current("draw_refit", "refit.svg", tmp_path)
