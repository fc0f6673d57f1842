"""A resize that keeps the prefix cache, on every KV cache group kind the embedded models have.

One subprocess (in-process engines, v1) runs each model with seeded weights:

- **grow**, on every model that prefix-caches on CPU — sliding window with full attention
  (tiny-gemma2, tiny-gpt-oss with attention sinks), KV sharing across layers
  (tiny-gemma4-kvshare, tiny-gemma4-fastprefill), Mamba hybrids (tiny-lfm2,
  tiny-nemotron-h), a KV connector (tiny-llama-connector): the pipelined engine at ``A``
  blocks serves a history, resizes to ``GROW`` keeping its prefix cache, and its block pool
  (queue, hashes, the bytes of every cached block) and its answers to the history again
  equal a stock engine started at ``GROW`` that served the same history;
- **the copy's geometry**, on those and MLA (tiny-deepseek-mla: vLLM turns prefix caching
  off for MLA on CPU, so nothing is cached there to carry): random bytes in the whole cache,
  three blocks set aside and written back at other ids through the rank functions; every
  layer's own view as vLLM bound it (``layer.kv_cache``, the backend's shape, read through
  vLLM's ``group_kernel_blocks``) must show the old blocks' bytes at the new ids.

tiny-jamba is left out: vLLM's CPU build has no ``selective_scan_fwd`` kernel for it.

Run as a script (``python test_resize_warm_models.py OUT.json WEIGHTS_DIR``) it is that
subprocess.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest

#: model -> (start blocks, grow blocks): MLA's 16-token blocks need more for max_model_len
MODELS = {
    "tiny-gemma2": (24, 40),
    "tiny-gpt-oss": (24, 40),
    "tiny-gemma4-kvshare": (24, 40),
    "tiny-gemma4-fastprefill": (24, 40),
    "tiny-lfm2": (24, 40),
    "tiny-nemotron-h": (24, 40),
    "tiny-llama-connector": (24, 40),
    "tiny-deepseek-mla": (40, 64),
}


# -- the subprocess ------------------------------------------------------------------------
def _layer_blocks(runner: Any, ids: list[int]) -> dict[str, list[Any]]:
    """Each layer's bytes of blocks ``ids``, read through the view vLLM bound to it."""
    import torch
    from vllm.v1.kv_cache_interface import group_kernel_blocks

    num_blocks = runner.initpipe_run.outputs["runner_kv_cache_config"].num_blocks
    out = {}
    for name, layer in runner.vllm_config.compilation_config.static_forward_context.items():
        cache = getattr(layer, "kv_cache", None)
        if cache is None:
            continue
        tensors = list(cache) if isinstance(cache, (list, tuple)) else [cache]
        # as raw bytes: random bytes read as floats hold NaNs, which never compare equal
        out[name] = [
            group_kernel_blocks(t, num_blocks)[ids].contiguous().view(torch.uint8) for t in tensors
        ]
    return out


def _geometry(llm: Any) -> dict[str, Any]:
    """Random cache bytes; blocks 1, 2, 3 stashed and written back at other ids."""
    import torch

    from initpipe_vllm.live.carry.kv_copy import block_views, rank_stash, rank_unstash

    wrapper = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker
    runner = wrapper.worker.model_runner
    gen = torch.Generator().manual_seed(0)
    for _, view in block_views(runner):
        view.copy_(torch.randint(-128, 128, view.shape, dtype=torch.int8, generator=gen))
    num_blocks = runner.initpipe_run.outputs["runner_kv_cache_config"].num_blocks
    src, dst = [1, 2, 3], [num_blocks - 1, 5, num_blocks - 2]
    before = _layer_blocks(runner, src)
    stash = rank_stash(wrapper, src, [0])
    unstash = rank_unstash(wrapper, dst)
    after = _layer_blocks(runner, dst)
    differ = sorted(
        name
        for name in before
        if not all(torch.equal(a, b) for a, b in zip(before[name], after[name], strict=True))
    )
    still = _layer_blocks(runner, src)
    moved = sorted(
        name
        for name in before
        if not all(torch.equal(a, b) for a, b in zip(before[name], still[name], strict=True))
    )
    return {
        "layers": len(before),
        "kinds": sorted({type(t).__name__ for ts in before.values() for t in ts}),
        "differ": differ,
        "unchanged_sources": len(before) - len(moved),
        "stash": stash,
        "unstash": unstash,
    }


def _one(name: str, weights_dir: str) -> dict[str, Any]:
    from test_resize_warm import _core, _pool, _serve, _stock
    from vllm import LLM

    import initpipe_vllm as ip
    from initpipe_vllm.hook import PIPELINED_WORKER
    from initpipe_vllm.testing import model_dir
    from initpipe_vllm.testing.equivalence import loadable_model, workload_engine_kwargs

    start, grow = MODELS[name]
    rec: dict[str, Any] = {}
    with loadable_model(model_dir(name), weights_dir=weights_dir) as (folder, extra):
        kwargs, _ = workload_engine_kwargs(
            folder, num_gpu_blocks_override=start, worker_cls=PIPELINED_WORKER, **extra
        )
        llm = LLM(**kwargs)
        core = _core(llm)
        bs = core.scheduler.block_size
        rec["prefix_caching"] = core.vllm_config.cache_config.enable_prefix_caching
        rec["groups"] = [
            type(g.kv_cache_spec).__name__ for g in core.scheduler.kv_cache_config.kv_cache_groups
        ]
        rng = random.Random(3)
        history = [[rng.randrange(3, 500) for _ in range(bs + 20)] for _ in range(3)]
        if rec["prefix_caching"]:
            _serve(llm, history)
            rec["cached_before"] = len(_pool(llm)["hashes"])
            rec["carry"] = ip.resize_kv_cache(llm, num_blocks=grow).to_dict()["prefix_cache"]
            rec["pool"] = _pool(llm)
            rec["after"] = _serve(llm, history)
        rec["geometry"] = _geometry(llm)
        llm.llm_engine.engine_core.shutdown()
        del llm
        if rec["prefix_caching"]:
            stock = _stock(folder, extra, grow, [history, history])
            rec["stock_pool"], rec["stock_after"] = stock["pool"], stock["outputs"]
    return rec


def main(out: str, weights_dir: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    sys.path.insert(0, str(Path(__file__).parent))
    result = {name: _one(name, weights_dir) for name in MODELS}
    Path(out).write_text(json.dumps(result, default=repr))


# -- the tests -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def result(script_result: Any) -> Any:
    return script_result(__file__)


CACHING = [m for m in MODELS if m != "tiny-deepseek-mla"]


@pytest.mark.parametrize("model", CACHING)
def test_a_grow_keeps_the_pool_of_a_stock_engine_with_the_same_history(
    result: Any, model: str
) -> None:
    rec = result[model]
    assert rec["prefix_caching"]
    assert rec["cached_before"] >= 3 and rec["carry"]["blocks_kept"] == rec["cached_before"]
    assert rec["pool"] == rec["stock_pool"]
    assert rec["after"] == rec["stock_after"]
    assert all(o["cached"] > 0 for o in rec["after"])


def test_the_models_cover_every_group_kind_the_carry_claims(result: Any) -> None:
    kinds = {kind for rec in result.values() for kind in rec["groups"]}
    assert {"FullAttentionSpec", "SlidingWindowSpec", "MambaSpec", "MLAAttentionSpec"} <= kinds


@pytest.mark.parametrize("model", list(MODELS))
def test_the_copy_lands_where_vllms_own_layer_views_read_the_blocks(
    result: Any, model: str
) -> None:
    geo = result[model]["geometry"]
    assert geo["stash"]["ok"] and geo["unstash"]["ok"], geo
    assert geo["layers"] >= 2
    assert geo["differ"] == []
    assert geo["unchanged_sources"] == geo["layers"]  # a stash reads, it never writes


def test_mla_prefix_caching_is_off_on_cpu_so_nothing_is_carried(result: Any) -> None:
    assert result["tiny-deepseek-mla"]["prefix_caching"] is False


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
