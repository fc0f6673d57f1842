"""The one pipelined-runner mixin, the runner lifecycle it checks, and the adapters as data.

What belongs here: everything the pipelined runners share, whichever vLLM model runner they
extend (v1's in :mod:`.runner`, Model Runner V2's in :mod:`.runner_v2`):

- :class:`RunnerAdapter` — what differs between runners, as data: how to read the runner's
  inputs and write the stage outputs back (table-driven, :class:`Write`), the catalog, the
  classes a pipelined class is built over, the names used in messages. One adapter per
  ``(runner, release)``; :func:`runner_adapter` looks it up, :func:`which_runner` answers
  "which runner" for a config, a worker or a runner (the only place that decides it);
- the lifecycle: ``new`` (no weights) -> ``weights`` -> ``model`` (model phase done) ->
  ``kv`` (a KV cache in place) -> ``released`` (torn down; the model phase stays), and
  ``closed`` after ``shutdown()``. :data:`ENTRY_STATES` says where each entry point runs;
  anywhere else it is refused with a :class:`~initpipe.PhaseOrderError` naming the call to
  make first, as the core's :class:`~initpipe.Run` does. A later refit is one more state
  and a row of that table;
- :class:`PipelineHost` — the mixin: construction, the KV phase, the zeroer call, the KV
  release a live resize drives, shutdown, the failure report; the class factory
  (:func:`pipelined_class`) and the resolver of the stable names (:func:`resolve_class`).

A new runner (or a release whose adapter differs) is one module defining a
:class:`RunnerAdapter` and a mixin subclass of :class:`PipelineHost` naming it: the
subclass registers itself. vLLM is imported lazily (the classes are built on first use).
"""

from __future__ import annotations

import functools
import gc
import importlib
import inspect
import os
import threading
from collections import ChainMap
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Literal

import attrs

from initpipe import KV, PhaseOrderError, Pipeline, Run, StageError
from initpipe.testing import ENV_FAULT, inject_faults_from_env

from .. import releases
from ..contract.declare import Capability, vllm_uses
from ..errors import UnsupportedRunnerError
from ..vllm_names import MRV2_RUNNER as _V2, V1_RUNNER as _V1
from .progress import log_phase, phase_spans

__all__ = [
    "DEFAULT_RELEASE",
    "ENTRY_STATES",
    "HOST_USES",
    "TRACE_MAX_RECORDS",
    "Labels",
    "PipelineHost",
    "RunnerAdapter",
    "RunnerState",
    "Write",
    "engine_inputs",
    "has_runner_choice",
    "installed_adapter",
    "owned",
    "pipelined_class",
    "read_attrs",
    "resolve_class",
    "runner_adapter",
    "runner_adapters",
    "start_run",
    "which_runner",
    "write_outputs",
]

#: The vLLM release an adapter is looked up for when none is named (what runs is the
#: contract's answer: :func:`installed_adapter`).
DEFAULT_RELEASE = releases.DEFAULT_RELEASE
#: The modules defining the adapters (imported on the first lookup; each registers its own).
ADAPTER_MODULES = ("initpipe_vllm.hook.runner", "initpipe_vllm.hook.runner_v2")
#: How many trace events a pipelined runner keeps (about 900 KV re-inits of the catalog).
TRACE_MAX_RECORDS = 20_000

_VLLM_CONFIG = "vllm.config.vllm:VllmConfig"
#: A sentinel: an attribute the subject does not have.
_ABSENT = object()


# -- the adapter: what differs between runners, as data ------------------------------------
@attrs.frozen
class Write:
    """One runner attribute the adapter writes from a stage output.

    Attributes:
        attr: the runner attribute.
        source: the output (``"name"``, or ``"name.field"`` for a field of it); None: the
            attribute is set to None.
        how: ``"set"``; ``"if_built"`` (set only when the output is not None: stock keeps
            the previous value otherwise); ``"update"`` (``attr.update(value)``); ``"fill"``
            (``attr[:] = value``, the list object kept); ``"list"`` (set to a list copy).
    """

    attr: str
    source: str | None
    how: Literal["set", "if_built", "update", "fill", "list"] = "set"


def write_outputs(runner: Any, writes: tuple[Write, ...], *outputs: Mapping[str, Any]) -> None:
    """Apply ``writes`` to ``runner``, reading each source from the first of ``outputs``."""
    found: ChainMap[str, Any] = ChainMap(*outputs)  # type: ignore[arg-type]
    for w in writes:
        value: Any = None
        if w.source is not None:
            name, _, field = w.source.partition(".")
            value = found[name] if not field else getattr(found[name], field)
        if w.how == "if_built" and value is None:
            continue
        if w.how == "update":
            getattr(runner, w.attr).update(value)
        elif w.how == "fill":
            getattr(runner, w.attr)[:] = value
        else:
            setattr(runner, w.attr, list(value) if w.how == "list" else value)


def attr_names(owner: str, *writes: tuple[Write, ...]) -> tuple[str, ...]:
    """The vLLM names (``owner.attr``) that ``writes`` assign: their declaration."""
    return tuple(dict.fromkeys(f"{owner}.{w.attr}" for ws in writes for w in ws))


#: The runner methods :class:`PipelineHost` replaces (``mirrors``) and the runner names it
#: calls or reads (``calls``), whichever runner: each adapter declares them on its own
#: runner class (:func:`host_uses`), with what its runner adds.
HOST_USES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "mirrors": ("initialize_kv_cache", "_init_kv_zero_meta", "shutdown"),
        "calls": ("__init__", "attn_groups", "kv_caches"),
    }
)


def engine_inputs(
    kv_cache_config: Any, is_profiling: bool = False, kv_cache_allocation_context: Any = None
) -> dict[str, Any]:
    """The KV-phase inputs the engine gives ``initialize_kv_cache``, by input name."""
    return {
        "kv_cache_config": kv_cache_config,
        "is_profiling": is_profiling,
        "kv_cache_allocation_context": kv_cache_allocation_context,
    }


def read_attrs(
    runner: Any, names: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The runner attributes ``names`` (and ``optional``: None where absent), by name."""
    found = {name: getattr(runner, name) for name in names}
    return found | {name: getattr(runner, name, None) for name in optional}


def owned(owner: str, names: tuple[str, ...]) -> tuple[str, ...]:
    """``owner.name`` for each of ``names``: their vLLM names, for a declaration."""
    return tuple(f"{owner}.{name}" for name in names)


def host_uses(runner: str, kind: str, *more: str) -> tuple[str, ...]:
    """The declaration of :data:`HOST_USES` ``kind`` on the vLLM class ``runner``, and ``more``."""
    return (*owned(runner, HOST_USES[kind]), *more)


@attrs.frozen
class Labels:
    """A runner in words: in a log line, in a contract refusal, in ``initpipe plan``."""

    log: str
    catalog: str
    plan: str


#: Where a pipelined runner stands (:attr:`PipelineHost.initpipe_state`).
RunnerState = Literal["new", "weights", "model", "kv", "released", "closed"]

#: The states each entry point runs in; in any other it is refused, naming the call to make
#: first. An adapter whose model phase runs lazily (v1) lets ``initialize_kv_cache()`` run
#: from ``weights`` too (:attr:`RunnerAdapter.entry_states`).
ENTRY_STATES: Mapping[str, frozenset[RunnerState]] = MappingProxyType(
    {
        "load_model()": frozenset({"new", "weights", "model", "released"}),
        "get_kv_cache_spec()": frozenset({"weights", "model", "kv", "released"}),
        "initialize_kv_cache()": frozenset({"model", "released"}),
        "_init_kv_zero_meta()": frozenset({"kv"}),
    }
)

#: What each entry point reads from the step before it (the end of its refusal).
_READS = {
    "get_kv_cache_spec()": "it reads the loaded model's layers",
    "initialize_kv_cache()": "the KV phase reads the model phase's outputs",
}


@attrs.frozen(kw_only=True, eq=False)
class RunnerAdapter:
    """What one vLLM model runner of one release needs of the shared mixin, as data.

    Attributes:
        runner: ``"v1"`` or ``"v2"`` (Model Runner V2).
        release: the vLLM release (``"0.32.0"``).
        capability: the contract capability of its catalog (``initpipe doctor``).
        labels: the runner in words (:class:`Labels`).
        stock_runner: ``module:qualname`` of vLLM's class every runner of it extends.
        catalog: ``module:factory`` of the default pipeline, called with ``release=`` the
            adapter's release.
        classes: the stable pipelined class names -> ``module:qualname`` of their base.
        class_suffix: appended to ``Pipelined<Base>`` for a base not in ``classes``.
        start_inputs: ``(runner) -> inputs`` of ``pipeline.start``.
        kv_inputs: ``(runner, kv_cache_config, is_profiling, kv_cache_allocation_context)``
            -> inputs of the KV phase.
        apply_kv: ``(runner, outputs)``: write a completed KV phase onto the runner.
        clear_kv: ``(runner)``: drop the runner's KV attributes as stock's cleanup does.
        engine_kv_cache_config: ``(runner) -> KVCacheConfig``: the engine's config again.
        release_cuda_graphs: ``(runner) -> int``: drop every captured graph.
        teardown: the call that tears a KV phase down (named in refusals) and why.
        close_first: whether ``shutdown()`` closes the run before vLLM's shutdown.
        entry_states: :data:`ENTRY_STATES` for this runner.
    """

    runner: str
    capability: Capability
    labels: Labels
    stock_runner: str
    catalog: str
    classes: Mapping[str, str]
    class_suffix: str = ""
    start_inputs: Callable[[Any], dict[str, Any]]
    kv_inputs: Callable[..., dict[str, Any]]
    apply_kv: Callable[[Any, Mapping[str, Any]], None]
    clear_kv: Callable[[Any], None]
    engine_kv_cache_config: Callable[[Any], Any]
    release_cuda_graphs: Callable[[Any], int]
    teardown: tuple[str, str]
    close_first: bool
    entry_states: Mapping[str, frozenset[RunnerState]] = ENTRY_STATES
    release: str = DEFAULT_RELEASE

    def pipeline(self) -> Pipeline:
        """The default pipeline: :attr:`catalog` built for this adapter's release."""
        module, _, factory = self.catalog.partition(":")
        built: Pipeline = getattr(importlib.import_module(module), factory)(release=self.release)
        return built

    def refusal(self, entry: str, state: RunnerState, kv_generation: int) -> str:
        """Why ``entry`` cannot run in ``state``, and the call to make first."""
        call, why = self.teardown
        if state == "closed":
            return (
                f"{entry} called after shutdown(): this runner's pipeline run is closed; "
                "build a new runner."
            )
        if state == "kv":
            return (
                f"{entry} called while a KV cache is in place (generation {kv_generation}). "
                "Re-initializing under a live engine would leave the scheduler's block pool, "
                f"captured CUDA graphs and KV connectors describing the old cache. Call {call} "
                f"first ({why}), or resize through the engine."
            )
        if entry == "_init_kv_zero_meta()":
            return f"{entry} needs a KV cache in place; call initialize_kv_cache() first."
        return f"load_model() must be called before {entry}: {_READS[entry]}."


#: (runner, release) -> the mixin naming that adapter (registered by its definition).
_MIXINS: dict[tuple[str, str], type[PipelineHost]] = {}


def _registry() -> dict[tuple[str, str], type[PipelineHost]]:
    for module in ADAPTER_MODULES:
        importlib.import_module(module)
    return _MIXINS


def runner_adapters(release: str = DEFAULT_RELEASE) -> tuple[RunnerAdapter, ...]:
    """Every runner's adapter for ``release``."""
    found = [m.initpipe_adapter for (_, rel), m in _registry().items() if rel == release]
    return tuple(sorted(found, key=lambda a: a.runner))


def runner_adapter(runner: str, release: str = DEFAULT_RELEASE) -> RunnerAdapter:
    """The adapter of ``runner`` (``"v1"``, ``"v2"``) on vLLM ``release``.

    Raises:
        UnsupportedRunnerError: no adapter for that pair (the known ones are named).
    """
    mixin = _registry().get((runner, release))
    if mixin is None:
        known = ", ".join(f"{r!r} on {rel}" for r, rel in _MIXINS)
        raise UnsupportedRunnerError(
            f"no pipelined runner adapter for runner {runner!r} on vLLM {release}; "
            f"adapters exist for {known}."
        )
    return mixin.initpipe_adapter


def installed_adapter(runner: str) -> RunnerAdapter:
    """``runner``'s adapter for the release the installed vLLM matched (the contract's
    answer for its catalog, :func:`~..contract.report.installed_release`); a vLLM that no
    lock matches gets :data:`DEFAULT_RELEASE`'s (the workers refuse it by name before they
    build a runner: :func:`~.worker.refuse_unsupported`).

    Raises:
        UnsupportedRunnerError: no adapter for ``runner``.
    """
    from ..contract.report import installed_release, missing_runner

    default = runner_adapter(runner)
    try:
        release = installed_release(default.capability)
    except UnsupportedRunnerError:
        missing = missing_runner(default.capability)
        if missing is not None:  # no such runner in this vLLM (v1 on 0.34.0): no default
            raise UnsupportedRunnerError(missing) from None
        return default
    return runner_adapter(runner, release)


@vllm_uses(
    ("catalog_v1", "catalog_mrv2"), calls=(f"{_VLLM_CONFIG}.use_v2_model_runner",), runner="v1"
)
def which_runner(subject: Any, release: str = DEFAULT_RELEASE) -> RunnerAdapter:
    """Which vLLM model runner ``subject`` is or will build: its adapter.

    The one answer to "v1 or Model Runner V2": for a pipelined runner (or class), its
    adapter; for a stock runner, the adapter whose vLLM class it extends; for a
    ``VllmConfig`` or a worker, vLLM's own decision, ``use_v2_model_runner`` (HiSparse,
    for which vLLM refuses v1 itself, answers Model Runner V2). A vLLM without that
    attribute has no v1 runner to choose (0.34.0 removed it): Model Runner V2.
    """
    cls = subject if isinstance(subject, type) else type(subject)
    adapter = getattr(cls, "initpipe_adapter", None)
    if isinstance(adapter, RunnerAdapter):
        return adapter
    names = {f"{c.__module__}:{c.__qualname__}" for c in cls.__mro__}
    for adapter in runner_adapters(release):
        if adapter.stock_runner in names:
            return adapter
    if not has_runner_choice(subject):
        return runner_adapter("v2", release)  # this vLLM has no runner choice: MRv2 only
    try:
        v2 = bool(subject.use_v2_model_runner)
    except ValueError:  # HiSparse: vLLM refuses v1 for it itself
        v2 = True
    return runner_adapter("v2" if v2 else "v1", release)


def has_runner_choice(subject: Any) -> bool:
    """Whether ``subject`` (a ``VllmConfig`` or a worker) has vLLM's ``use_v2_model_runner``
    to read: vLLM 0.34.0 removed it with Model Runner V1. Looked up statically, so an error
    inside vLLM's own property is not taken for its absence."""
    return inspect.getattr_static(subject, "use_v2_model_runner", _ABSENT) is not _ABSENT


# -- the class factory and the resolver of the stable names --------------------------------
def pipelined_class(adapter: RunnerAdapter, base: type | None = None) -> type:
    """``Pipelined<Base>``: ``adapter``'s mixin over ``base`` (default: the platform's
    class of that runner). Built once per pair; its ``__module__`` is
    ``initpipe_vllm.runner``, where pickling and vLLM's qualname lookups resolve it."""
    mixin: Any = _registry()[adapter.runner, adapter.release]
    return _pipelined(mixin, base or mixin.initpipe_platform_class())


@functools.cache
def _pipelined(mixin: Any, base: type) -> type:
    adapter: RunnerAdapter = mixin.initpipe_adapter  # type: ignore[attr-defined]
    names = {v.rpartition(":")[2]: k for k, v in adapter.classes.items()}
    name = names.get(base.__name__, f"Pipelined{base.__name__}{adapter.class_suffix}")
    return type(name, (mixin, base), {"__module__": "initpipe_vllm.runner", "__qualname__": name})


def resolve_class(name: str, release: str | None = None) -> type | None:
    """The pipelined class with the stable name ``name``, built on demand (None: not one),
    for vLLM ``release`` (None: the installed vLLM's, :func:`installed_adapter`): a class
    unpickled or looked up by name in a worker process is that release's."""
    for adapter in runner_adapters(DEFAULT_RELEASE):
        if name in adapter.classes:
            if release is None:
                adapter = installed_adapter(adapter.runner)
            elif release != adapter.release:
                adapter = runner_adapter(adapter.runner, release)
            module, _, qualname = adapter.classes[name].partition(":")
            return pipelined_class(adapter, getattr(importlib.import_module(module), qualname))
    return None


def start_run(pipeline: Pipeline, runner: Any, inputs: Mapping[str, Any]) -> Run:
    """Start ``pipeline`` for a pipelined runner (either runner version): its per-stage log
    lines until the worker's start-up is over (naming the rank when there are several; see
    :meth:`PipelineHost.initpipe_startup_done`), its trace, and the faults a test asked
    for through ``INITPIPE_FAULT`` (spawned worker processes)."""
    from .progress import listeners, stage_line

    line = None if runner._initpipe_started else stage_line(runner._initpipe_rank())
    runner._initpipe_stage_line = line  # kept: initpipe_startup_done() removes it
    run = pipeline.start(
        listeners=[*([line] if line is not None else []), *listeners(stage_lines=False)],
        trace=runner.initpipe_trace,
        **inputs,
    )
    if os.environ.get(ENV_FAULT):
        inject_faults_from_env(run)
    return run


# -- the one mixin ---------------------------------------------------------------------------
class PipelineHost:
    """Put (through a runner's subclass naming its adapter) before vLLM's runner class: its
    initialization runs as initpipe pipelines.

    Attributes:
        initpipe_adapter: the runner's :class:`RunnerAdapter` (a class attribute).
        initpipe_pipeline: the Pipeline used (the adapter's catalog unless one is given).
        initpipe_run: the current Run.
        initpipe_trace: the Trace of every stage run and teardown, and of the vLLM steps
            around them (the worker records those as spans); it outlives re-created runs.

    The KV lifecycle a live resize drives (:mod:`initpipe_vllm.live.core.rank` calls only
    these): :meth:`initpipe_requests`, :meth:`initpipe_kv_in_place`,
    :meth:`initpipe_release_cuda_graphs` (before the teardown: graphs hold the old KV
    addresses) and :meth:`initpipe_release_kv_cache`. Re-initializing is vLLM's own
    ``Worker.initialize_from_config`` (which calls :meth:`initialize_kv_cache`).
    """

    initpipe_adapter: ClassVar[RunnerAdapter]
    #: which vLLM model runner this is: ``"v1"`` or ``"v2"`` (the adapter's ``runner``)
    initpipe_runner_version: ClassVar[str]
    initpipe_default_pipeline: Pipeline | None = None
    initpipe_pipeline: Pipeline
    initpipe_run: Run
    initpipe_trace: Any
    #: whether the worker's start-up is over (:meth:`initpipe_startup_done`)
    _initpipe_started = False
    #: the current run's per-stage log line listener (None when there is none)
    _initpipe_stage_line: Any = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        adapter = cls.__dict__.get("initpipe_adapter")
        if adapter is not None:  # a runner's mixin: registered under (runner, release)
            cls.initpipe_runner_version = adapter.runner
            _MIXINS[adapter.runner, adapter.release] = cls

    @staticmethod
    def initpipe_platform_class() -> type:
        """vLLM's class of this runner that the current platform's stock worker builds."""
        raise NotImplementedError

    def __init__(self, vllm_config: Any, device: Any, *, pipeline: Pipeline | None = None) -> None:
        super().__init__(vllm_config, device)  # type: ignore[call-arg]
        from initpipe import Trace

        if pipeline is None:
            pipeline = type(self).initpipe_default_pipeline or self.initpipe_adapter.pipeline()
        self.initpipe_pipeline = pipeline
        # Bounded: a long-lived runner that re-runs its KV phase keeps the latest events.
        self.initpipe_trace = Trace(max_records=TRACE_MAX_RECORDS)
        self._initpipe_lock = threading.RLock()
        self.initpipe_run = self._initpipe_start()

    def _initpipe_start(self) -> Run:
        return start_run(self.initpipe_pipeline, self, self.initpipe_adapter.start_inputs(self))

    def _initpipe_restart(self) -> Run:
        """Close the run and start a new one (the model phase runs again on it)."""
        self.initpipe_run.close()
        self.initpipe_run = self._initpipe_start()
        return self.initpipe_run

    # the lifecycle -----------------------------------------------------------------------
    @property
    def initpipe_state(self) -> RunnerState:
        """Where this runner stands (:data:`RunnerState`), read from its run and its KV."""
        run = self.initpipe_run
        if run.state == "closed":
            return "closed"
        if run.kv_ready or getattr(self, "attn_groups", None) or getattr(self, "kv_caches", None):
            return "kv"
        if run.state == "loaded":
            return "released" if run.kv_generation else "model"
        return "weights" if getattr(self, "model", None) is not None else "new"

    def _initpipe_require(self, entry: str) -> RunnerState:
        """Refuse ``entry`` outside the states it runs in, naming the call to make first."""
        state = self.initpipe_state
        adapter = self.initpipe_adapter
        if state not in adapter.entry_states[entry]:
            raise PhaseOrderError(adapter.refusal(entry, state, self.initpipe_run.kv_generation))
        return state

    def _initpipe_phase(self, phase: Callable[..., Mapping[str, Any]], **inputs: Any) -> Any:
        """Run a phase of the current run; a failed stage is reported, then raised."""
        try:
            return phase(**inputs)
        except StageError as err:
            self._initpipe_report(err)
            raise

    def _initpipe_model_outputs(self) -> Mapping[str, Any]:
        """The completed model phase's outputs (v1 runs it here, on first need)."""
        return self.initpipe_run.outputs

    # the KV phase --------------------------------------------------------------------------
    def initialize_kv_cache(
        self,
        kv_cache_config: Any,
        is_profiling: bool = False,
        kv_cache_allocation_context: Any = None,
    ) -> None:
        """Run the KV phase (refused while one is in place, as stock refuses it)."""
        with self._initpipe_lock:
            self._initpipe_require("initialize_kv_cache()")
            self._initpipe_model_outputs()
            adapter = self.initpipe_adapter
            inputs = adapter.kv_inputs(
                self, kv_cache_config, is_profiling, kv_cache_allocation_context
            )
            run = self.initpipe_run
            adapter.apply_kv(self, self._initpipe_phase(run.initialize_kv_cache, **inputs))
            log_phase(run, KV, self._initpipe_rank())

    def _init_kv_zero_meta(self) -> None:
        """The worker's call after ``initialize_kv_cache``: the ``kv_block_zeroer`` stage
        built the zeroer already (or the config needs none), so build no second one.

        Only if that stage did not build one while the config asks for it (a KV phase run
        with ``is_profiling=True``, then this call) does vLLM's own method build it, over
        the same live tensors; the KV teardown drops it either way.
        """
        with self._initpipe_lock:
            self._initpipe_require("_init_kv_zero_meta()")
            if self.initpipe_run.outputs["kv_block_zeroer"] is None:
                super()._init_kv_zero_meta()  # type: ignore[misc]

    def _initpipe_release_kv(self) -> None:
        with self._initpipe_lock:
            # The runner lets go first, so the allocation's teardown can return the memory.
            self.initpipe_adapter.clear_kv(self)
            if self.initpipe_run.state != "closed":
                self.initpipe_run.teardown_kv_cache()
                phase_spans(self.initpipe_run.trace, KV, self._initpipe_rank())

    def _initpipe_flush(self, release: Callable[[], None]) -> None:
        """Synchronize, ``release``, then hand the freed memory back to the allocator."""
        import torch

        torch.accelerator.synchronize()
        release()
        gc.collect()
        torch.accelerator.empty_cache()

    # the KV lifecycle a live resize drives -------------------------------------------------
    def initpipe_requests(self) -> list[str]:
        """The ids of the requests this runner still holds state for, sorted."""
        raise NotImplementedError

    def initpipe_kv_in_place(self) -> bool:
        """Whether a KV cache, or part of one, is in place on this runner."""
        return bool(getattr(self, "kv_caches", None)) or self.initpipe_run.kv_ready

    def initpipe_release_cuda_graphs(self) -> int:
        """Drop every captured CUDA graph; return how many graph owners held graphs."""
        return self.initpipe_adapter.release_cuda_graphs(self)

    def initpipe_release_kv_cache(self) -> None:
        """Tear the KV phase down (reverse teardowns) and let go of the runner's KV
        attributes, as vLLM's own cleanup leaves the runner."""
        self._initpipe_flush(self._initpipe_release_kv)

    def shutdown(self) -> None:
        """vLLM's shutdown and closing the run, in the adapter's order."""
        if self.initpipe_adapter.close_first:
            try:
                with self._initpipe_lock:
                    self.initpipe_run.close()
            finally:
                super().shutdown()  # type: ignore[misc]
            return
        try:
            super().shutdown()  # type: ignore[misc]
        finally:
            self.initpipe_run.close()

    # log lines, reports, spans -------------------------------------------------------------
    def initpipe_startup_done(self) -> None:
        """The worker's start-up is over (its first warm-up returned): from now on each
        phase logs one summary line, not one line per stage and teardown — a live
        resize's KV phase is one line (each costs about 50 µs). Idempotent."""
        self._initpipe_started = True
        line, self._initpipe_stage_line = self._initpipe_stage_line, None
        if line is not None:
            self.initpipe_run.remove_listener(line)

    def _initpipe_rank(self) -> int | None:
        """This worker's global rank when there are several (log lines name it), else None."""
        parallel = self.vllm_config.parallel_config  # type: ignore[attr-defined]
        return int(parallel.rank) if parallel.world_size > 1 else None

    def _initpipe_report(self, err: Any) -> None:
        """Log the failed stage and the completed ones, and write the failure trace."""
        from .progress import report_failure

        parallel = self.vllm_config.parallel_config  # type: ignore[attr-defined]
        report_failure(
            err,
            self.initpipe_trace,
            self.initpipe_pipeline.graph,
            parallel.rank,
            parallel.world_size,
        )

    @vllm_uses(("catalog_v1", "catalog_mrv2"), calls=(f"{_V1}.capture_model",), runner="v1")
    @vllm_uses(("catalog_v1", "catalog_mrv2"), calls=(f"{_V2}.capture_model",))
    def capture_model(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's CUDA-graph capture, recorded as a span of the trace."""
        with self.initpipe_trace.span("capture_model (graph capture)", phase="vllm"):
            return super().capture_model(*args, **kwargs)  # type: ignore[misc]
