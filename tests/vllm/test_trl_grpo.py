"""TRL's GRPOTrainer on initpipe's engine, its weight sync made initpipe's checked refit by
``initpipe_vllm.integrations.trl.use_initpipe_refit``: the real model, a few steps.

Two processes, one after the other (an engine under TRL's external launcher binds its
process):

- ``trl_grpo_script.py``: TRL builds its colocated engine (``INITPIPE_VLLM=1``: initpipe's
  worker); TRL's own sync fails; with the adapter, ``train()`` runs, each sync recorded (the
  engine's greedy outputs on fixed prompts, the trainer's weights saved); then the control:
  vLLM's ``reload_weights`` of the last weights, and the adapter's sync of the same;
- this file as a script: the oracle, a fresh STOCK engine on each saved weights folder, with
  TRL's engine settings, serving the same prompts.

Run as a script (``python test_trl_grpo.py OUT.json WEIGHTS_DIR``) it is the second process,
and it starts the first.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from refit_kit import stock_engine
from requires import installed

installed("trl", "TRL comes with the dev extra (without its vllm extra)")
installed("datasets", "datasets comes with the dev extra")

STEPS = 2
SCRIPT = Path(__file__).with_name("trl_grpo_script.py")


def _stock_outputs(folder: str, engine: dict[str, Any], prompts: list[list[int]]) -> Any:
    sys.path.insert(0, str(SCRIPT.parent))
    from trl_grpo_script import _outputs

    kwargs = {
        "model": folder,
        "dtype": "bfloat16",  # the trainer saved fp32; TRL's engine holds the checkpoint's bf16
        "skip_tokenizer_init": True,
        "enforce_eager": True,
        "kv_cache_memory_bytes": 256 << 20,
        **engine,
    }
    with stock_engine(kwargs) as llm:
        return _outputs(llm, prompts)


def main(out: str, _weights_dir: str) -> None:
    from initpipe_vllm.real_model import smollm2

    model = smollm2()  # INITPIPE_CACHE_DIR: the suite's shared conversion
    work = Path(out).parent / "trl"
    if not (work / "run.json").is_file():  # (kept: a rerun of the oracle alone reuses it)
        env = {**os.environ, "INITPIPE_VLLM": "1"}
        subprocess.run(
            [sys.executable, str(SCRIPT), str(work), str(model), str(STEPS)], env=env, check=True
        )
    run = json.loads((work / "run.json").read_text())
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the oracle's engines in this process
    start = time.perf_counter()
    oracle: dict[str, Any] = {}
    for sync in run["syncs"]:
        oracle[sync["folder"]] = _stock_outputs(sync["folder"], run["engine"], run["prompts"])
        shutil.rmtree(sync["folder"])  # 0.5 GB each
    oracle["seconds"] = time.perf_counter() - start
    Path(out).write_text(json.dumps({"run": run, "oracle": oracle}))


# -- the tests -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def result(script_result: Any) -> Any:
    return script_result(__file__)


def test_trl_builds_initpipes_worker_under_its_own_launcher(result: Any) -> None:
    run = result["run"]
    assert run["worker"] == "PipelinedCPUWorker"
    assert run["executor"] == "ExecutorWithExternalLauncher"


def test_trls_own_weight_sync_fails_on_vllms_cpu_build(result: Any) -> None:
    """TRL's colocate sync hands each tensor to ``load_weights``: on vLLM's CPU build a linear
    layer's weight lives in a packed kernel, its parameter has no loader."""
    assert "no attribute 'weight_loader'" in result["run"]["trl_sync"]


def test_grpo_trains_and_every_sync_is_a_refit_checked_against_the_trainer(result: Any) -> None:
    from initpipe_vllm.live.refit.probe import reference_tolerance

    run = result["run"]
    assert len(run["rewards"]) == STEPS
    # TRL syncs before each generation after step 0's; the adapter's own call after training
    assert [s["step"] for s in run["syncs"]] == list(range(STEPS + 1))
    for sync in run["syncs"]:
        receipt = sync["receipt_dict"]
        assert receipt["weights"]["transport"] == "in-process"  # no /dev/shm copy
        probe = receipt["probe"]
        assert probe["ran"] and probe["ok"] and probe["reference_checked"]
        assert list(probe["reference_tolerance"]) == list(reference_tolerance("bfloat16"))
        assert 0 < probe["reference_mean_diff"] <= probe["reference_max_diff"]
        assert "reference: " in sync["receipt"]


def test_after_every_sync_the_engine_is_a_fresh_stock_engine_on_the_trainers_weights(
    result: Any,
) -> None:
    for sync in result["run"]["syncs"]:
        assert sync["outputs"] == result["oracle"][sync["folder"]], f"step {sync['step']}"


def test_training_changed_what_the_engine_serves(result: Any) -> None:
    """The first sync hands over the checkpoint's own weights (TRL syncs before step 0's
    generation), the last one two steps later: other tokens, so the equalities above are not
    those of an unchanged model."""
    syncs = result["run"]["syncs"]
    first, last = result["oracle"][syncs[0]["folder"]], result["oracle"][syncs[-1]["folder"]]
    assert result["run"]["before"] == syncs[0]["outputs"]
    assert last["tokens"] != first["tokens"]


def test_vllms_own_reload_serves_a_stale_state_the_refit_repairs(result: Any) -> None:
    """vLLM's ``reload_weights`` of the trainer's last weights skips the tied head: its
    outputs are not a fresh engine's. The refit of the same weights names the repair."""
    run = result["run"]
    last = run["syncs"][-1]
    assert run["reload"]["step"] == last["step"]
    assert run["reload"]["outputs"] != result["oracle"][last["folder"]]
    assert set(last["receipt_dict"]["checks"]["repaired"]) == {"lm_head"}


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
