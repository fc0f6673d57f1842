"""``Pipeline``: a validated, ordered set of stages with per-phase external inputs."""

from __future__ import annotations

import difflib
import importlib
import types
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs
import networkx as nx

from ._dispatch import Step
from ._extensions import apply_extensions, available, enabled_names, load_extension
from ._graph import START, collect_specs, edge_label, normalize_inputs, order_graph, validate
from ._run import Listener, Run, bind_inputs
from ._stage import KV, MODEL, PHASES, StageSpec, get_spec
from ._trace import Trace
from .errors import PipelineValidationError, StageDeclarationError, UnknownStageNameError

__all__ = ["Pipeline"]

InputDecl = Sequence[str] | Mapping[str, Any]


def module_inputs(module: types.ModuleType) -> dict[str, Any]:
    """The ``*_inputs`` arguments a module declares in ``INITPIPE_INPUTS`` (defaults:
    no start inputs, ``model``, ``kv_cache_config``)."""
    declared = getattr(module, "INITPIPE_INPUTS", None) or {}
    return {
        "start_inputs": declared.get(START, ()),
        "model_inputs": declared.get(MODEL, (MODEL,)),
        "kv_inputs": declared.get(KV, (KV,)),
    }


class Pipeline:
    """A validated DAG of stages, ordered by networkx, with per-phase external inputs.

    Immutable: the graph is frozen (``nx.freeze``), ``specs``, ``inputs``, ``kept_inputs``
    and ``producers_by_stage`` are read-only mappings, ``order`` returns a copy; derive
    variants with :meth:`replace`, :meth:`add`, :meth:`remove` and :meth:`with_extensions`.

    Args:
        stages: ``@stage`` functions (or StageSpecs), in any order.
        start_inputs: inputs given to :meth:`start` (for vLLM: ``vllm_config``, ``device``).
        model_inputs: inputs given to ``run.load()`` (default: ``model``).
        kv_inputs: inputs given to ``run.initialize_kv_cache()`` (default:
            ``kv_cache_config``). Each is a sequence of names (all required) or a mapping of
            name to default (:data:`initpipe.REQUIRED` for none).
        name: a label for messages and drawings.

    Raises:
        PipelineValidationError: listing every problem found (``.problems``).
    """

    def __init__(
        self,
        stages: Iterable[Any],
        *,
        start_inputs: InputDecl = (),
        model_inputs: InputDecl = (MODEL,),
        kv_inputs: InputDecl = (KV,),
        name: str = "pipeline",
    ) -> None:
        self._name = name
        inputs = {
            START: normalize_inputs(start_inputs),
            MODEL: normalize_inputs(model_inputs),
            KV: normalize_inputs(kv_inputs),
        }
        self._inputs: Mapping[str, Mapping[str, Any]] = MappingProxyType(
            {phase: MappingProxyType(declared) for phase, declared in inputs.items()}
        )
        specs, problems = collect_specs(stages)
        by_name, producers, graph, more = validate(specs, inputs)
        problems += more
        if problems:
            raise PipelineValidationError(problems)
        self._graph: nx.DiGraph[str] = nx.freeze(graph)
        self._order: tuple[str, ...] = tuple(order_graph(graph))
        self._specs: Mapping[str, StageSpec] = MappingProxyType(
            {n: by_name[n] for n in self._order}
        )
        self._producers: Mapping[str, str] = MappingProxyType(
            {k: v for k, v in producers.items() if not v.startswith("input:")}
        )
        # Dispatch-ready steps per phase, prepared once (runs share them; they are immutable).
        self._steps: Mapping[str, tuple[Step, ...]] = MappingProxyType(
            {
                phase: tuple(Step(self._specs[n]) for n in self.phase_order(phase))
                for phase in PHASES
            }
        )
        # What a run keeps of each phase's inputs once the phase completed: those a later
        # phase's stages read, and those a teardown of the phase names (it reads them when
        # the phase is torn down). Decided here, not on every run.
        needed = {MODEL: {k for step in self._steps[KV] for k in step.args}, KV: set[str]()}
        for phase in PHASES:
            needed[phase].update(k for st in self._steps[phase] for k in st.spec.teardown_inputs)
        self._kept_inputs: Mapping[str, tuple[str, ...]] = MappingProxyType(
            {phase: tuple(k for k in inputs[phase] if k in needed[phase]) for phase in PHASES}
        )

    # -- read-only state -----------------------------------------------------------------
    @property
    def name(self) -> str:
        """A label for messages and drawings."""
        return self._name

    @property
    def inputs(self) -> Mapping[str, Mapping[str, Any]]:
        """Declared external inputs per phase (``start``, ``model``, ``kv_cache_config``):
        name -> default (:data:`initpipe.REQUIRED` for none)."""
        return self._inputs

    @property
    def graph(self) -> nx.DiGraph[str]:
        """The frozen networkx graph: nodes are stage names (attribute ``spec``); an edge
        carries ``keys`` (data keys) and ``order`` (an ``after``/``before`` made it)."""
        return self._graph

    @property
    def order(self) -> list[str]:
        """Stage names in execution order (a copy)."""
        return list(self._order)

    @property
    def specs(self) -> Mapping[str, StageSpec]:
        """Stage specs by name, in execution order (read-only)."""
        return self._specs

    @property
    def producers_by_stage(self) -> Mapping[str, str]:
        """Output key -> name of the stage that provides it (read-only)."""
        return self._producers

    @property
    def steps(self) -> Mapping[str, tuple[Step, ...]]:
        """Dispatch-ready steps per phase, in order (what a :class:`Run` executes)."""
        return self._steps

    @property
    def kept_inputs(self) -> Mapping[str, tuple[str, ...]]:
        """Per phase (``model``, ``kv_cache_config``), the declared inputs a run keeps once
        the phase completed, until it is torn down: those a later phase's stages read and
        those a teardown of the phase names. A run releases the others at once."""
        return self._kept_inputs

    # -- construction --------------------------------------------------------------------
    @classmethod
    def from_module(cls, module: types.ModuleType | str, **kwargs: Any) -> Pipeline:
        """Build a pipeline from every stage that is an attribute of ``module``.

        Args:
            module: a module object or its dotted name.
            **kwargs: as for :class:`Pipeline`; when no ``*_inputs`` are given, the module's
                ``INITPIPE_INPUTS = {"start": ..., "model": ..., "kv_cache_config": ...}``
                is used if present.

        Raises:
            ImportError: the module cannot be imported.
            PipelineValidationError: see :class:`Pipeline`.
        """
        mod = importlib.import_module(module) if isinstance(module, str) else module
        stages = [v for v in vars(mod).values() if get_spec(v) is not None]
        if getattr(mod, "INITPIPE_INPUTS", None) and not any(k.endswith("_inputs") for k in kwargs):
            kwargs.update(module_inputs(mod))
        kwargs.setdefault("name", mod.__name__)
        return cls(stages, **kwargs)

    def _rebuild(self, stages: Iterable[Any]) -> Pipeline:
        return Pipeline(
            stages,
            start_inputs=self.inputs[START],
            model_inputs=self.inputs[MODEL],
            kv_inputs=self.inputs[KV],
            name=self.name,
        )

    def replace(self, name: str, new: Any, *, package: str | None = None) -> Pipeline:
        """Return a new pipeline where stage ``name`` is replaced by ``new``.

        The replacement keeps the stage's name and phase and must provide the same outputs;
        its inputs may differ (the whole graph is validated again).

        Raises:
            StageDeclarationError: ``new`` is not a stage, or provides other outputs/phase.
            KeyError-like InitpipeError: no stage called ``name`` (with suggestions).
            PipelineValidationError: the new graph is invalid.
        """
        old = self.stage(name)
        spec = _as_spec(new, package)
        if set(spec.provides) != set(old.provides) or spec.needs != old.needs:
            msg = (
                f"replacement {spec.qualname} for stage {name!r} must provide "
                f"{list(old.provides)} in phase {old.needs!r}; it provides "
                f"{list(spec.provides)} in phase {spec.needs!r}."
            )
            raise StageDeclarationError(msg, stage=spec.qualname, field="provides")
        spec = _evolve(spec, name=name, package=package)
        return self._rebuild([spec if n == name else s for n, s in self.specs.items()])

    def remove(self, *names: str) -> Pipeline:
        """Return a new pipeline without the stages ``names`` (validated once all are gone).

        Raises:
            UnknownStageNameError: no stage called one of ``names`` (with suggestions).
            PipelineValidationError: a remaining stage reads an output of a removed stage
                or is ordered against one (remove it too, or replace it first).
        """
        gone = {self.stage(name).name for name in names}
        return self._rebuild([s for n, s in self.specs.items() if n not in gone])

    def add(
        self,
        new: Any,
        *,
        after: str | Iterable[str] = (),
        before: str | Iterable[str] = (),
        package: str | None = None,
    ) -> Pipeline:
        """Return a new pipeline with stage ``new`` added (plus optional ordering edges).

        Raises:
            StageDeclarationError: ``new`` is not a stage.
            PipelineValidationError: the new graph is invalid (names ``package`` if given).
        """
        spec = _as_spec(new, package)
        extra_after = (after,) if isinstance(after, str) else tuple(after)
        extra_before = (before,) if isinstance(before, str) else tuple(before)
        spec = _evolve(
            spec, after=spec.after + extra_after, before=spec.before + extra_before, package=package
        )
        return self._rebuild([*self.specs.values(), spec])

    def with_extensions(self, names: Iterable[str] | str | None = None) -> Pipeline:
        """Return this pipeline with installed extensions (entry-point group
        ``initpipe.stages``) applied.

        Args:
            names: extension names, ``"all"``, or None to read ``INITPIPE_EXTENSIONS``
                (unset: no extension, the pipeline is returned as is).

        Raises:
            ExtensionError: an extension is unknown, fails to import, or breaks the graph
                (the error names the package).
        """
        wanted = enabled_names() if names is None else names
        if not wanted:
            return self
        eps = available()
        chosen = (
            sorted(eps)
            if wanted == "all"
            else [wanted]
            if isinstance(wanted, str)
            else list(wanted)
        )
        return apply_extensions(self, [load_extension(n, eps) for n in chosen])

    # -- inspection ----------------------------------------------------------------------
    def stage(self, name: str) -> StageSpec:
        """Return the spec of stage ``name``.

        Raises:
            UnknownStageNameError: no such stage (with close names).
        """
        try:
            return self.specs[name]
        except KeyError:
            close = difflib.get_close_matches(name, list(self.specs), n=3)
            hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
            msg = f"pipeline {self.name!r} has no stage {name!r}.{hint}"
            raise UnknownStageNameError(msg, name) from None

    def phase_order(self, phase: str) -> list[str]:
        """Stage names of ``phase`` (``model`` or ``kv_cache_config``) in execution order."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; use one of {PHASES}.")
        return [n for n, s in self.specs.items() if s.needs == phase]

    def edge_keys(self, a: str, b: str) -> str:
        """The data key(s) on edge a -> b, or ``after/before`` for an ordering edge."""
        return edge_label(self.graph, a, b)

    def __len__(self) -> int:
        return len(self.specs)

    def __repr__(self) -> str:
        counts = ", ".join(f"{p}: {len(self.phase_order(p))}" for p in PHASES)
        return f"<Pipeline {self.name!r} {len(self)} stages ({counts})>"

    # -- running -------------------------------------------------------------------------
    def start(
        self, *, listeners: Sequence[Listener] = (), trace: Trace | None = None, **inputs: Any
    ) -> Run:
        """Begin a run with the start-phase inputs.

        Args:
            listeners: callables receiving each TraceEvent (progress, logging).
            trace: record into this Trace (e.g. one shared with host spans or an earlier
                run) instead of a new one.
            **inputs: the declared start inputs.

        Raises:
            InputsError: missing or unknown inputs.
        """
        values = bind_inputs(START, "start()", self.inputs[START], inputs)
        return Run(self, values, tuple(listeners), trace)


def _as_spec(obj: Any, package: str | None) -> StageSpec:
    spec = get_spec(obj)
    if spec is None:
        who = f" (from package {package!r})" if package else ""
        raise StageDeclarationError(
            f"{obj!r}{who} is not a stage: decorate it with @stage(needs=...).",
            stage=repr(obj),
            field="func",
        )
    return spec


def _evolve(spec: StageSpec, **changes: Any) -> StageSpec:
    if changes.get("package") is None:
        changes.pop("package", None)
    return attrs.evolve(spec, **changes)
