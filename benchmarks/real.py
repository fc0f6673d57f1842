"""The real model, SmolLM2-135M-Instruct in bfloat16 (30 layers, grouped-query attention,
tied embeddings; :mod:`initpipe_vllm.real_model`): engine start, a live resize warm and cold
with the time to first token on a cached chat prefix after it, and a refit against its floor
and against a restart.

- **engine start**: fresh processes, stock worker vs initpipe's, ABBA-alternated
  (:func:`benchmarks.engine.measure` with the real weights, 64 MiB of KV cache);
- **resize**: one in-process pipelined engine (``benchmarks/_real_resize_child.py``) grows
  and shrinks between 22 and 40 blocks, keeping the prefix cache or not, alternated; after
  each, a chat turn whose 400-token system prompt was served before the resize is timed to
  its first token. A restart instead costs the stock engine start above plus that turn cold;
- **refit**: :mod:`benchmarks.refit`'s child on the converted checkpoint and a copy after one
  training step (``benchmarks/_real.py``): the refit against reading its 270 MB plus the KV
  memset, and against a restart on the other weights.

Nothing here is a pass/fail test. Untested on GPU.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import attrs

from ._common import Row, child_json, mm
from ._real import LABEL


def _resize(repeats: int) -> dict[str, list[dict[str, Any]]]:
    from ._real_resize_child import MARK

    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cpu"),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    return child_json(
        "benchmarks._real_resize_child", [str(repeats)], MARK, env, "real resize child", 1800
    )


def _resize_rows(res: dict[str, list[dict[str, Any]]], stock_start_s: float) -> list[Row]:
    out = []
    ttft = {}
    for side in ("warm", "cold"):
        rs = res[side]
        r_min, r_med = mm([r["resize_s"] for r in rs])
        t_min, t_med = mm([r["ttft_s"] for r in rs])
        ttft[side] = t_med
        cached = sorted({r["cached_tokens"] for r in rs})
        out.append(
            Row(
                bench="real",
                name=f"{LABEL} live resize, {side} (median)",
                value=round(r_med * 1e3, 1),
                unit="ms",
                detail=f"min {r_min * 1e3:.1f} ms over {len(rs)} resizes between 22 and 40 "
                f"blocks; blocks kept {sorted({r['kept_blocks'] for r in rs})}",
            )
        )
        out.append(
            Row(
                bench="real",
                name=f"{LABEL} time to first token after a {side} resize (median)",
                value=round(t_med * 1e3, 1),
                unit="ms",
                detail=f"a chat turn of {rs[0]['prompt_tokens']} tokens sharing its system "
                f"prompt with the turn served before the resize; cached tokens {cached}; "
                f"min {t_min * 1e3:.1f} ms",
            )
        )
    out.append(
        Row(
            bench="real",
            name=f"{LABEL} TTFT cold / warm after a resize (median)",
            value=round(ttft["cold"] / ttft["warm"], 2),
            unit="x",
            detail="the prefix cache a warm resize keeps, in the first token's latency",
        )
    )
    restart = stock_start_s + ttft["cold"]
    warm = mm([r["resize_s"] for r in res["warm"]])[1] + ttft["warm"]
    out.append(
        Row(
            bench="real",
            name=f"{LABEL} restart / warm resize, to the first token (median)",
            value=round(restart / warm, 1),
            unit="x",
            detail=f"restart: stock LLM() {stock_start_s:.2f} s + the turn cold "
            f"{ttft['cold'] * 1e3:.0f} ms (not counting a new process's imports); warm "
            f"resize + the turn {warm * 1e3:.0f} ms",
        )
    )
    return out


def run(smoke: bool = False) -> list[Row]:
    """Rows for the benchmark runner (``--smoke``: one sample of each)."""
    from initpipe_vllm.real_model import smollm2

    from . import engine, refit

    folder = str(smollm2())
    starts = 1 if smoke else 4
    samples = engine.measure(starts, warmup=not smoke, model=folder, real=True)
    rows = engine.start_rows(samples, starts, bench="real", label=f"{LABEL} ")
    rows += _resize_rows(_resize(1 if smoke else 4), mm(samples["stock"]["llm_s"])[1])
    with tempfile.TemporaryDirectory(prefix="initpipe_real_bench_") as tmp:
        got = refit.measure(Path("smollm2"), Path(tmp), 64 << 20, 1 if smoke else 4, 1)
    return rows + [attrs.evolve(row, bench="real") for row in refit.model_rows(got)]
