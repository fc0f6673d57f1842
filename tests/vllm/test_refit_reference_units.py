"""Units of the refit's check against the caller's own model
(:mod:`initpipe_vllm.live.refit.reference` and the probe's comparison), on a small torch
module (no engine). The engine-level proof, on the real model after a training step with its
planted defects, is ``test_refit_real.py``."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from initpipe_vllm.live.refit.probe import (
    Probe,
    ProbeResult,
    _against_reference,
    reference_tolerance,
)
from initpipe_vllm.live.refit.receipt import RefitReceipt
from initpipe_vllm.live.refit.reference import (
    BadReference,
    probe_with_reference,
    reference_logprobs,
)

VOCAB = 50


class TinyLM(torch.nn.Module):
    """A causal LM's interface (``input_ids`` in, an object with ``.logits`` out)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.drop = torch.nn.Dropout(0.5)  # eval mode must switch it off
        self.head = torch.nn.Linear(16, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> Any:
        return SimpleNamespace(logits=self.head(self.drop(self.embed(input_ids))))


def _config(vocab: int = VOCAB, block: int = 4, max_len: int = 64) -> Any:
    model = SimpleNamespace(get_vocab_size=lambda: vocab, max_model_len=max_len)
    return SimpleNamespace(model_config=model, cache_config=SimpleNamespace(block_size=block))


def test_each_token_after_the_first_is_scored_in_eval_mode_and_training_mode_comes_back() -> None:
    model = TinyLM().train()
    prompt = [3, 7, 7, 1, 9]
    (got,) = reference_logprobs(model, [prompt])
    assert model.training
    model.eval()
    with torch.no_grad():
        lp = torch.log_softmax(model.head(model.embed(torch.tensor(prompt))), -1)
    want = [float(lp[j, prompt[j + 1]]) for j in range(len(prompt) - 1)]
    assert len(got) == 4 and max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-6


def test_the_weights_are_read_as_the_engine_holds_them_and_left_as_they_were() -> None:
    """``dtype``: each parameter rounded to the engine's dtype while the pass runs (its
    arithmetic stays float32), the trainer's own values back afterwards, exactly."""
    model = TinyLM()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    prompt = [3, 7, 7, 1, 9]
    (plain,) = reference_logprobs(model, [prompt])
    (held,) = reference_logprobs(model, [prompt], torch.bfloat16)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    rounded = TinyLM()
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    (want,) = reference_logprobs(rounded, [prompt])
    assert held == want and held != plain
    assert reference_logprobs(model, [prompt], torch.float32) == (plain,)


def test_the_given_prompts_are_scored_and_none_given_is_refused() -> None:
    probe = probe_with_reference(Probe(prompts=[[1, 2, 3, 4, 5]]), TinyLM(), _config())
    assert probe.reference_logprobs is not None and len(probe.reference_logprobs[0]) == 4
    assert probe.problems() == []
    with pytest.raises(BadReference, match=r"needs the prompts it scores: pass probe="):
        probe_with_reference(Probe(), TinyLM(), _config())


def test_a_reference_that_cannot_be_used_is_named() -> None:
    with pytest.raises(BadReference, match="needs the probe"):
        probe_with_reference(Probe(enabled=False), TinyLM(), _config())
    with pytest.raises(BadReference, match="needs the prompts it scores"):
        probe_with_reference(Probe(), [[-1.0, -2.0]], _config())
    with pytest.raises(BadReference, match="expected a torch module"):
        probe_with_reference(Probe(prompts=[[1, 2, 3]]), object(), _config())
    with pytest.raises(BadReference, match=r"could not score it \(IndexError: index out of range"):
        reference_logprobs(TinyLM(), [[1, 60, 2]])

    class NoLogits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return torch.zeros(7)

    with pytest.raises(BadReference, match=r"expected logits of shape \[1, tokens, vocab\]"):
        reference_logprobs(NoLogits(), [[1, 2, 3]])
    given = probe_with_reference(Probe(prompts=[[1, 2, 3]]), [[-1.0]], _config())
    assert given.problems() == [
        "reference_logprobs[0] has 1 values for a prompt of 3 tokens (expected one per "
        "token after the first)"
    ]


def test_the_first_position_past_the_tolerance_is_named_with_its_token() -> None:
    prompts = [[5, 6, 7, 8]]
    tol = (0.2, 0.1)
    worst, mean, why = _against_reference(prompts, [[-1.0, -2.0, -3.0]], [[-1.1, -2, -2.95]], tol)
    assert why == "" and math.isclose(worst, 0.1) and math.isclose(mean, 0.05)
    worst, mean, why = _against_reference(prompts, [[-1.0, -2.0, -3.0]], [[-1.1, -4.5, -9]], tol)
    assert worst == 2.5 and math.isclose(mean, 1.3)  # the two positions scored
    assert why.startswith("prompt 0, position 2 (token 7): logprob -2.0000 in the engine, ")
    assert "-4.5000 in the reference: 2.5 apart (tolerance 0.2 at a position)" in why
    _, mean, why = _against_reference(prompts, [[-1.0, -2.0, -3.0]], [[-1.15, -2.15, -3.15]], tol)
    assert math.isclose(mean, 0.15) and "0.15 on average over 3 positions (tolerance 0.1;" in why
    assert (
        "the engine gave 1 prompt logprobs, the reference 3"
        in (_against_reference(prompts, [[-1.0]], [[-1.0, -2.0, -3.0]], tol)[2])
    )
    assert "not finite" in _against_reference(prompts, [[-1, math.nan, 0]], [[-1, -2, 0]], tol)[2]


def test_the_tolerance_follows_the_engines_dtype() -> None:
    for i in (0, 1):
        assert reference_tolerance("float32")[i] < reference_tolerance("float16")[i]
        assert reference_tolerance("float16")[i] < reference_tolerance("bfloat16")[i]
    assert reference_tolerance("torch.bfloat16") == reference_tolerance("bfloat16")
    assert Probe(reference_tolerance=(1, -1)).problems() == [
        "reference_tolerance=(1, -1): expected (per position, on average), two finite numbers >= 0"
    ]


def test_the_receipt_says_what_the_reference_check_compared() -> None:
    result = ProbeResult(
        ran=True,
        ok=True,
        prompts=((1, 2, 3, 4),),
        tokens=((9, 9),),
        logprobs=((-0.5, -0.7),),
        cached_tokens=(3,),
        reference_checked=True,
        reference_max_diff=0.031,
        reference_mean_diff=0.012,
        reference_tolerance=(1.0, 0.15),
    )
    assert ProbeResult.from_dict(result.to_dict()) == result
    receipt = RefitReceipt(
        version="step-1",
        previous_version="default",
        digests=("sha256:0",),
        digest_checked=False,
        blocks_before=8,
        blocks_after=8,
        kv_bytes_per_rank=(1,),
        steps=(),
        probe=result,
        mode="wait",
    )
    assert (
        "  reference: 3 prompt logprobs against your model's, max diff 0.031, mean 0.012 "
        "(tolerance 1, 0.15 on average)"
    ) in str(receipt)
