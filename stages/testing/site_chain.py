"""Run the ``sitecustomize`` that another one hides: for a ``sitecustomize.py`` put first on
``PYTHONPATH`` (the test kit's ``triton_cpu_site/``, the suite's ``tests/subprocess_site/``).

Python imports one module named ``sitecustomize`` at start-up, the first on ``sys.path``;
a folder put in front hides a system one, or another kit's. Each of ours calls
:func:`run_next_sitecustomize` last, so they add to a process's start-up instead of
replacing it. Standard library only: the suite's site loads this file by its path at every
interpreter start, without importing ``initpipe_vllm`` (about 0.2 s).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

__all__ = ["run_next_sitecustomize"]


def run_next_sitecustomize(site_file: str) -> None:
    """Run the next ``sitecustomize`` on ``sys.path`` after the folder of ``site_file``
    (the one calling), if there is one."""
    here = os.path.dirname(os.path.abspath(site_file))
    entries = [os.path.abspath(p or os.curdir) for p in sys.path]
    after = entries[entries.index(here) + 1 :] if here in entries else entries
    spec = importlib.machinery.PathFinder.find_spec(
        "sitecustomize", [p for p in after if p != here]
    )
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
