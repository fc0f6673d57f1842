"""Refit on a real tied model after a real training step: SmolLM2-135M-Instruct in bfloat16
(``initpipe_vllm.real_model``), one SGD step in transformers on fp32 master
weights, the weights handed over as a trainer holds them.

One subprocess (an in-process engine mutates its process):

- A: the bf16 checkpoint. The trainer loads it in fp32, takes one SGD step on a fixed
  sequence and saves B (fp32, tied: no ``lm_head.weight``), as ``save_pretrained`` does;
- the oracle: a fresh STOCK engine on B (``dtype="bfloat16"``: vLLM casts it), with its
  probe prompts served cold then warm (stock's own cold-vs-warm difference);
- the CONTROL: a stock engine on A, vLLM's ``reload_weights`` to B and
  ``reset_prefix_cache``: other tokens than fresh B (the tied head's stale CPU kernel);
- the engine under test (pipelined) on A: ``refit(llm, model.named_parameters())``, then
  back to A, then ``refit(llm, model.state_dict().items())`` (the tied head's copy beside
  the embedding): each equal to fresh B, the default probe passing at bfloat16's tolerance;
- the probe's other direction: with initpipe's repair and the load check switched off (a
  stale head reaches the probe), a probe expecting fresh B's outputs fails the refit closed;
- the check against the trainer's own model (``reference=``), after a gentle step (lr 0.02,
  as small as an RL step is next to the large one above) on a 131-token English text: it
  passes on the correct weights and fails closed on each planted defect (the head left on
  A's weights with initpipe's checks blinded, one layer's weight doubled on its way).

Run as a script (``python test_refit_real.py OUT.json WEIGHTS_DIR``) it is that subprocess.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from refit_kit import (
    ENGLISH,
    core as _core,
    default_prompts,
    digests as _digests,
    outputs as _outputs,
    stock_engine,
)
from requires import installed

installed("gguf", "gguf comes with the dev extra")
installed("accelerate", "accelerate comes with the dev extra")


def _kwargs(folder: Path, **more: Any) -> dict[str, Any]:
    return {
        "model": str(folder),
        "load_format": "auto",
        "skip_tokenizer_init": True,
        "enforce_eager": True,
        "dtype": "bfloat16",
        "max_model_len": 512,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 64,
        "seed": 0,
        "kv_cache_memory_bytes": 64 << 20,
        "num_gpu_blocks_override": 64,
        **more,
    }


def _stock_at(folder: Path) -> Any:
    return stock_engine(_kwargs(folder))


def _cold_warm(llm: Any, prompts: list[list[int]]) -> list[dict[str, Any]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from initpipe_vllm.live.refit.probe import Probe

    params = SamplingParams(
        max_tokens=Probe().max_tokens,
        temperature=0.0,
        ignore_eos=True,
        detokenize=False,
        logprobs=0,
    )
    runs = []
    for _ in ("cold", "warm"):
        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
        )
        runs.append(
            {
                "tokens": [list(o.outputs[0].token_ids) for o in outs],
                "logprobs": [
                    [
                        lp[t].logprob
                        for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids, strict=True)
                    ]
                    for o in outs
                ],
                "cached": [o.num_cached_tokens for o in outs],
            }
        )
    return runs


def _train_step(a: Path, b: Path | None, lr: float) -> Any:
    """One SGD step in transformers on fp32 master weights; B saved as a trainer saves it
    (``b=None``: not saved)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(a), dtype=torch.float32)
    ids = torch.tensor([[1, 9690, 2683, 314, 253, 1429, 28, 9, 2, 1, 4093, 198, 504, 2683]])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    model.zero_grad()
    if b is not None:
        model.save_pretrained(b)
    return model


#: The step the refit proofs above take: large (its logprobs reach -143), so a stale head
#: moves the probe's outputs past the expected-outputs tolerance.
STEP_LR = 0.5
#: The step of the check against the trainer's model: small, as an RL step is, and still a
#: model that answers in words (the large one is degenerate: its bf16 engine and fp32
#: trainer differ by about 7 nats on average, past any tolerance of bf16's arithmetic).
GENTLE_LR = 0.02


@contextlib.contextmanager
def _blind() -> Iterator[None]:
    """initpipe's repair off and its load check seeing nothing: a stale head is served."""
    import initpipe_vllm.live.refit.coverage as coverage

    repair, check = coverage.repair, coverage.check

    def nothing(*args: Any, **kwargs: Any) -> Any:
        import attrs

        return attrs.evolve(check(*args, **kwargs), problems=())

    coverage.repair = lambda *_a, **_k: {}  # type: ignore[assignment]
    coverage.check = nothing  # type: ignore[assignment]
    try:
        yield
    finally:
        coverage.repair, coverage.check = repair, check


def _fresh(b: Path, result: dict[str, Any]) -> list[list[int]]:
    # each stock engine in a function of its own: its LLM object is gone (and vLLM's
    # process-wide state with it) before the next one starts
    with _stock_at(b) as llm:
        prompts = default_prompts(llm)
        result["fresh_b"] = {"outputs": _outputs(llm), "digests": _digests(llm)}
        result["fresh_b"]["cold_warm"] = _cold_warm(llm, prompts)
    return prompts


def _control(a: Path, b: Path, result: dict[str, Any]) -> None:
    from initpipe_vllm.hook.packed import recording_packed_weights

    with _stock_at(a) as llm:
        result["fresh_a"] = {"outputs": _outputs(llm)}
        with recording_packed_weights():
            llm.collective_rpc("reload_weights", kwargs={"weights_path": str(b)})
        llm.reset_prefix_cache()
        result["control"] = {"outputs": _outputs(llm), "digests": _digests(llm)}


#: The tensor the "doubled" defect scales on its way from the trainer to the engine.
DOUBLED = "model.layers.15.mlp.down_proj.weight"


def _failure(refit: Any) -> dict[str, Any]:
    """How ``refit()`` failed (``{"error": None}``: it did not)."""
    try:
        refit()
    except Exception as err:
        return {
            "error": {
                "type": type(err).__name__,
                "step": getattr(err, "step", None),
                "message": str(err),
            }
        }
    return {"error": None}


def _against_the_trainer(ip: Any, llm: Any, a: Path, result: dict[str, Any]) -> None:
    """The refit checked against the trainer's own model (``reference=``), after a gentle
    step: it passes on the correct weights, and fails closed on each planted defect: a
    head left on A's weights (initpipe's own checks blinded), one tensor doubled on its
    way to the engine."""
    from transformers import AutoTokenizer

    gentle = _train_step(a, None, GENTLE_LR)
    text = AutoTokenizer.from_pretrained(str(a))(ENGLISH)["input_ids"]
    probe = {"prompts": [text]}
    receipt = ip.refit(llm, gentle.named_parameters(), reference=gentle, probe=probe)
    result["reference_ok"] = {"receipt": receipt.to_dict()}
    ip.refit(llm, a, probe=False)
    with _blind():
        result["stale_head_reference"] = _failure(
            lambda: ip.refit(llm, gentle.named_parameters(), reference=gentle, probe=probe)
        )
    ip.refit(llm, a, probe=False)
    doubled = {k: v.detach().clone() for k, v in gentle.state_dict().items()}
    doubled[DOUBLED] *= 2
    result["doubled_reference"] = _failure(
        lambda: ip.refit(llm, doubled, reference=gentle, probe=probe)
    )


def main(out: str, weights_dir: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import tempfile

    from vllm import LLM

    import initpipe_vllm as ip
    from initpipe_vllm.hook import PIPELINED_WORKER
    from initpipe_vllm.live.refit.probe import Probe
    from initpipe_vllm.real_model import smollm2

    a = smollm2()  # INITPIPE_CACHE_DIR: the suite's shared conversion
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="initpipe_refit_real_") as tmp:
        b = Path(tmp) / "step-1"
        trainer = _train_step(a, b, STEP_LR)
        prompts = _fresh(b, result)
        _control(a, b, result)
        llm = LLM(**_kwargs(a, worker_cls=PIPELINED_WORKER))
        _outputs(llm)

        def checkpoint(name: str, receipt: Any) -> None:
            result[name] = {
                "receipt": receipt.to_dict(),
                "outputs": _outputs(llm),
                "digests": _digests(llm),
            }

        checkpoint("named_parameters", ip.refit(llm, trainer.named_parameters()))
        checkpoint("back_to_a", ip.refit(llm, a))
        checkpoint("state_dict", ip.refit(llm, trainer.state_dict().items()))
        ip.refit(llm, a)
        fresh = result["fresh_b"]["cold_warm"][0]
        expecting_b = Probe(
            prompts=prompts, expected_tokens=fresh["tokens"], expected_logprobs=fresh["logprobs"]
        )
        with _blind():
            result["stale_head"] = _failure(lambda: ip.refit(llm, b, probe=expecting_b))
        checkpoint("expecting_b", ip.refit(llm, b, probe=expecting_b))
        _against_the_trainer(ip, llm, a, result)
        _core(llm).shutdown()
    Path(out).write_text(json.dumps(result))


# -- the tests -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def result(script_result: Any) -> Any:
    return script_result(__file__)


def test_the_training_step_changed_what_the_model_serves(result: Any) -> None:
    assert result["fresh_a"]["outputs"] != result["fresh_b"]["outputs"]


def test_vllms_own_reload_serves_a_stale_tied_head_on_the_real_model(result: Any) -> None:
    assert result["control"]["outputs"] != result["fresh_b"]["outputs"]
    assert result["control"]["digests"] != result["fresh_b"]["digests"]


@pytest.mark.parametrize("checkpoint", ["named_parameters", "state_dict", "expecting_b"])
def test_a_refit_from_the_trainer_is_a_fresh_engine_on_the_saved_weights(
    result: Any, checkpoint: str
) -> None:
    got, fresh = result[checkpoint], result["fresh_b"]
    assert got["outputs"] == fresh["outputs"]  # tokens, logprobs, prefix-cache hits
    assert got["digests"] == fresh["digests"]
    receipt = got["receipt"]
    assert receipt["weights"]["cast"] == {
        "float32->bfloat16": receipt["weights"]["cast"]["float32->bfloat16"]
    }
    assert set(receipt["checks"]["repaired"]) == {"lm_head"}
    probe = receipt["probe"]
    assert probe["ran"] and probe["ok"] and probe["atol"] == 0.25  # bfloat16's tolerance


def test_the_probe_passes_where_stock_cold_and_warm_differ_within_the_dtype(result: Any) -> None:
    """The probe's tolerance holds stock vLLM itself: its cold and warm runs of the probe's
    prompts differ by no more than bfloat16's default (tokens equal up to a near tie)."""
    from initpipe_vllm.live.refit.probe import _agreeing, default_atol

    cold, warm = result["fresh_b"]["cold_warm"]
    atol = default_atol("bfloat16")
    for i in range(len(cold["tokens"])):
        c = {"tokens": cold["tokens"][i], "logprobs": cold["logprobs"][i]}
        w = {"tokens": warm["tokens"][i], "logprobs": warm["logprobs"][i]}
        n, why = _agreeing(c, w, atol)
        assert why == ""
        assert all(
            abs(x - y) <= atol for x, y in zip(c["logprobs"][:n], w["logprobs"][:n], strict=True)
        )
    assert all(hit > 0 for hit in warm["cached"])


def test_a_probe_expecting_the_fresh_outputs_fails_on_a_stale_head(result: Any) -> None:
    err = result["stale_head"]["error"]
    assert err is not None, "a stale head passed the probe"
    assert err["type"] == "RefitError" and err["step"] == "probe", err
    assert "expected" in err["message"]


def test_a_refit_checked_against_the_trainers_model_passes_and_says_so(result: Any) -> None:
    """The trainer's own forward pass of the probe's prompt agrees with the refitted
    engine's prompt logprobs within bfloat16's tolerance; the receipt records how close."""
    from initpipe_vllm.live.refit.probe import reference_tolerance

    probe = result["reference_ok"]["receipt"]["probe"]
    assert probe["reference_checked"] and probe["ok"]
    assert list(probe["reference_tolerance"]) == list(reference_tolerance("bfloat16"))
    assert 0 < probe["reference_mean_diff"] <= probe["reference_max_diff"]
    assert probe["reference_max_diff"] <= probe["reference_tolerance"][0]


@pytest.mark.parametrize("defect", ["stale_head_reference", "doubled_reference"])
def test_each_planted_defect_fails_the_refit_against_the_trainers_model(
    result: Any, defect: str
) -> None:
    """A head left on the old weights (initpipe's own checks blinded) and one tensor doubled
    on its way: the engine's prompt logprobs leave the trainer's, and the refit fails closed
    at the probe, naming where."""
    err = result[defect]["error"]
    assert err is not None, f"{defect} passed the check against the trainer's model"
    assert err["type"] == "RefitError" and err["step"] == "probe", err
    assert "the engine does not serve the reference's weights" in err["message"]


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
