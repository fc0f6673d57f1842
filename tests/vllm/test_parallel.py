"""Several workers: stock vs pipelined engines with tensor and with pipeline parallelism,
every rank compared.

The equivalence harness (``python -m initpipe_vllm.testing.equivalence``, one subprocess
per parallel layout) runs vLLM's multiprocess executor with two worker processes on seeded
KV-sensitive weights: greedy tokens and logprobs of the prefix-cache workload, and each
rank's ``runner_snapshot`` (read with ``collective_rpc``) at start, after the workload and
through vLLM's profiling re-initialization, must equal the stock rank's exactly.

- TP=2 on tiny-llama (dense) and tiny-gemma2 (two KV cache groups: sliding window + full);
  each rank holds half the KV heads.
- PP=2 on tiny-llama; each rank holds half the layers. vLLM's CPU runner needs
  ``enforce_eager=False`` for PP (stock fails at the first step in eager mode).

On CPU the harness binds each rank's threads (``VLLM_CPU_OMP_THREADS_BIND``, split by
``initpipe_vllm.hook.parallel``): vLLM stops on a one-NUMA-node machine otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

CASES = {
    "tp2": (["tiny-llama", "tiny-gemma2"], ["--tensor-parallel-size", "2"]),
    "pp2": (["tiny-llama"], ["--pipeline-parallel-size", "2"]),
}
RANKS = ("rank0", "rank1")


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory, harness: Any) -> dict[str, Any]:
    found: dict[str, Any] = {"logs": {}}
    for case, (models, flags) in CASES.items():
        tmp = tmp_path_factory.mktemp(case)
        for rep in harness(tmp, models, *flags):
            found[f"{case}-{Path(rep['model']).name}"] = rep
        found["logs"][case] = (tmp / "harness.log").read_text()
    return found


PAIRS = [f"{case}-{m}" for case, (models, _) in CASES.items() for m in models]


@pytest.mark.parametrize("pair", PAIRS)
def test_every_rank_of_the_pipelined_engine_equals_stocks(reports: Any, pair: str) -> None:
    rep = reports[pair]
    assert "error" not in rep, rep.get("error")
    assert rep["diffs"] == [] and rep["equal"]
    assert rep["problems"] == []  # past a block, finite, prefix-cache hits
    assert rep["meta"]["pipelined"]["runner_classes"] == ["PipelinedCPUModelRunner"] * 2
    assert rep["meta"]["stock"]["runner_classes"] == ["CPUModelRunner"] * 2
    stock = rep["stock"]
    for key in ("init", "after_a", "reinitialized", "after_b"):
        assert sorted(stock[key]) == list(RANKS), key  # both ranks were compared
    for rank in RANKS:  # every rank's KV blocks were written by the workload
        assert any(stock["after_a"][rank]["nonzero_blocks"])
    assert rep["prefix_caching"]["enabled"] is True
    assert all(n > 0 for n in rep["prefix_caching"]["num_cached_tokens"])


def test_tensor_parallel_ranks_hold_half_the_kv_heads(reports: Any) -> None:
    for model in CASES["tp2"][0]:
        snap = reports[f"tp2-{model}"]["stock"]["after_a"]
        for rank in RANKS:
            heads = {g["spec"]["num_kv_heads"] for g in snap[rank]["kv_cache_config"]["groups"]}
            assert heads == {1}, (model, rank, heads)  # 2 KV heads split over 2 ranks
    gemma = reports["tp2-tiny-gemma2"]["stock"]["after_a"]["rank0"]
    assert {g["spec"]["type"] for g in gemma["kv_cache_config"]["groups"]} == {
        "SlidingWindowSpec",
        "FullAttentionSpec",
    }


def test_pipeline_parallel_ranks_hold_different_layers(reports: Any) -> None:
    snap = reports["pp2-tiny-llama"]["stock"]["after_a"]
    layers = [
        sorted(n for g in snap[rank]["kv_cache_config"]["groups"] for n in g["layer_names"])
        for rank in RANKS
    ]
    assert layers[0] and layers[1] and not set(layers[0]) & set(layers[1]), layers


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_ranks_stage_lines_name_the_rank(reports: Any, case: str) -> None:
    log = reports["logs"][case]
    for rank in (0, 1):
        assert f"initpipe rank {rank} kv_cache_config allocated_kv_caches" in log, case
        assert f"initpipe rank {rank} kv_cache_config phase: " in log, case


@pytest.mark.parametrize("case", sorted(CASES))
def test_initpipe_plan_of_each_rank_matches_its_real_allocation(reports: Any, case: str) -> None:
    """``initpipe plan --tensor-parallel-size / --pipeline-parallel-size``, planned on meta
    in one process, gives each rank the KV views the real stock workers allocated."""
    import json
    import os
    import subprocess
    import sys

    from initpipe_vllm.testing import model_dir

    snap = reports[f"{case}-tiny-llama"]["stock"]["after_a"]
    cmd = [sys.executable, "-m", "initpipe_vllm.tools.plan", "--json"]
    cmd += ["--model", str(model_dir("tiny-llama"))]
    cmd += ["--num-blocks", str(snap["rank0"]["kv_cache_config"]["num_blocks"])]
    cmd += ["--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "4"]
    cmd += ["--max-num-batched-tokens", "64", *CASES[case][1]]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    plans = out if isinstance(out, list) else [out, out]  # TP ranks allocate the same
    for rank, plan in zip(RANKS, plans, strict=True):
        keys = ("shape", "stride", "dtype")
        real = [{k: v[k] for k in keys} for v in snap[rank]["runner_kv_caches"]]
        planned = [{k: lp[k] for k in keys} for lp in plan["layers"]]
        assert planned == real, rank
