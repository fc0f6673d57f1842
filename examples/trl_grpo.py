"""GRPO with TRL on a colocated vLLM engine whose weight sync is initpipe's checked refit.

Run it with ``VLLM_TARGET_DEVICE=cpu python examples/trl_grpo.py`` (on a GPU machine, without
the variable). It needs TRL installed without its ``vllm`` extra (``pip install trl``: the
extra pins vLLM <= 0.31). On 2 CPU cores it takes about 3 minutes for 2 steps on
SmolLM2-135M-Instruct (``initpipe_vllm.real_model``, converted once on first use): TRL
builds its engine with initpipe's worker (``INITPIPE_VLLM=1``), ``use_initpipe_refit`` makes
every weight sync a refit checked against the trainer's own model, and each sync prints the
receipt's first line and its check against the trainer.
"""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("INITPIPE_VLLM", "1")  # the engine TRL builds runs initpipe's worker
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # on a CPU: 1 GiB of KV cache
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # this example's lines only

QUESTIONS = (
    "What is the capital of France?",
    "Write one word that rhymes with cat.",
    "Name a color.",
)


def reward(completions: list[Any], **_: Any) -> list[float]:
    """1 for an answer naming Paris, less a little per word: a toy reward."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float("paris" in t.lower()) - 0.02 * len(t.split()) for t in texts]


def eager_engine() -> None:
    """TRL builds its engine without ``enforce_eager`` and has no option for it; on a CPU vLLM
    then compiles the model for minutes. Add it to the ``LLM`` TRL builds (the weight sync is
    the same either way)."""
    import trl.generation.vllm_generation as vg

    vg.LLM = functools.partial(vg.LLM, enforce_eager=True)


def build_trainer(model_dir: str | Path, output_dir: str | Path, steps: int, lr: float) -> Any:
    """TRL's GRPOTrainer in colocate mode: a tiny batch, the toy reward, an in-memory
    dataset."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    config = GRPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=12,
        max_steps=steps,
        learning_rate=lr,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        use_cpu=True,  # this example's CPU run; on a GPU, drop it and bf16=False
        bf16=False,  # TRL's default mixes bf16 into training; fp32 here
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.2,  # vLLM's CPU build checks it against free RAM
        vllm_max_model_length=512,
    )
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
    return GRPOTrainer(
        model=str(model_dir),
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": chats * 4}),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2, help="GRPO steps (default 2)")
    parser.add_argument("--lr", type=float, default=1e-4, help="the learning rate")
    args = parser.parse_args(argv)

    import tempfile

    from initpipe_vllm.integrations.trl import use_initpipe_refit
    from initpipe_vllm.real_model import smollm2

    eager_engine()
    with tempfile.TemporaryDirectory(prefix="trl-grpo-") as out:
        trainer = build_trainer(smollm2(), out, args.steps, args.lr)

        def show(receipt: Any) -> None:
            lines = str(receipt).splitlines()
            print(lines[0])
            print(next(x for x in lines if x.startswith("  reference:")))

        sync = use_initpipe_refit(trainer, on_receipt=show)  # the one line
        trainer.train()
    rewards = [round(h["reward"], 3) for h in trainer.state.log_history if "reward" in h]
    print(f"{args.steps} steps, mean reward per step {rewards}, {len(sync.receipts)} refits")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
