"""KV allocation at size: the pipelined KV phase vs stock vLLM's and vs ``torch.zeros``.

For each size (64 MiB to 2 GiB; ``--smoke``: 8 MiB) the engine's planner makes a KV config
of that many bytes for the live stock and pipelined runners of :mod:`benchmarks.kv`, and
three calls alternate (the order rotates each repeat): ``initialize_kv_cache`` on the
stock runner, the same on the pipelined runner, and a plain ``torch.zeros`` of the same
bytes (int8) on the runner's device — the memset floor any KV allocation pays. Each call
starts from no KV cache: the runners are cleaned up (``_cleanup_profiling_kv_cache``)
and the zeros dropped after every timed call, untimed, with a ``gc.collect()`` so only one
buffer is alive at a time. The figure is floor/pipelined (1.0 = the KV phase costs no
more than the memset).

Written device-agnostic (the device comes from the runner's config) but untested on CUDA
(no GPU on the development machines).
"""

from __future__ import annotations

import gc
import os
import time

from ._common import Row, mm
from .kv import MAX_RATIO, live_pair, sync

#: Target from PRODUCT.md: KV allocation >= 0.9x a plain torch.zeros of the same bytes.
MIN_FLOOR_RATIO = 0.9
MIB = 1 << 20
SIZES = (64 * MIB, 256 * MIB, 1024 * MIB, 2048 * MIB)
SMOKE_SIZES = (8 * MIB,)


def _label(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):g} GiB" if nbytes >= 1 << 30 else f"{nbytes // MIB} MiB"


def measure(size: int, repeats: int) -> tuple[dict[str, list[float]], int, int]:
    """Samples (s) of stock, initpipe and floor at ``size``; bytes allocated; num_blocks."""
    import torch

    pair = live_pair()
    for side in pair.values():
        if side.runner.kv_caches:
            side.cleanup()
    cfgs = {name: side.plan(memory=size) for name, side in pair.items()}
    (nbytes,) = {t.size for c in cfgs.values() for t in c.kv_cache_tensors}
    device = pair["initpipe"].device

    def floor() -> torch.Tensor:
        buf = torch.zeros(nbytes, dtype=torch.int8, device=device)
        sync()
        return buf

    names = ["stock", "initpipe", "floor"]
    out: dict[str, list[float]] = {n: [] for n in names}
    for i in range(repeats + 1):  # the first round is a warm-up
        for name in names[i % 3 :] + names[: i % 3]:
            gc.collect()
            t0 = time.perf_counter()
            if name == "floor":
                buf = floor()
                elapsed = time.perf_counter() - t0
                del buf  # freeing is untimed on every side
            else:
                pair[name].init(cfgs[name])
                elapsed = time.perf_counter() - t0
                pair[name].cleanup()
            if i:
                out[name].append(elapsed)
    gc.collect()
    return out, nbytes, cfgs["initpipe"].num_blocks


def run(smoke: bool = False) -> list[Row]:
    """Rows per size: floor/pipelined (target) and pipelined/stock."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    # The framework's cost at size: no per-stage log lines (see benchmarks.kv for both).
    os.environ["INITPIPE_LOG_STAGES"] = "0"
    sizes = SMOKE_SIZES if smoke else SIZES
    device = live_pair()["initpipe"].device
    rows = []
    for size in sizes:
        # more repeats where a sample is short (the noise of a shared machine matters more)
        repeats = 2 if smoke else (9 if size <= 256 * MIB else 5)
        t, nbytes, blocks = measure(size, repeats)
        (s_min, s_med), (p_min, p_med), (f_min, f_med) = (
            mm(t[k]) for k in ("stock", "initpipe", "floor")
        )
        detail = (
            f"{nbytes} bytes, {blocks} blocks, device {device}; initpipe min/med "
            f"{p_min * 1e3:.1f}/{p_med * 1e3:.1f} ms; stock {s_min * 1e3:.1f}/"
            f"{s_med * 1e3:.1f} ms; torch.zeros {f_min * 1e3:.1f}/{f_med * 1e3:.1f} ms; "
            f"{repeats} rotated repeats; INITPIPE_LOG_STAGES=0"
        )
        floor_ratio = f_med / p_med
        rows.append(
            Row(
                bench="alloc",
                name=f"KV allocation {_label(size)}: torch.zeros/initpipe (median)",
                value=round(floor_ratio, 4),
                unit="x",
                target=f">= {MIN_FLOOR_RATIO}",
                met=floor_ratio >= MIN_FLOOR_RATIO,
                detail=detail + f"; floor/stock {f_med / s_med:.4f}",
            )
        )
        ratio = p_med / s_med
        rows.append(
            Row(
                bench="alloc",
                name=f"KV allocation {_label(size)}: initpipe/stock (median)",
                value=round(ratio, 4),
                unit="x",
                target=f"<= {MAX_RATIO}",
                met=ratio <= MAX_RATIO,
                detail=detail + f"; ratio of mins {p_min / s_min:.4f}",
            )
        )
    return rows
