"""Shared helpers: timing side by side, result rows, machine description."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class Row:
    """One reported figure.

    Attributes:
        bench: benchmark id (``dispatch``, ``scaling``, ...).
        name: what was measured.
        value: the figure (a ratio, seconds, µs ...).
        unit: unit of ``value``.
        target: the target as text (``<= 5``), or "" when only reported.
        met: True/False against the target, None when only reported.
        detail: extra numbers (min/median of each side) as a short string.
    """

    bench: str
    name: str
    value: float
    unit: str
    target: str = ""
    met: bool | None = None
    detail: str = ""


def alternate(
    fns: dict[str, Callable[[], Any]], repeats: int, number: int = 1
) -> dict[str, list[float]]:
    """Time each callable ``number`` times per sample, alternating, ``repeats`` samples.

    Returns seconds per call, one value per sample, for each name. Alternating in one run
    keeps a noisy machine's drift out of the ratios.
    """
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            out[name].append((time.perf_counter() - t0) / number)
    return out


def mm(samples: list[float]) -> tuple[float, float]:
    """(min, median) of samples."""
    return min(samples), statistics.median(samples)


def machine() -> dict[str, Any]:
    """Describe the machine the numbers came from."""
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }
