"""The catalog as a graph: importable without torch/vllm, ordered as vLLM requires."""

from __future__ import annotations

import subprocess
import sys

import initpipe_vllm
from initpipe import KV, MODEL, REQUIRED, Pipeline
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
    declared = initpipe_vllm.INITPIPE_INPUTS
    # exactly what the module declares, every phase, with the KV phase's defaults
    assert {phase: dict(inputs) for phase, inputs in p.inputs.items()} == {
        "start": dict.fromkeys(declared["start"], REQUIRED),
        MODEL: {"model": REQUIRED},
        KV: {
            "kv_cache_config": REQUIRED,
            "is_profiling": False,
            "kv_cache_allocation_context": None,
            "kv_cache_layout": None,
            "max_model_len": REQUIRED,
            "current_input_batch": REQUIRED,
            "current_input_batch_geometry": REQUIRED,
        },
    }
    assert p.inputs == catalog().inputs


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


#: vLLM 0.32.0's initialize_kv_cache, step by step (shared/design/vllm-init-map.md), then the
#: worker's KV block zeroer; each step lists the catalog stages that replace it.
STOCK_KV_STEPS = [
    ("K1 encoder-only group", ["encoder_only_kv_cache_group"]),
    ("K2 runner's config", ["runner_kv_cache_config"]),
    ("K3 attention backend", ["attention_groups", "cudagraph_mode"]),
    ("K4 Mamba SSU backend", ["mamba_ssu_backend"]),
    ("K5 kernel block sizes", ["kernel_block_sizes"]),
    (
        "K6 metadata builders",
        ["metadata_builders", "drafter_attn_groups", "reorder_batch_threshold"],
    ),
    ("K7 input batch", ["reinitialize_input_batch"]),
    ("K8 KV tensors", ["allocated_kv_caches", "kv_caches", "runner_kv_caches"]),
    ("K9 hidden-states check", ["extract_hidden_states_check"]),
    ("K10 connector", ["kv_connector_registration"]),
    ("worker: KV block zeroer", ["kv_block_zeroer"]),
]


def test_kv_phase_is_forced_into_stocks_order() -> None:
    """Every stage of a stock step has a path to every stage of each later step, so ANY
    topological order of the declared graph runs them in stock's order (not only the
    one networkx picks today); the chosen order follows it too."""
    import networkx as nx

    p = catalog()
    steps = [names for _, names in STOCK_KV_STEPS]
    assert sorted(n for names in steps for n in names) == sorted(p.phase_order(KV))
    for i, earlier in enumerate(steps):
        for later in steps[i + 1 :]:
            for a in earlier:
                for b in later:
                    assert nx.has_path(p.graph, a, b), f"{a} is not forced before {b}"
    order = p.phase_order(KV)
    flat = [n for names in steps for n in names]
    ranks = {n: i for i, names in enumerate(steps) for n in names}
    assert [ranks[n] for n in order] == sorted(ranks[n] for n in flat)


def test_effects_declared_and_undone_only_where_stock_undoes_them() -> None:
    specs = catalog().specs
    assert specs["cudagraph_mode"].effects == (
        "compilation_config.cudagraph_mode",
        "cudagraph_dispatcher keys",
    )
    assert "layer.kv_cache" in specs["runner_kv_caches"].effects
    # stock's cleanup leaves these in place, so no teardown touches them
    kept = {
        "cudagraph_mode",
        "mamba_ssu_backend",
        "drafter_attn_groups",
        "kv_connector_registration",  # connectors cannot unregister
    }
    for name, spec in specs.items():
        if spec.effects:
            assert (spec.teardown is None) == (name in kept), name
    assert specs["kv_block_zeroer"].teardown is not None  # nothing may point at freed KV


def test_every_stage_is_documented() -> None:
    for name, spec in catalog().specs.items():
        assert spec.doc, name
