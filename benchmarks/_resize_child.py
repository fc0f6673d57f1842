"""Child process of :mod:`benchmarks.resize`: one in-process engine, resized many times.

Prints one JSON line after ``MARK``. An in-process engine mutates its process (thread
binding), so this runs apart from the parent.
"""

from __future__ import annotations

import json
import os
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


def main(argv: list[str]) -> int:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("INITPIPE_LOG_STAGES", "0")
    import initpipe_vllm as ip

    repeats, big = int(argv[0]), int(argv[1])
    out: dict[str, Any] = {}
    # resize time: alternate two sizes on a live, warmed-up engine (one engine start)
    llm = _engine(8 << 20)
    _generate(llm)
    sizes = (32, 64)
    reports = []
    for i in range(repeats):
        reports.append(ip.resize_kv_cache(llm, num_blocks=sizes[i % 2]).to_dict())
        _generate(llm)
    out["resize"] = reports

    # memory on the same engine: grow to `big`, then big -> big/4 -> big -> release ->
    # resume, with the worker's RSS (this process)
    ip.resize_kv_cache(llm, kv_cache_memory_bytes=big)
    _generate(llm)
    t = time.perf_counter()
    shrink = ip.resize_kv_cache(llm, kv_cache_memory_bytes=big // 4).to_dict()
    shrink["wall_s"] = time.perf_counter() - t
    grow = ip.resize_kv_cache(llm, kv_cache_memory_bytes=big).to_dict()
    release = ip.release_kv_cache(llm).to_dict()
    resume = ip.resume_kv_cache(llm).to_dict()
    _generate(llm)
    out["memory"] = {
        "bytes": big,
        "shrink": shrink,
        "grow": grow,
        "release": release,
        "resume": resume,
    }
    llm.llm_engine.engine_core.shutdown()
    print(MARK + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
