"""Smoke pass of the benchmarks at tiny size: they run and report figures. No timing asserts."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_framework_benchmarks_run_and_write_the_report(tmp_path):
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--smoke",
            "--only",
            "dispatch",
            "scaling",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    data = json.loads((tmp_path / "benchmarks.json").read_text())
    names = {r["name"] for r in data["rows"]}
    assert "overhead per stage: initpipe" in names
    assert any(n.startswith("build+validate+order") for n in names)
    assert "| dispatch | overhead per stage: initpipe |" in (tmp_path / "BENCHMARKS.md").read_text()
