"""Building KV generation N+1 while N is alive: ``prepare_kv_cache()`` then
``commit_kv_cache()`` or ``abort_kv_cache()`` (graphlib's prepare()/done() protocol)."""

import pytest

from initpipe import REQUIRED, PhaseOrderError, Pipeline, StageError, stage


class Cache:
    """A KV pipeline whose stages allocate named "tensors" and log every run and teardown."""

    def __init__(self):
        self.log = []
        self.alive = set()
        self.fail = None
        log, alive = self.log, self.alive

        @stage(needs="model")
        def spec(model):
            return {"layers": model}

        def free(out):
            log.append(("free", out))
            alive.discard(out)

        @stage(needs="kv_cache_config", teardown=free)
        def tensors(spec, kv_cache_config):
            log.append(("alloc", kv_cache_config))
            alive.add(f"tensors@{kv_cache_config}")
            return f"tensors@{kv_cache_config}"

        def unbind(out):
            log.append(("unbind", out))
            alive.discard(out)

        @stage(needs="kv_cache_config", teardown=unbind)
        def bind(tensors, kv_cache_config):
            if self.fail == kv_cache_config:
                raise RuntimeError("out of memory")
            alive.add(f"bind@{kv_cache_config}")
            return f"bind@{kv_cache_config}"

        self.pipeline = Pipeline([bind, tensors, spec], kv_inputs={"kv_cache_config": REQUIRED})

    def loaded(self, config="a"):
        run = self.pipeline.start()
        run.load(model=2)
        run.initialize_kv_cache(config)
        self.log.clear()
        return run


def size(outputs):
    """Bytes a generation holds: its tensors' size (one per block of the config's name)."""
    return sum(len(v) for k, v in outputs.items() if k == "tensors")


def test_commit_frees_the_old_generation_after_the_new_one_is_built():
    c = Cache()
    run = c.loaded("a")
    handoff = run.prepare_kv_cache("bb")
    # both generations alive, each readable
    assert c.alive == {"tensors@a", "bind@a", "tensors@bb", "bind@bb"}
    assert c.log == [("alloc", "bb")]
    assert dict(handoff.previous_outputs) == {"tensors": "tensors@a", "bind": "bind@a"}
    assert dict(handoff.outputs) == {"tensors": "tensors@bb", "bind": "bind@bb"}
    assert (handoff.previous, handoff.generation) == (1, 2) and run.kv_pending is handoff
    assert run.outputs["bind"] == "bind@a"  # N is the run's until the commit
    assert handoff.peak_bytes(size) == len("tensors@a") + len("tensors@bb")

    out = run.commit_kv_cache()
    assert c.log == [("alloc", "bb"), ("unbind", "bind@a"), ("free", "tensors@a")]
    assert c.alive == {"tensors@bb", "bind@bb"} and out["bind"] == "bind@bb"
    assert run.kv_pending is None and run.kv_ready and run.kv_generation == 2
    teardowns = [(e.name, e.generation) for e in run.trace.events if e.kind == "teardown"]
    assert teardowns == [("bind", 1), ("tensors", 1)]  # N's teardowns, recorded as N's
    run.close()  # N+1 is the run's: torn down once, in reverse
    assert c.log[-2:] == [("unbind", "bind@bb"), ("free", "tensors@bb")] and not c.alive


def test_abort_tears_the_new_generation_down_in_reverse_and_keeps_the_old():
    c = Cache()
    run = c.loaded("a")
    run.prepare_kv_cache("b")
    run.abort_kv_cache()
    assert c.log == [("alloc", "b"), ("unbind", "bind@b"), ("free", "tensors@b")]
    assert c.alive == {"tensors@a", "bind@a"} and dict(run.outputs)["bind"] == "bind@a"
    assert run.kv_pending is None and run.kv_ready
    teardowns = [(e.name, e.generation) for e in run.trace.events if e.kind == "teardown"]
    assert teardowns == [("bind", 2), ("tensors", 2)]
    run.initialize_kv_cache("c")  # the default path frees N (still "a") first
    assert c.log[3:5] == [("unbind", "bind@a"), ("free", "tensors@a")]
    assert c.alive == {"tensors@c", "bind@c"}


def test_a_failing_new_generation_is_rolled_back_and_the_old_one_serves_on():
    c = Cache()
    run = c.loaded("a")
    c.fail = "b"
    with pytest.raises(StageError, match="stage 'bind'") as info:
        run.prepare_kv_cache("b")
    assert info.value.completed == ("tensors",) and info.value.rolled_back == ("tensors",)
    assert c.alive == {"tensors@a", "bind@a"} and run.outputs["bind"] == "bind@a"
    assert run.kv_pending is None
    with pytest.raises(PhaseOrderError, match=r"prepare_kv_cache\(\) must be called before"):
        run.commit_kv_cache()


def test_prepare_with_no_generation_alive_commits_like_a_first_initialization():
    c = Cache()
    run = c.pipeline.start()
    run.load(model=2)
    handoff = run.prepare_kv_cache("a")
    assert handoff.previous == 0 and dict(handoff.previous_outputs) == {}
    assert handoff.peak_bytes(size) == len("tensors@a")
    run.commit_kv_cache()
    assert run.outputs["tensors"] == "tensors@a" and c.alive == {"tensors@a", "bind@a"}


@pytest.mark.parametrize("call", ["commit_kv_cache", "abort_kv_cache"])
def test_commit_or_abort_without_prepare_says_to_prepare_first(call):
    run = Cache().loaded()
    with pytest.raises(
        PhaseOrderError, match=rf"prepare_kv_cache\(\) must be called before {call}\(\)"
    ):
        getattr(run, call)()


@pytest.mark.parametrize(
    ("call", "args"),
    [("prepare_kv_cache", ("c",)), ("initialize_kv_cache", ("c",)), ("teardown_kv_cache", ())],
)
def test_a_second_kv_call_while_prepared_says_to_commit_or_abort_first(call, args):
    c = Cache()
    run = c.loaded("a")
    run.prepare_kv_cache("b")
    with pytest.raises(
        PhaseOrderError,
        match=rf"KV generation 2 is prepared: call commit_kv_cache\(\) or abort_kv_cache\(\) "
        rf"before {call}\(\)",
    ):
        getattr(run, call)(*args)
    assert c.alive == {"tensors@a", "bind@a", "tensors@b", "bind@b"}  # nothing changed


def test_prepare_before_load_and_on_a_closed_run_say_what_to_call():
    run = Cache().pipeline.start()
    with pytest.raises(PhaseOrderError, match=r"load\(\) must be called before prepare_kv_cache"):
        run.prepare_kv_cache("a")
    run.close()
    with pytest.raises(PhaseOrderError, match=r"commit_kv_cache\(\) called on a closed run"):
        run.commit_kv_cache()


def test_close_while_prepared_tears_down_the_new_generation_then_the_old():
    c = Cache()
    run = c.loaded("a")
    run.prepare_kv_cache("b")
    run.close()
    assert c.log[1:] == [
        ("unbind", "bind@b"),
        ("free", "tensors@b"),
        ("unbind", "bind@a"),
        ("free", "tensors@a"),
    ]
    assert not c.alive and run.kv_pending is None
