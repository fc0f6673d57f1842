"""Child process of :mod:`benchmarks.resize`: one in-process engine, resized many times, and
the physical floor of each resize measured in the same process.

Prints one JSON line after ``MARK``. An in-process engine mutates its process (thread
binding), so this runs apart from the parent. Which runner the engine runs is the
environment's (the parent starts an MRv2 child with the test kit's ``triton_cpu.environ()``).

The floor of a resize from ``a`` to ``b`` bytes: dropping a tensor of ``a`` bytes, then
``torch.zeros`` of ``b`` bytes on the same device — what no resize can beat (the KV cache
must be freed and the new one zeroed).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

MARK = "RESIZE-BENCH "


def _engine(kv_bytes: int) -> Any:
    from vllm import LLM

    from initpipe_vllm.hook import PIPELINED_WORKER
    from initpipe_vllm.testing.equivalence import engine_kwargs
    from initpipe_vllm.tools.run import DEFAULT_MODEL

    kwargs, _ = engine_kwargs(DEFAULT_MODEL, kv_cache_memory_bytes=kv_bytes)
    return LLM(**kwargs, worker_cls=PIPELINED_WORKER)


def _generate(llm: Any) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, detokenize=False)
    llm.generate([TokensPrompt(prompt_token_ids=list(range(3, 200)))], params, use_tqdm=False)


def floor_seconds(old_bytes: int, new_bytes: int, repeats: int) -> float:
    """Median seconds of dropping ``old_bytes`` then ``torch.zeros(new_bytes)`` (int8, the
    KV allocation's dtype), each sample on a freshly zeroed old tensor."""
    import torch

    samples = []
    for _ in range(repeats):
        old = torch.zeros(old_bytes, dtype=torch.int8)
        t = time.perf_counter()
        del old
        new = torch.zeros(new_bytes, dtype=torch.int8)
        samples.append(time.perf_counter() - t)
        del new
    return statistics.median(samples)


def _fill(llm: Any, prompts: int, seed: int) -> None:
    """Cache ``prompts`` distinct prefixes of one full block each (128 tokens + 20)."""
    import random

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    rng = random.Random(seed)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
    batch = [
        TokensPrompt(prompt_token_ids=[rng.randrange(3, 500) for _ in range(148)])
        for _ in range(prompts)
    ]
    llm.generate(batch, params, use_tqdm=False)


def copy_seconds(nbytes: int, repeats: int) -> float:
    """The floor of a carry of ``nbytes`` (int8), median seconds: a fresh anonymous mapping
    filled with a copy (the stash: its pages are faulted in as it is written, as a new
    allocation's are), then a copy into an existing tensor (the write into the new cache,
    already zeroed by its KV phase)."""
    import mmap

    import torch

    src = torch.ones(nbytes, dtype=torch.int8)
    dst = torch.zeros_like(src)
    samples = []
    for _ in range(repeats):
        with mmap.mmap(-1, nbytes) as area:
            t = time.perf_counter()
            stash = torch.frombuffer(area, dtype=torch.int8)
            stash.copy_(src)
            dst.copy_(stash)
            samples.append(time.perf_counter() - t)
            del stash
    return statistics.median(samples)


def warm_vs_cold(llm: Any, cycles: int, prompts: int, sizes: tuple[int, int]) -> dict[str, Any]:
    """Resizes that keep the prefix cache and resizes that drop it, side by side: before
    each, ``prompts`` prefixes are cached; both directions, both kinds, alternating."""
    import initpipe_vllm as ip

    ip.resize_kv_cache(llm, num_blocks=sizes[0], keep_prefix_cache=False)
    order = ((sizes[1], True), (sizes[0], False), (sizes[1], False), (sizes[0], True))
    reports: dict[str, list[dict[str, Any]]] = {"kept": [], "dropped": []}
    for i in range(cycles):
        for blocks, keep in order:
            _fill(llm, prompts, seed=i * 10 + blocks)
            report = ip.resize_kv_cache(llm, num_blocks=blocks, keep_prefix_cache=keep)
            reports["kept" if keep else "dropped"].append(report.to_dict())
    kept_bytes = reports["kept"][-1]["prefix_cache"]["bytes_copied"]
    return {**reports, "sizes": sizes, "copy_s": copy_seconds(kept_bytes, 9)}


def main(argv: list[str]) -> int:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("INITPIPE_LOG_STAGES", "0")
    import initpipe_vllm as ip

    repeats, big, cycles = int(argv[0]), int(argv[1]), int(argv[2])
    out: dict[str, Any] = {}
    # resize time: alternate two sizes on a live, warmed-up engine (one engine start)
    llm = _engine(8 << 20)
    _generate(llm)
    out["model_runner"] = ip.kv_cache_info(llm).model_runner
    sizes = (32, 64)
    reports = []
    for i in range(repeats):
        reports.append(ip.resize_kv_cache(llm, num_blocks=sizes[i % 2]).to_dict())
        _generate(llm)
    out["resize"] = reports
    small = {(r["bytes_freed"], r["bytes_allocated"]) for r in reports[1:]}
    # both directions alternate: their floors' mean is the median resize's floor
    out["resize_floor_s"] = statistics.mean(floor_seconds(a, b, 9) for a, b in sorted(small))
    # keeping the prefix cache vs dropping it, on the same engine
    out["warm"] = warm_vs_cold(llm, int(argv[3]), int(argv[4]), (128, 96))

    # memory on the same engine: grow to `big`, then (big -> big/4 -> big) x cycles ->
    # release -> resume, with the worker's RSS (this process)
    ip.resize_kv_cache(llm, kv_cache_memory_bytes=big)
    _generate(llm)
    shrinks, grows = [], []
    for _ in range(cycles):
        shrinks.append(ip.resize_kv_cache(llm, kv_cache_memory_bytes=big // 4).to_dict())
        grows.append(ip.resize_kv_cache(llm, kv_cache_memory_bytes=big).to_dict())
    release = ip.release_kv_cache(llm).to_dict()
    resume = ip.resume_kv_cache(llm).to_dict()
    _generate(llm)
    shrink, grow = shrinks[-1], grows[-1]
    out["memory"] = {
        "bytes": big,
        "shrink": shrink,
        "shrinks": shrinks,
        "grow": grow,
        "grows": grows,
        "release": release,
        "resume": resume,
        # the same bytes as the engine's resizes, on the same heap, the engine still alive
        "shrink_floor_s": floor_seconds(shrink["bytes_freed"], shrink["bytes_allocated"], 3),
        "grow_floor_s": floor_seconds(grow["bytes_freed"], grow["bytes_allocated"], 3),
    }
    llm.llm_engine.engine_core.shutdown()
    print(MARK + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
