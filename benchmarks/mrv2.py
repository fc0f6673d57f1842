"""Model Runner V2: engine start and KV re-init, stock vLLM vs initpipe's MRv2 catalog.

- Engine start: as :mod:`benchmarks.engine` (fresh child processes, in-process engine, tiny
  Llama, dummy weights, ABBA order after a discarded warm-up pair), with
  ``--model-runner v2``: on a CPU target both sides run MRv2 through Triton's interpreter
  (``initpipe_vllm.testing.triton_cpu``), set up identically before vLLM is imported.
- KV re-init (:mod:`benchmarks._mrv2_kv_child`, one process): stock's
  ``_teardown_profiling_state`` + ``initialize_kv_cache`` vs the pipelined teardown +
  KV phase, alternating, on a frozen startup heap; and the first KV phase of each.

Ratios are initpipe/stock of the medians. The v1 runner's figures are in
:mod:`benchmarks.engine` and :mod:`benchmarks.kv` of the same run. Never run on a GPU.
"""

from __future__ import annotations

import os

from ._common import STEADY_ALLOCATOR, Row, child_json, mm, paired_ratio
from .engine import MAX_RATIO as ENGINE_MAX_RATIO, start_once

#: Targets from the issue: MRv2 engine start <= 1.03x stock, KV phase <= 1.05x.
KV_MAX_RATIO = 1.05
#: The re-init with the default logging (one summary line per phase after start-up).
KV_LOGGED_MAX_RATIO = 1.10


def engine_samples(repeats: int, warmup: bool) -> dict[str, list[float]]:
    """``LLM()`` seconds per side, ABBA-alternated fresh processes, both on MRv2."""
    if warmup:
        start_once(False, model_runner="v2")
        start_once(True, model_runner="v2")
    out: dict[str, list[float]] = {"stock": [], "initpipe": []}
    for i in range(repeats):
        order = ("stock", "initpipe") if i % 2 == 0 else ("initpipe", "stock")
        for side in order:
            got = start_once(side == "initpipe", model_runner="v2")
            if not got["runner_base_module"].startswith(
                ("vllm.v1.worker.cpu.", "vllm.v1.worker.gpu.")
            ):
                raise RuntimeError(f"engine child ran {got['runner_base_module']}, not MRv2")
            out[side].append(got["llm_s"])
    return out


def kv_samples(pairs: int) -> dict[str, object]:
    """The KV child's samples (first KV phase, re-init per side)."""
    from ._mrv2_kv_child import MARK

    env = {
        **os.environ,
        **STEADY_ALLOCATOR,
        "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cpu"),
    }
    data: dict[str, object] = child_json(
        "benchmarks._mrv2_kv_child", [str(pairs)], MARK, env, "MRv2 KV child", 600
    )
    return data


def _reinit_row(samples: object, name: str, limit: float, what: str) -> Row:
    assert isinstance(samples, dict)
    s_min, s_med = mm(samples["stock"])
    p_min, p_med = mm(samples["initpipe"])
    ratio = paired_ratio(samples["initpipe"], samples["stock"])
    return Row(
        bench="mrv2",
        name=name,
        value=round(ratio, 4),
        unit="x",
        target=f"<= {limit}",
        met=ratio <= limit,
        detail=(
            f"teardown + initialize_kv_cache, median of the paired ratios; initpipe min/med "
            f"{p_min * 1e3:.2f}/{p_med * 1e3:.2f} ms; stock {s_min * 1e3:.2f}/"
            f"{s_med * 1e3:.2f} ms; ratio of medians {p_med / s_med:.4f}; {what}"
        ),
    )


def run(smoke: bool = False) -> list[Row]:
    """Rows: MRv2 engine start ratio, MRv2 KV re-init ratio, first MRv2 KV phase."""
    repeats, pairs = (1, 3) if smoke else (6, 100)
    eng = engine_samples(repeats, warmup=not smoke)
    s_min, s_med = mm(eng["stock"])
    p_min, p_med = mm(eng["initpipe"])
    rows = [
        Row(
            bench="mrv2",
            name="MRv2 engine start initpipe/stock, LLM() in-process (median)",
            value=round(p_med / s_med, 4),
            unit="x",
            target=f"<= {ENGINE_MAX_RATIO}",
            met=p_med / s_med <= ENGINE_MAX_RATIO,
            detail=(
                f"initpipe min/med {p_min:.3f}/{p_med:.3f} s; stock min/med {s_min:.3f}/"
                f"{s_med:.3f} s; {repeats} ABBA-alternated fresh processes per side"
            ),
        )
    ]
    kv = kv_samples(pairs)
    for key, name, limit, what in (
        (
            "reinit",
            "MRv2 KV re-init initpipe/stock (median)",
            KV_MAX_RATIO,
            "INITPIPE_LOG_STAGES=0",
        ),
        (
            "logged",
            "MRv2 KV re-init initpipe/stock, default logging (median)",
            KV_LOGGED_MAX_RATIO,
            "the default logging past start-up (one summary line per phase)",
        ),
    ):
        rows.append(
            _reinit_row(
                kv[key],
                name,
                limit,
                f"{pairs} alternated pairs of 5 re-inits, frozen startup heap, glibc's "
                f"allocator thresholds pinned, {what}",
            )
        )
    first = kv["first"]
    assert isinstance(first, dict)
    rows.append(
        Row(
            bench="mrv2",
            name="MRv2 first KV phase initpipe/stock (one sample each)",
            value=round(first["initpipe"] / first["stock"], 4),
            unit="x",
            target="",
            met=None,
            detail=(
                f"initpipe {first['initpipe'] * 1e3:.2f} ms; stock {first['stock'] * 1e3:.2f} ms"
            ),
        )
    )
    return rows
