"""`initpipe plan` is dispatched to initpipe_vllm.tools.plan with its own flags."""

import subprocess
import sys

from waiting import HANG_S

from initpipe.cli import main


def test_plan_help_is_the_plan_tools_own(capsys):
    assert main(["plan", "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: initpipe plan" in out and "--num-blocks" in out
    assert "--model-runner" in out  # v1 or v2 (Model Runner V2)


def test_plan_usage_error_exits_2_through_the_console_script(tmp_path):
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "initpipe.cli",
            "plan",
            "--model",
            str(tmp_path / "nope"),
            "--num-blocks",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith("Error: ")
    assert "nope" in res.stderr


def test_top_level_help_lists_plan(capsys):
    assert main(["--help"]) == 0
    assert "plan" in capsys.readouterr().out
