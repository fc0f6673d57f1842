"""Run several ``initpipe_vllm.tools.plan.plan`` cases in one process and print them as JSON.

Planning binds process-global vLLM state, so the tests run this as a script in a
subprocess: ``python _plan_cases.py TINY_DIR BIG_DIR``. Prints one JSON object (case name
-> plan dict, or ``{"error": ...}``) on the last line of stdout.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

TINY_ARGS = {"dtype": "float32", "max_model_len": 256, "max_num_seqs": 4}


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    tiny, big = sys.argv[1], sys.argv[2]
    from initpipe_vllm.tools.plan import plan

    def case(**kw: object) -> dict[str, object]:
        try:
            return plan(**kw).to_dict()  # type: ignore[arg-type]
        except Exception as err:
            return {
                "error": f"{type(err).__name__}: {err}",
                "cause": repr(err.__cause__) if err.__cause__ else None,
            }

    out: dict[str, object] = {}
    out["tiny_cpu_blocks"] = case(model_dir=tiny, num_blocks=512, backend="CPU_ATTN", **TINY_ARGS)
    out["tiny_cpu_bytes"] = case(model_dir=tiny, kv_bytes=64 << 20, **TINY_ARGS)
    out["tiny_fa"] = case(
        model_dir=tiny, num_blocks=512, backend="FLASH_ATTN", max_model_len=256, max_num_seqs=4
    )
    out["tiny_fa_fp32"] = case(model_dir=tiny, num_blocks=512, backend="FLASH_ATTN", **TINY_ARGS)
    out["tiny_too_small"] = case(model_dir=tiny, kv_bytes=1 << 10, **TINY_ARGS)
    # Sliding window + cross-layer KV sharing (the catalog's tiny Gemma 4), when present.
    gemma = os.path.join(os.path.dirname(tiny), "tiny-gemma4-kvshare")
    if os.path.isdir(gemma):
        for backend in ("FLASH_ATTN", "CPU_ATTN"):
            out[f"gemma4_{backend}"] = case(
                model_dir=gemma, num_blocks=64, backend=backend, max_model_len=256
            )
    for backend in ("FLASH_ATTN", "TRITON_ATTN", "CPU_ATTN"):
        rss0, t0 = _rss_mib(), time.perf_counter()
        result = case(model_dir=big, num_blocks=100_000, backend=backend)
        result["measured"] = {
            "wall_s": time.perf_counter() - t0,
            "rss_before_mib": rss0,
            "rss_after_mib": _rss_mib(),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
        out[f"big_{backend}"] = result
    # Llama-3-70B's shape at TP=8 x PP=2: one plan per pipeline stage
    huge = os.path.join(os.path.dirname(big), "llama3-70b-shape")
    t0 = time.perf_counter()
    out["huge_tp8_pp2"] = {
        "ranks": [
            case(
                model_dir=huge,
                num_blocks=20_000,
                backend="FLASH_ATTN",
                tensor_parallel_size=8,
                pipeline_parallel_size=2,
                pp_rank=rank,
            )
            for rank in (0, 1)
        ],
        "measured": {
            "wall_s": time.perf_counter() - t0,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        },
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
