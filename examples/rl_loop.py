"""An RL loop on a real model: vLLM generates, a toy reward scores, torch takes a
policy-gradient step, initpipe refits the running engine with the new weights, repeat.

Run it with ``VLLM_TARGET_DEVICE=cpu python examples/rl_loop.py`` (on a GPU machine, without
the variable). On 2 CPU cores it takes about 3 minutes for 3 steps: SmolLM2-135M-Instruct
(``initpipe_vllm.real_model``, converted once, about 25 s, on first use), 8 sampled answers
per step, one REINFORCE step on fp32 master weights, one refit, and (unless
``--restart none``) a fresh stock engine started on the same weights, to compare.

Each step prints the mean reward, the refit receipt's first line, and the refit's time
against what a restart would cost: saving the checkpoint, then starting a fresh engine on
it in a new process (the import of vLLM and torch counted apart from the engine's start).
The toy reward is 1 for an answer that names Paris and is at most 12 words long, else 0:
something a few steps of a small learning rate can move.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# the workers share this process: a refit hands them the trainer's tensors as they are
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# vLLM's log on errors only: this page's lines are the loop's (VLLM_LOGGING_LEVEL=INFO for more)
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

QUESTIONS = (
    "What is the capital of France?",
    "Which city is the capital of France?",
    "Name the capital city of France.",
    "Tell me the capital of France.",
)
SAMPLES = 2  # per question: 8 answers a step
MAX_TOKENS = 24
ENGINE = {
    "dtype": "bfloat16",
    "enforce_eager": True,
    "max_model_len": 512,
    "max_num_seqs": 8,
    "kv_cache_memory_bytes": 64 << 20,
    "seed": 0,
}

#: A fresh stock engine in a new process: the cost of a restart on new weights.
_RESTART = """
import json, sys, time
t0 = time.perf_counter()
from vllm import LLM
t1 = time.perf_counter()
llm = LLM(model=sys.argv[1], **json.loads(sys.argv[2]))
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "start_s": t2 - t1}))
"""


def reward(text: str) -> float:
    """1.0 for a short answer that names Paris, else 0.0."""
    return float("Paris" in text and len(text.split()) <= 12)


def prompts(tokenizer: Any) -> list[list[int]]:
    """Each question as chat-formatted token ids."""
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
        )
        for q in QUESTIONS
    ]


def sample(llm: Any, chats: list[list[int]], step: int) -> list[tuple[list[int], list[int], str]]:
    """``SAMPLES`` answers to each chat at temperature 1: (prompt, answer ids, text)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, n=SAMPLES, seed=step)
    outs = llm.generate([TokensPrompt(prompt_token_ids=c) for c in chats], params, use_tqdm=False)
    return [
        (c, list(o.token_ids), o.text)
        for c, out in zip(chats, outs, strict=True)
        for o in out.outputs
    ]


def policy_gradient_step(
    policy: Any, optimizer: Any, batch: list[Any], rewards: list[float]
) -> None:
    """REINFORCE with the batch's mean reward as baseline, on the answers' tokens only."""
    import torch

    mean = sum(rewards) / len(rewards)
    optimizer.zero_grad()
    for (prompt, answer, _), r in zip(batch, rewards, strict=True):
        if not answer or r == mean:
            continue
        ids = torch.tensor([prompt + answer])
        logits = policy(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(answer)[:, None]).sum()
        (-(r - mean) * logp / len(batch)).backward()
    optimizer.step()


def restart_cost(policy: Any, tokenizer: Any, tmp: Path, step: int) -> dict[str, float]:
    """Save the weights as a checkpoint and start a fresh stock engine on them."""
    folder = tmp / f"step-{step}"
    t0 = time.perf_counter()
    policy.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    saved = time.perf_counter() - t0
    env = {k: v for k, v in os.environ.items() if k != "INITPIPE_VLLM"}  # vLLM's own worker
    out = subprocess.run(
        [sys.executable, "-c", _RESTART, str(folder), json.dumps(ENGINE)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return {"save_s": saved, **json.loads(out.stdout.splitlines()[-1])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="policy steps (default 3)")
    parser.add_argument("--lr", type=float, default=3e-5, help="Adam's learning rate")
    parser.add_argument(
        "--restart",
        choices=("every", "last", "none"),
        default="every",
        help="start a fresh engine on the new weights after every step (default), the last "
        "step only, or never",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams

    import initpipe_vllm as ip
    from initpipe_vllm.hook import PIPELINED_WORKER
    from initpipe_vllm.real_model import smollm2

    folder = smollm2(say=lambda line: print(line, file=sys.stderr, flush=True))
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    policy = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.lr)
    llm = LLM(model=str(folder), worker_cls=PIPELINED_WORKER, **ENGINE)
    chats = prompts(tokenizer)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)

    def answer() -> str:
        return (
            llm.chat([{"role": "user", "content": QUESTIONS[0]}], greedy, use_tqdm=False)[0]
            .outputs[0]
            .text
        )

    print(f"RL loop on {folder.name}: {len(chats) * SAMPLES} answers a step, Adam lr {args.lr}")
    print(f"before: {QUESTIONS[0]!r} -> {answer()!r}")
    with tempfile.TemporaryDirectory(prefix="rl_loop_") as tmp:
        for step in range(1, args.steps + 1):
            batch = sample(llm, chats, step)
            rewards = [reward(text) for _, _, text in batch]
            policy.train()
            policy_gradient_step(policy, optimizer, batch, rewards)
            # the trainer's fp32 master weights, cast to the engine's dtype as they are sent
            weights = ((n, p.detach().to(torch.bfloat16)) for n, p in policy.named_parameters())
            receipt = ip.refit(llm, weights)
            line = f"step {step}: mean reward {sum(rewards) / len(rewards):.3f}"
            print(f"{line} | {str(receipt).splitlines()[0]}")
            if args.restart == "every" or (args.restart == "last" and step == args.steps):
                cost = restart_cost(policy, tokenizer, Path(tmp), step)
                total = cost["save_s"] + cost["import_s"] + cost["start_s"]
                print(
                    f"  refit {receipt.total_s:.1f} s vs restart {total:.1f} s (save "
                    f"{cost['save_s']:.1f} s + import {cost['import_s']:.1f} s + engine start "
                    f"{cost['start_s']:.1f} s): {total / receipt.total_s:.1f}x"
                )
    print(f"after: {QUESTIONS[0]!r} -> {answer()!r}")
    print(f"{args.steps} steps in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
