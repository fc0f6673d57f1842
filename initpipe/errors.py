"""Every error initpipe raises, in one place.

Each class also subclasses the builtin it means, so ``except ValueError`` and friends keep
working. The facts in a message also ride on attributes that tests and tools can read.

    InitpipeError
    ├── StageDeclarationError (TypeError)      a bad ``@stage(...)`` or a non-stage object
    ├── PipelineValidationError (ValueError)   aggregate: ``.problems`` lists every problem
    ├── GraphProblem                           one problem found while validating a pipeline
    │   ├── MissingInputError (LookupError)     nobody provides a key that a stage needs
    │   ├── DuplicateProducerError (ValueError) two providers for one key
    │   ├── DuplicateStageError (ValueError)    two stages with one name
    │   ├── CycleError (ValueError)             the stages depend on each other in a loop
    │   ├── PhaseViolationError (ValueError)    a model stage depends on the KV phase
    │   ├── UnknownStageError (LookupError)     ``after=``/``before=`` names no stage
    │   └── NotAStageError (TypeError)          an object passed as a stage is not one
    ├── ExtensionError (ValueError)            an installed/enabled extension cannot apply
    ├── PhaseOrderError (RuntimeError)         runner methods called in the wrong order
    ├── InputsError (TypeError)                missing or unknown external inputs
    ├── OutputNotAvailableError (KeyError)     reading an output that does not exist (yet)
    ├── UnknownStageNameError (KeyError)       an API call names a stage the pipeline lacks
    ├── StageOutputError (TypeError)           a stage returned the wrong shape of outputs
    ├── StageError (RuntimeError)              a stage raised; names it and what completed
    │   └── StageError[X] (X)                   the same, also catchable as the cause's type X
    ├── TeardownError (RuntimeError)           one or more teardowns raised; lists them all
    ├── InjectedFault (RuntimeError)           raised by ``initpipe.testing`` fault injection
    ├── UsageError                             bad command-line input (the CLI exits 2)
    ├── TargetError                            a CLI target names no module/pipeline
    ├── ExportError (ValueError)               a saved graph export cannot be read
    └── GraphvizError (RuntimeError)           Graphviz's ``dot`` is missing or failed

The vLLM catalog's errors (``initpipe_vllm.errors``) derive from :class:`InitpipeError`
too, so ``except initpipe.InitpipeError`` catches everything either package raises.
"""

from __future__ import annotations

import builtins
import sys
import types
from collections.abc import Sequence
from types import GetSetDescriptorType, MemberDescriptorType
from typing import TYPE_CHECKING, Any, ClassVar, Self, cast

__all__ = [
    "CycleError",
    "DuplicateProducerError",
    "DuplicateStageError",
    "ExportError",
    "ExtensionError",
    "GraphProblem",
    "GraphvizError",
    "InitpipeError",
    "InjectedFault",
    "InputsError",
    "MissingInputError",
    "NotAStageError",
    "OutputNotAvailableError",
    "PhaseOrderError",
    "PhaseViolationError",
    "PipelineValidationError",
    "StageDeclarationError",
    "StageError",
    "StageOutputError",
    "TargetError",
    "TeardownError",
    "UnknownStageError",
    "UnknownStageNameError",
    "UsageError",
]


def error_text(err: BaseException) -> str:
    """``"Type: message"`` for an error; a placeholder message when its ``__str__`` raises
    (the failure is still reported, never replaced by the formatting error)."""
    try:
        text = str(err)
    except Exception:
        text = "<exception str() failed>"
    return f"{type(err).__name__}: {text}"


class InitpipeError(Exception):
    """Base class of every initpipe error."""


class StageDeclarationError(InitpipeError, TypeError):
    """A ``@stage(...)`` declaration is malformed.

    Attributes:
        stage: ``module:qualname`` of the offending function (or repr of the object).
        field: the declaration field at fault (``needs``, ``provides``, ``teardown``, ...).
    """

    def __init__(self, msg: str, *, stage: str, field: str) -> None:
        super().__init__(msg)
        self.stage = stage
        self.field = field


class GraphProblem(InitpipeError):
    """One problem found while validating a pipeline's graph."""


class MissingInputError(GraphProblem, LookupError):
    """A key that stages need is neither an external input nor any stage's output.

    Attributes:
        key: the missing key.
        consumers: every stage that needs it (``module:qualname``), sorted.
        suggestions: close existing keys (may be empty).
    """

    def __init__(self, key: str, consumers: Sequence[str], suggestions: Sequence[str]) -> None:
        self.key = key
        self.consumers = tuple(consumers)
        self.suggestions = tuple(suggestions)
        hint = f" Did you mean {' or '.join(repr(s) for s in suggestions)}?" if suggestions else ""
        msg = (
            f"missing input {key!r}: needed by {', '.join(self.consumers)} but no stage provides "
            f"it and it is not a declared pipeline input.{hint} Add a stage that provides it or "
            f"declare it as an input of the phase that supplies it."
        )
        super().__init__(msg)

    def __str__(self) -> str:  # KeyError-like bases would quote the message otherwise
        return str(self.args[0])


class DuplicateProducerError(GraphProblem, ValueError):
    """Two stages (or a stage and a pipeline input) provide the same key.

    Attributes:
        key: the key provided twice.
        producers: the two providers (stage names, or ``input:<phase>`` for an input).
    """

    def __init__(self, key: str, producers: Sequence[str]) -> None:
        self.key = key
        self.producers = tuple(producers)
        msg = (
            f"duplicate producer for {key!r}: provided by both {self.producers[0]} and "
            f"{self.producers[1]}. Rename one output, or replace the stage with "
            f"Pipeline.replace() instead of adding a second one."
        )
        super().__init__(msg)


class DuplicateStageError(GraphProblem, ValueError):
    """Two different functions declare stages with the same name.

    Attributes:
        name: the stage name used twice.
        stages: both functions as ``module:qualname``.
    """

    def __init__(self, name: str, stages: Sequence[str]) -> None:
        self.name = name
        self.stages = tuple(stages)
        msg = (
            f"duplicate stage name {name!r}: declared by {self.stages[0]} and {self.stages[1]}. "
            f"Stage names must be unique; rename one (@stage(name=...))."
        )
        super().__init__(msg)


class CycleError(GraphProblem, ValueError):
    """The stages depend on each other in a loop.

    Attributes:
        cycle: stage names in order, the first repeated at the end (``a -> b -> a``).
        keys: for each edge of the cycle, the data key(s) or ``after/before`` that made it.
    """

    def __init__(self, cycle: Sequence[str], keys: Sequence[str]) -> None:
        self.cycle = tuple(cycle)
        self.keys = tuple(keys)
        hops = ", ".join(
            f"{a} -> {b} via {k!r}"
            for a, b, k in zip(self.cycle[:-1], self.cycle[1:], self.keys, strict=True)
        )
        msg = (
            f"cycle: {' -> '.join(self.cycle)} (edges: {hops}). "
            f"Break it by removing one of these dependencies."
        )
        super().__init__(msg)


class PhaseViolationError(GraphProblem, ValueError):
    """A "needs model" stage depends, directly or transitively, on the KV phase.

    Attributes:
        stage: the model-phase stage.
        path: the dependency path from the KV-phase source to ``stage``.
    """

    def __init__(self, stage: str, path: Sequence[str]) -> None:
        self.stage = stage
        self.path = tuple(path)
        msg = (
            f"phase violation: model-phase stage {stage!r} depends on the KV phase through "
            f"{' -> '.join(self.path)}. Model stages run before any kv_cache_config exists: "
            f"declare {stage!r} with needs='kv_cache_config', or remove the dependency."
        )
        super().__init__(msg)


class UnknownStageError(GraphProblem, LookupError):
    """``after=`` or ``before=`` names a stage that is not in the pipeline.

    Attributes:
        stage: the stage whose ordering edge is dangling.
        reference: the unknown name.
        suggestions: close stage names.
    """

    def __init__(self, stage: str, field: str, reference: str, suggestions: Sequence[str]) -> None:
        self.stage = stage
        self.field = field
        self.reference = reference
        self.suggestions = tuple(suggestions)
        hint = f" Did you mean {' or '.join(repr(s) for s in suggestions)}?" if suggestions else ""
        msg = f"stage {stage} has {field}={reference!r}, but no stage has that name.{hint}"
        super().__init__(msg)

    def __str__(self) -> str:
        return str(self.args[0])


class NotAStageError(GraphProblem, TypeError):
    """An object given to a Pipeline is not a ``@stage``-decorated function.

    Attributes:
        obj: repr of the object.
    """

    def __init__(self, obj: Any) -> None:
        self.obj = repr(obj)
        msg = (
            f"{self.obj} is not a stage: decorate the function with "
            f"@stage(needs='model') or @stage(needs='kv_cache_config')."
        )
        super().__init__(msg)


class PipelineValidationError(InitpipeError, ValueError):
    """A pipeline has one or more problems; ``.problems`` holds one error per problem."""

    def __init__(self, problems: Sequence[GraphProblem]) -> None:
        self.problems = tuple(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        n = len(self.problems)
        super().__init__(f"invalid pipeline: {n} problem{'s' if n != 1 else ''}:\n{lines}")


class ExtensionError(InitpipeError, ValueError):
    """An extension (third-party stages) cannot be loaded or applied.

    Attributes:
        extension: the extension (entry-point) name.
        package: the distribution that brought it, if known.
        problems: the core errors it caused (e.g. the graph problems), if any.
    """

    def __init__(
        self, msg: str, *, extension: str, package: str | None, problems: Sequence[Exception] = ()
    ) -> None:
        super().__init__(msg)
        self.extension = extension
        self.package = package
        self.problems = tuple(problems)


class PhaseOrderError(InitpipeError, RuntimeError):
    """A runner method was called in the wrong order (e.g. KV phase before load)."""


class InputsError(InitpipeError, TypeError):
    """External inputs given to a phase are missing or unknown.

    Attributes:
        phase: the phase that was called (``start``, ``model`` or ``kv_cache_config``).
        missing: required inputs that were not given.
        unknown: given names the phase does not declare.
    """

    def __init__(
        self,
        phase: str,
        call: str,
        missing: Sequence[str],
        unknown: Sequence[str],
        expected: Sequence[str],
    ) -> None:
        self.phase = phase
        self.missing = tuple(missing)
        self.unknown = tuple(unknown)
        parts = []
        if self.missing:
            parts.append(f"missing {', '.join(map(repr, self.missing))}")
        if self.unknown:
            parts.append(f"unknown {', '.join(map(repr, self.unknown))}")
        msg = (
            f"{call}: {'; '.join(parts)}. This phase takes: "
            f"{', '.join(map(repr, expected)) or 'no inputs'}."
        )
        super().__init__(msg)


class OutputNotAvailableError(InitpipeError, KeyError):
    """An output was read that does not exist, or does not exist yet.

    Attributes:
        key: the key that was read.
    """

    def __init__(self, key: str, msg: str) -> None:
        super().__init__(msg)
        self.key = key

    def __str__(self) -> str:
        return str(self.args[0])


class UnknownStageNameError(InitpipeError, KeyError):
    """An API call (``replace``, ``stage``, ``--focus``) names a stage the pipeline lacks.

    Attributes:
        name: the unknown stage name.
    """

    def __init__(self, msg: str, name: str) -> None:
        super().__init__(msg)
        self.name = name

    def __str__(self) -> str:
        return str(self.args[0])


class StageOutputError(InitpipeError, TypeError):
    """A stage with several outputs returned something other than a mapping of exactly them.

    Attributes:
        stage: ``module:qualname`` of the stage.
        missing / unexpected: keys not returned / returned but not declared.
    """

    def __init__(
        self, stage: str, msg: str, missing: Sequence[str] = (), unexpected: Sequence[str] = ()
    ) -> None:
        super().__init__(msg)
        self.stage = stage
        self.missing = tuple(missing)
        self.unexpected = tuple(unexpected)


class TeardownError(InitpipeError, RuntimeError):
    """One or more teardowns raised; every teardown still ran.

    Attributes:
        failures: ``(stage name, exception)`` pairs, in the order the teardowns ran.
    """

    def __init__(self, failures: Sequence[tuple[str, BaseException]]) -> None:
        self.failures = tuple(failures)
        lines = "; ".join(f"{s}: {error_text(e)}" for s, e in self.failures)
        super().__init__(f"{len(self.failures)} teardown(s) failed (all teardowns ran): {lines}")

    def __reduce__(self) -> tuple[Any, ...]:  # rebuilt from the failures, not the message
        return (type(self), (self.failures,), self.__dict__)


class StageError(InitpipeError, RuntimeError):
    """A stage raised. The original exception is chained as ``__cause__``.

    A run raises an instance of ``StageError.subclass_for(type(cause))``: a class named
    ``StageError[ValueError]`` (``StageError[OutOfMemoryError]`` ...) that also
    derives from the cause's type, so ``except ValueError`` or ``except
    torch.OutOfMemoryError`` still catches a stage's failure; the cause's public attributes
    (``errno``, ``filename``, its own fields) are copied onto it. Where Python cannot make
    such a class the error is a plain StageError. Either way ``str(err)`` is this class's
    message: the stage, its phase, the completed stages and the rollback, then the cause's
    type and message. It pickles (the cause itself, as with any exception, does not travel).

    Attributes:
        stage: the stage's name.
        qualname: ``module:qualname`` of its function.
        phase: ``model`` or ``kv_cache_config``.
        completed: stages that had completed in this phase before it failed, in order.
        rolled_back: every stage undone during rollback, newest first (its outputs dropped,
            its teardown run where it has one).
        teardown_error: a TeardownError if rollback itself failed, else None.
    """

    #: the type a ``StageError[X]`` class also derives from (None on StageError itself)
    _cause_type: ClassVar[type[Exception] | None] = None
    #: C-level fields of that type (``errno``, ``filename`` ...), copied from the cause
    _fields: ClassVar[tuple[str, ...]] = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        # The nearest C base's __new__: a Python __new__ of the cause's class (or its C
        # argument parsing, as OSError's) would take the cause's arguments, not ours.
        base: type = cls
        while base.__flags__ & _HEAPTYPE:
            base = base.__base__  # type: ignore[assignment]
        err: Self = base.__new__(cls)  # type: ignore[call-overload]
        return err

    def __init__(
        self,
        stage: str,
        qualname: str,
        phase: str,
        completed: Sequence[str],
        rolled_back: Sequence[str],
        cause: BaseException,
        teardown_error: TeardownError | None = None,
    ) -> None:
        self.stage = stage
        self.qualname = qualname
        self.phase = phase
        self.completed = tuple(completed)
        self.rolled_back = tuple(rolled_back)
        self.teardown_error = teardown_error
        done = ", ".join(self.completed) or "none"
        undone = ", ".join(self.rolled_back) or "nothing to undo"
        msg = (
            f"stage {stage!r} ({qualname}) failed in phase {phase!r}: "
            f"{error_text(cause)}\n"
            f"  completed in this phase: {done}\n"
            f"  rolled back: {undone}"
        )
        if teardown_error is not None:
            msg += f"\n  rollback errors: {teardown_error}"
        # BaseException's own __init__, not the cooperative chain: the cause's class may
        # take other arguments (its __init__ never runs; its attributes are copied instead).
        BaseException.__init__(self, msg)
        cause_type = self._cause_type
        if cause_type is not None and isinstance(cause, cause_type):
            self._adopt(cause)

    def _adopt(self, cause: BaseException) -> None:
        """Copy the cause's attributes that a handler of its type may read."""
        for name in self._fields:
            try:
                setattr(self, name, getattr(cause, name))
            except (AttributeError, TypeError, ValueError):  # unset or read-only: skip it
                pass
        mine = self.__dict__
        for name, value in vars(cause).items():
            if not name.startswith("_") and name not in mine:
                mine[name] = value

    def __str__(self) -> str:  # ours, never the cause type's (KeyError would quote it)
        return str(self.args[0]) if self.args else ""

    __repr__ = BaseException.__repr__

    def __reduce__(self) -> tuple[Any, ...]:
        cause_type = self._cause_type
        if cause_type is not None and not _importable(cause_type):
            cause_type = None  # e.g. a class local to a function: comes back a plain StageError
        fields = {}
        for name in self._fields if cause_type is not None else ():
            try:
                fields[name] = getattr(self, name)
            except AttributeError:
                pass
        return (_restore_stage_error, (cause_type, self.args, dict(self.__dict__), fields))

    @staticmethod
    def subclass_for(cause_type: type[BaseException]) -> type[StageError]:
        """Return the StageError class that is also a ``cause_type`` (made once, cached).

        Returns:
            ``StageError[<cause type>]``; or ``StageError`` itself when the cause type is
            already one of its bases (``RuntimeError``), is not an ``Exception``, or cannot
            be a base here: a class marked ``@final``, a conflicting instance layout,
            metaclass or method order, a ``SyntaxError`` or an exception group (tracebacks
            print those from their own fields, which would hide the stage). Never raises.
        """
        try:
            cls = _SUBCLASSES.get(cause_type)
            if cls is None:
                cls = _SUBCLASSES.setdefault(cause_type, _make_subclass(cause_type))
        except TypeError:  # a metaclass that makes its classes unhashable
            return StageError
        return cls


# Py_TPFLAGS_HEAPTYPE: set on classes made in Python, clear on C types (ValueError, OSError).
_HEAPTYPE = 1 << 9
# cause type -> its StageError class. Kept for the process's life: a cached class keeps its
# cause type alive, as the exception types a program raises are few.
_SUBCLASSES: dict[type[BaseException], type[StageError]] = {}


def _type_name(t: type) -> str:
    """``ValueError`` for a builtin, ``module.qualname`` for anything else."""
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _importable(t: type) -> bool:
    """True when pickle can find ``t`` by its module and qualname."""
    obj: Any = sys.modules.get(t.__module__)
    for part in t.__qualname__.split("."):
        obj = getattr(obj, part, None)
    return obj is t


def _layout_fields(t: type) -> tuple[str, ...]:
    """The public C-level fields the builtin bases of ``t`` add (OSError: ``errno`` ...)."""
    names: dict[str, None] = {}
    for klass in t.__mro__:
        if klass.__flags__ & _HEAPTYPE or klass in (BaseException, object):
            continue
        for name, attr in vars(klass).items():
            if isinstance(attr, MemberDescriptorType | GetSetDescriptorType):
                if not name.startswith("_"):
                    names[name] = None
    return tuple(names)


def _make_subclass(cause_type: type[BaseException]) -> type[StageError]:
    if not issubclass(cause_type, Exception) or issubclass(StageError, cause_type):
        return StageError
    if issubclass(cause_type, StageError):  # a nested run's error: keep what it is
        return cause_type if "_cause_type" in vars(cause_type) else StageError
    if getattr(cause_type, "__final__", False) is True or issubclass(
        cause_type, SyntaxError | BaseExceptionGroup
    ):
        return StageError
    # The cause's bare qualname: a dot-free name pickle can look up on this module (a
    # module path would need dots, which pickle splits on).
    name = f"StageError[{cause_type.__qualname__}]"
    body = {
        "__module__": __name__,
        "__qualname__": name,
        "__doc__": f"A :class:`StageError` that is also a {_type_name(cause_type)}.",
        "_cause_type": cause_type,
        "_fields": _layout_fields(cause_type),
    }
    try:
        cls = types.new_class(name, (StageError, cause_type), exec_body=lambda ns: ns.update(body))
        meta: type = type(cls)
        call = next(k for k in meta.__mro__ if "__call__" in vars(k))
        if call is not type:  # a metaclass that builds instances its own way
            return StageError
        StageError.__new__(cls)  # the C base accepts the class (else: TypeError, not safe)
    except Exception:  # whatever Python refuses here, the plain StageError still works
        return StageError
    return cast("type[StageError]", cls)


def _restore_stage_error(
    cause_type: type[BaseException] | None,
    args: tuple[Any, ...],
    state: dict[str, Any],
    fields: dict[str, Any],
) -> StageError:
    """Unpickle a StageError (see :meth:`StageError.__reduce__`)."""
    cls = StageError if cause_type is None else StageError.subclass_for(cause_type)
    err = cls.__new__(cls)
    BaseException.__init__(err, *args)
    err.__dict__.update(state)
    for name, value in fields.items():
        try:
            setattr(err, name, value)
        except (AttributeError, TypeError, ValueError):
            pass
    return err


if not TYPE_CHECKING:  # hidden from type checkers, which would accept any name otherwise

    def __getattr__(name: str) -> Any:
        """Find a ``StageError[X]`` class by name, as pickle does for a class: one already
        made in this process, or the one for a builtin ``X`` (made now)."""
        for cls in list(_SUBCLASSES.values()):
            if cls.__qualname__ == name:
                return cls
        if name.startswith("StageError[") and name.endswith("]"):
            builtin = getattr(builtins, name[len("StageError[") : -1], None)
            if isinstance(builtin, type) and issubclass(builtin, BaseException):
                cls = StageError.subclass_for(builtin)
                if cls.__qualname__ == name:
                    return cls
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class UsageError(InitpipeError):
    """Bad command-line input: unknown target, bad flag value, missing tool (exit 2)."""


class TargetError(InitpipeError):
    """A command-line target cannot be resolved (bad module path, missing attribute, wrong
    kind of object)."""


class ExportError(InitpipeError, ValueError):
    """A saved graph export or trace file cannot be read."""


class GraphvizError(InitpipeError, RuntimeError):
    """Graphviz's ``dot`` is not installed (the message gives the install command) or
    failed."""


class InjectedFault(InitpipeError, RuntimeError):
    """The default error of a fault injected with :mod:`initpipe.testing`."""
