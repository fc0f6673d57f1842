"""The pipelined runner on real loaded models, snapshot-equal to stock vLLM's runner.

Bare runners (no engine): the test replays the engine's steps between the phases with
``initpipe_vllm.testing.plan_kv_cache_config``. Engine-level runs are in
``test_engine_equivalence.py``.
"""

from __future__ import annotations

import copy
import functools
import gc
import weakref

import pytest
import torch

from initpipe import KV, stage
from initpipe.errors import StageError
from initpipe_vllm import catalog
from initpipe_vllm.runner import engine_kv_cache_config
from initpipe_vllm.testing.snapshot import diff_snapshots, runner_snapshot

MODELS = [
    "tiny-llama",
    "tiny-gemma2",
    "tiny-gemma4-kvshare",
    "tiny-gemma4-fastprefill",
    "tiny-bert",
    "tiny-nemotron-h",
    "tiny-lfm2",
    "tiny-deepseek-mla",
    "tiny-gpt-oss",
    # Jamba (Mamba1) initializes on CPU, but its forward needs selective_scan_fwd,
    # which the CPU build lacks: covered here, not by the engine-level test.
    "tiny-jamba",
]


def _stock_cleanup(runner) -> None:
    """What vLLM's profiling pass does after capture: clear keys, then the cleanup."""
    for keys in runner.cudagraph_dispatcher.cudagraph_keys.values():
        keys.clear()
    runner.cudagraph_dispatcher.keys_initialized = False
    runner._cleanup_profiling_kv_cache()


def _pair(make, model):
    stock, piped = make(model), make(model, pipelined=True)
    assert stock.kv_cache_config == piped.kv_cache_config
    return stock, piped


def _init(made, cfg=None, **kw):
    with made.current():
        made.runner.initialize_kv_cache(copy.deepcopy(cfg or made.kv_cache_config), **kw)


def _same(a, b) -> None:
    diffs = diff_snapshots(runner_snapshot(a.runner), runner_snapshot(b.runner))
    assert diffs == []


@pytest.mark.parametrize("model", MODELS)
def test_init_cleanup_profiling_and_reinit_match_stock(make, model) -> None:
    stock, piped = _pair(make, model)
    _init(stock), _init(piped)
    _same(stock, piped)
    assert type(piped.runner).__name__.startswith("Pipelined")
    for made in (stock, piped):
        _stock_cleanup(made.runner)
    _same(stock, piped)
    for made in (stock, piped):  # vLLM's minimal profiling pass
        _init(made, made.kv_cache_config, is_profiling=True)
    _same(stock, piped)
    for made in (stock, piped):
        _stock_cleanup(made.runner)
        _init(made)
    _same(stock, piped)


def test_teardown_leaves_the_runner_as_vllms_cleanup(make) -> None:
    stock, piped = _pair(make, "tiny-gemma4-kvshare")
    _init(stock), _init(piped)
    piped.runner._cleanup_profiling_kv_cache()  # the run's KV teardown, keys included
    _stock_cleanup(stock.runner)
    _same(stock, piped)
    snap = runner_snapshot(piped.runner)
    assert snap["attn_groups"] == [] and snap["runner_kv_caches"] == []
    assert snap["init_block_sizes"] == [] and snap["kv_cache_config"] is None
    assert snap["shared_kv_cache_layers"] and snap["dispatcher"]["keys_initialized"] is False
    assert all(v["kv_cache"]["shape"] == [0] for v in snap["layers"].values())
    assert piped.runner.initpipe_run.completed(KV) == []


def test_kv_teardown_returns_the_kv_memory(make) -> None:
    piped = make("tiny-nemotron-h", pipelined=True)
    _init(piped)
    views = [weakref.ref(t) for t in piped.runner.kv_caches]
    piped.runner._cleanup_profiling_kv_cache()
    assert [v() for v in views] == [None] * len(views)


def test_model_phase_runs_at_get_kv_cache_spec_with_the_final_block_size(make) -> None:
    """The trap: vLLM fixes the block size after load_model; the specs must see it."""
    piped = make("tiny-llama", pipelined=True, plan=False, update_block_size=False)
    stock = make("tiny-llama", plan=False, update_block_size=False)
    run = piped.runner.initpipe_run
    assert run.state == "started"  # load_model did not run the model phase
    for made in (stock, piped):
        made.cfg.cache_config.block_size = 64
    spec = piped.runner.get_kv_cache_spec()
    assert {s.block_size for s in spec.values()} == {64}
    assert spec == stock.runner.get_kv_cache_spec()
    assert piped.runner.get_kv_cache_spec() == spec and piped.runner.initpipe_run is run  # memo
    piped.cfg.cache_config.block_size = 32  # changed again before any KV phase
    assert {s.block_size for s in piped.runner.get_kv_cache_spec().values()} == {32}


def test_block_size_change_with_a_kv_cache_in_place_is_refused(make) -> None:
    piped = make("tiny-llama", pipelined=True)
    _init(piped)
    piped.cfg.cache_config.block_size = 32
    with pytest.raises(RuntimeError, match="block_size changed from 128 to 32"):
        piped.runner.get_kv_cache_spec()


def test_get_kv_cache_spec_before_load_model_says_what_to_do(make) -> None:
    from vllm.config import set_current_vllm_config

    from initpipe_vllm.runner import pipelined_runner_class
    from initpipe_vllm.testing import ensure_distributed, tiny_vllm_config

    cfg = tiny_vllm_config("tiny-llama")
    ensure_distributed(cfg)
    with set_current_vllm_config(cfg):
        runner = pipelined_runner_class()(cfg, torch.device("cpu"))
        with pytest.raises(RuntimeError, match="load_model\\(\\) must be called"):
            runner.get_kv_cache_spec()


def test_resize_without_restart_frees_the_old_cache(make) -> None:
    from initpipe_vllm.testing import plan_kv_cache_config

    piped = make("tiny-gemma2", pipelined=True)
    _init(piped)
    old = weakref.ref(piped.runner.kv_caches[0])
    bigger = plan_kv_cache_config(piped.runner, 16 << 20)
    _init(piped, bigger)  # no cleanup call: the run tears down
    gc.collect()
    assert old() is None
    assert (
        piped.runner.kv_caches[0].shape[0] == bigger.num_blocks > piped.kv_cache_config.num_blocks
    )
    assert piped.runner.initpipe_run.kv_generation == 2


def test_max_model_len_is_read_at_kv_time(make) -> None:
    """The engine may shrink max_model_len between the phases (auto-fit, RPC
    update_max_model_len); the KV phase must use the new value, like stock vLLM."""
    stock, piped = _pair(make, "tiny-llama")
    for made in (stock, piped):
        made.runner.get_kv_cache_spec()
        made.cfg.model_config.max_model_len = 128  # what Worker.update_max_model_len does
        made.runner.max_model_len = 128
        _init(made)
    _same(stock, piped)
    assert piped.runner.input_batch.max_model_len == 128


def test_engine_kv_cache_config_inverts_the_runner_working_copy(make) -> None:
    for model in ("tiny-gemma4-kvshare", "tiny-bert"):
        piped = make(model, pipelined=True)
        _init(piped)
        assert engine_kv_cache_config(piped.runner) == piped.kv_cache_config


def _failing_once(name: str):
    """A replacement for stage ``name`` that raises on its first call only."""
    original = catalog().specs[name]
    calls = []

    @functools.wraps(original.func)  # the stage's signature (inputs) is the original's
    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError(f"injected failure in {name}")
        return original.func(*args, **kwargs)

    return stage(wrapper, needs=KV, provides=original.provides, teardown=original.teardown)


@pytest.mark.parametrize(
    "failing",
    [
        "attention_groups",
        "metadata_builders",
        "allocated_kv_caches",
        "runner_kv_caches",
        "kv_connector_registration",
    ],
)
def test_a_failing_stage_rolls_back_and_a_retry_works(make, failing) -> None:
    from initpipe_vllm.runner import pipelined_runner_class
    from initpipe_vllm.testing import build_runner, plan_kv_cache_config, tiny_vllm_config

    pipeline = catalog().replace(failing, _failing_once(failing))
    cfg = tiny_vllm_config("tiny-llama")
    runner = build_runner(cfg, pipelined_runner_class(), pipeline=pipeline)
    kv = plan_kv_cache_config(runner)
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(cfg):
        with pytest.raises(StageError, match=failing) as info:
            runner.initialize_kv_cache(copy.deepcopy(kv))
        assert info.value.stage == failing
        assert runner.attn_groups == [] and runner.kv_caches == []
        assert not hasattr(runner, "kv_cache_config")
        ctx = cfg.compilation_config.static_forward_context
        assert all(layer.kv_cache.numel() == 0 for layer in ctx.values())
        assert runner.cudagraph_dispatcher.keys_initialized is False
        runner.initialize_kv_cache(copy.deepcopy(kv))  # the retry
    assert len(runner.kv_caches) == 2 and runner.attn_groups


def test_shutdown_closes_the_run(make) -> None:
    piped = make("tiny-llama", pipelined=True)
    _init(piped)
    with piped.current():
        piped.runner.shutdown()
    assert piped.runner.initpipe_run.state == "closed"
    assert piped.runner.kv_caches == []
