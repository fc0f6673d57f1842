"""Live KV resize on both runners vs its physical floor and an engine restart, and the memory
a shrink or a release returns.

For each runner — v1, and Model Runner V2 (on Triton's interpreter here: the test kit's
``triton_cpu``) — a child process (``benchmarks/_resize_child.py``; an in-process engine
mutates its process) starts an in-process engine with the pipelined worker on the tiny
Llama (dummy weights, eager, float32) and:

- resizes it alternately to 32 and 64 blocks, generating between resizes; each
  ``ResizeReport`` gives the total and the per-step seconds (pause, teardown, KV phase,
  warm-up, scheduler, resume);
- then grows the same engine to ``kv_cache_memory_bytes`` = 1 GiB (64 MiB with
  ``--smoke``), shrinks it to a quarter and grows it back (three times; once with
  ``--smoke``), releases and resumes; the reports carry the worker's RSS (this process,
  read after ``malloc_trim``) around the teardown;
- measures each resize's physical floor in the same process: dropping a tensor of the old
  KV bytes, then ``torch.zeros`` of the new bytes;
- resizes 128 <-> 96 blocks keeping the prefix cache and dropping it, alternating, with 64
  one-block prefixes cached before each (16 with ``--smoke``): the ratio, the carry step
  against its floor (the kept bytes copied into fresh pages, then into an existing tensor,
  same process), and the peak KV bytes of each.

Goals (issues): each resize within 1.3x its floor + 20 ms, on both runners; resize >= 20x
faster than an in-process restart (v1, the restart from :mod:`benchmarks.engine` when it ran
earlier in this run, else measured here); the teardown of a 1 GiB -> 256 MiB shrink returns
>= 90% of the freed KV bytes to the OS, a release >= 95%. The runners' rows stand side by
side in one run. Untested on GPU (no GPU with vLLM on the development machines).
"""

from __future__ import annotations

import os
from typing import Any

from ._common import Row, child_json, mm

MIN_RESTART_RATIO = 20.0
MIN_SHRINK_RETURNED = 0.90
MIN_RELEASE_RETURNED = 0.95


RUNNERS = ("v1", "v2")
#: How the rows name each runner.
LABEL = {"v1": "v1", "v2": "MRv2"}
FLOOR_FACTOR, FLOOR_SLACK_S = 1.3, 0.020


def measure(
    repeats: int, big: int, cycles: int, runner: str = "v1", warm: tuple[int, int] = (1, 16)
) -> dict[str, Any]:
    """Run the child for ``runner``; its JSON result."""
    from ._resize_child import MARK

    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cpu"),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    if runner == "v2":
        from initpipe_vllm.testing import triton_cpu

        env = triton_cpu.environ(env)
    args = [str(a) for a in (repeats, big, cycles, *warm)]
    got: dict[str, Any] = child_json(
        "benchmarks._resize_child", args, MARK, env, f"resize child ({runner})", 1200
    )
    if got["model_runner"] != runner:
        raise RuntimeError(f"the {runner} resize child ran runner {got['model_runner']!r}")
    return got


def _floor_row(name: str, seconds: float, floor_s: float, detail: str) -> Row:
    bound = FLOOR_FACTOR * floor_s + FLOOR_SLACK_S
    return Row(
        bench="resize",
        name=name,
        value=round(seconds * 1e3, 2),
        unit="ms",
        target=f"<= {FLOOR_FACTOR:g} x floor + {FLOOR_SLACK_S * 1e3:g} ms = {bound * 1e3:.1f} ms",
        met=seconds <= bound,
        detail=f"floor (drop the old KV bytes + torch.zeros of the new, same process) "
        f"{floor_s * 1e3:.2f} ms; {detail}",
    )


def _returned(report: dict[str, Any]) -> float:
    """Share of the freed KV bytes the teardown gave back to the OS: the worker's RSS drop
    from before the teardown to right after it (before the new cache is allocated)."""
    rank = report["ranks"][0]
    if rank["rss_before"] is None or rank["rss_torn_down"] is None or not report["bytes_freed"]:
        return float("nan")
    return (rank["rss_before"] - rank["rss_torn_down"]) / report["bytes_freed"]


def _steps(report: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v * 1e3:.1f}" for k, v in report["steps"].items())


def runner_rows(res: dict[str, Any], runner: str) -> list[Row]:
    """One runner's rows: the small and the large resizes against their floors, and the
    memory returned."""
    label = LABEL[runner]
    reports = res["resize"]
    totals = [r["total_s"] for r in reports]
    t_min, t_med = mm(totals)
    steps = {k: mm([r["steps"][k] for r in reports])[1] for k in reports[0]["steps"]}
    breakdown = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in steps.items())
    out = [
        _floor_row(
            f"{label} KV resize 32<->64 blocks (median)",
            t_med,
            res["resize_floor_s"],
            f"min {t_min * 1e3:.2f} ms over {len(totals)} resizes; median per step (ms): "
            f"{breakdown}",
        )
    ]
    mem = res["memory"]
    mib = mem["bytes"] / (1 << 20)
    for what, key, frm, to in (
        ("shrink", "shrinks", mib, mib / 4),
        ("grow", "grows", mib / 4, mib),
    ):
        samples = [r["total_s"] for r in mem[key]]
        out.append(
            _floor_row(
                f"{label} KV resize {frm:.0f} MiB -> {to:.0f} MiB (median)",
                mm(samples)[1],
                mem[f"{what}_floor_s"],
                f"{len(samples)} sample(s); last (ms): {_steps(mem[what])}",
            )
        )
    shrink, release = mem["shrink"], mem["release"]
    for name, rep, goal in (
        (f"shrink {mib:.0f} -> {mib / 4:.0f} MiB", shrink, MIN_SHRINK_RETURNED),
        (f"release of {mib:.0f} MiB", release, MIN_RELEASE_RETURNED),
    ):
        share = _returned(rep)
        rank = rep["ranks"][0]
        out.append(
            Row(
                bench="resize",
                name=f"{label} RSS returned by the {name} / freed KV bytes",
                value=round(share, 4),
                unit="x",
                target=f">= {goal}",
                met=share >= goal,
                detail=f"freed {rep['bytes_freed'] / (1 << 20):.1f} MiB, then allocated "
                f"{rep['bytes_allocated'] / (1 << 20):.1f} MiB; worker RSS "
                f"{rank['rss_before'] / (1 << 20):.1f} -> {rank['rss_torn_down'] / (1 << 20):.1f}"
                f" MiB across the teardown, {rank['rss_after'] / (1 << 20):.1f} MiB at the end "
                f"(after malloc_trim)",
            )
        )
    return out


def warm_rows(res: dict[str, Any], runner: str) -> list[Row]:
    """A resize keeping the prefix cache against the same resize dropping it: the difference
    is the copy of the kept blocks (set aside, then written back), twice their bytes."""
    label, warm = LABEL[runner], res["warm"]
    kept, dropped = warm["kept"], warm["dropped"]
    k_med, d_med = mm([r["total_s"] for r in kept])[1], mm([r["total_s"] for r in dropped])[1]
    carry = mm([r["steps"]["carry"] for r in kept])[1]
    last = kept[-1]
    pc, rank = last["prefix_cache"], last["ranks"][0]
    mib = 1 << 20
    peak_plain = max(last["bytes_freed"], last["bytes_allocated"])
    small, large = warm["sizes"][1], warm["sizes"][0]
    return [
        Row(
            bench="resize",
            name=f"{label} KV resize {large}<->{small} blocks keeping / dropping the prefix "
            "cache (median)",
            value=round(k_med / d_med, 3),
            unit="x",
            detail=f"kept median {k_med * 1e3:.2f} ms, dropped {d_med * 1e3:.2f} ms over "
            f"{len(kept)}+{len(dropped)} resizes, {pc['blocks_kept']} cached blocks kept "
            f"({pc['bytes_copied'] / mib:.1f} MiB); the carry step median {carry * 1e3:.2f} ms "
            f"vs its floor {warm['copy_s'] * 1e3:.2f} ms (the same bytes copied into fresh "
            "pages, then into an existing tensor, same process); "
            f"peak KV bytes {peak_plain / mib:.1f} MiB dropping, "
            f"{(peak_plain + rank['stash_bytes']) / mib:.1f} MiB keeping (both caches alive "
            f"would be {(last['bytes_freed'] + last['bytes_allocated']) / mib:.1f} MiB)",
        )
    ]


def restart_rows(
    res: dict[str, Any], llm_s: list[float], wall_s: list[float], source: str
) -> list[Row]:
    """A stock engine restart against the v1 resize (the capability's reason to exist)."""
    t_med = mm([r["total_s"] for r in res["resize"]])[1]
    out = []
    for samples, what, target in (
        (llm_s, "LLM() in-process", True),
        (wall_s, "whole process", False),
    ):
        ratio = mm(samples)[1] / t_med
        out.append(
            Row(
                bench="resize",
                name=f"engine restart ({what}) / KV resize (median)",
                value=round(ratio, 1),
                unit="x",
                target=f">= {MIN_RESTART_RATIO:g}" if target else "",
                met=(ratio >= MIN_RESTART_RATIO) if target else None,
                detail=f"restart = {source}, median {mm(samples)[1]:.3f} s; resize = v1's "
                f"32<->64 blocks median {t_med * 1e3:.2f} ms",
            )
        )
    return out


def restart_seconds(smoke: bool) -> tuple[list[float], list[float], str]:
    """Stock engine starts: reused from the engine bench when it ran in this run."""
    from .kv import restart_seconds as shared

    return shared(smoke)


def run(smoke: bool = False) -> list[Row]:
    """Rows for the benchmark runner: both runners' children, one after the other."""
    repeats, big, cycles = (4, 64 << 20, 1) if smoke else (40, 1 << 30, 3)
    warm = (1, 16) if smoke else (3, 64)
    results = {r: measure(repeats, big, cycles, r, warm) for r in RUNNERS}
    out = [row for r in RUNNERS for row in (*runner_rows(results[r], r), *warm_rows(results[r], r))]
    return out + restart_rows(results["v1"], *restart_seconds(smoke))
