"""A stage's failure stays catchable as the type it raised, and keeps what StageError says."""

import errno
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import final

import pytest
from coretoys.failing import DeviceOutOfMemory, DiskError, QuotaError

from initpipe import InitpipeError, Pipeline, StageError, TeardownError, stage

CORE = Path(__file__).resolve().parent


def fail_with(error, *, teardown_fails=False):
    """Run a pipeline whose second KV stage raises ``error``; return the StageError."""

    def undo(out):
        if teardown_fails:
            raise RuntimeError("cannot undo first")

    @stage(needs="kv_cache_config", teardown=undo)
    def first(kv_cache_config):
        return 1

    @stage(needs="kv_cache_config")
    def boom(first):
        raise error

    run = Pipeline([first, boom]).start()
    run.load(model=None)
    try:
        run.initialize_kv_cache(0)
    except StageError as err:
        return err
    raise AssertionError("the stage did not fail")


def assert_stage_facts(err, cause):
    assert isinstance(err, StageError) and isinstance(err, InitpipeError)
    assert err.stage == "boom" and err.phase == "kv_cache_config"
    assert err.qualname.endswith("fail_with.<locals>.boom")
    assert err.completed == ("first",) and err.rolled_back == ("first",)
    assert err.__cause__ is cause and err.teardown_error is None
    assert str(err) == (
        f"stage 'boom' ({err.qualname}) failed in phase 'kv_cache_config': "
        f"{type(cause).__name__}: {cause}\n"
        "  completed in this phase: first\n"
        "  rolled back: first"
    )


class NeedsTwo(Exception):
    """A Python ``__new__`` that takes other arguments than a StageError's."""

    def __new__(cls, a, b):
        return super().__new__(cls, a, b)


@pytest.mark.parametrize(
    "cause",
    [
        ValueError("bad block size"),
        AssertionError("shapes differ"),
        KeyError("layer.0"),
        MemoryError("host"),
        DeviceOutOfMemory("CUDA out of memory. Tried to allocate 2.00 GiB"),
        QuotaError(7, "over budget"),
        NeedsTwo(1, 2),
    ],
    ids=lambda e: type(e).__name__,
)
def test_the_cause_type_still_catches_the_stage_error(cause):
    with pytest.raises(type(cause)) as info:  # the except clause stock's callers have
        raise fail_with(cause)
    err = info.value
    assert_stage_facts(err, cause)
    assert type(err).__name__ == f"StageError[{type(cause).__qualname__}]"
    assert type(err).__module__ == "initpipe.errors"
    assert repr(err).startswith(f"StageError[{type(cause).__qualname__}](\"stage 'boom'")


def test_the_subclass_is_made_once_per_cause_type():
    made = StageError.subclass_for(ValueError)
    assert StageError.subclass_for(ValueError) is made
    assert type(fail_with(ValueError("x"))) is made
    assert made.__mro__[1:3] == (StageError, InitpipeError)
    # a cause StageError already is (RuntimeError, Exception) needs no subclass
    assert StageError.subclass_for(RuntimeError) is StageError
    assert StageError.subclass_for(Exception) is StageError
    assert type(fail_with(RuntimeError("plain"))) is StageError


def test_a_keyerror_message_is_not_quoted_and_a_custom_str_does_not_win():
    err = fail_with(KeyError("layer.0"))
    assert str(err).startswith("stage 'boom'") and "KeyError: 'layer.0'" in str(err)
    err = fail_with(QuotaError(7, "over budget"))
    assert str(err).startswith("stage 'boom'")
    assert "QuotaError: quota 7: over budget" in str(err)


def test_the_cause_attributes_are_on_the_error_its_handlers_catch():
    err = fail_with(QuotaError(7, "over budget"))
    assert isinstance(err, QuotaError) and (err.code, err.detail) == (7, "over budget")
    cause = DiskError(errno.ENOSPC, "No space left on device", "/kv/cache.bin")
    with pytest.raises(OSError) as info:
        raise fail_with(cause)
    err = info.value
    assert_stage_facts(err, cause)
    assert (err.errno, err.strerror, err.filename) == (
        errno.ENOSPC,
        "No space left on device",
        "/kv/cache.bin",
    )


class _Refusing(Exception):
    def __init_subclass__(cls, **kwargs):
        raise TypeError(f"{cls.__name__} may not subclass _Refusing")


class _Meta(type):
    def __call__(cls, *args, **kwargs):
        return super().__call__(*args, **kwargs)


class _MetaError(Exception, metaclass=_Meta):
    pass


@final
class _FinalError(Exception):
    pass


class _WrongOrder(RuntimeError, InitpipeError):  # InitpipeError must precede RuntimeError
    pass


@pytest.mark.parametrize(
    "cause",
    [
        _Refusing("no subclass"),
        _MetaError("own metaclass __call__"),
        _FinalError("final"),
        _WrongOrder("inconsistent MRO"),
        SyntaxError("tracebacks print its own fields"),
        ExceptionGroup("group", [ValueError("inner")]),
    ],
    ids=lambda e: type(e).__name__,
)
def test_when_no_subclass_can_be_made_the_error_is_a_plain_stage_error(cause):
    err = fail_with(cause)
    assert type(err) is StageError
    assert_stage_facts(err, cause)
    assert StageError.subclass_for(type(cause)) is StageError  # cached, and still no error


def test_a_nested_runs_stage_error_keeps_its_catchable_type():
    inner = fail_with(ValueError("inner"))
    outer = fail_with(inner)
    assert type(outer) is type(inner) and isinstance(outer, ValueError)
    assert outer.__cause__ is inner


class _Unprintable(ValueError):
    def __str__(self):
        raise RuntimeError("no str")


def test_a_cause_whose_str_raises_still_gives_a_stage_error():
    err = fail_with(_Unprintable())
    assert isinstance(err, ValueError) and err.stage == "boom"
    assert "failed in phase 'kv_cache_config': _Unprintable: <exception str() failed>" in str(err)


def test_keyboard_interrupt_is_rolled_back_and_reraised_as_is():
    interrupt = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt) as info:
        fail_with(interrupt)
    assert info.value is interrupt and not isinstance(info.value, StageError)


def _round_trip(obj):
    return pickle.loads(pickle.dumps(obj))


@pytest.mark.parametrize(
    "cause",
    [ValueError("v"), QuotaError(7, "over budget"), DeviceOutOfMemory("oom"), RuntimeError("r")],
    ids=lambda e: type(e).__name__,
)
def test_a_stage_error_pickles_with_its_class_and_facts(cause):
    err = fail_with(cause)
    back = _round_trip(err)
    assert type(back) is type(err) and isinstance(back, type(cause))
    assert str(back) == str(err) and back.args == err.args
    assert (back.stage, back.qualname, back.phase, back.completed, back.rolled_back) == (
        err.stage,
        err.qualname,
        err.phase,
        err.completed,
        err.rolled_back,
    )
    assert _round_trip(type(err)) is type(err)  # the class is found by its name


def test_the_c_fields_and_rollback_errors_survive_pickling():
    err = fail_with(DiskError(errno.ENOSPC, "full", "/kv"), teardown_fails=True)
    assert isinstance(err.teardown_error, TeardownError)
    assert "rollback errors: 1 teardown(s) failed" in str(err)
    back = _round_trip(err)
    assert (back.errno, back.strerror, back.filename) == (errno.ENOSPC, "full", "/kv")
    assert [(s, str(e)) for s, e in back.teardown_error.failures] == [
        ("first", "cannot undo first")
    ]


def test_a_local_cause_class_unpickles_as_a_plain_stage_error():
    class LocalError(Exception):
        pass

    err = fail_with(LocalError("local"))
    assert isinstance(err, LocalError)
    back = _round_trip(err)
    assert type(back) is StageError
    assert str(back) == str(err) and back.stage == "boom"


def test_a_fresh_process_unpickles_the_same_catchable_error(tmp_path):
    errors = [fail_with(ValueError("bad")), fail_with(QuotaError(7, "over budget"))]
    path = tmp_path / "errors.pickle"
    path.write_bytes(pickle.dumps(errors))
    code = (
        "import json, pickle, sys\n"
        "from coretoys.failing import QuotaError\n"
        "errs = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "print(json.dumps([[type(e).__name__, isinstance(e, (ValueError, QuotaError)),\n"
        "                   e.stage, list(e.completed), str(e)] for e in errs]))\n"
    )
    paths = [str(CORE), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got == [[type(e).__name__, True, "boom", ["first"], str(e)] for e in errors]
