"""``tests/selected.py``: a module fixture learns which parameters the collected tests use."""

from __future__ import annotations

from pathlib import Path

import pytest

MODULE = """
import pytest
from selected import selected

SEEN = []

@pytest.fixture(scope="module")
def reports(request):
    SEEN.append(selected(request, "model", ["a", "b", "c"]))
    return SEEN[-1]

@pytest.mark.parametrize("model", ["a", "b", "c"])
def test_each(reports, model):
    assert model in reports

def test_all(reports):
    assert reports == ["a", "b", "c"]

def test_zz_seen():
    print("SEEN", SEEN)
"""


@pytest.mark.parametrize(
    ("select", "seen"),
    [
        (["test_toy.py::test_each[b]"], "SEEN [['b']]"),
        (["test_toy.py::test_each[c]", "test_toy.py::test_each[a]"], "SEEN [['a', 'c']]"),
        (["test_toy.py::test_all"], "SEEN [['a', 'b', 'c']]"),  # a test reads every model
        (["test_toy.py"], "SEEN [['a', 'b', 'c']]"),
    ],
)
def test_the_fixture_runs_only_the_selected_models(
    pytester: pytest.Pytester, select: list[str], seen: str
) -> None:
    pytester.makepyfile(test_toy=MODULE)
    pytester.syspathinsert(Path(__file__).parent)
    result = pytester.runpytest(
        "-s", "-p", "no:cacheprovider", *select, "test_toy.py::test_zz_seen"
    )
    assert result.ret == 0, result.stdout.str()
    assert seen in result.stdout.str()
