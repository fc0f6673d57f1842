"""Shared helpers: timing side by side, result rows, machine description."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
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
    fns: dict[str, Callable[[], Any]], repeats: int, number: int = 1, swap: bool = False
) -> dict[str, list[float]]:
    """Time each callable ``number`` times per sample, alternating, ``repeats`` samples.

    Returns seconds per call, one value per sample, for each name. Alternating in one run
    keeps a noisy machine's drift out of the ratios. ``swap``: reverse the order every other
    sample (A B, B A, ...), so that neither side always starts from the state the other
    left (its allocator's free lists, the CPU caches).
    """
    out: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for i in range(repeats):
        for name in reversed(names) if swap and i % 2 else names:
            fn = fns[name]
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            out[name].append((time.perf_counter() - t0) / number)
    return out


#: glibc's allocator thresholds pinned, for timing sub-millisecond KV re-inits: by default
#: glibc moves its mmap and trim thresholds as large blocks are freed, so whether a re-init's
#: new KV buffer reuses freed heap pages or faults in fresh ones (about +0.6 ms for 8 MiB
#: here) depends on what small allocations lie above it, which differs between two runners.
#: Pinned, freed KV memory is reused as a GPU's caching allocator reuses it, and the ratio
#: is the code's own cost. Read at process start: children only.
STEADY_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def child_json(
    module: str, args: list[str], mark: str, env: Mapping[str, str], what: str, timeout: float
) -> Any:
    """Run ``python -m module *args`` from the repository root with ``env``, and return the
    JSON of its last stdout line starting with ``mark`` (the benchmarks that need a process
    of their own: an in-process engine, Triton's interpreter, pinned allocator settings).

    Raises:
        RuntimeError: the child failed or printed no such line (``what`` names it).
    """
    res = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=Path(__file__).resolve().parents[1],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(mark)]
    if res.returncode != 0 or not lines:
        raise RuntimeError(f"{what} exited {res.returncode}: {res.stderr[-2000:]}")
    return json.loads(lines[-1][len(mark) :])


def paired_ratio(num: list[float], den: list[float]) -> float:
    """The median, over ABBA blocks (samples ``2k`` and ``2k+1`` of :func:`alternate` with
    ``swap``), of ``sum(num) / sum(den)`` in the block. Each block's samples ran back to
    back, so a drift of this noisy machine (another process, the CPU's clock) divides out,
    where a ratio of two medians carries it (the KV re-init's moved 1.82 -> 1.05 between two
    runs); and each side ran once first and once second in the block, so the cost of
    following the other side cancels, where single paired ratios split into two modes.
    """
    if len(num) != len(den) or not num:
        raise ValueError(f"paired samples needed, got {len(num)} and {len(den)}")
    if len(num) == 1:  # a smoke run's single sample
        return num[0] / den[0]
    blocks = range(0, len(num) - 1, 2)
    return statistics.median((num[i] + num[i + 1]) / (den[i] + den[i + 1]) for i in blocks)


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
