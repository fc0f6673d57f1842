"""The two-phase runner: ``load()`` runs the model phase, ``initialize_kv_cache()`` the
re-runnable KV phase; teardowns undo a phase in reverse order.

The phase protocol is explicit data (``Run.state``) and is checked on every call. Public
methods hold one lock, so concurrent calls are serialized (one waits for the other).

What a run keeps: the start inputs; every stage output until its phase is torn down; and of
a phase's inputs only those still needed once the phase completed (``Pipeline.kept_inputs``):
the model-phase inputs that KV stages read, and the inputs a teardown of the phase names
(the opt-in: name the input as a parameter of the stage's teardown), until the phase is torn
down. Everything else a phase was given is released when the phase completes or is rolled
back; completed stages hold only their outputs.

Two ways to replace a KV generation: ``initialize_kv_cache()`` frees generation N first and
then builds N+1 (the default: never two caches alive at once); ``prepare_kv_cache()`` builds
N+1 while N is still alive, and ``commit_kv_cache()`` (N torn down, N+1 in place) or
``abort_kv_cache()`` (N+1 torn down, N intact) ends it — the protocol of graphlib's
``prepare()``/``done()``, checked the same way. In between, both generations' outputs are
readable (:class:`KVHandoff`), so a caller can copy from the old cache into the new one, and
:meth:`KVHandoff.peak_bytes` says what holding both costs.
"""

from __future__ import annotations

import difflib
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from time import perf_counter
from types import MappingProxyType
from typing import Any, Literal, Protocol

import attrs
import networkx as nx

from ._dispatch import Done, Failed, Step, run_steps
from ._graph import REQUIRED
from ._stage import KV, MODEL, Phase, StageSpec
from ._trace import TEARDOWN, Outcome, Trace, TraceEvent, blame, critical_path
from .errors import (
    InputsError,
    OutputNotAvailableError,
    PhaseOrderError,
    StageError,
    TeardownError,
    error_text,
)

__all__ = ["KVHandoff", "Listener", "Outputs", "PipelineLike", "Run", "RunState"]

#: Called with each :class:`TraceEvent` after a stage run or teardown.
Listener = Callable[[TraceEvent], None]
#: Where a run stands: before ``load()``, after it, or after ``close()``.
RunState = Literal["started", "loaded", "closed"]


class PipelineLike(Protocol):
    """What a :class:`Run` reads from its pipeline (:class:`initpipe.Pipeline` is one).

    Declared here, not imported, so the run sits below the pipeline that starts it.
    """

    @property
    def name(self) -> str: ...
    @property
    def graph(self) -> nx.DiGraph[str]: ...
    @property
    def inputs(self) -> Mapping[str, Mapping[str, Any]]: ...
    @property
    def specs(self) -> Mapping[str, StageSpec]: ...
    @property
    def producers_by_stage(self) -> Mapping[str, str]: ...
    @property
    def steps(self) -> Mapping[str, tuple[Step, ...]]: ...
    @property
    def kept_inputs(self) -> Mapping[str, tuple[str, ...]]: ...
    def stage(self, name: str) -> StageSpec: ...
    def phase_order(self, phase: str) -> list[str]: ...


def bind_inputs(
    phase: str, call: str, declared: Mapping[str, Any], given: Mapping[str, Any]
) -> dict[str, Any]:
    """Check ``given`` against a phase's declared inputs and fill defaults."""
    if given.keys() == declared.keys():  # the common case, kept cheap for the hot path
        return dict(given)
    missing = [k for k, d in declared.items() if d is REQUIRED and k not in given]
    unknown = sorted(k for k in given if k not in declared)
    if missing or unknown:
        raise InputsError(phase, call, missing, unknown, list(declared))
    return {k: given.get(k, d) for k, d in declared.items()}


class Outputs(Mapping[str, Any]):
    """Read-only view of a run's stage outputs; a missing key says what to call."""

    def __init__(self, run: Run) -> None:
        # A weak proxy: no Run <-> Outputs cycle, so a finished Run is freed at once instead
        # of waiting for the cyclic GC (which showed up as ~20% of dispatch time).
        self._run = weakref.proxy(run)

    def _present(self) -> list[str]:
        return [k for k in self._run._values if k in self._run.pipeline.producers_by_stage]

    def __getitem__(self, key: str) -> Any:
        run = self._run
        if key in run.pipeline.producers_by_stage and key in run._values:
            return run._values[key]
        raise OutputNotAvailableError(key, run._why_missing(key))

    def __iter__(self) -> Iterator[str]:
        return iter(self._present())

    def __len__(self) -> int:
        return len(self._present())

    def __repr__(self) -> str:
        return f"<Outputs {self._present()}>"


@attrs.frozen(kw_only=True)
class KVHandoff:
    """Two KV generations alive at once: what :meth:`Run.prepare_kv_cache` returns.

    Attributes:
        previous: generation N, still in place (0: there was none).
        generation: generation N+1, built and waiting for ``commit_kv_cache()`` or
            ``abort_kv_cache()``.
        previous_outputs: N's KV-phase outputs (read-only; empty when there was none).
        outputs: N+1's KV-phase outputs (read-only).
    """

    previous: int
    generation: int
    previous_outputs: Mapping[str, Any] = attrs.field(repr=lambda m: repr(list(m)))
    outputs: Mapping[str, Any] = attrs.field(repr=lambda m: repr(list(m)))

    def peak_bytes(self, measure: Callable[[Mapping[str, Any]], int]) -> int:
        """Bytes held while both generations are alive: ``measure`` (which knows what a
        generation's outputs hold, e.g. its KV tensors) of N plus of N+1."""
        return int(measure(self.previous_outputs)) + int(measure(self.outputs))


@attrs.define
class _Pending:
    """Generation N+1 while N is alive: its own values and completed stages."""

    handoff: KVHandoff
    values: dict[str, Any]
    done: list[Done]


class Run:
    """One initialization: created by :meth:`Pipeline.start`, driven phase by phase.

    Attributes:
        pipeline: the validated :class:`~initpipe.Pipeline` that started the run.
        trace: the :class:`Trace` of every stage run, teardown and host span.
        outputs: read-only mapping of the stage outputs that exist now.
        state: ``started``, ``loaded`` or ``closed``.
        kv_generation: how many times the KV phase has completed or been attempted.
        kv_pending: the :class:`KVHandoff` between ``prepare_kv_cache()`` and its
            ``commit_kv_cache()``/``abort_kv_cache()``; None otherwise.
    """

    def __init__(
        self,
        pipeline: PipelineLike,
        start_values: dict[str, Any],
        listeners: tuple[Listener, ...] = (),
        trace: Trace | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.trace = Trace() if trace is None else trace
        self.outputs = Outputs(self)
        self.state: RunState = "started"
        self.kv_generation = 0
        self._values: dict[str, Any] = dict(start_values)
        self._done: dict[str, list[Done]] = {MODEL: [], KV: []}
        self._listeners = list(listeners)
        self._lock = threading.Lock()
        # Run-local copy of the pipeline's steps: initpipe.testing swaps a step here to
        # inject a fault into this run only.
        self._steps: dict[str, tuple[Step, ...]] = dict(pipeline.steps)
        self._pending: _Pending | None = None

    # -- observation ---------------------------------------------------------------------
    def add_listener(self, fn: Listener) -> None:
        """Call ``fn(event)`` after every stage run and teardown (progress, logging)."""
        self._listeners.append(fn)

    def remove_listener(self, fn: Listener) -> None:
        """Undo :meth:`add_listener` (no error if ``fn`` is not registered)."""
        if fn in self._listeners:
            self._listeners.remove(fn)

    @property
    def kv_ready(self) -> bool:
        """True while a completed KV phase is in place."""
        return bool(self._done[KV]) and len(self._done[KV]) == len(self._steps[KV])

    @property
    def kv_pending(self) -> KVHandoff | None:
        """The generation built by ``prepare_kv_cache()`` and not yet committed or aborted."""
        return None if self._pending is None else self._pending.handoff

    def completed(self, phase: str) -> list[str]:
        """Stage names completed (and not torn down) in ``phase``, in order."""
        return [step.name for step, _out in self._done[phase]]

    def critical_path(self) -> list[tuple[str, float]]:
        """The longest chain of stages weighted by their latest durations."""
        return critical_path(self.pipeline.graph, self.trace.durations())

    def blame(self) -> list[tuple[str, float]]:
        """Stages by their latest duration, longest first."""
        return blame(self.trace.durations())

    # -- phases --------------------------------------------------------------------------
    def load(self, **inputs: Any) -> Mapping[str, Any]:
        """Run every "needs model" stage, in order.

        Args:
            **inputs: the model phase's declared inputs (for vLLM: ``model``).

        Returns:
            The outputs mapping.

        Raises:
            PhaseOrderError: already loaded, or the run is closed.
            InputsError: missing or unknown inputs.
            StageError: a stage raised; the phase was rolled back and may be retried. The
                error is also an instance of the stage's exception type where Python
                allows (``except ValueError`` catches it; see ``StageError.subclass_for``).
        """
        with self._lock:
            self._check_open("load()")
            if self.state == "loaded":
                msg = (
                    "load() was already called on this run; model-phase outputs are "
                    "reused. Call close() and pipeline.start() for a new run."
                )
                raise PhaseOrderError(msg)
            values = bind_inputs(MODEL, "load()", self.pipeline.inputs[MODEL], inputs)
            self._run_phase(MODEL, values, 0)
            self.state = "loaded"
            return self.outputs

    def initialize_kv_cache(
        self, kv_cache_config: Any = REQUIRED, /, **inputs: Any
    ) -> Mapping[str, Any]:
        """Run every "needs kv_cache_config" stage, tearing down a previous KV phase first.

        Args:
            kv_cache_config: the KV cache config (the ``kv_cache_config`` input).
            **inputs: the other declared KV-phase inputs (e.g. ``is_profiling``).

        Returns:
            The outputs mapping.

        Raises:
            PhaseOrderError: load() has not run, or the run is closed.
            InputsError: missing or unknown inputs.
            TeardownError: tearing down the previous KV phase failed (its outputs are gone
                anyway; the new phase did not start).
            StageError: a stage raised; the phase was rolled back and may be retried. The
                error is also an instance of the stage's exception type where Python
                allows (``except ValueError`` catches it; see ``StageError.subclass_for``).
        """
        with self._lock:
            values = self._kv_values("initialize_kv_cache()", kv_cache_config, inputs)
            self._teardown_phase(KV)
            self.kv_generation += 1
            self._run_phase(KV, values, self.kv_generation)
            return self.outputs

    def prepare_kv_cache(self, kv_cache_config: Any = REQUIRED, /, **inputs: Any) -> KVHandoff:
        """Build KV generation N+1 while generation N stays in place; end it with
        :meth:`commit_kv_cache` or :meth:`abort_kv_cache`.

        Peak memory is both generations at once (:meth:`KVHandoff.peak_bytes`); where that
        does not fit, use :meth:`initialize_kv_cache`, which frees N first.

        Args:
            kv_cache_config: the KV cache config of N+1 (the ``kv_cache_config`` input).
            **inputs: the other declared KV-phase inputs.

        Returns:
            The handoff: N's and N+1's outputs, readable until the commit or abort.

        Raises:
            PhaseOrderError: load() has not run, the run is closed, or a generation is
                already prepared (commit or abort it first).
            InputsError: missing or unknown inputs.
            StageError: a stage of N+1 raised; N+1 was rolled back and N is intact.
        """
        with self._lock:
            values = self._kv_values("prepare_kv_cache()", kv_cache_config, inputs)
            kv_keys = {*self.pipeline.inputs[KV], *self._kv_outputs()}
            pending = {k: v for k, v in self._values.items() if k not in kv_keys}
            done: list[Done] = []
            previous = self.kv_generation if self.kv_ready else 0
            self.kv_generation += 1
            self._run_phase(KV, values, self.kv_generation, pending, done)
            handoff = KVHandoff(
                previous=previous,
                generation=self.kv_generation,
                previous_outputs=self._kv_view(self._values),
                outputs=self._kv_view(pending),
            )
            self._pending = _Pending(handoff, pending, done)
            return handoff

    def commit_kv_cache(self) -> Mapping[str, Any]:
        """Make the prepared generation N+1 the run's KV phase: N is torn down (reverse
        order, each teardown once), then N+1's outputs are the run's.

        Returns:
            The outputs mapping (now N+1's).

        Raises:
            PhaseOrderError: no generation is prepared (call prepare_kv_cache() first).
            TeardownError: some of N's teardowns raised (all ran; N+1 is in place anyway).
        """
        with self._lock:
            pending = self._take_pending("commit_kv_cache()")
            try:
                self._teardown_phase(KV, generation=pending.handoff.previous)
            finally:
                self._values = pending.values
                self._done[KV] = pending.done
            return self.outputs

    def abort_kv_cache(self) -> None:
        """Drop the prepared generation N+1 (its teardowns in reverse order); N stays.

        Raises:
            PhaseOrderError: no generation is prepared (call prepare_kv_cache() first).
            TeardownError: some of N+1's teardowns raised (all ran; N is intact).
        """
        with self._lock:
            self._abort_pending(self._take_pending("abort_kv_cache()"))

    def teardown_kv_cache(self) -> None:
        """Undo the KV phase (reverse order, each teardown once); model outputs stay.

        Raises:
            TeardownError: some teardowns raised (all ran; the outputs are gone).
        """
        with self._lock:
            self._check_no_pending("teardown_kv_cache()")
            self._teardown_phase(KV)

    def close(self) -> None:
        """Tear everything down (KV phase, then model phase). Idempotent.

        Raises:
            TeardownError: some teardowns raised (all ran).
        """
        with self._lock:
            if self.state == "closed":
                return
            errors: list[tuple[str, BaseException]] = []
            if self._pending is not None:  # the newest generation first
                try:
                    self._abort_pending(self._take_pending("close()"))
                except TeardownError as err:
                    errors.extend(err.failures)
            for phase in (KV, MODEL):
                try:
                    self._teardown_phase(phase)
                except TeardownError as err:
                    errors.extend(err.failures)
            self.state = "closed"
            if errors:
                raise TeardownError(errors)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------
    def _check_open(self, call: str) -> None:
        if self.state == "closed":
            raise PhaseOrderError(
                f"{call} called on a closed run; call pipeline.start() for a new one."
            )

    def _check_no_pending(self, call: str) -> None:
        if self._pending is not None:
            gen = self._pending.handoff.generation
            raise PhaseOrderError(
                f"KV generation {gen} is prepared: call commit_kv_cache() or "
                f"abort_kv_cache() before {call}."
            )

    def _kv_values(self, call: str, kv_cache_config: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        """The checks every KV call makes, and its bound inputs."""
        self._check_open(call)
        if self.state != "loaded":
            raise PhaseOrderError(
                f"load() must be called before {call}: the KV phase reads model-phase outputs."
            )
        self._check_no_pending(call)
        if kv_cache_config is not REQUIRED:
            if "kv_cache_config" in inputs:
                raise InputsError(KV, call, [], ["kv_cache_config"], list(self.pipeline.inputs[KV]))
            inputs["kv_cache_config"] = kv_cache_config
        return bind_inputs(KV, call, self.pipeline.inputs[KV], inputs)

    def _kv_outputs(self) -> list[str]:
        return [k for step in self._steps[KV] for k in step.provides]

    def _kv_view(self, values: Mapping[str, Any]) -> Mapping[str, Any]:
        return MappingProxyType({k: values[k] for k in self._kv_outputs() if k in values})

    def _take_pending(self, call: str) -> _Pending:
        self._check_open(call)
        pending = self._pending
        if pending is None:
            raise PhaseOrderError(
                f"prepare_kv_cache() must be called before {call}: no KV generation is prepared."
            )
        self._pending = None
        return pending

    def _abort_pending(self, pending: _Pending) -> None:
        self._teardown_phase(KV, pending.done, pending.values, pending.handoff.generation)

    def _listener(self) -> Callable[[], None] | None:
        """A callback handing the latest trace event to every listener (None: none)."""
        if not self._listeners:
            return None
        trace, listeners = self.trace, self._listeners

        def emit() -> None:
            ev = trace.last()
            for fn in listeners:
                fn(ev)

        return emit

    def _run_phase(
        self,
        phase: Phase,
        values: dict[str, Any],
        generation: int,
        into: dict[str, Any] | None = None,
        done: list[Done] | None = None,
    ) -> None:
        """Run ``phase`` with ``values`` added to ``into`` (the run's values unless given),
        completed stages going to ``done`` (the phase's unless given)."""
        into = self._values if into is None else into
        done = self._done[phase] if done is None else done
        into.update(values)
        try:
            run_steps(
                self._steps[phase],
                into,
                done,
                self.trace._records,  # the hot loop appends to the trace's own deque
                generation,
                self._listener(),
            )
        except Failed as failed:
            completed = [step.name for step, _out in done]
            rolled: list[str]
            td_err: TeardownError | None
            try:
                rolled, td_err = self._teardown_phase(phase, done, into, generation), None
            except TeardownError as teardown_err:
                rolled, td_err = completed[::-1], teardown_err
            if not isinstance(failed.error, Exception):
                raise failed.error from None  # KeyboardInterrupt etc.: rolled back, re-raised
            spec = failed.step.spec
            cls = StageError.subclass_for(type(failed.error))
            raise cls(
                spec.name, spec.qualname, phase, completed, rolled, failed.error, td_err
            ) from failed.error
        # The phase completed: release the inputs that no later phase reads and no
        # teardown names; the kept ones go when the phase is torn down.
        kept = self.pipeline.kept_inputs[phase]
        for k in values:
            if k not in kept:
                del into[k]

    def _teardown_phase(
        self,
        phase: str,
        done: list[Done] | None = None,
        values: dict[str, Any] | None = None,
        generation: int | None = None,
    ) -> list[str]:
        """Tear down ``done`` (the phase's unless given) newest first, popping its outputs
        and the phase's inputs from ``values`` (the run's unless given); the trace records
        ``generation`` (the current one unless given)."""
        done = self._done[phase] if done is None else done
        values = self._values if values is None else values
        if generation is None:
            generation = self.kv_generation if phase == KV else 0
        failures: list[tuple[str, BaseException]] = []
        ran: list[str] = []
        listener = self._listener()
        while done:
            step, out = done.pop()
            spec = step.spec
            if spec.teardown is not None:
                t0 = perf_counter()
                outcome: Outcome = "ok"
                err_s: str | None = None
                try:
                    spec.teardown(out, *[values[k] for k in spec.teardown_inputs])
                except Exception as err:  # every teardown runs; one error reports them all
                    failures.append((spec.name, err))
                    outcome, err_s = "error", error_text(err)
                t1 = perf_counter()
                self.trace.record(
                    spec.name,
                    phase,
                    TEARDOWN,
                    t0,
                    t1,
                    outcome,
                    generation,
                    err_s,
                )
                if listener is not None:
                    listener()
            for k in spec.provides:
                values.pop(k, None)
            ran.append(spec.name)
        for k in self.pipeline.inputs[phase]:
            values.pop(k, None)
        if failures:
            raise TeardownError(failures)
        return ran

    def _why_missing(self, key: str) -> str:
        p = self.pipeline
        if key in p.producers_by_stage:
            spec = p.specs[p.producers_by_stage[key]]
            call = "run.load(...)" if spec.needs == MODEL else "run.initialize_kv_cache(...)"
            if self.state == "closed":
                return (
                    f"output {key!r} of stage {spec.name!r} was torn down: the run is "
                    f"closed. Start a new run with pipeline.start()."
                )
            return (
                f"output {key!r} of stage {spec.name!r} ({spec.needs} phase) is not "
                f"available: the phase has not run, failed, or was torn down. "
                f"Call {call} first."
            )
        for phase, keys in p.inputs.items():
            if key in keys:
                return f"{key!r} is an input of the {phase!r} phase, not a stage output."
        close = difflib.get_close_matches(key, list(p.producers_by_stage), n=3)
        hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
        return f"no stage provides {key!r}.{hint}"
