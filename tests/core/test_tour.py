"""The README's tour example runs as documented."""

import runpy
from pathlib import Path

TOUR = Path(__file__).parents[2] / "examples" / "tour.py"


def test_tour_runs_and_tears_down_both_kv_generations(capsys):
    ns = runpy.run_path(str(TOUR), run_name="__main__")
    out = capsys.readouterr().out
    assert "order: layer_specs -> buffers -> summary" in out
    assert "total bytes: 49152 largest: layer.1" in out
    assert ns["FREED"] == ["2 buffers of 96 bytes", "2 buffers of 49152 bytes"]
