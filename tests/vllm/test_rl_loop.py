"""``examples/rl_loop.py`` runs as its docstring says: generate with vLLM, score, take a
policy-gradient step in torch, refit the running engine, repeat; each step's line shows its
mean reward, the refit receipt's first line and the refit's time against a restart.

Two steps here (three by default) and a restart timed after the last, on the suite's
shared conversion of SmolLM2-135M-Instruct (``INITPIPE_CACHE_DIR``). What the refit serves
is proven against fresh engines by ``test_refit_real.py``; this checks that the loop a user
copies works end to end.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from requires import installed

installed("gguf", "gguf comes with the dev extra")
installed("accelerate", "accelerate comes with the dev extra")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rl_loop.py"


def test_the_rl_loop_trains_refits_and_times_a_restart(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "2", "--restart", "last"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    out = res.stdout
    assert res.returncode == 0, out[-3000:] + res.stderr[-3000:]
    lines = out.splitlines()
    assert lines[0].startswith("RL loop on smollm2-135m-instruct-bf16-")
    assert lines[0].endswith(": 8 answers a step, Adam lr 3e-05")
    assert (
        lines[1] == "before: 'What is the capital of France?' -> 'The capital of France is Paris.'"
    )
    steps = [
        re.fullmatch(r"step (\d): mean reward ([\d.]+) \| refit (\S+) -> (\S+) .*", x)
        for x in lines
    ]
    found = [m.groups() for m in steps if m]
    assert [(s, old, new) for s, _, old, new in found] == [
        ("1", "default", "refit-1"),
        ("2", "refit-1", "refit-2"),
    ], out
    assert all(0.0 <= float(r) <= 1.0 for _, r, _, _ in found)
    assert all("(wait, runner v1): 22 -> 22 blocks" in x for x in lines if x.startswith("step "))
    timed = [x for x in lines if x.startswith("  refit ")]
    assert len(timed) == 1 and " s vs restart " in timed[0] and "engine start" in timed[0]
    assert (
        lines.index(timed[0]) == lines.index(next(x for x in lines if x.startswith("step 2"))) + 1
    )
    assert lines[-2].startswith("after: 'What is the capital of France?' -> ")
    assert re.fullmatch(r"2 steps in \d+ s", lines[-1])
    assert list(tmp_path.iterdir()) == []  # the restarts' checkpoints went with their folder
