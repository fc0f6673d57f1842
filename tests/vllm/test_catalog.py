"""The catalog as a graph: importable without torch/vllm, ordered as vLLM requires."""

from __future__ import annotations

import subprocess
import sys

import initpipe_vllm
from initpipe import KV, MODEL, Pipeline
from initpipe_vllm import catalog


def test_catalog_imports_without_torch_or_vllm() -> None:
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['vllm'] = None\n"
        "import initpipe_vllm, initpipe_vllm.testing.snapshot, initpipe_vllm.testing.equivalence\n"
        "p = initpipe_vllm.catalog(); print(len(p.order))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout.strip()) == len(initpipe_vllm.STAGES)


def test_from_module_reads_initpipe_inputs_and_matches_catalog() -> None:
    p = Pipeline.from_module("initpipe_vllm")
    assert p.order == catalog().order
    assert set(p.inputs[KV]) >= {
        "kv_cache_config",
        "is_profiling",
        "kv_cache_layout",
        "max_model_len",
        "kv_cache_allocation_context",
    }


def test_phases_split_model_facts_from_kv_work() -> None:
    specs = catalog().specs
    model = {n for n, s in specs.items() if s.needs == MODEL}
    assert model == {
        "attention_layers",
        "shared_kv_cache_layers",
        "kv_cache_spec",
        "encoder_only_layers",
        "kv_sharing_fast_prefill_eligible_layers",
        "runner_only_attn_layers",
        "attn_backends",
        "attention_cp_compatible",
    }
    # The encoder-only spec reads the block size at KV time, so it is a KV stage.
    assert specs["encoder_only_kv_cache_group"].needs == KV


def test_order_respects_vllm_constraints() -> None:
    order = catalog().order
    before = [
        ("kv_cache_spec", "runner_kv_cache_config"),  # shared map first
        ("shared_kv_cache_layers", "kv_caches"),
        ("runner_kv_cache_config", "attention_groups"),  # K1/K2 before K3
        ("cudagraph_mode", "metadata_builders"),  # K3a before K6
        ("kernel_block_sizes", "metadata_builders"),  # K5 before K6
        ("mamba_ssu_backend", "metadata_builders"),  # K4 before K6
        ("metadata_builders", "reorder_batch_threshold"),
        ("metadata_builders", "drafter_attn_groups"),
        ("allocated_kv_caches", "kv_caches"),  # K8a, K8b, K8c
        ("kv_caches", "runner_kv_caches"),
        ("runner_kv_caches", "kv_connector_registration"),
    ]
    for a, b in before:
        assert order.index(a) < order.index(b), (a, b)


def test_effects_come_with_teardowns() -> None:
    specs = catalog().specs
    assert specs["cudagraph_mode"].effects == (
        "compilation_config.cudagraph_mode",
        "cudagraph_dispatcher keys",
    )
    assert "layer.kv_cache" in specs["runner_kv_caches"].effects
    for name, spec in specs.items():
        if spec.effects and name != "kv_connector_registration":  # connectors cannot unregister
            assert spec.teardown is not None, name


def test_every_stage_is_documented() -> None:
    for name, spec in catalog().specs.items():
        assert spec.doc, name
