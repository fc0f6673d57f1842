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

from initpipe import KV, PhaseOrderError, stage
from initpipe.errors import StageError
from initpipe_vllm.runner import engine_kv_cache_config
from initpipe_vllm.testing import installed_catalog
from initpipe_vllm.testing.snapshot import runner_snapshot, stock_differences

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
    """``initialize_kv_cache``, then what the worker does next (``initialize_from_config``
    builds the KV block zeroer after a real, non-profiling KV phase)."""
    cfg = cfg or made.kv_cache_config
    with made.current():
        made.runner.initialize_kv_cache(copy.deepcopy(cfg), **kw)
        if cfg.needs_kv_cache_zeroing and not kw.get("is_profiling"):
            made.runner._init_kv_zero_meta()


def _same(stock, piped, *, torn_down=False) -> None:
    """Snapshot-equal, except the documented deliberate differences (``torn_down``: stock's
    zeroer predates a KV teardown, so the pipelined runner has none)."""
    diffs = stock_differences(
        runner_snapshot(stock.runner), runner_snapshot(piped.runner), torn_down=torn_down
    )
    assert diffs == []


@pytest.mark.parametrize("model", MODELS)
def test_init_cleanup_profiling_and_reinit_match_stock(make, model) -> None:
    stock, piped = _pair(make, model)
    _init(stock), _init(piped)
    _same(stock, piped)
    assert type(piped.runner).__name__.startswith("Pipelined")
    for made in (stock, piped):
        _stock_cleanup(made.runner)
    _same(stock, piped, torn_down=True)
    for made in (stock, piped):  # vLLM's minimal profiling pass
        _init(made, made.kv_cache_config, is_profiling=True)
    _same(stock, piped, torn_down=True)
    for made in (stock, piped):
        _stock_cleanup(made.runner)
        _init(made)
    _same(stock, piped)


def test_teardown_leaves_the_runner_as_vllms_cleanup(make) -> None:
    stock, piped = _pair(make, "tiny-gemma4-kvshare")
    _init(stock), _init(piped)
    for made in (stock, piped):  # the bare cleanup: no key clearing before it
        made.runner._cleanup_profiling_kv_cache()
    _same(stock, piped, torn_down=True)
    snap = runner_snapshot(piped.runner)
    assert snap["attn_groups"] == [] and snap["runner_kv_caches"] == []
    assert snap["init_block_sizes"] == [] and snap["kv_cache_config"] is None
    # stock's cleanup leaves the dispatcher keys (its profiling pass clears them itself)
    assert snap["shared_kv_cache_layers"] and snap["dispatcher"]["keys_initialized"] is True
    assert all(v["kv_cache"]["shape"] == [0] for v in snap["layers"].values())
    assert piped.runner.initpipe_run.completed(KV) == []


def test_cleanup_leaves_process_globals_and_drafter_as_stock(make) -> None:
    """The Mamba SSU backend global stays selected after cleanup, as stock leaves it (it
    used to be reset to None, breaking any Mamba forward until the next KV phase)."""
    from vllm.model_executor.layers.mamba.ops import ssu_dispatch

    stock, piped = _pair(make, "tiny-nemotron-h")
    saved = ssu_dispatch._mamba_ssu_backend
    try:
        for made in (stock, piped):
            ssu_dispatch._mamba_ssu_backend = None  # as in a fresh process
            _init(made)
            made.runner._cleanup_profiling_kv_cache()
            snap = runner_snapshot(made.runner)
            assert snap["process_globals"]["mamba_ssu_backend"] is not None
            assert ssu_dispatch.get_mamba_ssu_backend() is not None  # no raise
        _same(stock, piped, torn_down=True)
    finally:
        ssu_dispatch._mamba_ssu_backend = saved


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


def test_a_second_kv_phase_in_place_is_refused_and_cleanup_then_init_resizes(make) -> None:
    """Stock asserts on a second initialize_kv_cache; the pipelined runner refuses it by
    name (on a live engine a silent re-run would leave the block pool and CUDA graphs on
    the old cache). Cleanup first, then initialize: the old cache is freed."""
    from initpipe_vllm.testing import plan_kv_cache_config

    piped = make("tiny-gemma2", pipelined=True)
    _init(piped)
    old = weakref.ref(piped.runner.kv_caches[0])
    bigger = plan_kv_cache_config(piped.runner, 16 << 20)
    before = runner_snapshot(piped.runner)
    with pytest.raises(PhaseOrderError, match="_cleanup_profiling_kv_cache\\(\\) first"):
        _init(piped, bigger)
    assert stock_differences(before, runner_snapshot(piped.runner)) == []  # untouched
    with piped.current():
        piped.runner._cleanup_profiling_kv_cache()
    _init(piped, bigger)
    gc.collect()
    assert old() is None
    assert (
        piped.runner.kv_caches[0].shape[0] == bigger.num_blocks > piped.kv_cache_config.num_blocks
    )
    assert piped.runner.initpipe_run.kv_generation == 2


def test_the_replaced_input_batch_is_not_kept_alive(make) -> None:
    """After a KV phase that rebuilds the InputBatch, nothing of initpipe's holds the old one
    (stock drops it; the run used to keep it as a phase input until the next teardown)."""
    stock, piped = _pair(make, "tiny-llama")
    olds = []
    for made in (stock, piped):
        _init(made)
        with made.current():
            made.runner._cleanup_profiling_kv_cache()  # _init_block_sizes = []: rebuilt next
        olds.append(weakref.ref(made.runner.input_batch))
        _init(made)
        assert made.runner.input_batch is not olds[-1]()
    gc.collect()
    assert [ref() for ref in olds] == [None, None]


def test_kv_block_zeroer_follows_a_rerun_with_another_num_blocks(make) -> None:
    """The zeroer stores absolute addresses: after cleanup and a re-run with another
    num_blocks it must address the new tensors exactly as a fresh stock runner's zeroer
    over the same config does (relative to the buffers' bases); after cleanup it is gone."""
    from initpipe_vllm.testing import plan_kv_cache_config

    stock, piped = _pair(make, "tiny-nemotron-h")
    assert piped.kv_cache_config.needs_kv_cache_zeroing  # Mamba layers
    _init(piped)
    first = piped.runner._kv_block_zeroer
    assert piped.runner.initpipe_run.outputs["kv_block_zeroer"] is first  # no second one
    bigger = plan_kv_cache_config(piped.runner, 24 << 20)
    assert bigger.num_blocks != piped.kv_cache_config.num_blocks
    with piped.current():
        piped.runner._cleanup_profiling_kv_cache()
    assert not hasattr(piped.runner, "_kv_block_zeroer")
    assert first._meta is None  # disarmed: a leftover reference zeroes nothing
    with piped.current():  # the re-run alone (no worker call) leaves a zeroer over it
        piped.runner.initialize_kv_cache(copy.deepcopy(bigger))
    _init(stock, bigger)  # a fresh stock runner over the same config
    ours = runner_snapshot(piped.runner)["kv_block_zeroer"]
    assert ours == runner_snapshot(stock.runner)["kv_block_zeroer"]
    assert ours["segments"] and all(seg[0] != "freed" for seg in ours["segments"])
    # stock's cleanup keeps its zeroer over the freed cache: the deliberate difference
    with stock.current():
        stock.runner._cleanup_profiling_kv_cache()
    stale = runner_snapshot(stock.runner)["kv_block_zeroer"]
    assert {seg[0] for seg in stale["segments"]} == {"freed"}


def test_kv_sharing_target_after_its_sharer_runs_as_stock_runs_it(make) -> None:
    """vLLM's Gemma4 MTP drafter shares the KV cache of a LATER-indexed layer; stock's
    get_kv_cache_spec accepts it, so the catalog must too (same runner state)."""
    from initpipe_vllm.testing import plan_kv_cache_config

    made = []
    for pipelined in (False, True):
        m = make("tiny-llama", pipelined=pipelined, plan=False)
        layers = m.cfg.compilation_config.static_forward_context
        layers[
            "model.layers.0.self_attn.attn"
        ].kv_sharing_target_layer_name = "model.layers.1.self_attn.attn"
        m.kv_cache_config = plan_kv_cache_config(m.runner)
        made.append(m)
    stock, piped = made
    assert stock.kv_cache_config == piped.kv_cache_config
    _init(stock), _init(piped)
    _same(stock, piped)
    assert piped.runner.shared_kv_cache_layers == {
        "model.layers.0.self_attn.attn": "model.layers.1.self_attn.attn"
    }
    layers = piped.cfg.compilation_config.static_forward_context
    assert (
        layers["model.layers.0.self_attn.attn"].kv_cache.data_ptr()
        == layers["model.layers.1.self_attn.attn"].kv_cache.data_ptr()
    )


def test_a_draft_models_layers_are_marked_in_their_specs_as_stock_marks_them(make) -> None:
    """vLLM 0.33's ``get_kv_cache_spec`` marks the layers a drafter registered
    (``is_draft_layer``, set when it loads) ``is_draft=True`` in their specs, and its KV
    planning marks the EAGLE groups by it. The field is left out of spec equality, so the
    marks are compared by themselves. 0.32's specs have no such field (both sides None)."""
    from initpipe_vllm.hook.adapter import installed_adapter

    draft = "model.layers.1.self_attn.attn"
    marks = []
    for pipelined in (False, True):
        m = make("tiny-llama", pipelined=pipelined, plan=False)
        m.cfg.compilation_config.static_forward_context[draft].is_draft_layer = True
        with m.current():
            specs = m.runner.get_kv_cache_spec()
        marks.append({name: getattr(spec, "is_draft", None) for name, spec in specs.items()})
    stock, piped = marks
    assert piped == stock
    if installed_adapter("v1").release != "0.32.0":  # the contract's answer, not a version
        assert stock == {"model.layers.0.self_attn.attn": False, draft: True}


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
    original = installed_catalog().specs[name]
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

    pipeline = installed_catalog().replace(failing, _failing_once(failing))
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
        runner.initialize_kv_cache(copy.deepcopy(kv))  # the retry
    assert len(runner.kv_caches) == 2 and runner.attn_groups


def test_shutdown_closes_the_run(make) -> None:
    piped = make("tiny-llama", pipelined=True)
    _init(piped)
    with piped.current():
        piped.runner.shutdown()
    assert piped.runner.initpipe_run.state == "closed"
    assert piped.runner.kv_caches == []
