"""The hot loop: call a phase's stages in order, store outputs, record the trace.

Kept tiny on purpose: everything that can be decided once (argument names, calling
convention, output unpacking) is precomputed into a :class:`Step` when the pipeline is built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from time import perf_counter
from typing import Any

from ._stage import StageSpec
from ._trace import STAGE, Trace
from .errors import StageOutputError

__all__ = ["Failed", "Step", "run_steps"]


class Step:
    """A stage prepared for dispatch."""

    __slots__ = ("args", "func", "multi", "name", "phase", "positional", "provides", "spec")

    def __init__(self, spec: StageSpec, func: Callable[..., Any] | None = None) -> None:
        import inspect

        self.spec = spec
        self.name = spec.name
        self.phase = spec.needs
        self.func = func if func is not None else spec.func
        self.args = spec.inputs
        self.provides = spec.provides
        self.multi = spec.multi
        params = inspect.signature(spec.func).parameters.values()
        self.positional = all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params)


class Failed(Exception):
    """Internal: carries the failing step and its exception out of the loop."""

    def __init__(self, step: Step, error: BaseException) -> None:
        super().__init__(step.name)
        self.step = step
        self.error = error


def _unpack(step: Step, out: Any) -> Mapping[str, Any]:
    if not isinstance(out, Mapping):
        msg = (f"stage {step.spec.qualname} provides {step.provides} and must return a mapping "
               f"with exactly those keys, not {type(out).__name__}.")
        raise StageOutputError(step.spec.qualname, msg)
    if out.keys() != set(step.provides):
        missing = [k for k in step.provides if k not in out]
        extra = sorted(str(k) for k in out if k not in step.provides)
        msg = (f"stage {step.spec.qualname} must return exactly {list(step.provides)}; "
               f"missing {missing}, unexpected {extra}.")
        raise StageOutputError(step.spec.qualname, msg, missing, extra)
    return out


def run_steps(steps: list[Step], values: dict[str, Any], done: list[tuple[Step, Any, tuple]],
              trace: Trace, generation: int,
              listener: Callable[[Step, float, str], None] | None) -> None:
    """Run ``steps`` in order.

    Each completed step is appended to ``done`` as ``(step, output, args)`` so the caller can
    tear it down; its outputs go into ``values``. On failure raises :class:`Failed`.
    """
    record = trace.record
    for step in steps:
        t0 = perf_counter()
        try:
            if step.positional:
                args = tuple([values[k] for k in step.args])
                out = step.func(*args)
            else:
                args = tuple([values[k] for k in step.args])
                out = step.func(**dict(zip(step.args, args, strict=True)))
            if step.multi:
                values.update(_unpack(step, out))
            else:
                values[step.provides[0]] = out
        except BaseException as err:
            t1 = perf_counter()
            record(step.name, step.phase, STAGE, t0, t1, "error", generation,
                   f"{type(err).__name__}: {err}")
            if listener is not None:
                listener(step, t1 - t0, "error")
            raise Failed(step, err) from err
        t1 = perf_counter()
        done.append((step, out, args))
        record(step.name, step.phase, STAGE, t0, t1, "ok", generation)
        if listener is not None:
            listener(step, t1 - t0, "ok")
