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


#: ``initpipe plan --json`` plans one pipeline stage per plan (every tensor-parallel rank of
#: a stage allocates the same) and prints one object for one stage, a list for several:
#: per case, the plan each rank must match (an index into that list).
PLAN_OF_RANK = {"tp2": {"rank0": 0, "rank1": 0}, "pp2": {"rank0": 0, "rank1": 1}}


def _views(views: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The KV views' shape, stride and dtype (what a plan states of each)."""
    return [{k: v[k] for k in ("shape", "stride", "dtype")} for v in views]


def _plans(out: Any, case: str) -> list[dict[str, Any]]:
    """The plans of ``initpipe plan --json``'s output, checked against the case's layout."""
    n_stages = len(set(PLAN_OF_RANK[case].values()))
    if n_stages == 1:
        assert isinstance(out, dict), f"{case}: one pipeline stage, one plan expected: {out!r:.200}"
        plans = [out]
    else:
        assert isinstance(out, list) and len(out) == n_stages, (case, type(out), len(out))
        plans = out
    flags = CASES[case][1]
    tp = int(flags[1]) if flags[0] == "--tensor-parallel-size" else 1
    for stage, plan in enumerate(plans):
        layout = (plan["pp_rank"], plan["pipeline_parallel_size"], plan["tensor_parallel_size"])
        assert layout == (stage, n_stages, tp), (case, stage, layout)
    return plans


@pytest.mark.parametrize("case", sorted(CASES))
def test_initpipe_plan_of_each_rank_matches_its_real_allocation(reports: Any, case: str) -> None:
    """``initpipe plan --tensor-parallel-size / --pipeline-parallel-size``, planned on meta
    in one process, gives each rank the KV views the real stock workers allocated: the same
    layers by name (in each KV cache group and bound in the forward context), each with
    the view that rank bound, and the runner's list of views in order."""
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
    plans = _plans(json.loads(proc.stdout), case)
    for rank in RANKS:
        plan, real = plans[PLAN_OF_RANK[case][rank]], snap[rank]
        groups = [g["layers"] for g in plan["groups"]]
        real_groups = [g["layer_names"] for g in real["kv_cache_config"]["groups"]]
        assert groups == real_groups, f"{rank}: planned groups {groups}, real {real_groups}"
        planned = {lp["name"]: _views([lp])[0] for lp in plan["layers"]}
        bound = {name: _views([lay["kv_cache"]])[0] for name, lay in real["layers"].items()}
        assert sorted(planned) == sorted(bound), (
            f"{rank}: planned layers {sorted(planned)}, allocated {sorted(bound)}"
        )
        assert planned == bound, rank
        assert _views(plan["layers"]) == _views(real["runner_kv_caches"]), rank
