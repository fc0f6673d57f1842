"""Resize over HTTP vs restarting the server.

Starts real OpenAI-compatible servers (``python -m vllm.entrypoints.openai.api_server``,
``initpipe_vllm.testing.server``) on the tiny Llama (dummy weights, eager, float32) with the
pipelined worker and ``--middleware initpipe_vllm.serve.kv_cache_routes``, and measures,
side by side in one run:

- a restart: stopping a server and starting one with the new size until it answers
  ``GET /health`` (what changing ``--num-gpu-blocks-override`` costs without initpipe);
- a resize over HTTP: ``POST /initpipe/kv_cache/resize`` alternating 32 <-> 64 blocks, as
  the client sees it (round trip), with a completion between resizes; the engine's own
  ``total_s`` from the report gives the HTTP + frontend share;
- the time to first token of a request sharing a long cached prefix (three blocks, 384
  tokens) right after a resize, the prefix cache kept or dropped (alternating; the
  completion of one token, as the client sees it).

Goal (PRODUCT.md): a live resize >= 20x faster than starting the engine. Never ran on a GPU.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from ._common import Row, mm

MIN_RESTART_RATIO = 20.0


def _engine_kwargs(blocks: int) -> dict[str, Any]:
    from initpipe_vllm.testing.equivalence import engine_kwargs
    from initpipe_vllm.tools.run import DEFAULT_MODEL

    kwargs, _ = engine_kwargs(DEFAULT_MODEL, num_gpu_blocks_override=blocks, max_model_len=512)
    kwargs["gpu_memory_utilization"] = 0.2
    kwargs["enable_prompt_tokens_details"] = True  # cached tokens in the usage
    return kwargs


def _spec(name: str, blocks: int) -> Any:
    from initpipe_vllm.hook import PIPELINED_WORKER
    from initpipe_vllm.serve import OPEN_ENV
    from initpipe_vllm.testing.server import ServerSpec

    return ServerSpec(
        name,
        _engine_kwargs(blocks),
        [
            "--worker-cls",
            PIPELINED_WORKER,
            "--middleware",
            "initpipe_vllm.serve.kv_cache_routes",
        ],
        {OPEN_ENV: "1", "VLLM_API_KEY": None, "VLLM_LOGGING_LEVEL": "WARNING"},
    )


def _resizes(url: str, n: int, out: dict[str, Any]) -> None:
    import httpx

    model = _engine_kwargs(64)["model"]
    with httpx.Client(base_url=url, timeout=300) as client:
        body = {"model": model, "prompt": list(range(3, 200)), "max_tokens": 4}
        for i in range(n):
            client.post("/v1/completions", json=body).raise_for_status()
            t0 = time.perf_counter()
            r = client.post("/initpipe/kv_cache/resize", json={"num_blocks": 32 if i % 2 else 64})
            out["http_s"].append(time.perf_counter() - t0)
            r.raise_for_status()
            out["engine_s"].append(r.json()["total_s"])


PREFIX_TOKENS = 384  # three blocks of 128


def _ttft(url: str, n: int, out: dict[str, Any]) -> None:
    """Prime a long prefix, resize keeping or dropping the cache (alternating), then time a
    one-token completion that shares the prefix."""
    import random

    import httpx

    model = _engine_kwargs(64)["model"]
    rng = random.Random(5)
    prefix = [rng.randrange(3, 500) for _ in range(PREFIX_TOKENS)]
    with httpx.Client(base_url=url, timeout=300) as client:
        for i in range(2 * n):
            keep = i % 2 == 0
            ask = {"model": model, "max_tokens": 1, "temperature": 0.0}
            prime = {**ask, "prompt": prefix + [rng.randrange(3, 500) for _ in range(8)]}
            client.post("/v1/completions", json=prime).raise_for_status()
            body = {"num_blocks": 32 if (i // 2) % 2 else 64, "keep_prefix_cache": keep}
            client.post("/initpipe/kv_cache/resize", json=body).raise_for_status()
            query = {**ask, "prompt": prefix + [rng.randrange(3, 500) for _ in range(8)]}
            t0 = time.perf_counter()
            r = client.post("/v1/completions", json=query)
            elapsed = time.perf_counter() - t0
            r.raise_for_status()
            cached = (r.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
            out["ttft_kept" if keep else "ttft_dropped"].append(elapsed)
            out["cached_kept" if keep else "cached_dropped"].append(cached or 0)


def measure(restarts: int, resizes: int) -> dict[str, Any]:
    """Restart and HTTP resize samples (seconds); the resizes run on the last server."""
    from initpipe_vllm.testing.server import running_servers

    out: dict[str, Any] = {"restart_s": [], "http_s": [], "engine_s": []}
    for key in ("ttft_kept", "ttft_dropped", "cached_kept", "cached_dropped"):
        out[key] = []
    with tempfile.TemporaryDirectory(prefix="initpipe_bench_serve_") as tmp:
        for i in range(restarts):
            t0 = time.perf_counter()
            with running_servers([_spec(f"server{i}", 32)], tmp) as servers:
                ready = time.perf_counter() - t0
                if i == restarts - 1:
                    _resizes(servers[f"server{i}"].url, resizes, out)
                    _ttft(servers[f"server{i}"].url, resizes // 2, out)
                stop_from = time.perf_counter()
            out["restart_s"].append(ready + (time.perf_counter() - stop_from))
    return out


def rows(res: dict[str, Any]) -> list[Row]:
    """Rows from :func:`measure`'s samples."""
    h_min, h_med = mm(res["http_s"])
    e_med = mm(res["engine_s"])[1]
    r_min, r_med = mm(res["restart_s"])
    ratio = r_med / h_med
    k_min, k_med = mm(res["ttft_kept"])
    d_min, d_med = mm(res["ttft_dropped"])
    ttft = Row(
        bench="serve",
        name="time to first token after a resize, prefix cache kept / dropped (median)",
        value=round(k_med / d_med, 3),
        unit="x",
        detail=f"a one-token completion sharing a {PREFIX_TOKENS}-token cached prefix, "
        f"right after a resize 32<->64 blocks: kept median {k_med * 1e3:.1f} ms (min "
        f"{k_min * 1e3:.1f}, cached tokens {sorted(set(res['cached_kept']))}), dropped "
        f"{d_med * 1e3:.1f} ms (min {d_min * 1e3:.1f}, cached tokens "
        f"{sorted(set(res['cached_dropped']))}), {len(res['ttft_kept'])} each, alternating",
    )
    return [
        Row(
            bench="serve",
            name="KV resize over HTTP, tiny model (median)",
            value=round(h_med * 1e3, 1),
            unit="ms",
            detail=f"min {h_min * 1e3:.1f} ms over {len(res['http_s'])} resizes 32<->64 "
            f"blocks (client round trip); the engine's own total: median {e_med * 1e3:.1f} ms",
        ),
        Row(
            bench="serve",
            name="server restart / KV resize over HTTP (median)",
            value=round(ratio, 1),
            unit="x",
            target=f">= {MIN_RESTART_RATIO:g}",
            met=ratio >= MIN_RESTART_RATIO,
            detail=f"restart (start until /health answers, then stop) median {r_med:.1f} s, "
            f"min {r_min:.1f} s over {len(res['restart_s'])}",
        ),
        ttft,
    ]


def run(smoke: bool = False) -> list[Row]:
    """Rows for the benchmark runner."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    return rows(measure(1 if smoke else 3, 6 if smoke else 30))
