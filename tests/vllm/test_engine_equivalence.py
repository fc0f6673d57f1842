"""The acceptance test: real engines, stock vs pipelined worker, compared exactly.

Each group of architectures runs in ONE subprocess (``python -m
initpipe_vllm.testing.equivalence``): an in-process engine mutates its process (thread binding,
torch monkeypatches), so it never runs inside pytest. For every model the harness starts
a stock and a pipelined engine on seeded real weights (built once per session in
``seeded_weights_dir``), generates (or embeds) from token-id prompts longer than a KV block,
repeats a prefix that must hit the prefix cache, snapshots the runner, re-initializes the
KV cache as vLLM's profiling pass does, runs a second workload, and compares tokens,
logprobs and snapshots exactly at every step. ``test_kv_sensitivity.py`` shows that this
workload sees a corrupted KV block.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from selected import selected

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
# Where vLLM itself turns prefix caching off, and the words it logs for why.
PREFIX_CACHING_OFF = {
    "tiny-bert": "Pooling models with bidirectional attn do not support prefix caching.",
    "tiny-deepseek-mla": "MLA is enabled on a non-GPU platform; forcing chunked prefill and "
    "prefix caching to be disabled.",
}


@pytest.fixture(scope="module")
def reports(request, tmp_path_factory, harness) -> dict[str, dict]:
    """One harness run per group, on the models the collected tests need (all of them but
    in the release tier, which selects some)."""
    wanted = selected(request, "model", [m for ms in GROUPS.values() for m in ms])
    found = {}
    for group, models in GROUPS.items():
        if run := [m for m in models if m in wanted]:
            for rep in harness(tmp_path_factory.mktemp(group), run):
                found[Path(rep["model"]).name] = rep
    return found


def _check(rep: dict) -> dict:
    assert "error" not in rep, rep.get("error")
    assert rep["diffs"] == []
    assert rep["equal"]
    assert rep["weights"] == "seeded"
    assert rep["problems"] == []  # prompts past a block, finite outputs, prefix-cache hits
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


@pytest.mark.parametrize("model", [m for ms in GROUPS.values() for m in ms])
def test_the_workload_spans_blocks_and_hits_the_prefix_cache(reports, model) -> None:
    rep = reports[model]
    for key in ("outputs_a", "outputs_b"):
        for engine in ("stock", "pipelined"):
            facts = rep[engine][key]["facts"]
            block = max([facts["block_size"], *facts["group_block_sizes"]])
            long, repeated = rep[engine][key]["outputs"]
            assert long["prompt_tokens"] > block and repeated["prompt_tokens"] > block
            if model != "tiny-bert":  # greedy tokens and logprobs, compared exactly
                assert len(repeated["logprobs"]) == len(repeated["token_ids"]) > 0
                if facts["kv_sharing_fast_prefill"]:  # vLLM refuses prompt logprobs then
                    assert model == "tiny-gemma4-fastprefill"
                    assert long["prompt_logprobs"] is None
                else:
                    assert len(long["prompt_logprobs"]) == long["prompt_tokens"]
            if model in PREFIX_CACHING_OFF:
                assert facts["enable_prefix_caching"] is False
                assert repeated["num_cached_tokens"] == 0
            else:
                assert facts["enable_prefix_caching"] is True
                unit = math.lcm(facts["block_size"], *facts["group_block_sizes"])
                assert repeated["num_cached_tokens"] == unit > 0
    pc = rep["prefix_caching"]
    if model in PREFIX_CACHING_OFF:  # vLLM turned it off, and said why
        assert pc["enabled"] is False
        assert PREFIX_CACHING_OFF[model] in pc["vllm_log"]
    else:
        assert pc["enabled"] is True and all(n > 0 for n in pc["num_cached_tokens"])


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


def test_pipelined_worker_in_multiprocess_mode(tmp_path, harness, monkeypatch) -> None:
    """Fresh engines: the module's reports run in-process; this pair runs the engine core
    and the worker in processes of their own, a different start. With the README's opt-in
    ``INITPIPE_VLLM=1`` exported, which the spawned engine core of a stock oracle must
    not inherit: the stock side still runs vLLM's own runner."""
    monkeypatch.setenv("INITPIPE_VLLM", "1")
    (rep,) = harness(tmp_path, ["tiny-llama"], "--multiprocess", "--no-reinit")
    assert "error" not in rep, rep.get("error")
    assert rep["diffs"] == [] and rep["equal"] and rep["problems"] == []
    facts = rep["stock"]["outputs_a"]["facts"]
    assert rep["prefix_caching"]["num_cached_tokens"] == [facts["block_size"]]
    assert rep["meta"]["pipelined"]["runner_class"] == "PipelinedCPUModelRunner"
    assert rep["meta"]["stock"]["runners"] == [
        ["vllm.v1.worker.cpu_model_runner.CPUModelRunner", False]
    ]


def test_the_known_process_globals_reset_to_what_vllm_assigns_at_import() -> None:
    """The harness resets these before each engine (stock's must not leak into the
    pipelined side); the declared values are the ones vLLM's modules assign (read from
    the source, nothing imported), and a reset puts a module's value back."""
    from initpipe_vllm.testing.process_globals import (
        KNOWN_PROCESS_GLOBALS,
        ProcessGlobal,
        declared_value_problems,
        reset_process_globals,
    )

    assert declared_value_problems() == []
    ssu = "vllm.model_executor.layers.mamba.ops.ssu_dispatch"
    assert {g.path for g in KNOWN_PROCESS_GLOBALS} >= {f"{ssu}:_mamba_ssu_backend"}
    wrong = ProcessGlobal(module=ssu, name="_mamba_ssu_backend", import_value=0)
    assert declared_value_problems((wrong,)) == [
        f"{ssu}:_mamba_ssu_backend: vLLM assigns None, declared 0"
    ]
    here = ProcessGlobal(module=__name__, name="_SET_BY_AN_ENGINE", import_value=None)
    globals()["_SET_BY_AN_ENGINE"] = sentinel = object()
    assert reset_process_globals((here,)) == {here.path: sentinel}
    assert globals()["_SET_BY_AN_ENGINE"] is None


_SET_BY_AN_ENGINE: object = None
