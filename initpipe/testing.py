"""Test facilities: make a stage fail on purpose, in this process or in spawned workers.

What belongs here: tools for testing pipelines and the code that drives them — nothing the
product path calls. A fault is injected into one :class:`~initpipe.Run` without editing the
stage or its pipeline:

- ``after=False``: the stage fails *before* it runs (its function is never called); the
  stages before it are rolled back.
- ``after=True``: the stage runs and completes, then the phase fails at it — its output
  exists and is rolled back (its teardown runs) like every completed stage's.

Either way the run raises :class:`~initpipe.StageError` naming the stage, exactly as a real
failure would, and ``clear_faults(run)`` (or leaving the ``with`` block) restores the run.

Spawned worker processes cannot be reached with a function call: set
``INITPIPE_INJECT_FAULT=stage[:after][@N][,stage2...]`` in their environment and call
:func:`inject_faults_from_env` on each new run (the vLLM pipelined runner does when the
variable is set).
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ._run import Run
from ._trace import TraceEvent
from .errors import InjectedFault, UnknownStageNameError

__all__ = [
    "ENV_FAULT",
    "clear_faults",
    "fault",
    "inject_fault",
    "inject_faults_from_env",
    "parse_fault_spec",
]

#: ``stage[:after][@N]`` entries, comma-separated: faults for runs in processes you cannot
#: call (``@N``: only the stage's N-th run fails, e.g. the first resize after a start).
ENV_FAULT = "INITPIPE_INJECT_FAULT"

# The listeners each run got from inject_fault(after=True), so clear_faults removes them.
_AFTER: weakref.WeakKeyDictionary[Run, list[Callable[[TraceEvent], None]]] = (
    weakref.WeakKeyDictionary()
)


def inject_fault(
    run: Run,
    stage: str,
    error: BaseException | None = None,
    *,
    after: bool = False,
    times: int | None = None,
    skip: int = 0,
) -> None:
    """Make ``stage`` fail in ``run`` on its next runs, until :func:`clear_faults`.

    Args:
        run: the run to affect (other runs of the same pipeline are untouched).
        stage: the stage name.
        error: the exception to raise (default: :class:`~initpipe.errors.InjectedFault`).
        after: fail right after the stage completed (its output is rolled back) instead of
            before it runs.
        times: fail only on the next ``times`` runs of the stage, then run it normally
            (e.g. ``times=1``: a resize fails once and its rollback succeeds); ``None``:
            every run.
        skip: let the next ``skip`` runs of the stage pass before the faults start.

    Raises:
        UnknownStageNameError: no such stage (with close names).
        ValueError: ``times`` is below 1, or ``skip`` below 0.
    """
    spec = run.pipeline.stage(stage)
    if times is not None and times < 1:
        msg = f"inject_fault(times={times}): pass a count of at least 1, or None for always"
        raise ValueError(msg)
    if skip < 0:
        msg = f"inject_fault(skip={skip}): pass a count of runs to let pass, 0 or more"
        raise ValueError(msg)
    err = error if error is not None else InjectedFault(f"injected fault in {stage!r}")
    left = [times]
    passing = [skip]

    def fire() -> bool:
        if passing[0] > 0:
            passing[0] -= 1
            return False
        if left[0] is None:
            return True
        if left[0] == 0:
            return False
        left[0] -= 1
        return True

    if after:

        def fail_after(event: TraceEvent) -> None:
            if event.name == stage and event.kind == "stage" and event.outcome == "ok" and fire():
                raise err

        run.add_listener(fail_after)
        _AFTER.setdefault(run, []).append(fail_after)
        return

    phase = spec.needs
    original = next(step for step in run._steps[phase] if step.name == stage)

    def fail_before(*args: Any) -> Any:
        if fire():
            raise err
        return original.call(*args)

    # The run keeps its own copy of the pipeline's steps: swap this stage's call there.
    run._steps[phase] = tuple(
        step.with_call(fail_before) if step.name == stage else step for step in run._steps[phase]
    )


def clear_faults(run: Run) -> None:
    """Remove every fault injected into ``run``."""
    run._steps = dict(run.pipeline.steps)
    for fn in _AFTER.pop(run, ()):
        run.remove_listener(fn)


@contextlib.contextmanager
def fault(
    run: Run, stage: str, error: BaseException | None = None, *, after: bool = False
) -> Iterator[Run]:
    """``with fault(run, "stage"): ...`` — :func:`inject_fault`, cleared on exit."""
    inject_fault(run, stage, error, after=after)
    try:
        yield run
    finally:
        clear_faults(run)


def parse_fault_spec(value: str) -> list[tuple[str, bool, int | None]]:
    """Parse ``stage[:after][@N][,stage2[:before]...]`` into ``[(stage, after, N), ...]``
    (``N`` None: every run of the stage fails).

    Raises:
        ValueError: an entry's mode is neither ``after`` nor ``before``, or ``N`` is not a
            positive integer.
    """
    faults: list[tuple[str, bool, int | None]] = []
    for entry in value.split(","):
        entry = entry.strip()
        head, at_sign, count = entry.partition("@")
        name, _, mode = head.strip().partition(":")
        if not name:
            continue
        if mode not in ("", "before", "after"):
            msg = (
                f"{ENV_FAULT}={value!r}: {entry!r} has mode {mode!r}; use "
                f"'stage', 'stage:before' or 'stage:after'."
            )
            raise ValueError(msg)
        at = None
        if at_sign:
            if not count.strip().isdigit() or int(count) < 1:
                msg = (
                    f"{ENV_FAULT}={value!r}: {entry!r}: after '@' put the run of the stage "
                    f"that fails, 1 or more (e.g. '{name}@2'), not {count!r}."
                )
                raise ValueError(msg)
            at = int(count)
        faults.append((name, mode == "after", at))
    return faults


def inject_faults_from_env(
    run: Run,
    environ: Mapping[str, str] | None = None,
    make_error: Callable[[str], BaseException] | None = None,
) -> bool:
    """Inject the faults ``INITPIPE_INJECT_FAULT`` names into ``run``; True if any.

    Stage names the pipeline lacks are an error (a typo would silently test nothing).

    Raises:
        ValueError: a malformed entry.
        UnknownStageNameError: a stage the run's pipeline does not have.
    """
    raw = (os.environ if environ is None else environ).get(ENV_FAULT, "").strip()
    if not raw:
        return False
    for name, after, at in parse_fault_spec(raw):
        try:
            run.pipeline.stage(name)
        except UnknownStageNameError as err:
            raise UnknownStageNameError(f"{ENV_FAULT}: {err}", name) from None
        error = make_error(name) if make_error is not None else None
        if at is None:
            inject_fault(run, name, error, after=after)
        else:
            inject_fault(run, name, error, after=after, skip=at - 1, times=1)
    return True
