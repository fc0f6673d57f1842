"""The two-phase runner: order, re-runs, rollback on failure, misuse, outputs, and what a
run keeps alive (weakrefs)."""

import gc
import threading
import weakref

import pytest
from waiting import HANG_S, WatchedLock, until

from initpipe import (
    REQUIRED,
    InputsError,
    OutputNotAvailableError,
    PhaseOrderError,
    Pipeline,
    StageError,
    TeardownError,
    stage,
)
from initpipe.errors import StageOutputError, UnknownStageNameError
from initpipe.testing import clear_faults, fault, inject_fault


class Recorder:
    """A KV pipeline whose stages and teardowns log what they did."""

    def __init__(self):
        self.log = []
        self.fail_at = None
        log = self.log

        @stage(needs="model")
        def spec(model, config):
            log.append(("run", "spec"))
            return {"heads": model * config}

        def undo_groups(out):
            log.append(("teardown", "groups", out))

        @stage(needs="kv_cache_config", teardown=undo_groups)
        def groups(spec, kv_cache_config):
            log.append(("run", "groups"))
            return ("groups", kv_cache_config)

        def free(out, kv_cache_config):
            log.append(("teardown", "tensors", out, kv_cache_config))

        @stage(needs="kv_cache_config", teardown=free)
        def tensors(groups, kv_cache_config):
            log.append(("run", "tensors"))
            if self.fail_at == "tensors":
                raise RuntimeError("out of memory")
            return ("tensors", kv_cache_config)

        def unbind(out):
            log.append(("teardown", "bind", out))

        @stage(needs="kv_cache_config", teardown=unbind)
        def bind(tensors, is_profiling):
            log.append(("run", "bind"))
            if self.fail_at == "bind":
                raise ValueError("bad layer")
            return ("bind", tensors[1], is_profiling)

        self.pipeline = Pipeline(
            [bind, tensors, groups, spec],
            start_inputs=("config",),
            kv_inputs={"kv_cache_config": REQUIRED, "is_profiling": False},
        )

    def runs(self, name):
        return [e for e in self.log if e[:2] == ("run", name)]


def test_phases_run_in_order_and_outputs_are_a_mapping():
    r = Recorder()
    run = r.pipeline.start(config=3)
    run.load(model=2)
    assert dict(run.outputs) == {"spec": {"heads": 6}}
    run.initialize_kv_cache(100)
    assert [e[1] for e in r.log] == ["spec", "groups", "tensors", "bind"]
    assert run.outputs["bind"] == ("bind", 100, False)
    assert set(run.outputs) == {"spec", "groups", "tensors", "bind"}
    assert run.kv_ready and run.completed("kv_cache_config") == ["groups", "tensors", "bind"]


def test_three_kv_reruns_tear_down_in_reverse_once_and_reuse_model_outputs():
    r = Recorder()
    run = r.pipeline.start(config=1)
    run.load(model=1)
    for size in (10, 20, 30):
        run.initialize_kv_cache(size, is_profiling=size == 10)
    teardowns = [e for e in r.log if e[0] == "teardown"]
    assert teardowns == [
        ("teardown", "bind", ("bind", 10, True)),
        ("teardown", "tensors", ("tensors", 10), 10),
        ("teardown", "groups", ("groups", 10)),
        ("teardown", "bind", ("bind", 20, False)),
        ("teardown", "tensors", ("tensors", 20), 20),
        ("teardown", "groups", ("groups", 20)),
    ]
    assert len(r.runs("spec")) == 1
    assert len(r.runs("bind")) == 3
    assert run.outputs["tensors"] == ("tensors", 30)
    assert run.kv_generation == 3


def test_failing_kv_stage_rolls_back_and_retry_succeeds():
    r = Recorder()
    run = r.pipeline.start(config=1)
    run.load(model=1)
    r.fail_at = "bind"
    with pytest.raises(StageError, match=r"stage 'bind' .* failed in phase 'kv_cache_config'") as e:
        run.initialize_kv_cache(7)
    err = e.value
    assert err.stage == "bind" and err.phase == "kv_cache_config"
    assert err.qualname.endswith("Recorder.__init__.<locals>.bind")
    assert err.completed == ("groups", "tensors")
    assert err.rolled_back == ("tensors", "groups")
    assert isinstance(err.__cause__, ValueError)
    assert "completed in this phase: groups, tensors" in str(err)
    # nothing of the failed phase is visible; model outputs stay
    assert set(run.outputs) == {"spec"}
    with pytest.raises(OutputNotAvailableError, match="initialize_kv_cache"):
        run.outputs["tensors"]
    assert [e for e in r.log if e[0] == "teardown"] == [
        ("teardown", "tensors", ("tensors", 7), 7),
        ("teardown", "groups", ("groups", 7)),
    ]
    assert not run.kv_ready
    r.fail_at = None
    run.initialize_kv_cache(8)
    assert run.outputs["bind"] == ("bind", 8, False)
    # the failed attempt is not torn down twice
    assert len([e for e in r.log if e[0] == "teardown"]) == 2


def test_failing_model_stage_can_be_retried():
    calls = {"n": 0}

    @stage(needs="model")
    def flaky(model):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("weights not ready")
        return model

    p = Pipeline([flaky])
    run = p.start()
    with pytest.raises(StageError) as e:
        run.load(model=1)
    assert e.value.phase == "model" and e.value.completed == ()
    assert run.state == "started"
    run.load(model=1)
    assert run.outputs["flaky"] == 1


def test_kv_before_load_and_double_load_say_what_to_call():
    r = Recorder()
    run = r.pipeline.start(config=1)
    with pytest.raises(
        PhaseOrderError, match=r"load\(\) must be called before initialize_kv_cache"
    ):
        run.initialize_kv_cache(1)
    assert run.state == "started" and run.completed("kv_cache_config") == []
    first = dict(run.load(model=1))
    with pytest.raises(PhaseOrderError, match=r"load\(\) was already called"):
        run.load(model=1)
    assert dict(run.outputs) == first
    run.close()
    with pytest.raises(PhaseOrderError, match=r"closed run; call pipeline.start\(\)"):
        run.load(model=1)


def test_calls_on_a_closed_run_say_to_start_a_new_one():
    r = Recorder()
    run = r.pipeline.start(config=1)
    run.load(model=1)
    run.close()
    with pytest.raises(PhaseOrderError, match=r"closed run; call pipeline.start\(\)"):
        run.initialize_kv_cache(2)
    with pytest.raises(OutputNotAvailableError, match="run is closed") as e:
        run.outputs["spec"]
    assert e.value.key == "spec"


def test_missing_and_unknown_inputs_are_named():
    r = Recorder()
    with pytest.raises(InputsError, match=r"start\(\): missing 'config'") as e:
        r.pipeline.start()
    assert e.value.missing == ("config",) and e.value.unknown == ()
    assert e.value.phase == "start"
    run = r.pipeline.start(config=1)
    with pytest.raises(InputsError, match=r"unknown 'modle'.*takes: 'model'") as e:
        run.load(modle=1)
    assert e.value.unknown == ("modle",) and e.value.missing == ("model",)
    run.load(model=1)
    with pytest.raises(InputsError, match=r"missing 'kv_cache_config'"):
        run.initialize_kv_cache(is_profiling=True)
    with pytest.raises(InputsError, match=r"unknown 'extra'") as e:
        run.initialize_kv_cache(1, extra=2)
    assert e.value.unknown == ("extra",) and e.value.phase == "kv_cache_config"
    assert "This phase takes: 'kv_cache_config'" in str(e.value)


def test_kv_config_given_twice_is_refused():
    r = Recorder()
    run = r.pipeline.start(config=1)
    run.load(model=1)
    with pytest.raises(InputsError, match="unknown 'kv_cache_config'"):
        run.initialize_kv_cache(2, kv_cache_config=3)


def test_output_errors_subclass_keyerror_and_say_what_to_call():
    r = Recorder()
    run = r.pipeline.start(config=1)
    with pytest.raises(KeyError):
        run.outputs["spec"]
    with pytest.raises(OutputNotAvailableError, match=r"Call run.load\(...\) first"):
        run.outputs["spec"]
    with pytest.raises(OutputNotAvailableError, match="Did you mean 'tensors'"):
        run.outputs["tensor"]
    with pytest.raises(OutputNotAvailableError, match="is an input of the 'start' phase"):
        run.outputs["config"]
    assert run.outputs.get("spec") is None and "spec" not in run.outputs


def test_reading_a_kv_output_before_the_kv_phase_says_what_to_call():
    r = Recorder()
    run = r.pipeline.start(config=1)
    run.load(model=1)
    with pytest.raises(OutputNotAvailableError, match=r"run\.initialize_kv_cache") as e:
        run.outputs["tensors"]
    assert e.value.key == "tensors" and "stage 'tensors'" in str(e.value)


def test_all_teardowns_run_and_one_error_reports_every_failure():
    seen = []

    def bad(out):
        seen.append(out)
        raise RuntimeError(f"cannot free {out}")

    @stage(needs="kv_cache_config", teardown=bad)
    def first(kv_cache_config):
        return "first"

    @stage(needs="kv_cache_config", teardown=bad)
    def second(first):
        return "second"

    run = Pipeline([first, second]).start()
    run.load(model=None)
    run.initialize_kv_cache(1)
    with pytest.raises(TeardownError, match="2 teardown") as e:
        run.close()
    assert seen == ["second", "first"]
    assert [s for s, _ in e.value.failures] == ["second", "first"]
    assert run.state == "closed"
    run.close()  # idempotent


def test_close_tears_down_kv_then_model():
    order = []

    @stage(needs="model", teardown=lambda out: order.append("model"))
    def m(model):
        return 1

    @stage(needs="kv_cache_config", teardown=lambda out: order.append("kv"))
    def k(m, kv_cache_config):
        return 2

    run = Pipeline([k, m]).start()
    run.load(model=0)
    run.initialize_kv_cache(0)
    run.teardown_kv_cache()
    assert order == ["kv"] and set(run.outputs) == {"m"}
    run.initialize_kv_cache(0)
    with run:
        pass
    assert order == ["kv", "kv", "model"]


def test_multi_output_stage_must_return_exactly_its_keys():
    @stage(needs="model", provides=("a", "b"))
    def split(model):
        return {"a": 1, "c": 2}

    run = Pipeline([split]).start()
    with pytest.raises(StageError, match="missing \\['b'\\], unexpected \\['c'\\]") as e:
        run.load(model=0)
    cause = e.value.__cause__
    assert isinstance(cause, StageOutputError)
    assert cause.missing == ("b",) and cause.unexpected == ("c",)
    assert "must return exactly ['a', 'b']" in str(cause)
    assert e.value.stage == "split" and run.state == "started"


def test_concurrent_kv_initializations_are_serialized():
    """Each KV phase stays open until every other call is blocked on the run's lock or
    done, so the calls really race, on any machine."""
    alive = []
    max_alive = []
    done = []

    def free(out):
        alive.remove(out)

    @stage(needs="kv_cache_config", teardown=free)
    def alloc(kv_cache_config):
        alive.append(kv_cache_config)
        max_alive.append(len(alive))
        until("the other calls waiting or done", lambda: lock.blocked + len(done) >= 3)
        return kv_cache_config

    run = Pipeline([alloc]).start()
    run.load(model=0)
    lock = run._lock = WatchedLock(run._lock)

    def call(i):
        try:
            run.initialize_kv_cache(i)
        finally:
            done.append(i)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_S)
    assert len(done) == 4, "a call hangs"
    assert max(max_alive) == 1
    assert len(alive) == 1 and run.kv_generation == 4


def test_listeners_see_every_stage_and_teardown():
    r = Recorder()
    events = []
    run = r.pipeline.start(config=1, listeners=[events.append])
    run.load(model=1)
    run.initialize_kv_cache(1)
    run.initialize_kv_cache(2)
    kinds = [(e.kind, e.name) for e in events]
    assert kinds[:4] == [
        ("stage", "spec"),
        ("stage", "groups"),
        ("stage", "tensors"),
        ("stage", "bind"),
    ]
    assert kinds[4:7] == [("teardown", "bind"), ("teardown", "tensors"), ("teardown", "groups")]
    assert all(e.outcome == "ok" and e.duration >= 0 for e in events)


def test_replace_and_add_revalidate():
    r = Recorder()

    @stage(needs="kv_cache_config", provides="tensors")
    def zero_tensors(groups, kv_cache_config):
        return ("zeroed", kv_cache_config)

    p2 = r.pipeline.replace("tensors", zero_tensors)
    assert p2.order == r.pipeline.order
    run = p2.start(config=1)
    run.load(model=1)
    run.initialize_kv_cache(5)
    assert run.outputs["bind"] == ("bind", 5, False)
    assert run.outputs["tensors"] == ("zeroed", 5)

    @stage(needs="kv_cache_config")
    def connector(bind):
        return "registered"

    p3 = r.pipeline.add(connector, after="bind")
    assert p3.order[-1] == "connector"

    @stage(needs="kv_cache_config", provides="other")
    def wrong(groups):
        return 1

    from initpipe import StageDeclarationError

    with pytest.raises(StageDeclarationError, match="must provide \\['tensors'\\]") as e:
        r.pipeline.replace("tensors", wrong)
    assert e.value.field == "provides"
    with pytest.raises(UnknownStageNameError, match="Did you mean 'tensors'") as e:
        r.pipeline.replace("tensor", zero_tensors)
    assert e.value.name == "tensor"


def test_keyword_only_inputs_are_passed_by_name():
    @stage(needs="model")
    def kw(model, *, scale):
        return model * scale

    run = Pipeline([kw], start_inputs=("scale",)).start(scale=3)
    run.load(model=2)
    assert run.outputs["kw"] == 6


def test_injected_fault_before_a_stage_rolls_back_its_predecessors():
    r = Recorder()
    run = r.pipeline.start(config=1)
    run.load(model=1)
    inject_fault(run, "tensors", MemoryError("no KV memory"))
    with pytest.raises(StageError, match="no KV memory") as e:
        run.initialize_kv_cache(3)
    assert e.value.stage == "tensors" and e.value.completed == ("groups",)
    assert not r.runs("tensors")  # the stage itself never ran
    assert set(run.outputs) == {"spec"}
    clear_faults(run)
    run.initialize_kv_cache(4)
    assert run.outputs["bind"] == ("bind", 4, False)


def test_injected_fault_after_a_stage_also_tears_that_stage_down():
    r = Recorder()
    run = r.pipeline.start(config=1)
    run.load(model=1)
    inject_fault(run, "tensors", after=True)
    with pytest.raises(StageError, match="injected fault in 'tensors'") as e:
        run.initialize_kv_cache(3)
    assert e.value.completed == ("groups", "tensors")
    assert e.value.rolled_back == ("tensors", "groups")
    assert ("teardown", "tensors", ("tensors", 3), 3) in r.log
    assert set(run.outputs) == {"spec"}
    with pytest.raises(UnknownStageNameError, match="has no stage 'tensrs'") as e:
        inject_fault(run, "tensrs")
    assert "Did you mean 'tensors'" in str(e.value)


class Blob:
    """A phase input whose lifetime the tests watch with a weakref."""

    def __init__(self, name):
        self.name = name


def gone(ref):
    gc.collect()
    return ref() is None


def retention_pipeline(seen):
    """``weights`` (model phase) reads ``model``; no KV stage does. In the KV phase ``plan``
    reads ``scratch``, and ``arena`` reads ``batch``, which its teardown names."""

    @stage(needs="model")
    def weights(model):
        return f"weights of {model.name}"

    @stage(needs="kv_cache_config")
    def plan(weights, kv_cache_config, scratch):
        return (weights, kv_cache_config, scratch.name)

    def release(out, batch):
        seen.append(("release", out, batch.name))

    @stage(needs="kv_cache_config", teardown=release)
    def arena(plan, batch):
        return f"arena for {batch.name}"

    return Pipeline([weights, plan, arena], kv_inputs=("kv_cache_config", "batch", "scratch"))


def test_phase_inputs_nobody_needs_later_are_released_when_the_phase_completes():
    p = retention_pipeline([])
    assert p.kept_inputs == {"model": (), "kv_cache_config": ("batch",)}
    run = p.start()
    model, scratch = Blob("m"), Blob("s")
    run.load(model=model)
    assert run.outputs["weights"] == "weights of m"
    model_ref, scratch_ref = weakref.ref(model), weakref.ref(scratch)
    del model
    assert gone(model_ref), "the model phase's input outlived the phase"
    run.initialize_kv_cache(1, batch=Blob("b"), scratch=scratch)
    del scratch
    assert run.outputs["plan"] == ("weights of m", 1, "s")
    assert gone(scratch_ref), "a KV input that no teardown names outlived the phase"
    with pytest.raises(OutputNotAvailableError, match="is an input of the 'kv_cache_config'"):
        run.outputs["scratch"]


def test_an_input_a_teardown_names_is_kept_until_that_teardown_ran():
    seen = []
    run = retention_pipeline(seen).start()
    run.load(model=Blob("m"))
    first, second = Blob("b1"), Blob("b2")
    run.initialize_kv_cache(1, batch=first, scratch=Blob("s"))
    first_ref = weakref.ref(first)
    del first
    assert not gone(first_ref), "the input the teardown names was released before it ran"
    run.initialize_kv_cache(2, batch=second, scratch=Blob("s"))  # tears the first down
    assert seen == [("release", "arena for b1", "b1")]
    assert gone(first_ref), "the input outlived the teardown that named it"
    second_ref = weakref.ref(second)
    del second
    run.teardown_kv_cache()
    assert seen[-1] == ("release", "arena for b2", "b2")
    assert gone(second_ref)


def test_a_model_input_that_a_kv_stage_reads_stays_until_close():
    seen = []

    def forget(out, model):
        seen.append(("forget", model.name))

    @stage(needs="model", teardown=forget)
    def spec(model):
        return model.name

    @stage(needs="kv_cache_config")
    def bind(spec, model, kv_cache_config):
        return (spec, model.name, kv_cache_config)

    p = Pipeline([spec, bind])
    assert p.kept_inputs == {"model": ("model",), "kv_cache_config": ()}
    run = p.start()
    model = Blob("m")
    model_ref = weakref.ref(model)
    run.load(model=model)
    del model
    run.initialize_kv_cache(1)
    run.teardown_kv_cache()
    run.initialize_kv_cache(2)  # the KV phase reads it again after a re-init
    assert run.outputs["bind"] == ("m", "m", 2)
    assert not gone(model_ref), "the model was released while KV stages still read it"
    run.close()
    assert seen == [("forget", "m")]
    assert gone(model_ref), "the model outlived close()"


def test_the_inputs_of_a_failed_phase_are_released_after_its_rollback():
    seen = []
    p = retention_pipeline(seen)
    run = p.start()
    run.load(model=Blob("m"))
    batch, scratch = Blob("b"), Blob("s")
    refs = [weakref.ref(batch), weakref.ref(scratch)]
    with fault(run, "arena", after=True), pytest.raises(StageError) as info:
        run.initialize_kv_cache(1, batch=batch, scratch=scratch)
    assert info.value.rolled_back == ("arena", "plan")
    del info, batch, scratch  # the error's traceback holds the stages' frames, as any does
    assert seen == [("release", "arena for b", "b")]  # the rollback's teardown got it
    assert all(gone(r) for r in refs), "an input of the failed phase outlived the rollback"
    assert run.completed("kv_cache_config") == []
