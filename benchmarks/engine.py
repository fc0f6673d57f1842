"""Engine start: stock vLLM worker vs initpipe's ``PipelinedWorker``, fresh processes.

Each sample is one child process (``benchmarks/_engine_child.py``) that imports vLLM and
starts an in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) on the tiny Llama
(dummy weights, eager, float32, ``kv_cache_memory_bytes=8 MiB``). The child reports the
time from just before ``LLM(...)`` to just after it returns; the parent also times the
whole process (interpreter start, imports, engine, shutdown). Stock and initpipe children
alternate (ABBA order, so neither side always runs first) after one discarded warm-up
pair (``.pyc`` files, OS file cache; skipped with ``--smoke``). Ratios are initpipe/stock of
the min and the median.

The device is whatever vLLM's platform picks (``VLLM_TARGET_DEVICE``; CPU here). Written
device-agnostic but untested on CUDA (no GPU on the development machines).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ._common import Row, mm

#: Target from PRODUCT.md: engine start through initpipe <= 1.03x stock.
MAX_RATIO = 1.03
ROOT = Path(__file__).resolve().parents[1]
SIDES = ("stock", "initpipe")
#: The samples of the last :func:`run` in this process (:mod:`benchmarks.kv` reuses the
#: stock starts as the cost of an engine restart).
LAST_SAMPLES: dict[str, dict[str, list[float]]] | None = None


def start_once(
    pipelined: bool,
    model: str | None = None,
    model_runner: str | None = None,
    *,
    real: bool = False,
) -> dict[str, Any]:
    """Start one engine in a fresh child process; its timing line plus ``wall_s``."""
    from ._engine_child import MARK

    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cpu"),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    argv = [sys.executable, "-m", "benchmarks._engine_child"]
    argv += ["--pipelined"] if pipelined else []
    argv += ["--model", model] if model else []
    argv += ["--real"] if real else []
    argv += ["--model-runner", model_runner] if model_runner else []
    t0 = time.perf_counter()
    res = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    wall = time.perf_counter() - t0
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(MARK)]
    if res.returncode != 0 or not lines:
        msg = (
            f"engine child ({'initpipe' if pipelined else 'stock'}) exited "
            f"{res.returncode}: {res.stderr[-1500:]}"
        )
        raise RuntimeError(msg)
    out = json.loads(lines[-1][len(MARK) :])
    want = "Pipelined" if pipelined else ""
    if pipelined != out["runner"].startswith("Pipelined"):
        raise RuntimeError(f"engine child ran {out['runner']!r}, expected {want or 'stock'}")
    out["wall_s"] = wall
    return out


def measure(
    repeats: int, warmup: bool = True, model: str | None = None, real: bool = False
) -> dict[str, dict[str, list[float]]]:
    """``repeats`` engine starts per side, ABBA-alternated; samples of ``llm_s``/``wall_s``.

    ``warmup`` first runs one discarded pair (``.pyc`` files, the OS file cache); ``model``
    and ``real`` go to :func:`start_once`.
    """
    if warmup:
        start_once(False, model, real=real)
        start_once(True, model, real=real)
    samples = {s: {"llm_s": [], "wall_s": []} for s in SIDES}
    for i in range(repeats):
        order = SIDES if i % 2 == 0 else SIDES[::-1]
        for side in order:
            got = start_once(side == "initpipe", model, real=real)
            samples[side]["llm_s"].append(got["llm_s"])
            samples[side]["wall_s"].append(got["wall_s"])
    return samples


def run(smoke: bool = False) -> list[Row]:
    """Rows for the benchmark runner: in-process ``LLM()`` ratio and whole-process ratio."""
    repeats = 1 if smoke else 6
    global LAST_SAMPLES
    samples = LAST_SAMPLES = measure(repeats, warmup=not smoke)
    return start_rows(samples, repeats)


def start_rows(
    samples: dict[str, dict[str, list[float]]],
    repeats: int,
    *,
    bench: str = "engine",
    label: str = "",
) -> list[Row]:
    """The in-process ``LLM()`` ratio (against :data:`MAX_RATIO`) and the whole-process
    ratio of :func:`measure`'s samples; ``label`` prefixes each figure's name."""
    rows = []
    for key, what in (("llm_s", "LLM() in-process"), ("wall_s", "whole process")):
        s_min, s_med = mm(samples["stock"][key])
        p_min, p_med = mm(samples["initpipe"][key])
        ratio = p_med / s_med
        is_target = key == "llm_s"
        rows.append(
            Row(
                bench=bench,
                name=f"{label}engine start initpipe/stock, {what} (median)",
                value=round(ratio, 4),
                unit="x",
                target=f"<= {MAX_RATIO}" if is_target else "",
                met=(ratio <= MAX_RATIO) if is_target else None,
                detail=(
                    f"initpipe min/med {p_min:.3f}/{p_med:.3f} s; stock min/med "
                    f"{s_min:.3f}/{s_med:.3f} s; ratio of mins {p_min / s_min:.4f}; "
                    f"{repeats} ABBA-alternated fresh processes per side"
                ),
            )
        )
    return rows
