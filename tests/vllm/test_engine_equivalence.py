"""The acceptance test: real engines, stock vs pipelined worker, compared exactly.

Each group of architectures runs in ONE subprocess (``python -m
initpipe_vllm.testing.equivalence``): an in-process engine mutates its process (thread binding,
torch monkeypatches), so it never runs inside pytest. For every model the harness starts
a stock and a pipelined engine, generates (or embeds) from token-id prompts, snapshots the
runner, re-initializes the KV cache as vLLM's profiling pass does, runs a second workload,
and compares outputs and snapshots at every step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from initpipe_vllm.testing import model_dir

GROUPS = {
    "attention": [
        "tiny-llama",
        "tiny-gemma2",
        "tiny-bert",
        "tiny-gemma4-kvshare",
        "tiny-gemma4-fastprefill",
        "tiny-llama-connector",
    ],
    # MLA, Mamba2 hybrid, short-conv hybrid, attention sinks + MoE + sliding window.
    "hybrid": ["tiny-deepseek-mla", "tiny-nemotron-h", "tiny-lfm2", "tiny-gpt-oss"],
}


def _harness(tmp: Path, models: list[str], *extra: str) -> list[dict]:
    out = tmp / "report.json"
    cmd = [sys.executable, "-m", "initpipe_vllm.testing.equivalence", "--json", str(out), *extra]
    for m in models:
        cmd += ["--model", str(model_dir(m))]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, dict]:
    found = {}
    for group, models in GROUPS.items():
        for rep in _harness(tmp_path_factory.mktemp(group), models):
            found[Path(rep["model"]).name] = rep
    return found


def _check(rep: dict) -> dict:
    assert "error" not in rep, rep.get("error")
    assert rep["diffs"] == []
    assert rep["equal"]
    assert rep["meta"]["pipelined"]["runner_class"] == "PipelinedCPUModelRunner"
    assert rep["meta"]["stock"]["runner_class"] == "CPUModelRunner"
    # init (1) + cleanup/profiling (2) + real (3): the pipelined KV phase ran three times.
    assert rep["meta"]["pipelined"]["kv_generation"] == 3
    stock = rep["stock"]
    assert stock["outputs_a"] and stock["outputs_b"]
    return stock


@pytest.mark.parametrize("model", [m for ms in GROUPS.values() for m in ms])
def test_stock_and_pipelined_engines_are_identical(reports, model) -> None:
    stock = _check(reports[model])
    snap = stock["after_a"]
    if model != "tiny-bert":  # decoder KV blocks were written by the workload
        assert any(snap["nonzero_blocks"])
        assert stock["reinitialized"]["nonzero_blocks"] == [[] for _ in snap["nonzero_blocks"]]
        assert (
            stock["profiling"]["kv_cache_config"]["num_blocks"]
            < snap["kv_cache_config"]["num_blocks"]
        )  # the minimal profiling cache
    else:  # encoder-only: no KV cache groups from the engine
        assert snap["runner_kv_caches"] == []


def test_the_architectures_cover_what_they_claim(reports) -> None:
    def snap(m):
        return reports[m]["stock"]["after_a"]

    assert len(snap("tiny-gemma2")["attn_groups"]) == 2
    assert {g["spec"]["type"] for g in snap("tiny-gemma2")["kv_cache_config"]["groups"]} == {
        "SlidingWindowSpec",
        "FullAttentionSpec",
    }
    bert = snap("tiny-bert")
    assert bert["kv_cache_config"]["groups"][-1]["spec"]["type"] == "EncoderOnlyAttentionSpec"
    assert len(bert["runner_only_attn_layers"]) == 2
    kvshare = snap("tiny-gemma4-kvshare")
    assert len(kvshare["shared_kv_cache_layers"]) == 2
    heads = {g["spec"]["head_size"] for g in kvshare["kv_cache_config"]["groups"]}
    assert heads == {32, 64}  # mixed head sizes
    fast = snap("tiny-gemma4-fastprefill")
    assert len(fast["kv_sharing_fast_prefill_eligible_layers"]) == 2
    assert any(
        g["backend_class"].startswith("FastPrefill") for gs in fast["attn_groups"] for g in gs
    )
    assert snap("tiny-deepseek-mla")["attn_groups"][0][0]["backend"] == "CPU_MLA"
    meta = reports["tiny-llama-connector"]["meta"]["pipelined"]
    assert meta["kv_connector_registered"] is True  # ExampleConnector, not profiling
    assert reports["tiny-llama"]["meta"]["pipelined"]["kv_connector_registered"] is False
    for hybrid in ("tiny-nemotron-h", "tiny-lfm2"):
        assert snap(hybrid)["init_slot_mapping_modes"][0] == "SlotMappingMode.NONE"


def test_pipelined_worker_in_multiprocess_mode(tmp_path) -> None:
    (rep,) = _harness(tmp_path, ["tiny-llama"], "--multiprocess", "--no-reinit")
    assert "error" not in rep, rep.get("error")
    assert rep["diffs"] == [] and rep["equal"]
    assert rep["meta"]["pipelined"]["runner_class"] == "PipelinedCPUModelRunner"
