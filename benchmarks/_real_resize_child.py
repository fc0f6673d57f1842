"""Child process of :mod:`benchmarks.real`: a live resize of SmolLM2-135M-Instruct, warm
(the prefix cache kept) and cold, and the time to first token of a chat turn whose long
system prompt was cached before the resize.

Usage: ``python -m benchmarks._real_resize_child REPEATS``. Prints one JSON line after
``MARK``. One in-process engine with the pipelined worker (an in-process engine mutates its
process, so this runs apart from the parent), prefix caching on (vLLM's default), vLLM's
own prefill chunk. Each repeat, for ``keep`` in (True, False) alternating which goes first:
serve turn A (the system prompt and a first question), resize to the other size of
``SIZES`` with ``keep_prefix_cache=keep``, then serve turn B (the same system prompt, a new
question) for one token: its latency is the time to first token, and its cached tokens show
what the resize kept.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

MARK = "REAL-RESIZE-BENCH "
SIZES = (22, 40)
SYSTEM = (
    "You are a concise geography tutor. Answer in one short sentence, name the city first, "
    "and never add facts the student did not ask for. "
) * 14


def main(argv: list[str]) -> int:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("INITPIPE_LOG_STAGES", "0")
    repeats = int(argv[0])

    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    import initpipe_vllm as ip
    from initpipe_vllm.hook import PIPELINED_WORKER
    from initpipe_vllm.real_model import smollm2

    folder = smollm2()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))

    def turn(question: str) -> list[int]:
        chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        got = tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return list(got["input_ids"])

    a, b = turn("What is the capital of France?"), turn("What is the capital of Italy?")
    llm = LLM(
        model=str(folder),
        worker_cls=PIPELINED_WORKER,
        dtype="auto",
        enforce_eager=True,
        max_model_len=1024,
        num_gpu_blocks_override=SIZES[0],
        kv_cache_memory_bytes=64 << 20,
        seed=0,
    )

    def serve(prompt: list[int], tokens: int) -> tuple[float, int]:
        params = SamplingParams(max_tokens=tokens, temperature=0.0, detokenize=False)
        t = time.perf_counter()
        (out,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
        return time.perf_counter() - t, out.num_cached_tokens

    serve(a, 8)  # warm-up: first-call imports and caches, not counted
    size = SIZES[0]
    samples: dict[str, list[dict[str, Any]]] = {"warm": [], "cold": []}
    for i in range(repeats):
        for keep in (True, False) if i % 2 == 0 else (False, True):
            serve(a, 8)
            size = SIZES[1] if size == SIZES[0] else SIZES[0]
            report = ip.resize_kv_cache(llm, num_blocks=size, keep_prefix_cache=keep)
            ttft, cached = serve(b, 1)
            samples["warm" if keep else "cold"].append(
                {
                    "resize_s": report.total_s,
                    "ttft_s": ttft,
                    "cached_tokens": cached,
                    "prompt_tokens": len(b),
                    "kept_blocks": (report.to_dict()["prefix_cache"] or {}).get("blocks_kept", 0),
                }
            )
    llm.llm_engine.engine_core.shutdown()
    print(MARK + json.dumps(samples), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
