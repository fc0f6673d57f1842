"""The order of ``make test``'s modules (``tests/module_order.py``): every listed module
exists, so a renamed module cannot fall silently to the end; the end-of-run list adds up
each module's set-up, call and tear-down."""

from __future__ import annotations

from pathlib import Path

from module_order import SLOW_FIRST, module_seconds

ROOT = Path(__file__).resolve().parents[1]


def test_every_slow_first_module_exists_once() -> None:
    missing = [m for m in SLOW_FIRST if not (ROOT / m).is_file()]
    assert missing == [], f"SLOW_FIRST names modules that are not there: {missing}"
    assert len(set(SLOW_FIRST)) == len(SLOW_FIRST)


class _Report:
    def __init__(self, nodeid: str, duration: object) -> None:
        self.nodeid, self.duration = nodeid, duration


def test_a_modules_seconds_are_its_tests_phases_summed_slowest_first() -> None:
    reports = [
        _Report("tests/a.py::test_x", 2.0),  # set-up: the module's engine
        _Report("tests/a.py::test_x", 0.5),  # call
        _Report("tests/b.py::test_y[v1]", 4.0),
        _Report("tests/a.py::test_z", 0.25),
        _Report("", 9.0),  # a collection report of no test
        _Report("tests/c.py::test_w", None),  # no duration: a warning record
        object(),
    ]
    assert list(module_seconds(reports).items()) == [("tests/b.py", 4.0), ("tests/a.py", 2.75)]
