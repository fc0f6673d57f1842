"""Child process of :mod:`benchmarks.refit`: one in-process engine refitted many times, the
refit's physical floor measured in the same process, then engine restarts.

Usage: ``python -m benchmarks._refit_child MODEL_DIR CACHE_DIR KV_BYTES REPEATS RESTARTS``
(``MODEL_DIR`` ``smollm2``: the real model and a trained copy, :mod:`benchmarks._real`).
Prints one JSON line after ``MARK``. An in-process engine mutates its process (thread
binding), so this runs apart from the parent.

The floor of a refit to folder ``F``: reading every safetensors file of ``F`` fully into a
tensor, then ``torch.zeros`` of the engine's KV bytes per rank — what no refit can beat
(the new weights' bytes must be read and the KV cache must be zeroed).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

MARK = "REFIT-BENCH "


def _generate(llm: Any) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, detokenize=False)
    llm.generate([TokensPrompt(prompt_token_ids=list(range(3, 100)))], params, use_tqdm=False)


def probe_floor_seconds(llm: Any, prompts: Any, max_tokens: int) -> float:
    """Seconds to serve the probe's prompts as plain requests, cold (prefix cache reset
    first) then warm, as the probe does: the model's own compute, without the refit."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False, logprobs=0
    )
    batch = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
    llm.reset_prefix_cache()
    t = time.perf_counter()
    for _ in range(2):
        llm.generate(batch, params, use_tqdm=False)
    return time.perf_counter() - t


def read_seconds(folder: Path) -> float:
    """Seconds to read every safetensors file of ``folder`` fully into a fresh tensor."""
    import torch

    files = sorted(folder.glob("*.safetensors"))
    t = time.perf_counter()
    for path in files:
        buf = torch.empty(path.stat().st_size, dtype=torch.uint8)
        with path.open("rb", buffering=0) as f:
            view = memoryview(buf.numpy())
            got = 0
            while got < len(view):
                n = f.readinto(view[got:])
                if not n:
                    break
                got += n
        del view, buf
    return time.perf_counter() - t


def memset_seconds(kv_bytes: int) -> float:
    """Seconds of ``torch.zeros`` of ``kv_bytes`` (int8, the KV allocation's dtype)."""
    import torch

    t = time.perf_counter()
    kv = torch.zeros(kv_bytes, dtype=torch.int8)
    took = time.perf_counter() - t
    del kv
    return took


def _shutdown(llm: Any) -> None:
    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()


def main(argv: list[str]) -> int:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["INITPIPE_VLLM"] = "1"  # the pipelined worker, for the restarts too
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("INITPIPE_LOG_STAGES", "0")
    model_dir, cache_dir = Path(argv[0]), Path(argv[1])
    kv_bytes, repeats, restarts = int(argv[2]), int(argv[3]), int(argv[4])

    real = str(model_dir) == "smollm2"  # SmolLM2-135M-Instruct and a trained copy
    t = time.perf_counter()
    if real:
        from benchmarks._real import LABEL, real_pair

        folders = real_pair(cache_dir)
    else:
        from initpipe_vllm.testing.weights import seeded_model

        folders = [seeded_model(model_dir, cache_dir, seed=s) for s in (0, 1)]
    build_s = time.perf_counter() - t

    from vllm import LLM

    import initpipe_vllm as ip
    from initpipe_vllm.testing.equivalence import engine_kwargs

    # a user's engine: vLLM's own prefill chunk (not the equivalence workload's 64 tokens)
    dtype = {"dtype": "auto"} if real else {}  # the real model's own bfloat16
    kwargs, _ = engine_kwargs(
        folders[0], load_format="auto", kv_cache_memory_bytes=kv_bytes, **dtype
    )
    t = time.perf_counter()
    llm = LLM(**kwargs)
    start_s = time.perf_counter() - t
    _generate(llm)
    # one refit to warm up (first-call imports and caches), not counted
    ip.refit(llm, folders[1])
    _generate(llm)

    refits: list[dict[str, Any]] = []
    unprobed: list[dict[str, Any]] = []
    reads: list[float] = []
    memsets: list[float] = []
    plain: list[float] = []
    stock_reloads: list[float] = []
    at = 1  # the folder the engine serves now
    for _ in range(repeats):
        # alternate A/B: a probed refit, its floor, an unprobed refit, its floor
        for probe, out in ((True, refits), (False, unprobed)):
            at = 1 - at
            out.append(ip.refit(llm, folders[at], probe=probe).to_dict())
            _generate(llm)
            if probe:
                got = out[-1]["probe"]
                plain.append(probe_floor_seconds(llm, got["prompts"], len(got["tokens"][0])))
            reads.append(read_seconds(folders[at]))
            memsets.append(memset_seconds(out[-1]["kv_bytes_per_rank"][0]))
        # vLLM's own parts, called by hand as a user without initpipe would: reload_weights
        # (what the refit's load step calls) and reset_prefix_cache
        at = 1 - at
        t = time.perf_counter()
        llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folders[at])})
        llm.reset_prefix_cache()
        stock_reloads.append(time.perf_counter() - t)
        _generate(llm)
    info = ip.weights_info(llm)

    # a restart, as users without sleep mode do: drop the engine, start a fresh one on the
    # other weights, serve one request
    restart_s: list[float] = []
    for _ in range(restarts):
        at = 1 - at
        t = time.perf_counter()
        _shutdown(llm)
        del llm
        gc.collect()
        llm = LLM(**{**kwargs, "model": str(folders[at])})
        _generate(llm)
        restart_s.append(time.perf_counter() - t)
    _shutdown(llm)

    weight_bytes = sum(p.stat().st_size for p in folders[0].glob("*.safetensors"))
    result = {
        "model": LABEL if real else model_dir.name,
        "weight_bytes": weight_bytes,
        "build_s": build_s,
        "start_s": start_s,
        "refits": refits,
        "unprobed": unprobed,
        "read_s": reads,
        "memset_s": memsets,
        "probe_plain_s": plain,
        "floor_s": statistics.median(r + m for r, m in zip(reads, memsets, strict=True)),
        "restart_s": restart_s,
        "stock_reload_s": stock_reloads,
        "refits_done": info.refits,
    }
    print(MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
