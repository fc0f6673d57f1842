"""The ``@stage`` decorator and the frozen spec it attaches to a function."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final, Literal, TypeVar, overload

import attrs

from .errors import StageDeclarationError

__all__ = ["KV", "MODEL", "PHASES", "Phase", "StageSpec", "get_spec", "is_stage", "stage"]

#: A stage's phase: what it needs before it can run.
Phase = Literal["model", "kv_cache_config"]
MODEL: Final = "model"
KV: Final = "kv_cache_config"
#: The stage phases, in execution order.
PHASES: Final[tuple[Phase, Phase]] = (MODEL, KV)

SPEC_ATTR = "__initpipe_stage__"

F = TypeVar("F", bound=Callable[..., Any])


def qualname_of(obj: Any) -> str:
    """Return ``module:qualname`` for a function (or ``repr`` for anything else)."""
    mod = getattr(obj, "__module__", None)
    qn = getattr(obj, "__qualname__", None)
    return f"{mod}:{qn}" if mod and qn else repr(obj)


def _names(value: str | Iterable[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


@attrs.frozen(kw_only=True)
class StageSpec:
    """What a stage declares: its phase, inputs, outputs, teardown and effects.

    Attributes:
        name: unique stage name (the function name unless given).
        func: the plain function.
        needs: ``"model"`` or ``"kv_cache_config"``, the phase the stage runs in.
        inputs: parameter names, in order; each is a data key.
        provides: output keys. One key: the return value. Several: a mapping.
        teardown: called with the output (plus any stage inputs it names) to undo the stage.
        teardown_inputs: the stage inputs the teardown takes, after the output.
        effects: external state the stage must mutate (shown in graphs, undone by teardown).
        after / before: ordering-only edges to other stages, by name.
        doc: first line of the docstring.
        package: the distribution or extension that brought the stage (``None`` = built in).
        meta: free-form declarations about the stage that the framework does not interpret
            (e.g. which host functions it mirrors): a read-only mapping of string keys to
            strings, numbers, booleans, None or tuples of strings, shown by ``initpipe
            graph`` and exported with the graph.
    """

    name: str
    func: Callable[..., Any] = attrs.field(repr=False)
    needs: Phase = attrs.field(validator=attrs.validators.in_(PHASES))
    inputs: tuple[str, ...]
    provides: tuple[str, ...]
    teardown: Callable[..., Any] | None = attrs.field(default=None, repr=False)
    teardown_inputs: tuple[str, ...] = ()
    effects: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    before: tuple[str, ...] = ()
    doc: str = ""
    package: str | None = None
    #: False when some input is keyword-only (the runner then passes inputs by name)
    positional: bool = True
    meta: Mapping[str, Any] = attrs.field(factory=dict, hash=False, repr=False)

    @property
    def qualname(self) -> str:
        """``module:qualname`` of the stage function."""
        return qualname_of(self.func)

    @property
    def module(self) -> str:
        """The module that defines the stage function."""
        return getattr(self.func, "__module__", "") or ""

    @property
    def multi(self) -> bool:
        """True when the stage returns a mapping of several outputs."""
        return len(self.provides) != 1


_SCALARS = (str, int, float, bool, type(None))


def _meta(func: Any, meta: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``meta`` checked and frozen: string keys; values are scalars or strings (a list or
    tuple of strings becomes a tuple)."""
    if meta is None:
        return MappingProxyType({})
    if not isinstance(meta, Mapping):
        raise _fail(func, "meta", f"meta={meta!r} must be a mapping of names to values.")
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if not isinstance(key, str) or not key:
            raise _fail(func, "meta", f"meta key {key!r} must be a non-empty string.")
        if isinstance(value, (list, tuple)):
            if not all(isinstance(v, str) for v in value):
                raise _fail(
                    func, "meta", f"meta[{key!r}]={value!r}: a sequence must hold strings only."
                )
            value = tuple(value)
        elif not isinstance(value, _SCALARS):
            raise _fail(
                func,
                "meta",
                f"meta[{key!r}] is a {type(value).__name__}; use a string, number, bool, None "
                "or a tuple of strings (it is exported as JSON).",
            )
        out[key] = value
    return MappingProxyType(out)


def _fail(func: Any, field: str, msg: str) -> StageDeclarationError:
    who = qualname_of(func)
    return StageDeclarationError(f"stage {who}: {msg}", stage=who, field=field)


def _plain_parameters(
    func: Callable[..., Any], field: str, owner: Any, kwonly: list[str] | None = None
) -> list[str]:
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError) as err:
        raise _fail(owner, field, f"cannot read the signature of {func!r}: {err}") from err
    names = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise _fail(
                owner,
                field,
                f"parameter {p.name!r} is *args/**kwargs; a stage's "
                f"inputs must be named parameters.",
            )
        if p.kind is p.POSITIONAL_ONLY:
            raise _fail(
                owner, field, f"parameter {p.name!r} is positional-only; inputs are passed by name."
            )
        if p.kind is p.KEYWORD_ONLY and kwonly is not None:
            kwonly.append(p.name)
        names.append(p.name)
    return names


def _check_teardown(
    func: Callable[..., Any], teardown: Any, inputs: tuple[str, ...]
) -> tuple[str, ...]:
    if not callable(teardown):
        raise _fail(
            func,
            "teardown",
            f"teardown={teardown!r} is not callable; pass a function "
            f"taking the stage's output first.",
        )
    names = _plain_parameters(teardown, "teardown", func)
    if not names:
        raise _fail(
            func,
            "teardown",
            f"teardown {qualname_of(teardown)} takes no parameter; "
            f"its first parameter receives the stage's output.",
        )
    extra = [n for n in names[1:] if n not in inputs]
    if extra:
        raise _fail(
            func,
            "teardown",
            f"teardown {qualname_of(teardown)} names "
            f"{', '.join(map(repr, extra))}, which are not inputs of "
            f"the stage (inputs: {', '.join(inputs) or 'none'}).",
        )
    return tuple(names[1:])


def make_spec(
    func: Any,
    *,
    needs: Any,
    provides: str | Iterable[str] | None = None,
    name: str | None = None,
    teardown: Any = None,
    effects: Iterable[str] = (),
    after: str | Iterable[str] = (),
    before: str | Iterable[str] = (),
    package: str | None = None,
    meta: Mapping[str, Any] | None = None,
) -> StageSpec:
    """Build a StageSpec for ``func`` and check the declaration; see :func:`stage`."""
    if not callable(func) or isinstance(func, type):
        raise _fail(func, "func", "a stage must be a plain function (not a class or value).")
    if needs not in PHASES:
        raise _fail(
            func,
            "needs",
            f"needs={needs!r} is unknown; use needs='model' or needs='kv_cache_config'.",
        )
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        raise _fail(
            func,
            "func",
            "generator functions are not supported; return the outputs instead of yielding them.",
        )
    if inspect.iscoroutinefunction(func):
        raise _fail(func, "func", "async functions are not supported; stages run synchronously.")
    kwonly: list[str] = []
    inputs = tuple(_plain_parameters(func, "func", func, kwonly))
    stage_name = name if name is not None else getattr(func, "__name__", None)
    if not isinstance(stage_name, str) or not stage_name.isidentifier():
        raise _fail(func, "name", f"name={stage_name!r} is not a valid identifier.")
    outs = (stage_name,) if provides is None else _names(provides)
    if not outs or not all(isinstance(k, str) and k for k in outs):
        raise _fail(
            func, "provides", f"provides={provides!r} must be a key or a non-empty tuple of keys."
        )
    if len(set(outs)) != len(outs):
        raise _fail(func, "provides", f"provides={provides!r} repeats a key.")
    both = sorted(set(outs) & set(inputs))
    if both:
        raise _fail(
            func,
            "provides",
            f"{', '.join(map(repr, both))} is both an input and an output of the stage.",
        )
    t_inputs = _check_teardown(func, teardown, inputs) if teardown is not None else ()
    for field, value in (("effects", effects), ("after", after), ("before", before)):
        vals = _names(value)
        if not all(isinstance(v, str) and v for v in vals):
            raise _fail(func, field, f"{field}={value!r} must be a string or strings.")
    doc = inspect.getdoc(func) or ""
    return StageSpec(
        name=stage_name,
        func=func,
        needs=needs,
        inputs=inputs,
        provides=outs,
        teardown=teardown,
        teardown_inputs=t_inputs,
        effects=_names(effects),
        after=_names(after),
        before=_names(before),
        doc=doc.strip().splitlines()[0] if doc.strip() else "",
        package=package,
        positional=not kwonly,
        meta=_meta(func, meta),
    )


@overload
def stage(
    func: F,
    *,
    needs: Phase,
    provides: str | Iterable[str] | None = None,
    name: str | None = None,
    teardown: Callable[..., Any] | None = None,
    effects: Iterable[str] = (),
    after: str | Iterable[str] = (),
    before: str | Iterable[str] = (),
    meta: Mapping[str, Any] | None = None,
) -> F: ...


@overload
def stage(
    func: None = None,
    *,
    needs: Phase,
    provides: str | Iterable[str] | None = None,
    name: str | None = None,
    teardown: Callable[..., Any] | None = None,
    effects: Iterable[str] = (),
    after: str | Iterable[str] = (),
    before: str | Iterable[str] = (),
    meta: Mapping[str, Any] | None = None,
) -> Callable[[F], F]: ...


def stage(
    func: F | None = None,
    *,
    needs: Phase,
    provides: str | Iterable[str] | None = None,
    name: str | None = None,
    teardown: Callable[..., Any] | None = None,
    effects: Iterable[str] = (),
    after: str | Iterable[str] = (),
    before: str | Iterable[str] = (),
    meta: Mapping[str, Any] | None = None,
) -> F | Callable[[F], F]:
    """Mark a plain function as a stage and return it unchanged.

    Args:
        needs: ``"model"`` (runs once the model is loaded) or ``"kv_cache_config"`` (runs in
            the re-runnable KV phase).
        provides: the output key (default: the function name), or a tuple of keys, in which
            case the function returns a mapping with exactly those keys.
        name: the stage name (default: the function name).
        teardown: undoes what the stage created; called with its output first, plus any of
            the stage's inputs it names as parameters.
        effects: names of external state the stage mutates because the host forces it.
        after: stage names this stage must run after (ordering only).
        before: stage names this stage must run before (ordering only).
        meta: declarations the framework keeps but does not interpret (string keys;
            strings, numbers, booleans, None or tuples of strings), e.g. which host
            functions the stage mirrors; shown by ``initpipe graph`` and in its JSON export.

    Returns:
        The same function, with a frozen :class:`StageSpec` at ``func.__initpipe_stage__``.

    Raises:
        StageDeclarationError: the declaration is malformed (names the function and field).
    """

    def mark(fn: F) -> F:
        spec = make_spec(
            fn,
            needs=needs,
            provides=provides,
            name=name,
            teardown=teardown,
            effects=effects,
            after=after,
            before=before,
            meta=meta,
        )
        try:
            setattr(fn, SPEC_ATTR, spec)
        except (AttributeError, TypeError) as err:
            raise _fail(
                fn, "func", "cannot attach a spec to this callable; use a def function."
            ) from err
        return fn

    return mark if func is None else mark(func)


def get_spec(obj: Any) -> StageSpec | None:
    """Return the StageSpec of a stage function or a spec itself, else None."""
    if isinstance(obj, StageSpec):
        return obj
    spec = getattr(obj, SPEC_ATTR, None) if callable(obj) else None
    return spec if isinstance(spec, StageSpec) else None


def is_stage(obj: Any) -> bool:
    """Return True if ``obj`` is a ``@stage`` function or a StageSpec."""
    return get_spec(obj) is not None
