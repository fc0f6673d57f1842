"""The catalog as a graph: importable without torch/vllm, ordered as vLLM requires."""

from __future__ import annotations

import subprocess
import sys

import pytest

import initpipe_vllm
from initpipe import KV, MODEL, REQUIRED, Extension, Pipeline, get_spec, stage
from initpipe_vllm import UnsupportedRunnerError, catalog


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


# -- the catalogs per (runner, release): one module per release, built once ---------------
def test_zero_argument_entry_points_return_the_memoized_catalogs() -> None:
    import initpipe_vllm.mrv2 as mrv2
    from initpipe_vllm import catalogs

    v1 = catalogs.base_catalog(runner="v1", release="0.32.0")
    assert initpipe_vllm.base_catalog() is v1 and catalog() is v1
    assert initpipe_vllm.pipeline is v1  # what `initpipe graph initpipe_vllm:pipeline` draws
    v2 = catalogs.catalog(runner="mrv2", release="0.32.0")
    assert mrv2.base_catalog() is v2 and mrv2.catalog() is v2 and mrv2.pipeline is v2
    assert mrv2.spec_pipeline() is mrv2.spec_pipeline(release="0.32.0")
    assert (v1.name, v2.name, mrv2.spec_pipeline().name) == (
        "initpipe_vllm",
        "initpipe_vllm.mrv2",
        "initpipe_vllm.mrv2.spec",
    )


def test_a_release_changes_only_the_stages_its_overlays_name_and_the_inputs_it_declares() -> None:
    """Each release's catalogs are the first release's but for the stages its module's
    overlays replace (the same spec object otherwise: one stage for both releases) and the
    phases whose inputs it declares anew (``INPUTS``); the variants keep the base's name,
    outputs and phase."""
    from initpipe import get_spec
    from initpipe_vllm import catalogs
    from initpipe_vllm.releases import RELEASES, inputs, release_module, runners

    first = RELEASES[0]
    for release in RELEASES[1:]:
        overlays = release_module(release).OVERLAYS
        for runner in runners(release):
            old = catalogs.base_catalog(runner=runner, release=first)
            new = catalogs.base_catalog(runner=runner, release=release)
            mine = [ext for ext in overlays if ext.applies(old.name)]
            replaced = {n for ext in mine for n in ext.replace}
            replaced |= {get_spec(s).name for ext in mine for s in ext.add} & set(old.specs)
            changed = {n for n in old.specs if new.specs.get(n) is not old.specs[n]}
            assert changed == replaced, (release, runner)
            added = {get_spec(s).name for ext in mine for s in ext.add} - set(old.specs)
            assert set(new.specs) == set(old.specs) | added
            for name in replaced:
                a, b = old.specs[name], new.specs[name]
                assert (b.provides, b.needs) == (a.provides, a.needs), name
                # the variant's own body, or the base's body with its own teardown (0.34's
                # kv_caches_by_layer: only the HiSparse unbinding changed)
                assert b.qualname != a.qualname or b.teardown is not a.teardown, name
            declared = inputs(release, old.name)
            for phase, found in new.inputs.items():
                wanted = set(declared[phase]) if phase in declared else set(old.inputs[phase])
                assert set(found) == wanted, (release, runner, phase)


def test_an_unknown_runner_or_release_is_refused_by_name() -> None:
    from initpipe_vllm import catalogs

    with pytest.raises(UnsupportedRunnerError, match=r"runner 'v3'.*'v1', 'mrv2'"):
        catalogs.catalog(runner="v3")
    with pytest.raises(UnsupportedRunnerError, match=r"release '0\.31\.0'.*v0_31_0\.py"):
        catalogs.catalog(release="0.31.0")


def test_the_registries_list_every_catalog_and_release() -> None:
    """RUNNERS names every package that declares a CATALOG; RELEASES every release module,
    each describing its own release, each overlay naming the catalog pipelines it changes."""
    import importlib
    import pkgutil

    from initpipe_vllm import catalogs, releases

    packages = {
        info.name
        for info in pkgutil.iter_modules(initpipe_vllm.__path__, "initpipe_vllm.")
        if info.ispkg and hasattr(importlib.import_module(info.name), "CATALOG")
    }
    assert packages == set(catalogs.RUNNERS.values())
    for runner, package in catalogs.RUNNERS.items():
        assert catalogs.catalog_def(runner) is importlib.import_module(package).CATALOG
    modules = {info.name for info in pkgutil.iter_modules(releases.__path__)}
    assert modules == {releases.module_name(r) for r in releases.RELEASES}
    names = {d.name for d in (catalogs.catalog_def(r) for r in catalogs.RUNNERS)}
    names.add("initpipe_vllm.mrv2.spec")
    for release in releases.RELEASES:
        module = releases.release_module(release)
        assert module.RELEASE == release
        assert module.RUNNERS and set(module.RUNNERS) <= set(catalogs.RUNNERS), release
        for overlay in module.OVERLAYS:
            assert overlay.applies_to and set(overlay.applies_to) <= names, overlay.name
    assert releases.DEFAULT_RELEASE in releases.RELEASES


def test_a_release_is_a_module_whose_overlays_change_only_its_catalogs(monkeypatch) -> None:
    """A release added as a module (here a stand-in): its overlay removes, replaces and
    adds through the core's Extension; the other releases' catalogs stay as they are."""
    import sys
    import types

    from initpipe_vllm import catalogs, releases

    module = types.ModuleType("initpipe_vllm.releases.v99_0_0")
    module.RELEASE = "99.0.0"
    module.RUNNERS = ("v1", "mrv2")
    module.OVERLAYS = (
        Extension(
            name="vllm 99.0.0 (v1)",
            applies_to=("initpipe_vllm",),
            remove=("attention_cp_compatible",),
            replace={"reorder_batch_threshold": threshold_variant},
            add=(release_probe,),
        ),
    )
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(releases, "RELEASES", (*releases.RELEASES, "99.0.0"))
    new = catalogs.catalog(release="99.0.0")
    assert new is catalogs.catalog(release="99.0.0")  # memoized per release too
    old = catalog()
    assert set(new.order) ^ set(old.order) == {"attention_cp_compatible", "release_probe"}
    assert new.specs["reorder_batch_threshold"].func is threshold_variant
    assert catalogs.catalog(runner="mrv2", release="99.0.0").order == (
        catalogs.catalog(runner="mrv2").order
    )


def test_a_release_without_a_runner_has_neither_its_catalog_nor_its_declarations(
    monkeypatch,
) -> None:
    """A release that removed Model Runner V1 (as 0.34.0 did; here a stand-in): asking for
    the v1 catalog names the release and the runners it has; its MRv2 catalog builds; the
    contract declares no v1 name for it (the v1 catalog's stages, the declarations only
    the v1 catalog makes, those marked ``runner="v1"``), and still all of them for 0.32.0."""
    import sys
    import types

    from initpipe_vllm import catalogs, releases
    from initpipe_vllm.contract import declare
    from initpipe_vllm.mrv2 import base_catalog as mrv2_catalog, spec_pipeline
    from initpipe_vllm.tools.plan import planning_pipeline

    module = types.ModuleType("initpipe_vllm.releases.v99_1_0")
    module.RELEASE = "99.1.0"
    module.RUNNERS = ("mrv2",)
    module.OVERLAYS = ()
    known = releases.RELEASES
    bare = types.ModuleType("initpipe_vllm.releases.v99_2_0")  # forgot RUNNERS
    monkeypatch.setitem(sys.modules, bare.__name__, bare)
    monkeypatch.setattr(releases, "RELEASES", (*known, "99.2.0"))
    with pytest.raises(UnsupportedRunnerError, match=r"v99_2_0 declares no RUNNERS"):
        releases.runners("99.2.0")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(releases, "RELEASES", (*known, "99.1.0"))
    with pytest.raises(UnsupportedRunnerError) as err:
        catalogs.catalog(runner="v1", release="99.1.0")
    message = str(err.value)
    assert "vLLM 99.1.0 has no Model Runner V1" in message
    assert "its runners: Model Runner V2: ask for runner='mrv2' (`--model-runner v2`)" in message
    assert "(0.32.0, 0.33.0)" in message  # where v1 still is
    assert mrv2_catalog(release="99.1.0").order == mrv2_catalog().order
    assert spec_pipeline(release="99.1.0").order == spec_pipeline().order

    declare.declarations.cache_clear()
    try:
        new = declare.declarations(release="99.1.0")
        old = declare.declarations(release="0.32.0")
    finally:
        declare.declarations.cache_clear()
    assert {u.runner for u in new} == {None, "mrv2"}
    v1_only = {u for u in old if u.runner == "v1"}
    assert v1_only and not v1_only & set(new)
    assert {u.affects.partition(":")[0] for u in v1_only if ":" in u.affects} >= {
        "initpipe_vllm",  # the v1 catalog's stages
        "initpipe_vllm.hook.runner",  # the v1 adapter's declarations (catalog_v1 only)
    }
    assert {u.affects for u in new} == {u.affects for u in old if u.runner != "v1"}
    shared = [u for u in new if u.affects == "initpipe_vllm.compat:plan_kv_cache_configs"]
    assert shared and all(u.capabilities == ("plan", "resize") for u in shared)
    # plan belongs to no runner: it plans with the release's own (MRv2 here), not v1's
    assert any("plan" in u.capabilities for u in new)
    assert not any("plan" in u.capabilities and u.runner == "v1" for u in new)
    assert "forward_context_layers" in planning_pipeline(release="99.1.0").specs  # MRv2 plan
    with pytest.raises(UnsupportedRunnerError, match=r"initpipe plan .* 99\.1\.0 has no Model"):
        planning_pipeline(release="99.1.0", runner="v1")


def test_a_declaration_belongs_to_the_runner_of_its_one_catalog() -> None:
    from initpipe_vllm import catalogs
    from initpipe_vllm.contract import declare
    from initpipe_vllm.contract.declare import vllm_uses

    # the contract's runner names are the catalogs' (it sits below them, so it lists them)
    assert declare._ALL_RUNNERS == tuple(catalogs.RUNNERS)
    assert set(declare.CAPABILITY_RUNNER.values()) == set(declare.RUNNER_CLASSES)
    assert set(declare.RUNNER_CLASSES) == set(catalogs.RUNNERS)
    for runner in catalogs.RUNNERS:
        assert catalogs.catalog_def(runner).runner == runner

    def uses(**kw):
        def f() -> None: ...

        return declare._uses_of(vllm_uses(**kw)(f))[0].runner

    name = "vllm.v1.worker.gpu_model_runner:GPUModelRunner.load_model"
    with pytest.raises(ValueError, match=r"runner='mrv2' contradicts capability \('catalog_v1',\)"):
        uses(capability="catalog_v1", calls=(name,), runner="mrv2")
    assert uses(capability="catalog_v1", calls=(name,)) == "v1"
    assert uses(capability="catalog_mrv2", calls=(name,)) == "mrv2"
    assert uses(capability=("catalog_v1", "catalog_mrv2"), calls=(name,)) is None
    assert uses(capability=("catalog_v1", "plan"), calls=(name,)) is None  # plan: either's
    assert uses(capability="plan", calls=(name,)) is None
    assert uses(capability=("catalog_v1", "resize"), calls=(name,)) is None
    assert uses(capability=("catalog_v1", "catalog_mrv2"), calls=(name,), runner="v1") == "v1"
    with pytest.raises(ValueError, match="runner='v3'"):
        uses(capability="resize", calls=(name,), runner="v3")


@stage(needs="kv_cache_config", provides="reorder_batch_threshold")
def threshold_variant(attn_groups):
    """A stand-in release variant of ``reorder_batch_threshold`` (same output and phase)."""


@stage(needs="kv_cache_config", after="kv_block_zeroer")
def release_probe(kv_block_zeroer):
    """A stand-in stage a release adds."""
    return kv_block_zeroer


def test_mrv2_shares_v1s_mamba_ssu_backend_body_re_specced() -> None:
    import initpipe_vllm.mrv2 as mrv2

    v1, v2 = catalog().specs["mamba_ssu_backend"], mrv2.catalog().specs["mamba_ssu_backend"]
    assert v1.func is v2.func and v1.effects == v2.effects
    assert (v1.after, v2.after) == (("cudagraph_mode",), ("pcp_manager", "ubatch_runner"))
    assert v1.meta["mirrors"] != v2.meta["mirrors"]  # each names its own runner
    assert get_spec(v1.func) is v1  # the re-spec left v1's own spec on the function
