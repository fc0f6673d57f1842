"""The equivalence workload sees what each model caches: corrupting it changes outputs.

Stock vLLM only (every engine here is started inside
``initpipe_vllm.testing.stock.stock_environment()`` and checked with ``require_stock``: an
exported ``INITPIPE_VLLM=1`` must not make the oracle pipelined). Each engine runs in a
subprocess (an in-process engine mutates its process); the harness's engine arguments,
seeded weights and workload: ``long`` fills the prefix cache, ``repeated_prefix`` reuses
its first unit. Corruptions go through ``collective_rpc`` into the worker, into the tensors
each layer has bound (``layer.kv_cache``, as the forward reads them), and are restored
after the request.

- tiny-llama (full attention): ``repeated_prefix`` runs again untouched (control:
  identical outputs), with the cached block zeroed in every layer, and swapped with another
  written block. The same with vLLM's dummy weights, which cannot see it.
- Per architecture (:data:`CASES`), the cached blocks of the prefix are filled with a
  constant in the layers named: the sliding-window layer of tiny-gemma2; the KV-sharing
  layers of tiny-gemma4-kvshare, through their own bindings (checked to be the memory of
  the layer they share, so the fill reaches both: which of the two read it cannot be told
  apart); the conv state and, separately, the SSM state of tiny-nemotron-h's Mamba2
  layer (the state the prefix cache holds at the block boundary; Jamba's Mamba1 forward
  cannot run on the CPU build); every layer of tiny-llama on Model Runner V2 (Triton's
  interpreter: its own subprocess, one model, four requests of one token each). The
  outputs must change; after the restore they repeat exactly. Filling a block no request
  reads changes nothing (that is how each case was shown able to fail).
- tiny-deepseek-mla (MLA latent cache): vLLM's CPU platform turns prefix caching and
  chunked prefill off for MLA, so no cached prefix exists; the request is stepped, and
  after its prefill its first latent block is filled in every layer: the decode steps read
  it, so the later tokens' logprobs change; an untouched run repeats exactly.

The seeded weights themselves (:mod:`initpipe_vllm.testing.weights`) are checked here too:
cached, deterministic, atomic, and loaded by vLLM's loader for a model whose forward the
CPU build cannot run (Jamba), so every tiny model is loaded with them somewhere.

Run as a script (``python test_kv_sensitivity.py JSON WEIGHTS_DIR``) it is that subprocess;
under Model Runner V2 (``VLLM_USE_V2_MODEL_RUNNER=1``) it runs the ``mrv2`` case only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest


class Case(NamedTuple):
    """One architecture's cache, and how the request reaches it."""

    model: str
    runner: str  # "v1" or "v2" (Model Runner V2, on Triton's interpreter)
    #: "prefix": the cached blocks of the prefix, filled between requests; "running": the
    #: request's first block, filled once its prefill is done
    reach: str
    corruptions: dict[str, str]  # name -> the layers filled (see ``_targets``)
    #: tokens generated per request; the MRv2 case's one token (read from the cached
    #: prefix alone) keeps its interpreted steps few
    max_tokens: int = 6


CASES = {
    "sliding_window": Case("tiny-gemma2", "v1", "prefix", {"kv": "sliding_window"}),
    "kv_sharing": Case("tiny-gemma4-kvshare", "v1", "prefix", {"kv": "kv_sharing"}),
    "mla": Case("tiny-deepseek-mla", "v1", "running", {"latent": "all"}),
    "mamba": Case(
        "tiny-nemotron-h", "v1", "prefix", {"conv_state": "mamba:0", "ssm_state": "mamba:1"}
    ),
    "mrv2": Case("tiny-llama", "v2", "prefix", {"kv": "all"}, max_tokens=1),
}
CORRUPTIONS = [(case, name) for case, c in CASES.items() for name in c.corruptions]
#: What a corrupted block is filled with (any constant the cache does not hold).
FILL = 0.5

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


def _bound(worker: Any, name: str) -> list[Any]:
    """The tensors layer ``name`` has bound (a Mamba layer binds one per state)."""
    ctx = worker.model_runner.vllm_config.compilation_config.static_forward_context
    kv = ctx[name].kv_cache
    return list(kv) if isinstance(kv, (list, tuple)) else [kv]


def _targets(worker: Any, select: str, blocks: dict[str, list[int]]) -> list[list[Any]]:
    """``[layer, state, block]`` to fill: the layers ``select`` names, each with the blocks
    of its KV cache group (``blocks``: group index -> block ids).

    ``select``: ``all``; ``sliding_window`` (layers of sliding-window groups);
    ``kv_sharing`` (layers that read another layer's cache); ``mamba:I`` (state I of the
    Mamba layers).
    """
    from vllm.v1.kv_cache_interface import MambaSpec, SlidingWindowSpec

    runner = worker.model_runner
    shared = getattr(runner, "shared_kv_cache_layers", {})
    kind, _, state = select.partition(":")
    found = []
    for gi, group in enumerate(runner.kv_cache_config.kv_cache_groups):
        spec = group.kv_cache_spec
        for name in group.layer_names:
            chosen = {
                "all": True,
                "sliding_window": isinstance(spec, SlidingWindowSpec),
                "kv_sharing": name in shared,
                "mamba": isinstance(spec, MambaSpec),
            }[kind]
            if chosen:
                for block in blocks.get(str(gi), []):
                    found.append([name, int(state) if state else None, block])
    return found


def _fill(worker: Any, targets: list[list[Any]]) -> bool:
    """Fill each target block with :data:`FILL` (saved first); whether every one changed."""
    import torch

    num_blocks = worker.model_runner.kv_cache_config.num_blocks
    saved, changed = [], []
    for name, state, block in targets:
        for i, t in enumerate(_bound(worker, name)):
            if state is not None and i != state:
                continue
            assert t.shape[0] == num_blocks, (name, tuple(t.shape))
            before = t[block].clone()
            saved.append((t, block, before))
            t[block].fill_(FILL)
            changed.append(not torch.equal(before, t[block]))
    _SAVED["fill"] = saved
    return bool(changed) and all(changed)


def _unfill(worker: Any) -> None:
    """Put back what :func:`_fill` overwrote."""
    for t, block, before in reversed(_SAVED.pop("fill")):  # shared memory: last saved first
        t[block].copy_(before)


def _sharing(worker: Any) -> dict[str, bool]:
    """Per KV-sharing layer: whether its binding is its target layer's memory."""
    runner = worker.model_runner
    return {
        name: _bound(worker, name)[0].data_ptr() == _bound(worker, target)[0].data_ptr()
        for name, target in getattr(runner, "shared_kv_cache_layers", {}).items()
    }


# -- run in the engine's process -----------------------------------------------------------
def _scheduler(llm: Any) -> Any:
    """The in-process engine's scheduler."""
    return llm.llm_engine.engine_core.engine_core.scheduler


def _cached_block_ids(llm: Any) -> list[int]:
    """Blocks the prefix cache can hand out (in-process engine: the scheduler's pool)."""
    pool = _scheduler(llm).kv_cache_manager.block_pool
    return sorted(b.block_id for b in pool.blocks if b.block_hash is not None)


def _cached_by_group(llm: Any) -> dict[str, list[int]]:
    """The prefix cache's blocks per KV cache group (group index as a string: JSON keys)."""
    from vllm.v1.core.kv_cache_utils import get_group_id

    pool = _scheduler(llm).kv_cache_manager.block_pool
    found: dict[str, list[int]] = {}
    for b in pool.blocks:
        if b.block_hash is not None:
            found.setdefault(str(get_group_id(b.block_hash)), []).append(b.block_id)
    return {g: sorted(ids) for g, ids in sorted(found.items())}


def _first_token_change(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Change of the top logprob at the first generated position (the prompt's context)."""
    return abs(a["logprobs"][0][0][1] - b["logprobs"][0][0][1])


def _compare(first: dict[str, Any], again: dict[str, Any]) -> dict[str, Any]:
    """How ``again`` differs from ``first``: snapshot diffs, changed positions, tokens."""
    from initpipe_vllm.testing.snapshot import diff_snapshots

    return {
        "output": again,
        "diffs": diff_snapshots(first, again),
        "first_token_change": _first_token_change(first, again),
        "changed_positions": [
            i
            for i, (x, y) in enumerate(zip(first["logprobs"], again["logprobs"], strict=True))
            if x[0][1] != y[0][1]
        ],
        "tokens_changed": sum(
            x != y for x, y in zip(first["token_ids"], again["token_ids"], strict=True)
        ),
    }


def _start(model: Path, weights: str, weights_dir: str) -> tuple[Any, str]:
    """A stock in-process engine on ``model`` with the harness's workload arguments."""
    from vllm import LLM

    from initpipe_vllm.testing.equivalence import loadable_model, workload_engine_kwargs
    from initpipe_vllm.testing.stock import require_stock, stock_environment

    with loadable_model(model, weights=weights, weights_dir=weights_dir) as (folder, extra):
        kwargs, opts = workload_engine_kwargs(folder, **extra)
        with stock_environment():
            llm = LLM(**kwargs)
    try:
        require_stock(llm, f"the {model.name} engine")
    except BaseException:
        _stop(llm)
        raise
    return llm, opts.get("task", "generate")


def _stop(llm: Any) -> None:
    """Shut the in-process engine down (the next one starts in this process)."""
    llm.llm_engine.engine_core.shutdown()


def _probe(model: Path, weights: str, weights_dir: str) -> dict[str, Any]:
    """tiny-llama's cached block zeroed, then swapped with another written block."""
    from initpipe_vllm.testing.equivalence import _kv_facts, run_requests, workload_requests
    from initpipe_vllm.testing.stock import runner_classes

    llm, task = _start(model, weights, weights_dir)
    try:
        facts = llm.collective_rpc(_kv_facts)[0]
        long, repeated = workload_requests(facts, salt=1)
        first = run_requests(llm, task, [long, repeated])
        cached = _cached_block_ids(llm)
        assert len(cached) == 1, f"expected one cached block after the workload, got {cached}"
        (block,) = cached
        others = [b for b in llm.collective_rpc(_written_blocks)[0] if b != block]
        assert others, "no other written KV block to swap with"
        out: dict[str, Any] = {"facts": facts, "first": first[1], "cached_block": block}
        out["runner_classes"] = runner_classes(llm)
        for how in ("control", "zero", "swap"):
            if how != "control":
                llm.collective_rpc(_corrupt, args=(how, block, others[0]))
            (again,) = run_requests(llm, task, [repeated])
            if how != "control":
                llm.collective_rpc(_restore, args=(block, others[0]))
            out[how] = _compare(first[1], again)
        return out
    finally:
        _stop(llm)


def _stepped(
    llm: Any, request: dict[str, Any], max_tokens: int, select: str | None = None
) -> tuple[dict, Any, bool]:
    """Run ``request`` (greedy, top logprobs) step by step; with ``select``, fill its first
    block in those layers once its prefill is done (the first token sampled), restore it
    when it finished. Returns the output record, the targets and whether the memory
    changed."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from initpipe_vllm.testing.equivalence import _TOP_LOGPROBS, _logprobs

    engine = llm.llm_engine
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=0.0,
        ignore_eos=True,
        detokenize=False,
        logprobs=_TOP_LOGPROBS,
    )
    engine.add_request(request["name"], TokensPrompt(prompt_token_ids=request["prompt"]), params)
    targets: Any = None
    changed = False
    final = None
    while final is None:
        for out in engine.step():
            if out.finished:
                final = out
            elif select is not None and targets is None and out.outputs[0].token_ids:
                (running,) = _scheduler(llm).running
                ids = _scheduler(llm).kv_cache_manager.get_block_ids(running.request_id)
                blocks = {str(g): group[:1] for g, group in enumerate(ids)}
                targets = llm.collective_rpc(_targets, args=(select, blocks))[0]
                changed = llm.collective_rpc(_fill, args=(targets,))[0]
    if targets is not None:
        llm.collective_rpc(_unfill)
    rec = {
        "name": request["name"],
        "prompt_tokens": len(request["prompt"]),
        "token_ids": list(final.outputs[0].token_ids),
        "logprobs": _logprobs(final.outputs[0].logprobs),
        "prompt_logprobs": None,
        "num_cached_tokens": final.num_cached_tokens,
    }
    return rec, targets, changed


def _probe_case(case: str, weights_dir: str) -> dict[str, Any]:
    """One :data:`CASES` entry: the baseline, each corruption, the restored run."""
    from initpipe_vllm.testing import model_dir
    from initpipe_vllm.testing.equivalence import _kv_facts, _runner_meta, workload_requests
    from initpipe_vllm.testing.stock import runner_classes

    c = CASES[case]
    began = time.monotonic()
    llm, _ = _start(model_dir(c.model), "seeded", weights_dir)
    started = time.monotonic()
    try:
        facts = llm.collective_rpc(_kv_facts)[0]
        long, repeated = workload_requests(facts, salt=1)
        out: dict[str, Any] = {"facts": facts, "runner_classes": runner_classes(llm)}
        out["runner_version"] = llm.collective_rpc(_runner_meta)[0]["runner_version"]
        out["sharing"] = llm.collective_rpc(_sharing)[0]
        out["corrupted"] = {}
        if c.reach == "prefix":  # long fills the cache, repeated reads its first unit
            _stepped(llm, long, c.max_tokens)
            request = repeated
            out["cached"] = cached = _cached_by_group(llm)
        else:  # the running request's own blocks
            request = long
        first = _stepped(llm, request, c.max_tokens)[0]
        for name, select in c.corruptions.items():
            if c.reach == "prefix":
                targets = llm.collective_rpc(_targets, args=(select, cached))[0]
                changed = llm.collective_rpc(_fill, args=(targets,))[0]
                again = _stepped(llm, request, c.max_tokens)[0]
                llm.collective_rpc(_unfill)
            else:
                again, targets, changed = _stepped(llm, request, c.max_tokens, select)
            rec = {"targets": targets, "memory_changed": changed}
            out["corrupted"][name] = {**rec, **_compare(first, again)}
        again = _stepped(llm, request, c.max_tokens)[0]
        out["first"] = first
        out["restored"] = _compare(first, again)
        # what this case costs (reported, never asserted)
        out["seconds"] = {"start": started - began, "requests": time.monotonic() - started}
        return out
    finally:
        _stop(llm)


def main(json_out: str, weights_dir: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from initpipe_vllm.testing import model_dir

    report: dict[str, Any] = {}
    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1":
        report["mrv2"] = _probe_case("mrv2", weights_dir)
    else:
        model = model_dir("tiny-llama")
        report.update({w: _probe(model, w, weights_dir) for w in ("seeded", "dummy")})
        for case, c in CASES.items():
            if c.runner == "v1":
                report[case] = _probe_case(case, weights_dir)
    Path(json_out).write_text(json.dumps(report))


# -- the tests ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def report(script_result: Any) -> dict:
    """The v1 subprocess's report: tiny-llama (seeded, dummy) and the v1 :data:`CASES`."""
    result: dict = script_result(__file__)
    return result


@pytest.fixture(scope="module")
def report_v2(script_result: Any) -> dict:
    """The Model Runner V2 subprocess's report (Triton's interpreter): the ``mrv2`` case."""
    result: dict = script_result(__file__, model_runner="v2")
    return result


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


@pytest.fixture
def case_report(request: pytest.FixtureRequest) -> Any:
    """The report of the ``case`` parameter: from the MRv2 subprocess for an MRv2 case,
    else from the v1 one (only the subprocess a selected test needs is started)."""
    case = request.node.callspec.params["case"]
    fixture = "report_v2" if CASES[case].runner == "v2" else "report"
    return request.getfixturevalue(fixture)[case]


@pytest.mark.parametrize(("case", "name"), CORRUPTIONS)
def test_corrupting_what_the_model_caches_changes_the_outputs(case_report, case, name) -> None:
    rep = case_report
    bad = rep["corrupted"][name]
    assert bad["targets"] and bad["memory_changed"], (case, name, bad["targets"])
    assert bad["diffs"], f"{case}/{name}: filling {bad['targets']} changed no output"
    if CASES[case].reach == "prefix":
        # the corrupted run still read the prefix from the cache, and its first token
        # (computed from that prefix alone) moved
        assert bad["output"]["num_cached_tokens"] == rep["first"]["num_cached_tokens"] > 0
        assert bad["first_token_change"] > 0.0, (case, name, bad["changed_positions"])
    else:  # filled after the first token: the decode steps read it
        assert bad["changed_positions"] and 0 not in bad["changed_positions"], (case, name)


@pytest.mark.parametrize("case", list(CASES))
def test_after_the_restore_the_outputs_repeat_exactly(case_report, case) -> None:
    rep = case_report
    assert rep["restored"]["diffs"] == [], (case, rep["restored"]["diffs"][:5])
    assert rep["restored"]["output"]["num_cached_tokens"] == rep["first"]["num_cached_tokens"]


@pytest.mark.parametrize("case", list(CASES))
def test_each_engine_is_stock_and_reads_the_cache_it_is_said_to(case_report, case) -> None:
    rep = case_report
    assert [piped for _, piped in rep["runner_classes"]] == [False], rep["runner_classes"]
    runner, reach = CASES[case].runner, CASES[case].reach
    assert rep["runner_version"] == runner
    facts = rep["facts"]
    assert facts["enable_prefix_caching"] is (reach == "prefix"), facts
    if case == "kv_sharing":  # the sharers' bindings are their targets' memory
        assert rep["sharing"] and all(rep["sharing"].values()), rep["sharing"]
    if case == "mamba":
        assert facts["mamba_cache_mode"] == "align", facts


def test_the_llama_engines_are_stock(report) -> None:
    for weights in ("seeded", "dummy"):
        assert [piped for _, piped in report[weights]["runner_classes"]] == [False], weights


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
