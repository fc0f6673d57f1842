"""Each KV-phase stage, called directly with real inputs, against stock vLLM's runner."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from initpipe_vllm.errors import KVCacheConfigError
from initpipe_vllm.v1 import kv_phase as kp, kv_tensors as kt
from initpipe_vllm.v1.types import InputBatchGeometry, RunnerSettings


def _stock_init(made):
    with made.current():
        made.runner.initialize_kv_cache(copy.deepcopy(made.kv_cache_config))
    return made.runner


def _working(made, m):
    enc = kp.encoder_only_kv_cache_group(
        made.cfg,
        RunnerSettings.from_runner(made.runner),
        m["attention_layers"],
        m["encoder_only_layers"],
    )
    return kp.runner_kv_cache_config(
        made.kv_cache_config, m["attention_layers"], m["shared_kv_cache_layers"], enc
    )


def _groups(made, m):
    return kp.attention_groups(_working(made, m), m["attention_layers"], m["attn_backends"])


def _shape(groups):
    return [
        [
            (g.backend.full_cls_name(), list(g.layer_names), g.kv_cache_spec, g.kv_cache_group_id)
            for g in gs
        ]
        for gs in groups
    ]


# -- K1 / K2 ----------------------------------------------------------------------------
def test_encoder_only_group_reads_block_size_at_kv_time(make, model_inputs) -> None:
    made = make("tiny-bert")
    m = model_inputs(made)
    settings = RunnerSettings.from_runner(made.runner)
    made.cfg.cache_config.block_size = 32  # changed after the model phase ran
    group = kp.encoder_only_kv_cache_group(
        made.cfg, settings, m["attention_layers"], m["encoder_only_layers"]
    )
    assert type(group.kv_cache_spec).__name__ == "EncoderOnlyAttentionSpec"
    assert group.kv_cache_spec.block_size == 32
    assert group.layer_names == list(m["encoder_only_layers"])
    llama = make("tiny-llama", plan=False)
    ml = model_inputs(llama)
    assert kp.encoder_only_kv_cache_group(llama.cfg, settings, ml["attention_layers"], ()) is None


@pytest.mark.parametrize("model", ["tiny-gemma4-kvshare", "tiny-bert", "tiny-nemotron-h"])
def test_runner_kv_cache_config_equals_stock_working_copy(make, model_inputs, model) -> None:
    made = make(model)
    m = model_inputs(made)
    before = copy.deepcopy(made.kv_cache_config)
    working = _working(made, m)
    assert made.kv_cache_config == before  # the engine's config is not touched
    assert working == _stock_init(made).kv_cache_config


def test_runner_kv_cache_config_rejects_an_unknown_layer(make, model_inputs) -> None:
    made = make("tiny-llama")
    m = model_inputs(made)
    made.kv_cache_config.kv_cache_groups[0].layer_names[1] = "model.layers.7.self_attn.attn"
    with pytest.raises(KVCacheConfigError, match=r"model\.layers\.7\.self_attn\.attn") as info:
        _working(made, m)
    assert (info.value.field, info.value.layer) == (
        "kv_cache_groups",
        "model.layers.7.self_attn.attn",
    )


def test_runner_kv_cache_config_rejects_zero_blocks(make, model_inputs) -> None:
    made = make("tiny-llama")
    m = model_inputs(made)
    made.kv_cache_config.num_blocks = 0
    with pytest.raises(KVCacheConfigError, match="num_blocks is 0") as info:
        _working(made, m)
    assert info.value.field == "num_blocks"


def test_runner_kv_cache_config_rejects_mismatched_tensor_sizes(make, model_inputs) -> None:
    made = make("tiny-gemma2")
    m = model_inputs(made)
    made.kv_cache_config.kv_cache_tensors[0].size += 4096
    with pytest.raises(KVCacheConfigError, match="one backing allocation") as info:
        _working(made, m)
    assert info.value.field == "kv_cache_tensors"


def test_runner_kv_cache_config_rejects_a_runner_working_copy(make, model_inputs) -> None:
    made = make("tiny-gemma4-kvshare")
    m = model_inputs(made)
    working = _working(made, m)
    with pytest.raises(KVCacheConfigError, match="runner-only layer") as info:
        kp.runner_kv_cache_config(working, m["attention_layers"], m["shared_kv_cache_layers"], None)
    assert info.value.layer == "model.layers.2.self_attn.attn"


# -- K3 / K3a / K4 / K5 -------------------------------------------------------------------
@pytest.mark.parametrize(
    "model",
    ["tiny-gemma2", "tiny-gemma4-kvshare", "tiny-nemotron-h", "tiny-bert", "tiny-deepseek-mla"],
)
def test_attention_groups_group_as_stock(make, model_inputs, model) -> None:
    made = make(model)
    m = model_inputs(made)
    groups = _groups(made, m)
    assert all(g.metadata_builders == [] for gs in groups for g in gs)
    assert _shape(groups) == _shape(_stock_init(made).attn_groups)


def test_cudagraph_mode_sets_dispatcher_keys_which_stay_as_stock_leaves_them(
    make, model_inputs
) -> None:
    from vllm.config import CUDAGraphMode

    made = make("tiny-llama")
    m = model_inputs(made)
    working = _working(made, m)
    groups = kp.attention_groups(working, m["attention_layers"], m["attn_backends"])
    disp = made.runner.cudagraph_dispatcher
    assert not disp.keys_initialized
    with made.current():
        mode = kp.cudagraph_mode(
            made.cfg, working, groups, RunnerSettings.from_runner(made.runner), False, disp, None
        )
    assert mode == CUDAGraphMode.NONE == made.cfg.compilation_config.cudagraph_mode
    assert disp.keys_initialized
    # stock's _cleanup_profiling_kv_cache clears no keys (its profiling pass does, itself)
    assert kp.cudagraph_mode.__initpipe_stage__.teardown is None


def test_mamba_ssu_backend_selects_the_global_and_leaves_it_as_stock(make, model_inputs) -> None:
    from vllm.model_executor.layers.mamba.ops import ssu_dispatch

    made = make("tiny-nemotron-h")
    m = model_inputs(made)
    working = _working(made, m)
    saved = ssu_dispatch._mamba_ssu_backend
    ssu_dispatch._mamba_ssu_backend = None
    try:
        selected = kp.mamba_ssu_backend(made.cfg, working)
        assert selected is not None and ssu_dispatch._mamba_ssu_backend is selected
        assert kp.mamba_ssu_backend.__initpipe_stage__.teardown is None  # stock keeps it
    finally:
        ssu_dispatch._mamba_ssu_backend = saved


@pytest.mark.parametrize(
    "model", ["tiny-gemma4-kvshare", "tiny-bert", "tiny-nemotron-h", "tiny-deepseek-mla"]
)
def test_kernel_block_sizes_equal_stock(make, model_inputs, model) -> None:
    made = make(model)
    m = model_inputs(made)
    got = kp.kernel_block_sizes(_working(made, m), _groups(made, m))
    assert got == _stock_init(made)._kernel_block_sizes


# -- K6 / K7 ----------------------------------------------------------------------------
def test_metadata_builders_build_on_copies(make, model_inputs) -> None:
    made = make("tiny-nemotron-h")
    m = model_inputs(made)
    working = _working(made, m)
    groups = kp.attention_groups(working, m["attention_layers"], m["attn_backends"])
    kbs = kp.kernel_block_sizes(working, groups)
    with made.current():
        built = kp.metadata_builders(made.cfg, made.runner.device, working, groups, kbs, None)
    assert all(g.metadata_builders == [] for gs in groups for g in gs)  # inputs untouched
    names = [[type(g.get_metadata_builder()).__name__ for g in gs] for gs in built]
    stock = _stock_init(made)
    assert names == [
        [type(g.get_metadata_builder()).__name__ for g in gs] for gs in stock.attn_groups
    ]
    assert kp.reorder_batch_threshold(built) == stock.reorder_batch_threshold
    kp.metadata_builders.__initpipe_stage__.teardown(built)
    assert all(g.metadata_builders == [] for gs in built for g in gs)


def test_drafter_attn_groups_empty_without_speculative_decoding(make, model_inputs) -> None:
    made = make("tiny-llama")
    m = model_inputs(made)
    assert kp.drafter_attn_groups(made.cfg, None, _working(made, m), [128]) == []


def test_reinitialize_input_batch_keeps_or_rebuilds(make, model_inputs) -> None:
    made = make("tiny-gemma2")
    m = model_inputs(made)
    working = _working(made, m)
    r = made.runner
    settings = RunnerSettings.from_runner(r)
    placeholder = r.input_batch
    fresh = kp.reinitialize_input_batch(
        made.cfg,
        r.device,
        settings,
        working,
        r.max_model_len,
        placeholder,
        InputBatchGeometry.from_runner(r),
        None,
    )
    assert fresh["input_batch"] is not placeholder  # two groups: the placeholder had one
    geometry = fresh["input_batch_geometry"]
    assert geometry.block_sizes == (128, 128)
    kept = kp.reinitialize_input_batch(
        made.cfg, r.device, settings, working, r.max_model_len, fresh["input_batch"], geometry, None
    )
    assert kept["input_batch"] is fresh["input_batch"]
    stock = _stock_init(made)
    assert list(geometry.max_num_blocks) == stock._init_max_num_blocks
    assert [bt.block_size for bt in fresh["input_batch"].block_table.block_tables] == [
        bt.block_size for bt in stock.input_batch.block_table.block_tables
    ]


# -- K8 - K10 ---------------------------------------------------------------------------
def _views(d):
    return {n: (tuple(t.shape), t.stride(), t.dtype, t.storage_offset()) for n, t in d.items()}


def test_allocation_uses_the_resolved_layout_device_and_context(make, model_inputs) -> None:
    made = make("tiny-gemma4-kvshare")
    m = model_inputs(made)
    working = _working(made, m)
    kbs = kp.kernel_block_sizes(working, _groups(made, m))
    entered = []

    @contextlib.contextmanager
    def pool():
        entered.append("in")
        yield
        entered.append("out")

    views = kt.allocated_kv_caches(
        made.cfg, made.runner.device, working, kbs, "LBHNC", pool(), None
    )
    assert entered == ["in", "out"]
    assert {t.device for t in views.values()} == {made.runner.device}
    assert len({t.untyped_storage().data_ptr() for t in views.values()}) == 1
    _stock_init(made)
    ctx = made.cfg.compilation_config.static_forward_context
    assert _views(views) == _views({n: ctx[n].kv_cache for n in views})


def test_allocation_rejects_an_unknown_layout(make, model_inputs) -> None:
    made = make("tiny-llama")
    m = model_inputs(made)
    working = _working(made, m)
    with pytest.raises(KVCacheConfigError, match="XYZ") as info:
        kt.allocated_kv_caches(made.cfg, made.runner.device, working, [128], "XYZ", None, None)
    assert info.value.field == "kv_cache_layout"


def test_kv_caches_alias_sharing_layers_and_name_a_missing_target(make, model_inputs) -> None:
    made = make("tiny-gemma4-kvshare")
    m = model_inputs(made)
    working = _working(made, m)
    kbs = kp.kernel_block_sizes(working, _groups(made, m))
    views = kt.allocated_kv_caches(made.cfg, made.runner.device, working, kbs, None, None, None)
    aliased = kt.kv_caches(views, m["shared_kv_cache_layers"])
    for name, target in m["shared_kv_cache_layers"].items():
        assert aliased[name] is aliased[target]
    del views["model.layers.0.self_attn.attn"]
    with pytest.raises(KVCacheConfigError, match=r"model\.layers\.0\.self_attn\.attn"):
        kt.kv_caches(views, m["shared_kv_cache_layers"])


def test_binding_sets_layer_kv_cache_and_teardown_resets_it(make, model_inputs) -> None:
    made = make("tiny-gemma4-kvshare")
    m = model_inputs(made)
    working = _working(made, m)
    groups = kp.attention_groups(working, m["attention_layers"], m["attn_backends"])
    kbs = kp.kernel_block_sizes(working, groups)
    with made.current():
        built = kp.metadata_builders(made.cfg, made.runner.device, working, groups, kbs, None)
    views = kt.kv_caches(
        kt.allocated_kv_caches(made.cfg, made.runner.device, working, kbs, None, None, None),
        m["shared_kv_cache_layers"],
    )
    runner_list = kt.runner_kv_caches(made.cfg, views, working, built, [], None)
    ctx = made.cfg.compilation_config.static_forward_context
    assert [id(t) for t in runner_list] == [
        id(views[f"model.layers.{i}.self_attn.attn"]) for i in range(4)
    ]
    assert all(ctx[n].kv_cache is views[n] for n in views)
    kt.runner_kv_caches.__initpipe_stage__.teardown(runner_list, made.cfg)
    assert runner_list == []
    assert all(
        isinstance(ctx[n].kv_cache, torch.Tensor) and ctx[n].kv_cache.numel() == 0 for n in views
    )


def test_extract_hidden_states_and_connector_are_no_ops_without_them(make) -> None:
    made = make("tiny-llama", plan=False)
    assert kt.extract_hidden_states_check(made.cfg, None, made.kv_cache_config) is False
    assert kt.kv_connector_registration({}, False, []) is False
    assert kt.kv_connector_registration({}, True, []) is False
