"""Model Runner V2: stock vs pipelined engines on every embedded model, compared exactly.

MRv2 runs here through Triton's interpreter (``initpipe_vllm.testing.triton_cpu``), which
must be set up before vLLM is imported: each run is ONE subprocess of the equivalence
harness with ``--model-runner v2`` (it sets the interpreter up itself, and its spawned
engine cores and workers get it through the ``sitecustomize`` on ``PYTHONPATH``). For
every model the harness starts stock MRv2 and pipelined MRv2 on seeded real weights, runs
the KV-sensitive, prefix-cache workload, re-initializes the KV cache as vLLM's profiling
does (stock's ``_teardown_profiling_state`` vs the pipeline's teardown, a minimal profiling
cache, the real one again), and compares tokens, logprobs and MRv2 runner snapshots at every
step. Interpreted kernels are slow: the workloads are the harness's short ones.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from selected import selected
from waiting import run_watched

from initpipe_vllm.testing import MODELS, model_dir
from initpipe_vllm.testing.equivalence import MAX_MODEL_LEN, PREFILL_STEP

#: Every embedded model MRv2 runs: stock and pipelined must be identical.
EQUAL = [
    "tiny-llama",
    "tiny-gemma2",
    "tiny-bert",
    "tiny-gemma4-kvshare",
    "tiny-gemma4-fastprefill",
    "tiny-llama-connector",
    "tiny-deepseek-mla",
    "tiny-nemotron-h",
    "tiny-lfm2",
    "tiny-gpt-oss",
]
#: Embedded models stock MRv2 itself fails on here, with the words of its error and where
#: it is raised (the innermost frame; the innermost vLLM frame): the pipelined engine must
#: fail with exactly stock's error, in the same place. Jamba's Mamba1 mixer calls a
#: CUDA-only custom op through the interpreter-less path (vLLM's, not initpipe's).
REFUSED_BY_STOCK = {
    "tiny-jamba": "AttributeError: '_OpNamespace' '_C' object has no attribute "
    "'selective_scan_fwd'",
}
REFUSED_WHERE = {
    "tiny-jamba": ("torch._ops:_OpNamespace.__getattr__", "vllm._custom_ops:selective_scan_fwd"),
}
PREFIX_CACHING_OFF = ("tiny-bert", "tiny-deepseek-mla")
V2 = ("--model-runner", "v2")


@pytest.fixture(scope="module")
def reports(request, tmp_path_factory, harness) -> dict[str, dict]:
    """One harness run on the models the collected tests need (all of them but in the
    release tier, which selects some)."""
    models = selected(request, "model", EQUAL + list(REFUSED_BY_STOCK))
    found = harness(tmp_path_factory.mktemp("mrv2"), models, *V2)
    return {Path(rep["model"]).name: rep for rep in found}


def _check_equal(rep: dict, world: int = 1, kv_generations: int = 3) -> dict:
    assert "error" not in rep, rep.get("error")
    assert "refused" not in rep, rep.get("refused")
    assert rep["diffs"] == []
    assert rep["equal"] and rep["problems"] == []
    assert rep["model_runner"] == "v2"
    meta = rep["meta"]
    assert meta["stock"]["runner_classes"] == ["CPUModelRunner"] * world
    assert meta["pipelined"]["runner_classes"] == ["PipelinedCPUModelRunnerV2"] * world
    assert meta["stock"]["runner_version"] == meta["pipelined"]["runner_version"] == "v2"
    # init (1) + cleanup/profiling (2) + real (3): the pipelined KV phase ran three times.
    assert meta["pipelined"]["kv_generation"] == kv_generations
    return rep["stock"]


def test_every_embedded_model_is_equal_or_pinned() -> None:
    embedded = {p.name for p in MODELS.iterdir() if (p / "config.json").exists()}
    assert embedded == set(EQUAL) | set(REFUSED_BY_STOCK)


@pytest.mark.parametrize("model", EQUAL)
def test_stock_and_pipelined_mrv2_engines_are_identical(reports, model) -> None:
    stock = _check_equal(reports[model])
    init, after = stock["init"], stock["after_a"]
    assert init["runner_base_class"] == "CPUModelRunner"
    assert init["block_tables"] is not None and init["model_state"]["class"]
    if model != "tiny-bert":  # decoder KV blocks were written by the workload
        assert any(after["nonzero_blocks"])
        assert stock["reinitialized"]["nonzero_blocks"] == [[] for _ in after["nonzero_blocks"]]
        assert (
            stock["profiling"]["kv_cache_config"]["num_blocks"]
            < after["kv_cache_config"]["num_blocks"]
        )  # the minimal profiling cache
    cached = reports[model]["prefix_caching"]["num_cached_tokens"]
    if model in PREFIX_CACHING_OFF:
        assert cached == [0, 0]
    else:
        assert all(n > 0 for n in cached)


@pytest.mark.parametrize("model", EQUAL)
def test_the_teardown_leaves_what_stocks_teardown_leaves(reports, model) -> None:
    """After the profiling teardown: no KV cache config, no attention groups, no bound
    views, no CUDA-graph manager, as stock's ``_teardown_profiling_state`` leaves it."""
    cleaned = reports[model]["pipelined"]["cleaned"]
    assert cleaned["kv_cache_config"] is None and cleaned["attn_groups"] == []
    assert cleaned["runner_kv_caches"] == []
    assert cleaned["cudagraphs"]["manager"] == {"class": None}
    assert all(_unbound(v["kv_cache"]) for v in cleaned["layers"].values()), model


def _unbound(view) -> bool:
    """A layer's ``kv_cache`` as the teardown leaves it: an empty tensor (attention) or an
    empty list (Mamba-like layers hold a list of state tensors)."""
    return view == [] if isinstance(view, list) else view["shape"] == [0]


@pytest.mark.parametrize("model", sorted(REFUSED_BY_STOCK))
def test_where_stock_mrv2_fails_the_pipelined_engine_fails_the_same_way(reports, model):
    """The same error, raised in the same place (frame and vLLM function), after the same
    snapshots and outputs, with the same runner state at the failure."""
    rep = reports[model]
    assert rep["refused"] == {
        "stock": REFUSED_BY_STOCK[model],
        "pipelined": REFUSED_BY_STOCK[model],
    }
    assert rep["diffs"] == []
    assert rep["equal"]
    for side in ("stock", "pipelined"):
        failure = rep["failures"][side]
        assert (failure["raised_in"], failure["vllm_frame"]) == REFUSED_WHERE[model], side
        assert failure["stage"] is None  # in the forward, after the engine started
        # compared too (equal, as rep["diffs"] says): what was taken before it failed
        assert set(failure["partial"]) == {"init", "at_failure"}, side


def test_mrv2_with_the_engine_core_and_two_workers_in_their_own_processes(
    tmp_path, harness
) -> None:
    """Both other placements at once: the engine core in its own process and TP=2 through
    vLLM's multiprocess executor (each rank compared with its stock peer). Every spawned
    process builds MRv2 too (the test device's ``sitecustomize``). Without the re-init pass
    (the in-process run above covers it): interpreted kernels in four processes are slow."""
    (rep,) = harness(
        tmp_path,
        ["tiny-llama"],
        *V2,
        "--multiprocess",
        "--tensor-parallel-size",
        "2",
        "--no-reinit",
    )
    stock = _check_equal(rep, world=2, kv_generations=1)
    assert set(stock["init"]) == {"rank0", "rank1"}
    assert all(n > 0 for n in rep["prefix_caching"]["num_cached_tokens"])


PLANNED = ["tiny-llama", "tiny-gemma2", "tiny-gemma4-kvshare"]

#: One process plans every model (as ``tests/vllm_plan`` does): vLLM's import dominates.
_PLAN_SCRIPT = """
import json, sys
from initpipe_vllm.tools.plan import plan
out = {}
for path, blocks in json.loads(sys.argv[1]):
    out[path] = plan(path, int(blocks), max_model_len=%d, max_num_seqs=4,
                     max_num_batched_tokens=%d, dtype="float32",
                     model_runner="v2").to_dict()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def plans(reports) -> dict[str, dict]:
    """``initpipe plan --model-runner v2`` (meta device, no MRv2 run) of each model at the
    harness's engine settings and stock MRv2's block count."""
    jobs = [
        [str(model_dir(m)), reports[m]["stock"]["init"]["kv_cache_config"]["num_blocks"]]
        for m in PLANNED
    ]
    code = _PLAN_SCRIPT % (MAX_MODEL_LEN, PREFILL_STEP)
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_LOGGING_STREAM": "ext://sys.stderr"}
    proc = run_watched([sys.executable, "-c", code, json.dumps(jobs)], env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_path = json.loads(proc.stdout.strip().splitlines()[-1])
    return {m: by_path[str(model_dir(m))] for m in PLANNED}


def _views(items) -> list:
    return sorted((v["shape"], v["stride"], v["dtype"]) for v in items)


@pytest.mark.parametrize("model", PLANNED)
def test_an_mrv2_plan_is_what_stock_mrv2_allocates(reports, plans, model) -> None:
    """The MRv2 plan (MRv2's catalog on the meta device) against stock MRv2's runner at
    init (the harness's engine): the same KV views (shape, stride, dtype; KV-sharing
    aliases included), kernel block sizes and block-table widths."""
    stock = reports[model]["stock"]["init"]
    num_blocks = stock["kv_cache_config"]["num_blocks"]
    plan = plans[model]
    assert plan["model_runner"] == "v2" and plan["num_blocks"] == num_blocks
    assert plan["kernel_block_sizes"] == stock["kernel_block_sizes"]
    planned = [
        {"shape": lp["shape"], "stride": lp["stride"], "dtype": lp["dtype"]}
        for lp in plan["layers"]
    ]
    assert _views(planned) == _views(stock["runner_kv_caches"])
    widths = [shape[1] for shape in stock["block_tables"]["input_block_tables"]]
    assert plan["block_table_widths"] == widths
    assert any("planned with Model Runner V2's catalog" in n for n in plan["notes"])
    # the plan ran MRv2's own catalog, not v1's
    assert "block_tables" in plan["stages"] and "allocated_kv_caches" not in plan["stages"]


def test_initpipe_run_model_runner_v2_compares_with_stock_and_traces(tmp_path, capsys) -> None:
    """``initpipe run --model-runner v2 --compare-stock --resize 16 --trace``: it says it
    uses Triton's interpreter, runs the MRv2 catalog, matches stock MRv2, resizes the live
    engine to 16 blocks and matches a fresh stock MRv2 engine of that size; the trace
    overlays the MRv2 graph."""
    from initpipe.cli import main

    trace = tmp_path / "mrv2.json"
    cmd = [
        sys.executable,
        "-m",
        "initpipe.cli",
        "run",
        "--model",
        "tiny-llama",
        "--model-runner",
        "v2",
    ]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    proc = run_watched(
        [*cmd, "--compare-stock", "--resize", "16", "--trace", str(trace)], env=env, cwd=tmp_path
    )
    # the comparisons' lines whole (a difference lists 40 lines and the engines' numerics)
    compared = proc.stdout[proc.stdout.find("--resize 16:") :]
    assert proc.returncode == 0, compared[:8000] + proc.stderr[-3000:]
    assert "Model Runner V2 on a CPU: Triton's interpreter runs its kernels" in proc.stdout
    assert "runner: PipelinedCPUModelRunnerV2 (catalog initpipe_vllm.mrv2)" in proc.stdout
    assert "SAME as stock vLLM" in proc.stdout
    assert "--resize 16: SAME tokens and logprobs as a fresh stock engine of 16 blocks" in (
        proc.stdout
    )
    assert main(["graph", "initpipe_vllm.mrv2:pipeline", "--trace", str(trace)]) == 0
    assert "kv_caches_by_layer" in capsys.readouterr().out
