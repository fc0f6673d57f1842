"""The bad-input catalogue: each bad declaration, call or KV config gets a specific error.

Every case names its culprit (stage, key, layer or field) in the message and on the
error's attributes, and says what to do — never a raw KeyError, networkx or assertion
traceback. Three groups: malformed declarations (core), runtime misuse (core and the
pipelined runner), and bad KV configs fed to the real catalog KV phase of a loaded
tiny-llama runner (through ``initialize_kv_cache``, or straight to one stage where vLLM's
own constructors would reject the input first).
"""

from __future__ import annotations

import copy
import dataclasses

import networkx as nx
import pytest
from relkit import Rig, frozen_gc

from initpipe import (
    KV,
    MODEL,
    CycleError,
    DuplicateProducerError,
    DuplicateStageError,
    InputsError,
    MissingInputError,
    OutputNotAvailableError,
    PhaseOrderError,
    PhaseViolationError,
    Pipeline,
    PipelineValidationError,
    StageDeclarationError,
    StageError,
    stage,
)
from initpipe.errors import (
    NotAStageError,
    StageOutputError,
    UnknownStageError,
    UnknownStageNameError,
)
from initpipe.testing import inject_fault
from initpipe_vllm.errors import KVCacheConfigError, ModelPhaseError

L0, L1 = "model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"
NOT_RAW = (AssertionError, nx.NetworkXException)


def _only_problem(stages, **kw):
    with pytest.raises(PipelineValidationError) as info:
        Pipeline(stages, **kw)
    (problem,) = info.value.problems
    assert not isinstance(problem, NOT_RAW)
    return problem, str(info.value)


# -- toy stages (plain functions; the failing ones are built inside each test) -----------
@stage(needs=MODEL)
def layers(model):
    return ["l0", "l1"]


@stage(needs=MODEL)
def specs(layers):
    return dict.fromkeys(layers, 16)


@stage(needs=KV)
def tensors(specs, kv_cache_config):
    return {name: bytearray(size * kv_cache_config) for name, size in specs.items()}


def _toy(**kw):
    return Pipeline([layers, specs, tensors], **kw)


# == 1. malformed declarations ===========================================================
def test_cycle_is_reported_in_order_with_its_keys() -> None:
    @stage(needs=MODEL)
    def a(c):
        return 1

    @stage(needs=MODEL)
    def b(a):
        return 2

    @stage(needs=MODEL)
    def c(b):
        return 3

    problem, text = _only_problem([a, b, c], model_inputs=())
    assert isinstance(problem, CycleError)
    assert problem.cycle == ("a", "b", "c", "a") and problem.keys == ("a", "b", "c")
    assert "a -> b -> c -> a" in text and "Break it" in text


def test_missing_input_names_the_key_every_consumer_and_a_suggestion() -> None:
    @stage(needs=KV)
    def groups(kv_cache_confg):
        return []

    with pytest.raises(PipelineValidationError, match="kv_cache_confg") as info:
        Pipeline([groups])
    (problem,) = info.value.problems
    assert isinstance(problem, MissingInputError) and not isinstance(problem, KeyError)
    assert problem.key == "kv_cache_confg"
    assert problem.consumers == (
        f"{__name__}:test_missing_input_names_the_key_every_"
        f"consumer_and_a_suggestion.<locals>.groups",
    )
    assert problem.suggestions == ("kv_cache_config",)
    assert "Did you mean 'kv_cache_config'?" in str(problem)


def test_duplicate_producer_names_the_key_and_both_stages() -> None:
    @stage(needs=MODEL, provides="specs", name="specs_again")
    def specs_again(layers):
        return {}

    problem, text = _only_problem([layers, specs, specs_again])
    assert isinstance(problem, DuplicateProducerError)
    assert problem.key == "specs"
    assert problem.producers[0].endswith(":specs")
    assert problem.producers[1].endswith(".<locals>.specs_again")
    assert "Pipeline.replace()" in text


def test_phase_violation_names_the_model_stage_and_the_path() -> None:
    @stage(needs=MODEL)
    def peek(tensors):
        return len(tensors)

    problem, text = _only_problem([layers, specs, tensors, peek])
    assert isinstance(problem, PhaseViolationError)
    assert problem.stage.endswith(".peek") and problem.path == ("tensors", "peek")
    assert "needs='kv_cache_config'" in text


def test_a_stage_reading_a_kv_input_in_the_model_phase_is_a_phase_violation() -> None:
    @stage(needs=MODEL)
    def early(kv_cache_config):
        return 0

    problem, _ = _only_problem([early])
    assert isinstance(problem, PhaseViolationError)
    assert problem.stage.endswith(".early") and problem.path == ("kv_cache_config", "early")


def test_unknown_needs_names_the_field_and_the_valid_phases() -> None:
    def f(model):
        return 0

    with pytest.raises(StageDeclarationError, match="needs='kv_cache'") as info:
        stage(f, needs="kv_cache")
    assert info.value.field == "needs" and info.value.stage.endswith(".f")
    assert "needs='kv_cache_config'" in str(info.value)


def test_a_non_callable_cannot_be_a_stage() -> None:
    with pytest.raises(StageDeclarationError, match="plain function") as info:
        stage(42, needs=MODEL)
    assert info.value.field == "func" and info.value.stage == "42"


def test_an_undecorated_function_in_a_pipeline_is_named() -> None:
    def plain(model):
        return 0

    problem, text = _only_problem([layers, plain])
    assert isinstance(problem, NotAStageError) and "plain" in problem.obj
    assert "@stage(needs='model')" in text


def test_duplicate_stage_names_name_both_functions() -> None:
    @stage(needs=MODEL, name="specs", provides="other_specs")
    def other(layers):
        return {}

    problem, text = _only_problem([layers, specs, other])
    assert isinstance(problem, DuplicateStageError)
    assert problem.name == "specs"
    assert problem.stages[0].endswith(":specs") and problem.stages[1].endswith(".other")
    assert "@stage(name=...)" in text


def test_a_generator_function_is_refused() -> None:
    def gen(model):
        yield 1

    with pytest.raises(StageDeclarationError, match="generator functions") as info:
        stage(gen, needs=MODEL)
    assert info.value.field == "func" and info.value.stage.endswith(".gen")


def test_an_async_function_is_refused() -> None:
    async def coro(model):
        return 1

    with pytest.raises(StageDeclarationError, match="async functions") as info:
        stage(coro, needs=MODEL)
    assert info.value.field == "func" and info.value.stage.endswith(".coro")


def test_a_non_callable_teardown_is_refused() -> None:
    def alloc(model):
        return 1

    with pytest.raises(StageDeclarationError, match="teardown='free' is not callable") as info:
        stage(alloc, needs=MODEL, teardown="free")
    assert info.value.field == "teardown" and info.value.stage.endswith(".alloc")


def test_a_teardown_naming_a_non_input_is_refused() -> None:
    def free(out, device):
        pass

    def alloc(model):
        return 1

    with pytest.raises(StageDeclarationError, match="'device'") as info:
        stage(alloc, needs=MODEL, teardown=free)
    assert info.value.field == "teardown"
    assert "not inputs of the stage (inputs: model)" in str(info.value)


def test_a_teardown_without_a_parameter_is_refused() -> None:
    def free():
        pass

    def alloc(model):
        return 1

    with pytest.raises(StageDeclarationError, match="takes no parameter") as info:
        stage(alloc, needs=MODEL, teardown=free)
    assert info.value.field == "teardown"


def test_star_args_inputs_are_refused() -> None:
    def loose(*inputs):
        return 0

    with pytest.raises(StageDeclarationError, match="'inputs' is \\*args") as info:
        stage(loose, needs=MODEL)
    assert info.value.field == "func"


def test_an_output_that_is_also_an_input_is_refused() -> None:
    def grow(specs):
        return specs

    with pytest.raises(StageDeclarationError, match="'specs' is both an input and an output"):
        stage(grow, needs=MODEL, provides="specs")


def test_after_naming_no_stage_suggests_a_close_name() -> None:
    @stage(needs=MODEL, after="layer")
    def late(model):
        return 0

    problem, _ = _only_problem([layers, late])
    assert isinstance(problem, UnknownStageError)
    assert problem.reference == "layer" and problem.field == "after"
    assert problem.suggestions[0] == "layers" and "Did you mean 'layers'" in str(problem)


def test_replace_with_other_outputs_is_refused() -> None:
    @stage(needs=MODEL, provides="specz")
    def specs2(layers):
        return {}

    with pytest.raises(StageDeclarationError, match="must provide \\['specs'\\]") as info:
        _toy().replace("specs", specs2)
    assert info.value.field == "provides"


def test_replace_of_an_unknown_stage_suggests_a_name() -> None:
    @stage(needs=MODEL)
    def specs(layers):
        return {}

    with pytest.raises(UnknownStageNameError, match="Did you mean 'specs'") as info:
        _toy().replace("spec", specs)
    assert info.value.name == "spec"


# == 2. runtime misuse ===================================================================
def test_kv_phase_before_load_says_to_call_load_first() -> None:
    run = _toy().start()
    with pytest.raises(
        PhaseOrderError, match="load\\(\\) must be called before initialize_kv_cache\\(\\)"
    ):
        run.initialize_kv_cache(2)
    assert run.state == "started" and run.completed(KV) == []


def test_double_load_is_refused_and_keeps_the_outputs() -> None:
    run = _toy().start()
    first = dict(run.load(model="m"))
    with pytest.raises(PhaseOrderError, match="load\\(\\) was already called"):
        run.load(model="m")
    assert dict(run.outputs) == first


def test_missing_start_input_is_named() -> None:
    p = Pipeline([layers, specs, tensors], start_inputs=("device",))
    with pytest.raises(InputsError, match="missing 'device'") as info:
        p.start()
    assert info.value.missing == ("device",) and info.value.unknown == ()
    assert info.value.phase == "start"


def test_unknown_extra_input_is_named_with_what_the_phase_takes() -> None:
    run = _toy().start()
    run.load(model="m")
    with pytest.raises(InputsError, match="unknown 'num_blocks'") as info:
        run.initialize_kv_cache(2, num_blocks=4)
    assert info.value.unknown == ("num_blocks",) and info.value.phase == KV
    assert "This phase takes: 'kv_cache_config'" in str(info.value)


def test_kv_config_given_twice_is_refused() -> None:
    run = _toy().start()
    run.load(model="m")
    with pytest.raises(InputsError, match="unknown 'kv_cache_config'"):
        run.initialize_kv_cache(2, kv_cache_config=3)


def test_calls_on_a_closed_run_say_to_start_a_new_one() -> None:
    run = _toy().start()
    run.load(model="m")
    run.close()
    with pytest.raises(PhaseOrderError, match=r"closed run; call pipeline.start\(\)"):
        run.initialize_kv_cache(2)
    with pytest.raises(OutputNotAvailableError, match="run is closed") as info:
        run.outputs["specs"]
    assert info.value.key == "specs"


def test_reading_a_kv_output_before_the_kv_phase_says_what_to_call() -> None:
    run = _toy().start()
    run.load(model="m")
    with pytest.raises(OutputNotAvailableError, match=r"run\.initialize_kv_cache") as info:
        run.outputs["tensors"]
    assert info.value.key == "tensors" and "stage 'tensors'" in str(info.value)


def test_a_multi_output_stage_returning_the_wrong_keys_names_them() -> None:
    @stage(needs=MODEL, provides=("a", "b"))
    def pair(model):
        return {"a": 1, "c": 2}

    run = Pipeline([pair]).start()
    with pytest.raises(StageError, match="missing \\['b'\\], unexpected \\['c'\\]") as info:
        run.load(model="m")
    cause = info.value.__cause__
    assert isinstance(cause, StageOutputError)
    assert cause.missing == ("b",) and cause.unexpected == ("c",)
    assert info.value.stage == "pair" and run.state == "started"


def test_injecting_a_fault_into_an_unknown_stage_is_refused() -> None:
    run = _toy().start()
    with pytest.raises(UnknownStageNameError, match="Did you mean 'tensors'"):
        inject_fault(run, "tensor")


# == 3. bad KV configs fed to the real catalog KV phase ==================================
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
            rig.init(cfg)
        assert not isinstance(info.value.__cause__, (KeyError, *NOT_RAW))
        assert rig.diff(rig.cleaned) == []
        return info.value

    yield _bad
    rig.init()  # the good config still works afterwards
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
    from initpipe_vllm.kv_phase import runner_kv_cache_config

    ghost = "model.layers.7.self_attn.attn"
    with pytest.raises(KVCacheConfigError, match=ghost) as info:
        runner_kv_cache_config(
            _engine_config_without(rig, L1), model_outputs["attention_layers"], {L1: ghost}, None
        )
    assert info.value.layer == ghost and info.value.field == "kv_cache_groups"
    assert L1 in str(info.value)


def test_kv_sharing_target_that_does_not_exist_model_phase(rig, model_outputs) -> None:
    from initpipe_vllm.model_phase import shared_kv_cache_layers

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
    from initpipe_vllm.kv_tensors import kv_caches

    with pytest.raises(KVCacheConfigError, match="got no KV cache tensor") as info:
        kv_caches({L0: object()}, {L1: "model.layers.7.self_attn.attn"})
    assert info.value.layer == "model.layers.7.self_attn.attn"
    assert info.value.field == "kv_cache_tensors"


def test_kv_sharing_target_after_its_sharer_model_phase(rig, model_outputs) -> None:
    from initpipe_vllm.model_phase import shared_kv_cache_layers

    layer = model_outputs["attention_layers"][L0]
    layer.kv_sharing_target_layer_name = L1
    try:
        with pytest.raises(ModelPhaseError, match=L1) as info:
            shared_kv_cache_layers(model_outputs["attention_layers"])
    finally:
        layer.kv_sharing_target_layer_name = None
    assert info.value.layer == L0


def test_kv_sharing_target_after_its_sharer_kv_phase(rig, model_outputs) -> None:
    from initpipe_vllm.kv_phase import runner_kv_cache_config

    with pytest.raises(KVCacheConfigError, match=L1) as info:
        runner_kv_cache_config(
            _engine_config_without(rig, L0), model_outputs["attention_layers"], {L0: L1}, None
        )
    assert info.value.layer in (L0, L1)


def test_a_bad_kv_cache_layout_name(rig) -> None:
    from initpipe_vllm.kv_tensors import resolve_layout

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
