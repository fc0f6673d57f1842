"""Model Runner V2 without an engine: the teardown against stock's, and a fault at every
stage (``mrv2_engineless_script.py``, one fresh subprocess: MRv2 needs Triton's interpreter
set up before vLLM is imported).

Teardown: MRv2's ``profile_cudagraph_memory`` (which calls ``_teardown_profiling_state``)
never runs on CPU, and vLLM's ``_init_minimal_kv_cache_for_profiling`` fails here
(``min(max_num_reqs, None)``), so the teardown is compared directly: stock's
``_teardown_profiling_state`` vs the pipelined runner's ``initpipe_teardown_profiling_state``
after the same KV phase, on models with and without KV-sharing fast prefill.

Faults: each MRv2 stage fails before it runs and right after it completed. The error names
the stage, its phase and the completed stages, keeps the cause's type; nothing half-built
stays on the runner; the failed pass's KV storages are freed; a retry equals a clean run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from initpipe_vllm.testing import installed_catalog, triton_cpu

SCRIPT = Path(__file__).with_name("mrv2_engineless_script.py")


@pytest.fixture(scope="module")
def result(script_result) -> dict:
    tests = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(
        p for p in (str(triton_cpu.SITE_DIR), tests, os.environ.get("PYTHONPATH")) if p
    )
    env = {**triton_cpu.environ({}), "PYTHONPATH": path}
    return script_result(str(SCRIPT), env=env)


def test_runners_are_mrv2(result) -> None:
    for rec in result["teardown"].values():
        assert rec["stock_class"] == "vllm.v1.worker.cpu.model_runner.CPUModelRunner"
        assert rec["pipelined_class"] == "PipelinedCPUModelRunnerV2"
        assert rec["plans_equal"]


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gemma4-fastprefill"])
def test_the_pipelined_teardown_equals_stocks_but_for_the_listed_differences(result, model):
    rec = result["teardown"][model]
    assert rec["init"] == [] and rec["torn_down"] == [] and rec["reinit"] == []
    # as stock: block_tables kept, the CUDA-graph manager dropped
    assert rec["stock_kept"]["block_tables"] and rec["pipelined_kept"]["block_tables"]
    assert not rec["stock_kept"]["cudagraph_manager"]
    assert not rec["pipelined_kept"]["cudagraph_manager"]
    assert not rec["pipelined_kept"]["fast_prefill"]
    if rec["stock_fast_prefill_before"]:  # the one deliberate difference, seen for real
        assert rec["stock_kept"]["fast_prefill"]
        (raw,) = rec["torn_down_raw"]
        assert "/cudagraphs/fast_prefill" in raw and "'holds_runner_manager': False" in raw
    else:
        assert rec["torn_down_raw"] == []


def test_fast_prefill_is_exercised(result) -> None:
    assert result["teardown"]["tiny-gemma4-fastprefill"]["stock_fast_prefill_before"]


def _check_error(err: dict, name: str, phase: str, order: list[str], after: bool) -> None:
    i = order.index(name)
    completed = order[: i + 1] if after else order[:i]
    assert err["is_stage_error"] and err["stage"] == name and err["phase"] == phase
    assert err["qualname"] == installed_catalog("v2").specs[name].qualname
    assert err["completed"] == completed
    assert err["rolled_back"] == completed[::-1]
    assert err["teardown_error"] is None
    assert err["cause"] == "Injected" and err["keeps_cause_type"]
    assert f"stage {name!r}" in err["text"]


def test_a_fault_at_every_kv_stage_rolls_back_frees_and_retries(result) -> None:
    faults = result["faults"]
    order = faults["order"]["kv_cache_config"]
    # the installed vLLM release's catalog (its variants included), the runner's own
    assert order == installed_catalog("v2").phase_order("kv_cache_config")
    assert faults["runner_catalog_is_installed"]
    seen = {(r["stage"], r["after"]) for r in faults["kv"]}
    assert seen == {(n, a) for n in order for a in (False, True)}
    for rec in faults["kv"]:
        where = f"{rec['stage']} after={rec['after']}"
        _check_error(rec["error"], rec["stage"], "kv_cache_config", order, rec["after"])
        assert rec["state_vs_torn_down"] == [], where  # nothing half-built on the runner
        assert not rec["kv_ready"], where
        assert rec["live_kv_allocations"] == 0, where  # the failed pass's KV freed
        assert rec["retry_vs_clean"] == [], where


def test_a_fault_at_every_model_stage_leaves_nothing_and_retries(result) -> None:
    faults = result["faults"]
    order = faults["order"]["model"]
    assert order == installed_catalog("v2").phase_order("model")
    assert {(r["stage"], r["after"]) for r in faults["model"]} == {
        (n, a) for n in order for a in (False, True)
    }
    for rec in faults["model"]:
        _check_error(rec["error"], rec["stage"], "model", order, rec["after"])
        assert rec["half_built"] == [] and rec["run_state"] == "started"
        assert rec["retry_built"] == [
            "model_state",
            "prompt_logprobs_worker",
            "sampler",
            "structured_outputs_worker",
        ]
