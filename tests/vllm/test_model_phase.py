"""Each model-phase stage, called directly with a real loaded model, against stock vLLM."""

from __future__ import annotations

import pytest

from initpipe_vllm.errors import ModelPhaseError
from initpipe_vllm.v1 import model_phase as mp


def _stock_specs(made):
    with made.current():
        return made.runner.get_kv_cache_spec()


def test_attention_layers_are_the_forward_context_attention_layers(make) -> None:
    made = make("tiny-llama", plan=False)
    layers = mp.attention_layers(made.cfg, made.runner.model)
    assert list(layers) == ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
    ctx = made.cfg.compilation_config.static_forward_context
    assert all(layers[n] is ctx[n] for n in layers)


def test_attention_layers_refuses_a_missing_model(make) -> None:
    made = make("tiny-llama", plan=False)
    with pytest.raises(ModelPhaseError, match="model is None"):
        mp.attention_layers(made.cfg, None)


def test_shared_kv_cache_layers_is_vllms_hidden_side_effect_made_explicit(make) -> None:
    made = make("tiny-gemma4-kvshare", plan=False)
    layers = mp.attention_layers(made.cfg, made.runner.model)
    shared = mp.shared_kv_cache_layers(layers)
    assert made.runner.shared_kv_cache_layers == {}  # stock fills it only in get_kv_cache_spec
    _stock_specs(made)
    assert (
        shared
        == made.runner.shared_kv_cache_layers
        == {
            "model.layers.2.self_attn.attn": "model.layers.0.self_attn.attn",
            "model.layers.3.self_attn.attn": "model.layers.1.self_attn.attn",
        }
    )


def test_shared_kv_cache_layers_names_a_target_that_is_not_an_attention_layer(make) -> None:
    made = make("tiny-gemma4-kvshare", plan=False)
    layers = mp.attention_layers(made.cfg, made.runner.model)
    del layers["model.layers.0.self_attn.attn"]
    with pytest.raises(ModelPhaseError, match=r"model\.layers\.2\.self_attn\.attn") as info:
        mp.shared_kv_cache_layers(layers)
    assert info.value.layer == "model.layers.2.self_attn.attn"


@pytest.mark.parametrize(
    "model",
    [
        "tiny-llama",
        "tiny-gemma2",
        "tiny-gemma4-kvshare",
        "tiny-bert",
        "tiny-nemotron-h",
        "tiny-deepseek-mla",
    ],
)
def test_kv_cache_spec_equals_stock_get_kv_cache_spec(make, model) -> None:
    made = make(model, plan=False)
    layers = mp.attention_layers(made.cfg, made.runner.model)
    spec = mp.kv_cache_spec(made.cfg, layers, mp.shared_kv_cache_layers(layers))
    assert spec == _stock_specs(made)
    if model == "tiny-bert":
        assert spec == {}  # encoder-only layers get their spec from the runner, at KV time


def test_kv_cache_spec_reads_the_block_size_current_when_it_runs(make) -> None:
    """The trap: the block size is fixed after load_model, and the spec must see it."""
    made = make("tiny-llama", plan=False, update_block_size=False)
    layers = mp.attention_layers(made.cfg, made.runner.model)
    made.cfg.cache_config.block_size = 64  # as update_block_size_for_backend may do
    spec = mp.kv_cache_spec(made.cfg, layers, {})
    assert {s.block_size for s in spec.values()} == {64}
    assert spec == _stock_specs(made)


def test_encoder_only_layers(make) -> None:
    bert = make("tiny-bert", plan=False)
    layers = mp.attention_layers(bert.cfg, bert.runner.model)
    assert mp.encoder_only_layers(layers) == tuple(layers)
    llama = make("tiny-llama", plan=False)
    assert mp.encoder_only_layers(mp.attention_layers(llama.cfg, llama.runner.model)) == ()


@pytest.mark.parametrize("fast_prefill", [False, True])
def test_fast_prefill_eligible_layers_match_stock(make, fast_prefill) -> None:
    made = make("tiny-gemma4-kvshare", kv_sharing_fast_prefill=fast_prefill)
    layers = mp.attention_layers(made.cfg, made.runner.model)
    eligible = mp.kv_sharing_fast_prefill_eligible_layers(
        made.cfg, layers, mp.shared_kv_cache_layers(layers)
    )
    with made.current():
        made.runner.initialize_kv_cache(made.kv_cache_config)
    assert eligible == made.runner.kv_sharing_fast_prefill_eligible_layers
    assert bool(eligible) is fast_prefill


def test_runner_only_attn_layers_match_stock(make) -> None:
    for model in ("tiny-bert", "tiny-gemma4-kvshare"):
        made = make(model)
        layers = mp.attention_layers(made.cfg, made.runner.model)
        got = mp.runner_only_attn_layers(
            mp.encoder_only_layers(layers), mp.shared_kv_cache_layers(layers)
        )
        with made.current():
            made.runner.initialize_kv_cache(made.kv_cache_config)
        assert got == made.runner.runner_only_attn_layers != set()


def test_attn_backends_wraps_fast_prefill_layers_once(make) -> None:
    made = make("tiny-gemma4-kvshare", plan=False, kv_sharing_fast_prefill=True)
    layers = mp.attention_layers(made.cfg, made.runner.model)
    eligible = mp.kv_sharing_fast_prefill_eligible_layers(
        made.cfg, layers, mp.shared_kv_cache_layers(layers)
    )
    backends = mp.attn_backends(layers, eligible)
    plain = {n: b for n, b in backends.items() if n not in eligible}
    assert {b.__name__ for b in plain.values()} == {"CPUAttentionBackend"}
    wrapped = {backends[n] for n in eligible}
    assert len(wrapped) == 1  # one subclass, reused by every KV phase
    (cls,) = wrapped
    assert cls.__name__.startswith("FastPrefill") and issubclass(cls, next(iter(plain.values())))
    assert mp.attn_backends(layers, frozenset()) == {
        n: layer.get_attn_backend() for n, layer in layers.items()
    }


def test_attention_cp_compatible(make) -> None:
    made = make("tiny-llama", plan=False)
    assert mp.attention_cp_compatible(made.cfg, mp.attention_layers(made.cfg, made.runner.model))
