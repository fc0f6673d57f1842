"""The real model of the benchmarks: SmolLM2-135M-Instruct as converted
(:func:`initpipe_vllm.real_model.smollm2`) and the same after one training step."""

from __future__ import annotations

from pathlib import Path

#: Label of the real model's rows.
LABEL = "SmolLM2-135M-Instruct (bf16)"


def real_pair(cache: Path) -> list[Path]:
    """``[A, B]``: the converted checkpoint, and B: one SGD step in transformers on fp32
    master weights, saved in bfloat16 as a trainer's checkpoint (tied: no ``lm_head``),
    built under ``cache`` once."""
    from initpipe_vllm.real_model import smollm2

    a = smollm2()
    b = cache / "smollm2-step-1"
    if (b / "model.safetensors").is_file():
        return [a, b]
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(a), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(a))
    ids = tokenizer("The capital of France is Paris.", return_tensors="pt").input_ids
    model(input_ids=ids, labels=ids).loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.5 * p.grad
    model.to(torch.bfloat16).save_pretrained(b)
    tokenizer.save_pretrained(b)
    return [a, b]
