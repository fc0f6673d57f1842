"""Bad KV configs fed to the real vLLM catalog get a specific error naming the culprit.

Each case names its culprit (stage, field or layer) in the message and on the error's
attributes, never a raw KeyError, networkx or assertion traceback. Most mutate a copy of
the engine's KV cache config and pass it to ``initialize_kv_cache`` of a loaded tiny-llama
pipelined runner (``relkit.Rig``), which must be left as vLLM's cleanup leaves it, with
the good config still working afterwards. Inputs vLLM's own constructors would reject
first (a bad KV cache layout, KV-sharing targets that are missing, the layer itself or of
another attention type) go straight to the catalog stage that consumes them; a target
after its sharer is accepted, as stock accepts it. Last, the pipelined runner
refuses ``initialize_kv_cache`` before ``load_model``.

The core contracts live in tests/core/: malformed ``@stage`` declarations in
test_stage.py, pipeline validation problems (cycle, missing input, duplicate producer or
name, phase violation, unknown ``after``) in test_validation.py, and runtime misuse of
``Pipeline``/``Run`` (phase order, inputs, outputs, ``replace``, ``inject_fault``) in
test_run.py.
"""

from __future__ import annotations

import copy
import dataclasses

import networkx as nx
import pytest
from relkit import Rig, frozen_gc

from initpipe import PhaseOrderError, StageError
from initpipe_vllm.errors import KVCacheConfigError, ModelPhaseError

L0, L1 = "model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"
NOT_RAW = (AssertionError, nx.NetworkXException)


@pytest.fixture(scope="module")
def rig():
    with frozen_gc():
        yield Rig()


@pytest.fixture
def bad(rig):
    """``bad(mutate)``: initialize the runner with a mutated copy of the engine's config.

    Returns the StageError; checks the runner stayed as vLLM's cleanup leaves it, and
    that the good config still works afterwards.
    """

    def _bad(mutate):
        cfg = copy.deepcopy(rig.kv_cache_config)
        mutate(cfg)
        with pytest.raises(StageError) as info:
            rig.reinit(cfg)
        assert not isinstance(info.value.__cause__, (KeyError, *NOT_RAW))
        assert rig.diff(rig.cleaned) == []
        return info.value

    yield _bad
    rig.reinit()  # the good config still works afterwards
    assert rig.diff(rig.clean) == []


def _spec(**changes):
    def mutate(cfg):
        group = cfg.kv_cache_groups[0]
        group.kv_cache_spec = dataclasses.replace(group.kv_cache_spec, **changes)

    return mutate


def test_zero_blocks(bad) -> None:
    err = bad(lambda cfg: setattr(cfg, "num_blocks", 0))
    assert err.stage == "runner_kv_cache_config"
    cause = err.__cause__
    assert isinstance(cause, KVCacheConfigError) and cause.field == "num_blocks"
    assert "num_blocks is 0" in str(err) and "at least one block" in str(err)


def test_a_group_naming_an_unknown_layer(bad) -> None:
    def mutate(cfg):
        cfg.kv_cache_groups[0].layer_names[1] = "layers.1.self_attn.attn"

    err = bad(mutate)
    cause = err.__cause__
    assert isinstance(cause, KVCacheConfigError) and not isinstance(cause, KeyError)
    assert cause.field == "kv_cache_groups" and cause.layer == "layers.1.self_attn.attn"
    assert "is not an attention layer of the loaded model. Did you mean" in str(err)


def test_a_group_naming_an_unknown_layer_suggests_the_closest(bad) -> None:
    def mutate(cfg):
        cfg.kv_cache_groups[0].layer_names[1] = "layers.1.self_attn.attn"

    err = bad(mutate)
    assert f"Did you mean {L1!r}?" in str(err)


def test_a_tensor_holding_a_layer_no_group_names(bad) -> None:
    def mutate(cfg):
        cfg.kv_cache_groups[0].layer_names = [L0]

    err = bad(mutate)
    cause = err.__cause__
    assert isinstance(cause, KVCacheConfigError)
    assert cause.field == "kv_cache_tensors" and cause.layer == L1


def test_tensors_of_different_sizes(bad) -> None:
    def mutate(cfg):
        t = cfg.kv_cache_tensors[0]
        cfg.kv_cache_tensors = [
            dataclasses.replace(t, layers=[L0]),
            dataclasses.replace(t, layers=[L1], size=t.size // 2),
        ]

    err = bad(mutate)
    cause = err.__cause__
    assert isinstance(cause, KVCacheConfigError) and cause.field == "kv_cache_tensors"
    assert "[4194304, 8388608]" in str(cause)


def test_not_a_kv_cache_config(bad) -> None:
    err = bad(lambda cfg: delattr(cfg, "kv_cache_tensors"))
    cause = err.__cause__
    assert isinstance(cause, KVCacheConfigError) and cause.field == "kv_cache_tensors"
    assert "pass a vllm KVCacheConfig" in str(cause)


def test_a_block_size_no_backend_kernel_supports(bad) -> None:
    err = bad(_spec(block_size=100))
    assert err.stage == "kernel_block_sizes"
    assert isinstance(err.__cause__, ValueError)
    assert "No common block size for 100 (CPU_ATTN" in str(err)
    # vLLM's own ValueError stays catchable as stock raises it (issue 12, point 7)
    assert isinstance(err, ValueError) and type(err).__name__ == "StageError[ValueError]"


def test_an_out_of_memory_in_a_stage_is_still_a_torch_out_of_memory_error(rig) -> None:
    """What a GPU raises when the KV cache does not fit (on CPU an OOM is a plain
    RuntimeError): injected into the real allocation stage, caught as stock's type."""
    import torch

    from initpipe.testing import fault

    rig.cleanup()
    with fault(rig.runner.initpipe_run, "allocated_kv_caches", torch.OutOfMemoryError("OOM")):
        with pytest.raises(torch.OutOfMemoryError) as info:
            rig.init()
    err = info.value
    assert isinstance(err, StageError) and err.stage == "allocated_kv_caches"
    assert err.phase == "kv_cache_config" and "reinitialize_input_batch" in err.completed
    assert "reinitialize_input_batch" in str(err)  # what crosses a process boundary
    rig.init()  # the retry
    assert rig.diff(rig.clean) == []


def test_a_tensor_too_small_for_its_blocks(bad) -> None:
    def mutate(cfg):
        cfg.kv_cache_tensors[0].size = cfg.kv_cache_tensors[0].size // 2
        cfg.kv_cache_tensors[0].layer_stride //= 2  # consistent, but half the blocks

    err = bad(mutate)
    assert isinstance(err.__cause__, KVCacheConfigError)
    assert err.__cause__.field == "kv_cache_tensors" and err.__cause__.layer in (L0, L1)


def test_more_blocks_than_the_tensors_hold(bad) -> None:
    err = bad(lambda cfg: setattr(cfg, "num_blocks", cfg.num_blocks * 2))
    assert isinstance(err.__cause__, KVCacheConfigError)
    assert err.__cause__.field in ("num_blocks", "kv_cache_tensors")


def test_a_group_block_size_that_does_not_match_the_tensors(bad) -> None:
    err = bad(_spec(block_size=256))
    assert isinstance(err.__cause__, KVCacheConfigError)
    assert "block_size" in str(err.__cause__) or err.__cause__.field == "kv_cache_tensors"


def test_a_grouped_layer_without_a_tensor(bad) -> None:
    def mutate(cfg):
        cfg.kv_cache_tensors[0].layers = [L0]

    err = bad(mutate)
    assert isinstance(err.__cause__, KVCacheConfigError) and err.__cause__.layer == L1


def test_a_group_spec_that_does_not_match_the_layers(bad) -> None:
    err = bad(_spec(head_size=16))
    assert isinstance(err.__cause__, KVCacheConfigError) and err.__cause__.layer in (L0, L1)


# KV-sharing maps: vLLM's Attention rejects a bad target at construction, so these are fed
# straight to the stages that consume the map, with the real loaded model's layers.
@pytest.fixture
def model_outputs(rig):
    return rig.runner.initpipe_run.outputs


def _engine_config_without(rig, sharer):
    """The engine config as vLLM plans it when ``sharer`` shares a cache (no own tensor)."""
    cfg = copy.deepcopy(rig.kv_cache_config)
    cfg.kv_cache_groups[0].layer_names.remove(sharer)
    cfg.kv_cache_tensors[0].layers.remove(sharer)
    return cfg


def test_kv_sharing_target_that_does_not_exist_kv_phase(rig, model_outputs) -> None:
    from initpipe_vllm.v1.kv_phase import runner_kv_cache_config

    ghost = "model.layers.7.self_attn.attn"
    with pytest.raises(KVCacheConfigError, match=ghost) as info:
        runner_kv_cache_config(
            _engine_config_without(rig, L1), model_outputs["attention_layers"], {L1: ghost}, None
        )
    assert info.value.layer == ghost and info.value.field == "kv_cache_groups"
    assert L1 in str(info.value)


def test_kv_sharing_target_that_does_not_exist_model_phase(rig, model_outputs) -> None:
    from initpipe_vllm.v1.model_phase import shared_kv_cache_layers

    layer = model_outputs["attention_layers"][L1]
    ghost = "model.layers.7.self_attn.attn"
    layer.kv_sharing_target_layer_name = ghost
    try:
        with pytest.raises(ModelPhaseError, match=ghost) as info:
            shared_kv_cache_layers(model_outputs["attention_layers"])
    finally:
        layer.kv_sharing_target_layer_name = None
    assert info.value.layer == L1 and "not an attention layer" in str(info.value)


def test_kv_sharing_target_without_a_tensor_at_allocation(rig, model_outputs) -> None:
    from initpipe_vllm.v1.kv_tensors import kv_caches

    with pytest.raises(KVCacheConfigError, match="got no KV cache tensor") as info:
        kv_caches({L0: object()}, {L1: "model.layers.7.self_attn.attn"})
    assert info.value.layer == "model.layers.7.self_attn.attn"
    assert info.value.field == "kv_cache_tensors"


def test_kv_sharing_target_after_its_sharer_is_accepted_as_stock_accepts_it(
    rig, model_outputs
) -> None:
    """Stock's get_kv_cache_spec has no order check (vLLM's Gemma4 MTP drafter shares a
    later-indexed layer); both phases accept it (stock-equality: tests/vllm/test_runner.py)."""
    from initpipe_vllm.v1.kv_phase import runner_kv_cache_config
    from initpipe_vllm.v1.model_phase import shared_kv_cache_layers

    layer = model_outputs["attention_layers"][L0]
    layer.kv_sharing_target_layer_name = L1
    try:
        assert shared_kv_cache_layers(model_outputs["attention_layers"]) == {L0: L1}
    finally:
        layer.kv_sharing_target_layer_name = None
    cfg = runner_kv_cache_config(
        _engine_config_without(rig, L0), model_outputs["attention_layers"], {L0: L1}, None
    )
    assert any(L0 in g.layer_names and L1 in g.layer_names for g in cfg.kv_cache_groups)


@pytest.mark.parametrize("phase", ["model", "kv"])
def test_kv_sharing_target_that_is_the_layer_itself(rig, model_outputs, phase) -> None:
    from initpipe_vllm.v1.kv_phase import runner_kv_cache_config
    from initpipe_vllm.v1.model_phase import shared_kv_cache_layers

    layers = model_outputs["attention_layers"]
    if phase == "kv":
        with pytest.raises(KVCacheConfigError, match="names itself") as info:
            runner_kv_cache_config(_engine_config_without(rig, L1), layers, {L1: L1}, None)
        assert info.value.field == "kv_cache_groups"
    else:
        layers[L1].kv_sharing_target_layer_name = L1
        try:
            with pytest.raises(ModelPhaseError, match="names itself") as info:
                shared_kv_cache_layers(layers)
        finally:
            layers[L1].kv_sharing_target_layer_name = None
    assert info.value.layer == L1


def test_kv_sharing_target_of_another_attention_type(rig, model_outputs) -> None:
    from vllm.v1.attention.backend import AttentionType

    from initpipe_vllm.v1.model_phase import shared_kv_cache_layers

    layers = model_outputs["attention_layers"]
    layers[L1].kv_sharing_target_layer_name = L0
    saved = layers[L0].attn_type
    layers[L0].attn_type = AttentionType.ENCODER_ONLY
    try:
        with pytest.raises(ModelPhaseError, match="same attention type") as info:
            shared_kv_cache_layers(layers)
    finally:
        layers[L1].kv_sharing_target_layer_name = None
        layers[L0].attn_type = saved
    assert info.value.layer == L1 and L0 in str(info.value)


def test_a_bad_kv_cache_layout_name(rig) -> None:
    from initpipe_vllm.v1.kv_tensors import resolve_layout

    with pytest.raises(KVCacheConfigError, match="'NCHW' is not a KVCacheLayout") as info:
        resolve_layout("NCHW", rig.cfg)
    assert info.value.field == "kv_cache_layout" and not isinstance(info.value, KeyError)


def test_runner_kv_phase_before_load_model() -> None:
    import torch
    from vllm.config import set_current_vllm_config

    from initpipe_vllm.runner import pipelined_runner_class
    from initpipe_vllm.testing import ensure_distributed, tiny_vllm_config

    cfg = tiny_vllm_config("tiny-llama")
    ensure_distributed(cfg)
    with set_current_vllm_config(cfg):
        runner = pipelined_runner_class()(cfg, torch.device("cpu"))
        with pytest.raises(PhaseOrderError, match="load_model\\(\\) must be called"):
            runner.initialize_kv_cache(None)
