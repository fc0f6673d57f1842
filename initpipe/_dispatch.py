"""The hot loop: call a phase's stages in order, store outputs, record the trace.

Kept tiny on purpose: everything that can be decided once (argument names, calling
convention, output unpacking) is precomputed into a :class:`Step` when the pipeline is built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableSequence
from operator import itemgetter
from time import perf_counter
from typing import Any

from ._stage import StageSpec
from ._trace import RawRecord
from .errors import StageOutputError, error_text

__all__ = ["Done", "Failed", "Step", "run_steps"]


class Step:
    """A stage prepared for dispatch."""

    __slots__ = ("args", "call", "func", "gather", "key", "name", "phase", "provides", "spec")

    def __init__(self, spec: StageSpec, func: Callable[..., Any] | None = None) -> None:
        self.spec = spec
        self.name = spec.name
        self.phase = spec.needs
        self.func = func if func is not None else spec.func
        self.args = spec.inputs
        self.provides = spec.provides
        #: the output key, or None when the stage returns a mapping of several outputs
        self.key = None if spec.multi else spec.provides[0]
        self.gather = _gatherer(spec.inputs)
        if spec.positional:
            self.call = self.func
        else:  # keyword-only parameters: pass every input by name
            names, fn = self.args, self.func
            self.call = lambda *args: fn(**dict(zip(names, args, strict=True)))

    def with_call(self, call: Callable[..., Any]) -> Step:
        """Return a copy of this step that calls ``call`` instead (wrappers, test faults)."""
        other = Step.__new__(Step)
        for slot in Step.__slots__:
            setattr(other, slot, getattr(self, slot))
        other.call = call
        return other


def _gatherer(keys: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """Return a fast ``values -> tuple of the inputs`` function (itemgetter where it can)."""
    if len(keys) >= 2:
        return itemgetter(*keys)
    if len(keys) == 1:
        (k,) = keys
        return lambda values: (values[k],)
    return lambda values: ()


#: A step that ran to completion, as ``(step, output)``: what its teardown and a rollback
#: need (a plain tuple: the hot loop builds one per stage). It holds none of the stage's
#: inputs: a teardown gets the inputs it names from the run's values, which keep them until
#: the phase is torn down (see ``Pipeline.kept_inputs``).
Done = tuple[Step, Any]


class Failed(Exception):
    """Internal: carries the failing step and its exception out of the loop.

    ``step`` either raised, or completed (it is then the last of ``done``) and a listener
    raised on its event: either way the phase fails at ``step``.
    """

    def __init__(self, step: Step, error: BaseException) -> None:
        super().__init__(step.name)
        self.step = step
        self.error = error


def _unpack(step: Step, out: Any) -> Mapping[str, Any]:
    if not isinstance(out, Mapping):
        msg = (
            f"stage {step.spec.qualname} provides {step.provides} and must return a mapping "
            f"with exactly those keys, not {type(out).__name__}."
        )
        raise StageOutputError(step.spec.qualname, msg)
    if out.keys() != set(step.provides):
        missing = [k for k in step.provides if k not in out]
        extra = sorted(str(k) for k in out if k not in step.provides)
        msg = (
            f"stage {step.spec.qualname} must return exactly {list(step.provides)}; "
            f"missing {missing}, unexpected {extra}."
        )
        raise StageOutputError(step.spec.qualname, msg, missing, extra)
    return out


def run_steps(
    steps: tuple[Step, ...],
    values: dict[str, Any],
    done: list[Done],
    records: MutableSequence[RawRecord],
    generation: int,
    notify: Callable[[], None] | None,
) -> None:
    """Run ``steps`` in order.

    Each completed step is appended to ``done`` (a :data:`Done`) so the caller can tear it
    down; its outputs go into ``values``; one record per step goes into ``records`` (a
    :data:`~initpipe._trace.RawRecord`: name, phase, kind, start, duration, outcome,
    generation, error); ``notify()`` is called after each record.

    Raises:
        Failed: a stage raised, or ``notify()`` raised after a stage completed.
    """
    append = records.append
    done_append = done.append
    clock = perf_counter
    for step in steps:
        args = step.gather(values)
        t0 = clock()
        try:
            out = step.call(*args)
            key = step.key
            if key is None:
                values.update(_unpack(step, out))
            else:
                values[key] = out
        except BaseException as err:
            t1 = clock()
            error = error_text(err)
            append((step.name, step.phase, "stage", t0, t1 - t0, "error", generation, error))
            if notify is not None:
                notify()
            raise Failed(step, err) from err
        t1 = clock()
        done_append((step, out))
        append((step.name, step.phase, "stage", t0, t1 - t0, "ok", generation, None))
        if notify is not None:
            try:
                notify()
            except BaseException as err:  # the stage completed: it is rolled back with the rest
                raise Failed(step, err) from err
