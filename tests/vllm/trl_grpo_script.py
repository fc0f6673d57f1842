"""TRL's GRPOTrainer on initpipe's engine, as a trainer user runs it: the subprocess of
``test_trl_grpo.py`` (an engine under TRL's external launcher binds its process).

    python trl_grpo_script.py OUT_DIR MODEL_DIR [STEPS]

SmolLM2-135M-Instruct (bf16), GRPO in colocate mode (TRL builds the engine itself, with
``INITPIPE_VLLM=1`` set: initpipe's worker), a tiny batch, a toy reward, an in-memory dataset:

1. TRL's own ``sync_weights`` before training: on vLLM's CPU build it raises (the error is
   recorded);
2. ``use_initpipe_refit(trainer)``, then ``train()`` for STEPS steps: TRL syncs before each
   generation after the first step; after every sync the engine's greedy outputs on fixed
   prompts are recorded and the trainer's weights saved (``OUT_DIR/step-K``), so a fresh
   stock engine on them can be compared (the test does, in another process);
3. the control after training: the engine back on the checkpoint, then the trainer's last
   weights pushed by vLLM's own ``reload_weights`` + ``reset_prefix_cache`` (what a TRL
   user would write instead), its outputs recorded and its prompt logprobs compared with
   the trainer's model; then the adapter's sync of the same weights, recorded the same way.

Writes ``OUT_DIR/run.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # before the example's ERROR

#: the fixed prompts the engine's outputs are recorded on after every sync (token ids:
#: the oracle runs without a tokenizer)
CHECK_TOKENS = 8
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _outputs(llm: Any, prompts: list[list[int]]) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=CHECK_TOKENS, temperature=0.0, logprobs=0)
    got = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    out = {"tokens": [], "logprobs": []}
    for r in got:
        c = r.outputs[0]
        out["tokens"].append(list(c.token_ids))
        out["logprobs"].append(
            [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs, strict=True)]
        )
    return out


def _reference_gap(llm: Any, model: Any, prompts: tuple[tuple[int, ...], ...]) -> dict[str, Any]:
    """The engine's prompt logprobs against the trainer model's (the refit's own check)."""
    import torch
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from initpipe_vllm.live.refit.reference import reference_logprobs

    ref = reference_logprobs(model, prompts, torch.bfloat16)
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    got = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params)
    diffs = []
    for r, p, want in zip(got, prompts, ref, strict=True):
        engine = [d[t].logprob for t, d in zip(p[1:], r.prompt_logprobs[1:], strict=True)]
        diffs += [abs(a - b) for a, b in zip(engine, want, strict=True)]
    return {"max": max(diffs), "mean": sum(diffs) / len(diffs), "n": len(diffs)}


def main() -> None:
    out_dir, model_dir = Path(sys.argv[1]), sys.argv[2]
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    import torch
    from transformers import AutoTokenizer

    sys.path.insert(0, str(EXAMPLES))
    from trl_grpo import QUESTIONS, build_trainer, eager_engine  # the page's example

    from initpipe_vllm.integrations.trl import use_initpipe_refit

    torch.manual_seed(0)
    eager_engine()
    tok = AutoTokenizer.from_pretrained(model_dir)
    chat = [[{"role": "user", "content": q}] for q in QUESTIONS]
    t0 = time.perf_counter()
    trainer = build_trainer(model_dir, out_dir / "trainer", steps, lr=1e-4)
    built_s = time.perf_counter() - t0
    gen = trainer.vllm_generation
    llm = gen.llm
    engine_config = llm.llm_engine.vllm_config
    record: dict[str, Any] = {
        "built_s": built_s,
        "worker": type(
            llm.llm_engine.model_executor.driver_worker.worker
        ).__name__,  # the pipelined worker?
        "executor": type(llm.llm_engine.model_executor).__name__,
        "engine": {
            "max_num_seqs": engine_config.scheduler_config.max_num_seqs,
            "max_num_batched_tokens": engine_config.scheduler_config.max_num_batched_tokens,
            "max_model_len": engine_config.model_config.max_model_len,
            "seed": engine_config.model_config.seed,
            "logprobs_mode": str(engine_config.model_config.logprobs_mode),
        },
    }
    texts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chat]
    prompts = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    record["prompts"] = prompts
    record["before"] = _outputs(llm, prompts)

    # 1. TRL's own sync, before any step (the weights are the engine's: nothing to change)
    try:
        gen.sync_weights()
        record["trl_sync"] = "ok"
    except Exception as err:
        record["trl_sync"] = f"{type(err).__name__}: {err}"

    # 2. the adapter: every sync a checked refit; after each, the outputs and the weights
    syncs: list[dict[str, Any]] = []
    model = trainer.accelerator.unwrap_model(trainer.model)

    def on_receipt(receipt: Any) -> None:
        folder = out_dir / f"sync-{len(syncs)}"
        model.save_pretrained(folder, safe_serialization=True)
        syncs.append(
            {
                "step": trainer.state.global_step,
                "folder": str(folder),
                "receipt": str(receipt),
                "receipt_dict": receipt.to_dict(),
                "reference_max": receipt.probe.reference_max_diff,
                "reference_mean": receipt.probe.reference_mean_diff,
                "outputs": _outputs(llm, prompts),
            }
        )
        print(str(receipt).splitlines()[0], flush=True)

    sync = use_initpipe_refit(trainer, on_receipt=on_receipt)
    t0 = time.perf_counter()
    trainer.train()
    record["train_s"] = time.perf_counter() - t0
    record["sync_s"] = list(sync.seconds)
    record["rewards"] = [h.get("reward") for h in trainer.state.log_history if "reward" in h]

    # 3. the control: the engine back on the checkpoint (a checked refit from its folder),
    # then the trainer's last weights through vLLM's own reload_weights, as a TRL user would
    # write the sync instead; then the adapter's sync of the same weights
    from initpipe_vllm import refit

    refit(llm, model_dir)
    weights = [(n, p.detach()) for n, p in model.named_parameters()]
    t0 = time.perf_counter()
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
    llm.reset_prefix_cache()
    record["reload_s"] = time.perf_counter() - t0
    record["reload"] = {
        "step": trainer.state.global_step,
        "outputs": _outputs(llm, prompts),
        "reference": _reference_gap(llm, model, sync.prompts),
    }
    sync()  # the adapter's sync of the same weights: saved as the last sync-K
    (out_dir / "run.json").write_text(json.dumps({**record, "syncs": syncs}, indent=1))


if __name__ == "__main__":
    main()
