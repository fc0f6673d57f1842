"""Each validation rule reports its culprit; all problems are collected at once."""

import networkx as nx
import pytest
from coretoys import cyclic, diamond, duplicate_producer, linear, missing_input, phase_violation

from initpipe import (
    CycleError,
    DuplicateProducerError,
    DuplicateStageError,
    MissingInputError,
    PhaseViolationError,
    Pipeline,
    PipelineValidationError,
    stage,
)
from initpipe.errors import NotAStageError, UnknownStageError


def problems_of(module_or_stages, **kw):
    """The PipelineValidationError; none of its problems is a raw assertion or networkx error."""
    with pytest.raises(PipelineValidationError) as e:
        if isinstance(module_or_stages, list):
            Pipeline(module_or_stages, **kw)
        else:
            Pipeline.from_module(module_or_stages, **kw)
    for p in e.value.problems:
        assert not isinstance(p, (AssertionError, nx.NetworkXException))
    return e.value


def test_valid_toys_build_in_order():
    assert Pipeline.from_module(linear).order == ["a", "b", "c", "d"]
    assert Pipeline.from_module(diamond).order == ["top", "left", "right", "bottom"]


def test_from_module_accepts_a_dotted_name():
    assert Pipeline.from_module("coretoys.linear").order == ["a", "b", "c", "d"]


def test_missing_input_names_key_consumers_and_suggestion():
    err = problems_of(missing_input)
    (p,) = err.problems
    assert isinstance(p, MissingInputError) and isinstance(p, LookupError)
    assert not isinstance(p, KeyError)
    assert p.key == "kv_cache_confg"
    assert p.consumers == ("coretoys.missing_input:groups", "coretoys.missing_input:tensors")
    assert p.suggestions == ("kv_cache_config",)
    assert "kv_cache_confg" in str(err) and "Did you mean 'kv_cache_config'?" in str(err)
    assert "Did you mean 'kv_cache_config'?" in str(p)
    assert "coretoys.missing_input:groups, coretoys.missing_input:tensors" in str(p)


def test_duplicate_producer_names_both_stages_and_key():
    err = problems_of(duplicate_producer)
    (p,) = err.problems
    assert isinstance(p, DuplicateProducerError)
    assert p.key == "kv_caches"
    assert p.producers == (
        "coretoys.duplicate_producer:allocate",
        "coretoys.duplicate_producer:allocate_again",
    )
    assert "duplicate producer for 'kv_caches'" in str(p)
    assert "Pipeline.replace()" in str(err)


def test_stage_providing_a_declared_input_is_a_duplicate_producer():
    @stage(needs="model", provides="model_copy")
    def model_copy(model):
        return model

    @stage(needs="model", provides="vllm_config")
    def cfg(model):
        return model

    err = problems_of([model_copy, cfg], start_inputs=("vllm_config",))
    (p,) = err.problems
    assert p.producers == ("input:start", cfg.__module__ + ":" + cfg.__qualname__)


def test_cycle_is_reported_in_order_with_edge_keys():
    err = problems_of(cyclic)
    (p,) = err.problems
    assert isinstance(p, CycleError) and isinstance(p, ValueError)
    assert p.cycle == ("a", "b", "c", "a")
    assert p.keys == ("a", "b", "c")
    assert "cycle: a -> b -> c -> a" in str(p)
    assert "a -> b via 'a'" in str(p)
    assert "Break it" in str(err)


def test_self_cycle_through_ordering_edge():
    @stage(needs="model", after="s")
    def s(model):
        return 1

    (p,) = problems_of([s]).problems
    assert isinstance(p, CycleError)
    assert p.cycle == ("s", "s") and p.keys == ("after/before",)


def test_phase_violation_names_the_path():
    err = problems_of(phase_violation)
    assert [type(p) for p in err.problems] == [PhaseViolationError, PhaseViolationError]
    by_stage = {p.stage: p for p in err.problems}
    assert by_stage["coretoys.phase_violation:specs"].path == ("groups", "specs")
    assert by_stage["coretoys.phase_violation:backends"].path == ("groups", "specs", "backends")
    assert "groups -> specs -> backends" in str(err)
    assert "needs='kv_cache_config'" in str(err)


def test_model_stage_reading_the_kv_input_directly_is_a_phase_violation():
    @stage(needs="model")
    def early(kv_cache_config):
        return 1

    (p,) = problems_of([early]).problems
    assert isinstance(p, PhaseViolationError)
    assert p.stage.endswith(".early") and p.path == ("kv_cache_config", "early")


def test_model_stage_ordered_after_kv_stage_is_a_phase_violation():
    @stage(needs="kv_cache_config")
    def kv(kv_cache_config):
        return 1

    @stage(needs="model", after="kv")
    def m(model):
        return 2

    (p,) = problems_of([kv, m]).problems
    assert isinstance(p, PhaseViolationError) and p.path == ("kv", "m")


def test_duplicate_stage_names():
    def make():
        @stage(needs="model", provides="x1")
        def same(model):
            return 1

        return same

    first = make()

    @stage(needs="model", provides="x2", name="same")
    def other(model):
        return 2

    err = problems_of([first, other])
    (p,) = err.problems
    assert isinstance(p, DuplicateStageError)
    assert p.name == "same"
    assert p.stages[0].endswith(":test_duplicate_stage_names.<locals>.make.<locals>.same")
    assert p.stages[1].endswith(":test_duplicate_stage_names.<locals>.other")
    assert "@stage(name=...)" in str(err)


def test_not_a_stage_object():
    def plain(model):
        return 1

    err = problems_of([plain, 3])
    (p,) = err.problems[:1]
    assert isinstance(p, NotAStageError) and "plain" in p.obj
    assert "@stage(needs='model')" in str(err)


def test_unknown_after_reference_suggests_close_names():
    @stage(needs="model")
    def alloc(model):
        return 1

    @stage(needs="model", after="aloc")
    def bind(model):
        return 1

    (p,) = problems_of([alloc, bind]).problems
    assert isinstance(p, UnknownStageError)
    assert p.reference == "aloc" and p.suggestions == ("alloc",) and p.field == "after"
    assert "Did you mean 'alloc'" in str(p)


def test_every_problem_is_collected_at_once():
    stages = [*vars_stages(cyclic), *vars_stages(missing_input), *vars_stages(phase_violation)]
    # names collide across toys (a, groups): those are reported too
    err = problems_of(stages, model_inputs=("model",))
    kinds = {type(p) for p in err.problems}
    assert {CycleError, MissingInputError, PhaseViolationError, DuplicateStageError} <= kinds
    assert str(err).startswith(f"invalid pipeline: {len(err.problems)} problems:")


def vars_stages(mod):
    from initpipe import is_stage

    return [v for v in vars(mod).values() if is_stage(v)]
