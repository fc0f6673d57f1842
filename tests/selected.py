"""Which parameter values the collected tests need: a module fixture that runs one engine per
model runs only the models of the tests that will run.

``make test-release`` selects some parameters of a proof (``-m proof``, the node ids in
``tests/conftest.py``: ``RELEASE_PROOFS``); the whole suite selects all of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest


def selected(request: pytest.FixtureRequest, param: str, every: Sequence[str]) -> list[str]:
    """The values of ``param`` that the collected tests of the requesting fixture's module
    use, in the order of ``every``; all of ``every`` when a collected test of the module uses
    the fixture without that parameter (it reads every value). Skipped tests need none."""
    fixture = request.fixturename
    module = request.node.nodeid.split("::", 1)[0]
    wanted: set[str] = set()
    for item in request.session.items:
        if not item.nodeid.startswith(module + "::"):
            continue
        if fixture not in getattr(item, "fixturenames", ()):
            continue
        if item.get_closest_marker("skip") is not None:  # never runs: needs nothing
            continue
        callspec = getattr(item, "callspec", None)
        if callspec is None or param not in callspec.params:
            return list(every)
        wanted.add(callspec.params[param])
    return [v for v in every if v in wanted]
