"""The tours run as documented: examples/tour.py and the README's short one."""

import re
import runpy
from pathlib import Path

ROOT = Path(__file__).parents[2]
TOUR = ROOT / "examples" / "tour.py"


def test_tour_runs_and_tears_down_both_kv_generations(capsys):
    ns = runpy.run_path(str(TOUR), run_name="__main__")
    out = capsys.readouterr().out
    assert "order: layer_specs -> buffers -> summary" in out
    assert "total bytes: 49152 largest: layer.1" in out
    assert ns["FREED"] == ["2 buffers of 96 bytes", "2 buffers of 49152 bytes"]


def test_the_readmes_tour_gives_what_its_comments_say():
    readme = (ROOT / "README.md").read_text()
    code = re.findall(r"## A short tour\n\n```python\n(.*?)```", readme, re.S)[0]
    before_close, _, after = code.partition("run.close()")
    assert before_close and "# every teardown" in after
    ns: dict = {}
    exec(compile(before_close, "README.md (tour)", "exec"), ns)
    (shown,) = re.findall(r'run\.outputs\["buffers"\]  # (\{.*\})', code)
    assert repr(ns["run"].outputs["buffers"]) == shown
    ns["run"].close()
