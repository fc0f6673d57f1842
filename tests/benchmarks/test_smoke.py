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


def test_a_run_of_some_benchmarks_replaces_only_their_rows_and_dates_them() -> None:
    """``--only`` over a report already written: that benchmark's rows and error are
    replaced, the others kept with the date of the run that measured them."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.__main__ import markdown, merged
    from benchmarks._common import Row

    def _row(bench: str, name: str, value: float, unit: str) -> Row:
        return Row(bench=bench, name=name, value=value, unit=unit)

    old = {"platform": "p", "python": "3.11", "cpus": 2, "processor": "x", "date": "day 1"}
    new = {**old, "date": "day 2"}
    first = merged(
        None,
        ["dispatch", "scaling", "real"],
        [_row("dispatch", "a", 1.0, "x"), _row("scaling", "b", 2.0, "s")],
        {"real": "failed: no wheel"},
        old,
    )
    again = merged(first, ["real", "dispatch"], [_row("real", "c", 3.0, "ms")], {}, new)
    assert [(r["bench"], r["name"]) for r in again["rows"]] == [("scaling", "b"), ("real", "c")]
    assert again["errors"] == {}  # real measured now; dispatch ran and gave nothing
    assert {k: v["date"] for k, v in again["runs"].items()} == {"scaling": "day 1", "real": "day 2"}
    text = markdown(again)
    assert "benchmarks run at different times (`--only`): scaling day 1; real day 2." in text
    assert "| real | c | 3 ms |" in text
