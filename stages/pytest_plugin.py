"""Stable dotted name for the pytest plugin's helpers.

Third-party tests import ``assert_same_state`` and ``assert_stages_ran`` from here. The
plugin itself (``pytest11`` entry point ``initpipe``: the fixtures) lives in
:mod:`initpipe_vllm.testing.pytest_plugin`.
"""

from __future__ import annotations

from .testing.pytest_plugin import Prepared, assert_same_state, assert_stages_ran

__all__ = ["Prepared", "assert_same_state", "assert_stages_ran"]
