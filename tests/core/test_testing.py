"""``initpipe.testing``: fault injection into one run, from code or from the environment,
and the core behaviour it rests on (a listener that raises fails the phase at the stage
whose event it was handling, and everything completed is rolled back)."""

from __future__ import annotations

import pytest
from test_run import Recorder

from initpipe import InjectedFault, StageError, UnknownStageNameError
from initpipe.testing import (
    ENV_FAULT,
    clear_faults,
    fault,
    inject_fault,
    inject_faults_from_env,
    parse_fault_spec,
)


def _loaded(r: Recorder):
    run = r.pipeline.start(config=1)
    run.load(model=1)
    return run


def test_a_raising_listener_rolls_back_the_stage_it_was_told_about() -> None:
    r = Recorder()
    run = _loaded(r)

    def refuse(event) -> None:
        if event.name == "tensors" and event.kind == "stage":
            raise OSError("the progress sink is gone")

    run.add_listener(refuse)
    with pytest.raises(StageError, match=r"stage 'tensors'.*OSError: the progress sink") as info:
        run.initialize_kv_cache(3)
    assert info.value.completed == ("groups", "tensors")
    assert info.value.rolled_back == ("tensors", "groups")
    assert ("teardown", "tensors", ("tensors", 3), 3) in r.log
    assert set(run.outputs) == {"spec"} and not run.kv_ready
    run.remove_listener(refuse)
    run.initialize_kv_cache(4)
    assert run.outputs["bind"] == ("bind", 4, False)


def test_faults_touch_one_run_only_and_the_context_manager_clears_them() -> None:
    r = Recorder()
    run, other = _loaded(r), _loaded(r)
    with fault(run, "bind", after=True):
        with pytest.raises(StageError, match="InjectedFault: injected fault in 'bind'"):
            run.initialize_kv_cache(1)
        other.initialize_kv_cache(2)  # same pipeline, other run: untouched
    assert other.outputs["bind"] == ("bind", 2, False)
    run.initialize_kv_cache(5)
    assert run.outputs["bind"] == ("bind", 5, False)


def test_the_default_fault_is_an_injected_fault_error() -> None:
    run = _loaded(Recorder())
    inject_fault(run, "groups")
    with pytest.raises(StageError) as info:
        run.initialize_kv_cache(1)
    assert isinstance(info.value.__cause__, InjectedFault)
    clear_faults(run)


@pytest.mark.parametrize("after", [False, True])
def test_a_counted_fault_fires_that_many_times_then_the_stage_runs(after: bool) -> None:
    run = _loaded(Recorder())
    inject_fault(run, "tensors", after=after, times=2)
    for size in (1, 2):
        with pytest.raises(StageError, match="stage 'tensors'"):
            run.initialize_kv_cache(size)
    run.initialize_kv_cache(3)  # the third run is not touched
    assert run.outputs["bind"] == ("bind", 3, False)
    clear_faults(run)


def test_a_fault_count_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="times=0"):
        inject_fault(_loaded(Recorder()), "tensors", times=0)


def test_fault_spec_from_the_environment() -> None:
    assert parse_fault_spec("a, b:after ,c:before,d@2, e:after@3") == [
        ("a", False, None),
        ("b", True, None),
        ("c", False, None),
        ("d", False, 2),
        ("e", True, 3),
    ]
    with pytest.raises(ValueError, match=r"'b:later' has mode 'later'; use 'stage'"):
        parse_fault_spec("a,b:later")
    for bad in ("a@0", "a@", "a@x", "a@-1"):
        with pytest.raises(ValueError, match=r"after '@' put the run of the stage that fails"):
            parse_fault_spec(bad)


def test_a_fault_can_let_runs_pass_first() -> None:
    r = Recorder()
    run = _loaded(r)
    inject_fault(run, "tensors", skip=1, times=1)
    run.initialize_kv_cache(1)  # passes
    run.teardown_kv_cache()
    with pytest.raises(StageError, match="stage 'tensors'"):
        run.initialize_kv_cache(2)
    run.initialize_kv_cache(3)  # and the fault is spent
    assert run.outputs["bind"] == ("bind", 3, False)
    with pytest.raises(ValueError, match="skip=-1"):
        inject_fault(run, "tensors", skip=-1)


def test_an_env_fault_at_a_given_run_fails_only_that_run() -> None:
    run = _loaded(Recorder())
    assert inject_faults_from_env(run, {ENV_FAULT: "tensors:after@2"}) is True
    run.initialize_kv_cache(1)
    run.teardown_kv_cache()
    with pytest.raises(StageError, match="stage 'tensors'"):
        run.initialize_kv_cache(2)
    run.initialize_kv_cache(3)
    assert run.outputs["bind"] == ("bind", 3, False)


def test_faults_from_the_environment_reach_a_run() -> None:
    r = Recorder()
    run = _loaded(r)
    assert inject_faults_from_env(run, {}) is False
    assert inject_faults_from_env(run, {ENV_FAULT: "tensors:after"}) is True
    with pytest.raises(StageError, match="stage 'tensors'") as info:
        run.initialize_kv_cache(1)
    assert info.value.completed == ("groups", "tensors")


def test_an_unknown_stage_in_the_environment_is_an_error_not_a_silent_no_op() -> None:
    run = _loaded(Recorder())
    with pytest.raises(UnknownStageNameError, match=r"INITPIPE_INJECT_FAULT: .*'tensrs'"):
        inject_faults_from_env(run, {ENV_FAULT: "tensrs"})
