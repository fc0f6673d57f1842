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


def paired_ratio(num: list[float], den: list[float]) -> float:
    """The median of the per-sample ratios ``num[i] / den[i]``, for samples taken in
    alternation (:func:`alternate`): each pair ran back to back, so a drift of this noisy
    machine (another process, the CPU's clock) divides out of each ratio, where a ratio of
    two medians carries it (the KV re-init's ratio of medians moved 1.82 -> 1.05 between two
    runs; its paired ratio stays within a few percent)."""
    if len(num) != len(den) or not num:
        raise ValueError(f"paired samples needed, got {len(num)} and {len(den)}")
    return statistics.median(n / d for n, d in zip(num, den, strict=True))


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
