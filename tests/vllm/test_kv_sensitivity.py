"""The equivalence workload sees the KV cache: corrupting one cached block changes outputs.

One subprocess (an in-process engine mutates its process) starts stock vLLM on tiny-llama
with the harness's engine arguments and runs the harness's workload: ``long`` fills the
prefix cache, ``repeated_prefix`` reuses its first block. Then ``repeated_prefix`` runs
again three times: untouched (control: identical outputs), with that cached block zeroed in
every layer, and with it swapped with another written block — each time through
``collective_rpc`` into the worker's ``model_runner.kv_caches``, restoring the block
afterwards. The same is done with vLLM's dummy weights, which cannot see it.

The seeded weights themselves (:mod:`initpipe_vllm.testing.weights`) are checked here too:
cached, deterministic, atomic, and loaded by vLLM's loader for a model whose forward the
CPU build cannot run (Jamba), so every tiny model is loaded with them somewhere.

Run as a script (``python test_kv_sensitivity.py JSON WEIGHTS_DIR``) it is that subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

_SAVED: dict[str, list[Any]] = {}


# -- run inside the worker (collective_rpc passes the worker first) -----------------------
def _written_blocks(worker: Any) -> list[int]:
    """Blocks holding non-zero data in any layer (block is dim 0 of each layer's view)."""
    import torch

    runner = worker.model_runner
    found: set[int] = set()
    for t in runner.kv_caches:
        assert t.shape[0] == runner.cache_config.num_gpu_blocks, tuple(t.shape)
        found.update(torch.nonzero(t.reshape(t.shape[0], -1).ne(0).any(dim=1)).flatten().tolist())
    return sorted(found)


def _corrupt(worker: Any, how: str, block: int, other: int) -> None:
    caches = worker.model_runner.kv_caches
    _SAVED["blocks"] = [(t[block].clone(), t[other].clone()) for t in caches]
    for t in caches:
        if how == "zero":
            t[block].zero_()
        else:  # swap
            a = t[block].clone()
            t[block].copy_(t[other])
            t[other].copy_(a)


def _restore(worker: Any, block: int, other: int) -> None:
    for t, (a, b) in zip(worker.model_runner.kv_caches, _SAVED.pop("blocks"), strict=True):
        t[block].copy_(a)
        t[other].copy_(b)


def _cached_block_ids(llm: Any) -> list[int]:
    """Blocks the prefix cache can hand out (in-process engine: the scheduler's pool)."""
    pool = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
    return sorted(b.block_id for b in pool.blocks if b.block_hash is not None)


def _first_token_change(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Change of the top logprob at the first generated position (the prompt's context)."""
    return abs(a["logprobs"][0][0][1] - b["logprobs"][0][0][1])


def _probe(model: Path, weights: str, weights_dir: str) -> dict[str, Any]:
    from vllm import LLM

    from initpipe_vllm.testing.equivalence import (
        _kv_facts,
        loadable_model,
        run_requests,
        workload_engine_kwargs,
        workload_requests,
    )
    from initpipe_vllm.testing.snapshot import diff_snapshots

    with loadable_model(model, weights=weights, weights_dir=weights_dir) as (folder, extra):
        kwargs, opts = workload_engine_kwargs(folder, **extra)
        llm = LLM(**kwargs)
    try:
        task = opts.get("task", "generate")
        facts = llm.collective_rpc(_kv_facts)[0]
        long, repeated = workload_requests(facts, salt=1)
        first = run_requests(llm, task, [long, repeated])
        cached = _cached_block_ids(llm)
        assert len(cached) == 1, f"expected one cached block after the workload, got {cached}"
        (block,) = cached
        others = [b for b in llm.collective_rpc(_written_blocks)[0] if b != block]
        assert others, "no other written KV block to swap with"
        out: dict[str, Any] = {"facts": facts, "first": first[1], "cached_block": block}
        for how in ("control", "zero", "swap"):
            if how != "control":
                llm.collective_rpc(_corrupt, args=(how, block, others[0]))
            (again,) = run_requests(llm, task, [repeated])
            if how != "control":
                llm.collective_rpc(_restore, args=(block, others[0]))
            out[how] = {
                "output": again,
                "diffs": diff_snapshots(first[1], again),
                "first_token_change": _first_token_change(first[1], again),
                "tokens_changed": sum(
                    x != y for x, y in zip(first[1]["token_ids"], again["token_ids"], strict=True)
                ),
            }
        return out
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm


def main(json_out: str, weights_dir: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from initpipe_vllm.testing import model_dir

    model = model_dir("tiny-llama")
    report = {w: _probe(model, w, weights_dir) for w in ("seeded", "dummy")}
    Path(json_out).write_text(json.dumps(report))


# -- the tests ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, seeded_weights_dir: Path) -> dict:
    out = tmp_path_factory.mktemp("kv_sensitivity") / "report.json"
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    cmd = [sys.executable, __file__, str(out), str(seeded_weights_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_repeated_request_reads_one_cached_block_and_repeats_exactly(report) -> None:
    seeded = report["seeded"]
    unit = seeded["facts"]["block_size"]
    assert seeded["first"]["prompt_tokens"] > unit
    assert seeded["first"]["num_cached_tokens"] == unit
    control = seeded["control"]
    assert control["output"]["num_cached_tokens"] == unit
    assert control["diffs"] == [] and control["first_token_change"] == 0.0


@pytest.mark.parametrize("how", ["zero", "swap"])
def test_a_corrupted_cached_block_changes_the_outputs(report, how) -> None:
    seeded = report["seeded"][how]
    assert seeded["output"]["num_cached_tokens"] == report["seeded"]["facts"]["block_size"]
    assert seeded["diffs"], f"{how}: corrupting the cached KV block changed nothing"
    assert seeded["first_token_change"] > 0.0 and seeded["tokens_changed"] > 0
    # vLLM's dummy weights (±1e-3) see less (measured here: nothing at all).
    dummy = report["dummy"][how]
    assert seeded["first_token_change"] > dummy["first_token_change"], (seeded, dummy)


# -- the seeded weights ----------------------------------------------------------------------
def test_seeded_weights_are_cached_deterministic_and_keep_the_folder_files(tmp_path) -> None:
    from initpipe_vllm.testing import model_dir
    from initpipe_vllm.testing.weights import seeded_model

    src = model_dir("tiny-bert")  # config, initpipe.json and tokenizer files
    built = seeded_model(src, tmp_path / "a")
    assert seeded_model(src, tmp_path / "a") == built  # reused, not rebuilt
    again = seeded_model(src, tmp_path / "b")
    assert [p.name for p in (tmp_path / "a").iterdir()] == [built.name]  # no temp folder left
    names = sorted(p.name for p in built.iterdir())
    assert names == sorted(["model.safetensors", *(p.name for p in src.iterdir() if p.is_file())])
    for name in names:
        assert (built / name).read_bytes() == (again / name).read_bytes(), name
        if name != "model.safetensors":
            assert (built / name).read_bytes() == (src / name).read_bytes(), name
    assert seeded_model(src, tmp_path / "a", seed=1) != built


def test_an_architecture_transformers_cannot_build_is_named(tmp_path) -> None:
    from initpipe_vllm.testing.weights import WeightsError, seeded_model

    src = tmp_path / "src"
    src.mkdir()
    config = {"architectures": ["NoSuchForCausalLM"], "model_type": "llama"}
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match="model_type 'llama', architecture 'NoSuchForCausalLM'"):
        seeded_model(src, tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []  # nothing half-built


def test_jamba_loads_its_seeded_weights_through_vllms_loader(make, seeded_weights_dir) -> None:
    """Jamba is not in the engine groups (its forward needs ``selective_scan_fwd``)."""
    import torch

    from initpipe_vllm.testing import model_dir
    from initpipe_vllm.testing.weights import seeded_model

    folder = seeded_model(model_dir("tiny-jamba"), seeded_weights_dir)
    made = make(str(folder), plan=False, load_format="safetensors")
    params = dict(made.runner.model.named_parameters())
    assert all(bool(torch.isfinite(p).all()) for p in params.values())
    # vLLM raises on a weight the checkpoint lacks; dummy weights would stay within 1e-3.
    assert max(float(p.abs().max()) for p in params.values() if p.numel()) > 0.1


if __name__ == "__main__":
    main(*sys.argv[1:])
