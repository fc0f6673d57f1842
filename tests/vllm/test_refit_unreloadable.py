"""A model vLLM's reload cannot refit: the refit is refused before anything changes, and
the load's own check fails closed where that refusal is bypassed.

tiny-gpt-oss (GPT-OSS: a mixture of experts with attention sinks), seeded weights A then
B, in one subprocess. Its unquantized ``load_weights`` writes the experts' stacks and the
sinks with ``param.copy_`` directly, not through a weight loader; vLLM's layerwise reload
has those parameters on the meta device then, so the writes go nowhere and the layers are
put back with their old values ("GptOssRoutedExperts: Failed to load weights").

- the CONTROL: a stock engine on A, vLLM's own ``reload_weights`` to B and
  ``reset_prefix_cache``: other tokens than a fresh stock engine on B;
- the engine under test (pipelined) on A: ``refit(llm, B)`` is refused before anything
  changes, naming the experts, and on 0.32.0 the sinks (the fresh load recorded that
  ``load_weights`` writes them outside their weight loaders); the engine serves on, exactly
  as before;
- the same engine with that record cleared (as if the fresh load had not seen it): the
  refit fails closed at ``verify`` naming the same parameters; the engine then refuses
  requests (it would serve stale experts), and a retry fails the same way.

Run as a script (``python test_refit_unreloadable.py OUT.json WEIGHTS_DIR``) it is that
subprocess.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

MODEL = Path(__file__).resolve().parents[2] / "stages" / "models" / "tiny-gpt-oss"


def _outputs(llm: Any) -> Any:
    from initpipe_vllm.testing.equivalence import run_workload

    return run_workload(llm, "generate", salt=2)["outputs"]


def _kwargs(folder: Path, **more: Any) -> dict[str, Any]:
    from initpipe_vllm.testing.equivalence import workload_engine_kwargs

    kwargs, _ = workload_engine_kwargs(
        folder, num_gpu_blocks_override=40, load_format="auto", **more
    )
    return kwargs


def _stock(a: Path, b: Path) -> dict[str, Any]:
    from vllm import LLM

    from initpipe_vllm.testing.stock import require_stock, stock_environment

    out: dict[str, Any] = {}
    for name, folder in (("fresh_b", b), ("control", a)):
        with stock_environment():
            llm = LLM(**_kwargs(folder))
        require_stock(llm)
        if name == "control":
            _outputs(llm)
            llm.collective_rpc("reload_weights", kwargs={"weights_path": str(b)})
            llm.reset_prefix_cache()
        out[name] = _outputs(llm)
        llm.llm_engine.engine_core.shutdown()
        del llm
    return out


def _forget_outside(worker: Any) -> None:
    import attrs

    from initpipe_vllm.hook.fresh_load import FRESH_ATTR, fresh_load

    model = worker.model_runner.get_model()
    object.__setattr__(model, FRESH_ATTR, attrs.evolve(fresh_load(model), outside=None))


def _attempt(llm: Any, b: Path) -> dict[str, Any]:
    import initpipe_vllm as ip

    try:
        ip.refit(llm, b)
        out: dict[str, Any] = {"error": None}
    except ip.RefitError as err:
        out = {"type": type(err).__name__, "step": err.step, "message": str(err)}
        out["rank"] = getattr(err, "rank", None)
    out["state"] = ip.weights_info(llm).state
    return out


def _refit(a: Path, b: Path) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from initpipe_vllm.hook import PIPELINED_WORKER

    llm = LLM(**_kwargs(a, worker_cls=PIPELINED_WORKER))
    out: dict[str, Any] = {"before": _outputs(llm)}
    out["refused"] = _attempt(llm, b)
    out["after_refusal"] = _outputs(llm)
    llm.collective_rpc(_forget_outside)
    for attempt in ("first", "retry"):
        out[attempt] = _attempt(llm, b)
    params = SamplingParams(max_tokens=2, temperature=0.0, detokenize=False)
    try:
        llm.generate([TokensPrompt(prompt_token_ids=[5, 6, 7])], params, use_tqdm=False)
        out["serves"] = True
    except Exception as err:
        out["serves"] = [c.__name__ for c in type(err).__mro__]
    llm.llm_engine.engine_core.shutdown()
    return out


def main(out: str, weights_dir: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from initpipe_vllm.testing.weights import seeded_model

    a = seeded_model(MODEL, weights_dir)
    b = seeded_model(MODEL, weights_dir, seed=1)
    result = {"refit": _refit(a, b), **_stock(a, b)}
    Path(out).write_text(json.dumps(result))


@pytest.fixture(scope="module")
def result(script_result: Any) -> Any:
    return script_result(__file__)


def test_vllms_own_reload_serves_stale_experts(result: Any) -> None:
    """The control: if this fails, vLLM reloads GPT-OSS right; the refit must then pass
    and docs/how-to/refit.md's list of models that fail closed changes."""
    assert result["control"] != result["fresh_b"]


def test_the_refit_is_refused_before_any_change_naming_the_stale_parameters(
    result: Any,
) -> None:
    """The fresh load recorded the parameters GPT-OSS's ``load_weights`` writes itself (on
    vLLM 0.32.0 the experts and the sinks); the refit names them and changes nothing: the
    engine serves A's exact outputs on."""
    got = result["refit"]["refused"]
    assert got.get("type") == "RefitRefusedError", got
    assert got["step"] == "engine" and got["state"] != "failed"
    assert (
        "written by GptOssForCausalLM.load_weights outside their weight loaders" in (got["message"])
    )
    # the experts on every release (0.33.0 loads the sinks through their weight loader)
    assert "model.layers.0.mlp.experts.routed_experts.w13_bias" in got["message"]
    assert result["refit"]["after_refusal"] == result["refit"]["before"]


def test_without_the_record_the_load_check_fails_closed(result: Any) -> None:
    """The second net: with the refusal bypassed, ``verify`` finds the stale parameters."""
    for attempt in ("first", "retry"):
        got = result["refit"][attempt]
        assert got.get("type") == "RefitError", got
        assert got["step"] == "verify" and got["rank"] == 0 and got["state"] == "failed"
        assert "routed_experts.w13_weight was not written" in got["message"]
    assert "RefitFailedError" in result["refit"]["serves"]  # refused, not served stale


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
