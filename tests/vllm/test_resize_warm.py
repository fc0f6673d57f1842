"""A resize that keeps the prefix cache, in-process: after it, the engine is an engine of the
new size that served the same requests — its block pool and the bytes of every cached block.

One subprocess per runner (an in-process engine mutates its process) runs tiny-llama with
seeded, KV-sensitive weights (outputs depend on what the KV cache holds):

- the engine under test starts with the pipelined worker at ``A`` blocks and serves a
  history ``H`` of prompts (one full block and a partial one each, one at a time): every
  prompt's first block is cached, nothing was evicted (the pool before the resize shows it),
  so without a resize each prompt would hit ``block_size`` tokens;
- **grow** ``A -> GROW`` keeping the prefix cache; a STOCK engine started at ``GROW`` serves
  the same ``H``: the block pools are equal (free queue order, cached block ids, their
  hashes) and so are the bytes of every cached block, by hash. Then both serve ``H`` again:
  every prompt hits ``block_size`` tokens, and tokens and logprobs are equal;
- **shrink** ``GROW -> SHRINK`` keeping what fits: the ``SHRINK - 1`` most recently used
  cached blocks are kept (compacted to new ids: their bytes equal the old cache's, by
  hash), the others are evicted; a stock engine started at ``SHRINK`` serves the same
  history (``H`` twice); then both serve the newest kept prompts and the evicted ones:
  hits (``block_size`` for the kept, 0 for the evicted), tokens and logprobs are equal;
- **the proof can fail**: the same grow with the carry broken — contents not written (the
  old bug: hashes kept, blocks zeroed) or written to the wrong block ids — gives another
  answer for a prompt whose prefix hits, and other block bytes;
- **fall back by name**: a rank whose memory cannot hold the kept blocks, and blocks
  computed under another weights version (``set_weight_version`` without a refit), make the
  resize empty the prefix cache and say why; the resize itself succeeds;
- **rollback**: a KV stage that fails during a resize that keeps the cache rolls back to the
  old size with the kept blocks in place: the prompt still hits and answers as before;
- ``keep_prefix_cache=False`` empties the cache, as a plain resize always did.

Run as a script (``python test_resize_warm.py OUT.json WEIGHTS_DIR``) it is that subprocess.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

A, GROW, SHRINK, OTHER = 24, 40, 6, 48
N_HISTORY = 8
MODEL = Path(__file__).resolve().parents[2] / "stages" / "models" / "tiny-llama"
RUNNERS = ("v1", "v2")


# -- the subprocess ------------------------------------------------------------------------
def _core(llm: Any) -> Any:
    return llm.llm_engine.engine_core.engine_core


def _runner(llm: Any) -> Any:
    return _core(llm).model_executor.driver_worker.worker.model_runner


def _history(block_size: int) -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(3, 500) for _ in range(block_size + 20)] for _ in range(N_HISTORY)]


def _serve(llm: Any, prompts: list[list[int]]) -> list[dict[str, Any]]:
    """Each prompt alone, in order (the order is the history the pool remembers)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(
        max_tokens=4, temperature=0.0, ignore_eos=True, detokenize=False, logprobs=3
    )
    out = []
    for p in prompts:
        (o,) = llm.generate([TokensPrompt(prompt_token_ids=p)], params, use_tqdm=False)
        seq = o.outputs[0]
        out.append(
            {
                "tokens": list(seq.token_ids),
                "logprobs": [
                    sorted([t, lp.logprob] for t, lp in step.items()) for step in seq.logprobs
                ],
                "cached": o.num_cached_tokens,
            }
        )
    return out


def _pool(llm: Any, *, stock: bool = False) -> dict[str, Any]:
    """The block pool's prefix-cache state and the bytes of every cached block (by hash)."""
    from initpipe_vllm.live.carry.kv_copy import block_views

    pool = _core(llm).scheduler.kv_cache_manager.block_pool
    runner = _runner(llm)
    views = [v for _, v in block_views(runner, runner.kv_cache_config if stock else None)]
    hashes: dict[str, str] = {}
    contents: dict[str, str] = {}
    for b in pool.blocks:
        if b.block_hash is None or b.is_null:
            continue
        key = bytes(b.block_hash).hex()
        hashes[str(b.block_id)] = key
        digest = hashlib.sha256()
        for v in views:
            digest.update(v[:, b.block_id].contiguous().numpy().tobytes())  # int8 views
        contents[key] = digest.hexdigest()
    return {
        "num_blocks": pool.num_gpu_blocks,
        "queue": [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        "hashes": hashes,
        "contents": contents,
    }


def _stock(folder: Path, extra: dict[str, Any], blocks: int, rounds: list[list[list[int]]]) -> Any:
    """A stock engine of ``blocks`` blocks that served ``rounds[:-1]``; its pool then, and
    its answers to ``rounds[-1]``."""
    from vllm import LLM

    from initpipe_vllm.testing.equivalence import workload_engine_kwargs
    from initpipe_vllm.testing.stock import require_stock, stock_environment

    kwargs, _ = workload_engine_kwargs(folder, num_gpu_blocks_override=blocks, **extra)
    with stock_environment():
        llm = LLM(**kwargs)
    require_stock(llm)
    try:
        for prompts in rounds[:-1]:
            _serve(llm, prompts)
        pool = _pool(llm, stock=True)
        return {"pool": pool, "outputs": _serve(llm, rounds[-1])}
    finally:
        llm.llm_engine.engine_core.shutdown()


@contextlib.contextmanager
def _broken_unstash(how: str) -> Iterator[None]:
    """The carry broken on purpose: ``zeroed`` writes nothing back (the blocks keep their
    hashes over a zeroed cache), ``shifted`` writes every block one id off."""
    from initpipe_vllm.live.carry import kv_copy

    original = kv_copy.rank_unstash

    def broken(wrapper: Any, new_ids: list[int]) -> Any:
        if how == "zeroed":
            return kv_copy.rank_drop_stash(wrapper)
        return original(wrapper, new_ids[1:] + new_ids[:1])

    kv_copy.rank_unstash = broken  # type: ignore[assignment]
    try:
        yield
    finally:
        kv_copy.rank_unstash = original  # type: ignore[assignment]


def _report(rep: Any) -> dict[str, Any]:
    data: dict[str, Any] = rep.to_dict()
    return data


def _engine(folder: Path, extra: dict[str, Any], history: list[list[int]]) -> dict[str, Any]:
    from vllm import LLM

    import initpipe_vllm as ip
    from initpipe.testing import clear_faults, inject_fault
    from initpipe_vllm.hook import PIPELINED_WORKER
    from initpipe_vllm.live.carry import kv_copy
    from initpipe_vllm.testing.equivalence import workload_engine_kwargs

    kwargs, _ = workload_engine_kwargs(
        folder, num_gpu_blocks_override=A, worker_cls=PIPELINED_WORKER, **extra
    )
    llm = LLM(**kwargs)
    rec: dict[str, Any] = {"history": _serve(llm, history), "pool_A": _pool(llm)}
    # grow, then the history again
    rec["grow"] = _report(ip.resize_kv_cache(llm, num_blocks=GROW))
    rec["pool_grow"] = _pool(llm)
    rec["after_grow"] = _serve(llm, history)
    # shrink: the newest kept prompts, then the evicted ones
    rec["pool_before_shrink"] = _pool(llm)
    rec["shrink"] = _report(ip.resize_kv_cache(llm, num_blocks=SHRINK, keep_prefix_cache=True))
    rec["pool_shrink"] = _pool(llm)
    rec["after_shrink"] = _serve(llm, shrink_queries(history))

    def refill(blocks: int) -> None:  # an empty cache at ``blocks``, then the history
        ip.resize_kv_cache(llm, num_blocks=blocks, keep_prefix_cache=False)
        _serve(llm, history)

    # the carry broken on purpose, then done right
    last = [history[-1]]
    for how in ("zeroed", "shifted"):
        refill(GROW)
        with _broken_unstash(how):
            ip.resize_kv_cache(llm, num_blocks=OTHER)
        rec[f"broken_{how}"] = {"pool": _pool(llm), "outputs": _serve(llm, last)}
    refill(GROW)
    rec["cold"] = _report(ip.resize_kv_cache(llm, num_blocks=OTHER, keep_prefix_cache=False))
    rec["after_cold"] = _serve(llm, last)
    # fall back by name: memory, then another weights version
    refill(GROW)
    original = kv_copy.available_memory
    kv_copy.available_memory = lambda worker: 4096  # type: ignore[assignment]
    try:
        rec["no_memory"] = _report(ip.resize_kv_cache(llm, num_blocks=OTHER))
    finally:
        kv_copy.available_memory = original  # type: ignore[assignment]
    rec["after_no_memory"] = _serve(llm, last)
    refill(GROW)
    _core(llm).set_weight_version("set-by-hand")
    rec["other_weights"] = _report(ip.resize_kv_cache(llm, num_blocks=OTHER))
    _serve(llm, history)
    rec["same_weights_again"] = _report(ip.resize_kv_cache(llm, num_blocks=GROW))
    # a failure rolls back with the kept blocks in place
    run = _runner(llm).initpipe_run
    stage = "allocated_kv_caches" if "allocated_kv_caches" in run.outputs else "kv_caches_by_layer"
    inject_fault(run, stage, after=True, times=1)
    try:
        ip.resize_kv_cache(llm, num_blocks=OTHER)
    except Exception as err:
        rec["rollback_error"] = {"type": type(err).__name__, "rolled_back": err.rolled_back}
    finally:
        clear_faults(run)
    rec["info_after_rollback"] = ip.kv_cache_info(llm).to_dict()
    rec["after_rollback"] = _serve(llm, last)
    llm.llm_engine.engine_core.shutdown()
    return rec


def warm_round(llm: Any, prompt: list[int], resize: Any) -> dict[str, Any]:
    """For the other placements (engine core in its own process, TP=2, HTTP): ``prompt``
    served twice (the second hits its cached prefix), ``resize()``, then ``prompt`` again."""
    _serve(llm, [prompt])
    (hit,) = _serve(llm, [prompt])
    report = resize()
    (after,) = _serve(llm, [prompt])
    return {"report": report.to_dict(), "hit": hit, "after": after}


def warm_round_problems(rec: dict[str, Any], ranks: int = 1) -> list[str]:
    """What is wrong with a :func:`warm_round`: the prompt must hit its prefix after the
    resize exactly as before it (tokens, logprobs, cached tokens), every rank having copied
    the kept blocks."""
    problems = []
    carry = rec["report"]["prefix_cache"]
    if not (carry and carry["kept"] and carry["blocks_kept"] >= 1):
        problems.append(f"the prefix cache was not kept: {carry}")
    if rec["hit"]["cached"] < 128:
        problems.append(f"the prompt did not hit before the resize: {rec['hit']['cached']}")
    if rec["after"] != rec["hit"]:
        problems.append(f"after the resize {rec['after']} != before {rec['hit']}")
    stashed = [r["stash_bytes"] for r in rec["report"]["ranks"]]
    if len(stashed) != ranks or not all(stashed):
        problems.append(f"stash bytes per rank: {stashed}")
    return problems


def shrink_queries(history: list[list[int]]) -> list[list[int]]:
    """After the shrink: the two newest prompts (kept: they hit), then the three oldest
    (evicted: recomputed). Each query's partial block evicts the least recently used kept
    block, so the newest come first."""
    return [history[-1], history[-2], *history[:3]]


def main(out: str, weights_dir: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from initpipe_vllm.compat import runner_from_env
    from initpipe_vllm.testing.equivalence import loadable_model

    version = runner_from_env()
    with loadable_model(MODEL, weights_dir=weights_dir) as (folder, extra):
        block_size = 128
        history = _history(block_size)
        result: dict[str, Any] = {"model_runner": version, "block_size": block_size}
        result["engine"] = _engine(folder, extra, history)
        result["stock_grow"] = _stock(folder, extra, GROW, [history, history])
        result["stock_shrink"] = _stock(
            folder, extra, SHRINK, [history, history, shrink_queries(history)]
        )
    Path(out).write_text(json.dumps(result))


# -- the tests -----------------------------------------------------------------------------
@pytest.fixture(scope="module", params=RUNNERS)
def result(request: pytest.FixtureRequest, script_result: Any) -> Any:
    got = script_result(__file__, model_runner=request.param)
    assert got["model_runner"] == request.param
    return got


def test_without_a_resize_every_prompt_of_the_history_would_hit(result: Any) -> None:
    pool = result["engine"]["pool_A"]
    assert len(pool["hashes"]) == N_HISTORY  # one full block per prompt, none evicted
    assert all(o["cached"] == 0 for o in result["engine"]["history"])  # distinct prompts


def test_a_grow_keeps_the_pool_of_an_engine_of_the_new_size_with_the_same_history(
    result: Any,
) -> None:
    ours, stock = result["engine"]["pool_grow"], result["stock_grow"]["pool"]
    assert ours == stock
    assert len(ours["contents"]) == N_HISTORY
    carry = result["engine"]["grow"]["prefix_cache"]
    assert carry["kept"] and carry["blocks_kept"] == N_HISTORY and carry["blocks_evicted"] == 0


def test_after_a_grow_every_prompt_hits_and_answers_as_the_stock_engine(result: Any) -> None:
    ours, stock = result["engine"]["after_grow"], result["stock_grow"]["outputs"]
    assert [o["cached"] for o in ours] == [result["block_size"]] * N_HISTORY
    assert ours == stock


def test_a_shrink_keeps_the_most_recent_blocks_that_fit_with_their_bytes(result: Any) -> None:
    before, after = result["engine"]["pool_before_shrink"], result["engine"]["pool_shrink"]
    order = [before["hashes"][str(b)] for b in before["queue"] if str(b) in before["hashes"]]
    kept = order[-(SHRINK - 1) :]
    assert sorted(after["hashes"].values()) == sorted(kept)
    assert after["contents"] == {h: before["contents"][h] for h in kept}
    assert [after["hashes"][str(b)] for b in after["queue"] if str(b) in after["hashes"]] == kept
    assert all(int(b) < SHRINK for b in after["hashes"])
    carry = result["engine"]["shrink"]["prefix_cache"]
    assert (carry["blocks_kept"], carry["blocks_evicted"]) == (SHRINK - 1, N_HISTORY - SHRINK + 1)


def test_after_a_shrink_the_kept_hit_the_evicted_recompute_as_the_stock_engine(
    result: Any,
) -> None:
    ours, stock = result["engine"]["after_shrink"], result["stock_shrink"]["outputs"]
    bs = result["block_size"]
    assert [o["cached"] for o in ours] == [bs, bs, 0, 0, 0]
    assert ours == stock


def test_the_proof_fails_when_the_contents_are_not_carried(result: Any) -> None:
    eng = result["engine"]
    right = eng["after_grow"][-1]
    for how in ("zeroed", "shifted"):
        broken = eng[f"broken_{how}"]
        assert broken["outputs"][0]["cached"] == result["block_size"], how  # the hashes hit
        assert broken["outputs"][0]["logprobs"] != right["logprobs"], how
        assert broken["pool"]["contents"] != eng["pool_grow"]["contents"], how


def test_keep_prefix_cache_false_empties_the_cache(result: Any) -> None:
    eng = result["engine"]
    assert eng["cold"]["prefix_cache"] == {
        "kept": False,
        "cached_before": 0,
        "blocks_kept": 0,
        "blocks_evicted": 0,
        "bytes_copied": 0,
        "reason": "keep_prefix_cache=False",
    }
    assert eng["after_cold"][0]["cached"] == 0
    assert eng["after_cold"][0]["tokens"] == eng["after_grow"][-1]["tokens"]


def test_a_rank_without_memory_for_the_kept_blocks_empties_the_cache_by_name(
    result: Any,
) -> None:
    eng = result["engine"]
    carry = eng["no_memory"]["prefix_cache"]
    assert not carry["kept"]
    assert "rank 0 has 4,096 bytes free" in carry["reason"]
    assert eng["no_memory"]["ranks"][0]["stash_bytes"] == 0
    assert eng["after_no_memory"][0]["cached"] == 0


def test_blocks_of_another_weights_version_are_never_kept(result: Any) -> None:
    eng = result["engine"]
    carry = eng["other_weights"]["prefix_cache"]
    assert not carry["kept"]
    assert "'default'" in carry["reason"] and "'set-by-hand'" in carry["reason"]
    assert eng["same_weights_again"]["prefix_cache"]["kept"]  # cached under the new version


def test_a_failed_resize_rolls_back_with_the_kept_blocks(result: Any) -> None:
    eng = result["engine"]
    assert eng["rollback_error"] == {"type": "ResizeError", "rolled_back": True}
    assert eng["info_after_rollback"]["num_blocks"] == GROW
    assert eng["after_rollback"] == [eng["after_grow"][-1]]


def test_the_resize_page_shows_this_shrinks_real_report(result: Any) -> None:
    from initpipe_vllm.live.resize.report import PrefixCacheCarry

    line = str(PrefixCacheCarry(**result["engine"]["shrink"]["prefix_cache"]))
    docs = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "resize.md"
    assert f"```text\n{line}\n```" in docs.read_text()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
