"""The declarations: which vLLM functions each part of initpipe mirrors or calls.

What belongs here: the vocabulary of the contract and the collection of every declaration,
and nothing that reads vLLM. Declarations live next to the code they describe:

- a **stage** declares in its spec's generic ``meta`` (the core does not interpret it)::

      @stage(needs=KV, meta={"mirrors": (f"{RUNNER}.initialize_kv_cache_tensors",),
                             "calls": ("vllm.v1.worker.utils:allocate_kv_cache",)})

  ``mirrors``: the vLLM code whose orchestration the stage replaces (its whole source is
  fingerprinted); ``calls``: the vLLM callables and names it calls or reads (their
  signatures are fingerprinted). A stage's teardown is covered by the stage's declaration.
- **other code** (a resize replay, a worker override, a patched method or module global,
  a private vLLM global read, a runner attribute the adapter writes) declares with
  :func:`vllm_uses` on the function that depends on it.

Names are ``module:qualname`` (``vllm.v1.worker.gpu_model_runner:GPUModelRunner.load_model``,
``vllm.v1.worker.cpu_worker:CPUModelRunner`` for a module global). Each declaration belongs
to one or more *capabilities* (:data:`CAPABILITIES`), which the doctor reports and the
gates decide on. :func:`declarations` collects them: the stages from the catalogs' pipelines
and the decorated functions from the modules that declare (:func:`use_modules`, found by
reading the package's source, then imported by name, so this layer does not import the
layers above it; none of them imports vLLM at import time).

Declarations are scoped by vLLM release (:func:`releases`) and by runner
(:func:`release_runners`): a declaration tied to one runner (``runner="v1"``; every
declaration of the v1 catalog only, and the v1 catalog's stages) applies only to the
releases that have that runner, and otherwise a declaration applies to every
release unless one release's own declaration replaces it — ``@vllm_uses(...,
release="0.33.0", replaces=("initpipe_vllm.compat:plan_kv_cache_configs",))`` on that
release's variant, or the release's catalog holding another variant of a stage. Each
release's lock is built from its own declarations (``declarations(release=...)``).
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import attrs

__all__ = [
    "CAPABILITIES",
    "CAPABILITY_RUNNER",
    "KINDS",
    "RUNNER_CLASSES",
    "STAGE_CATALOGS",
    "STAGE_CATALOG_RUNNER",
    "USE_MODULES",  # noqa: F822  (found on first access, by __getattr__)
    "Capability",
    "Kind",
    "Use",
    "absent_capabilities",
    "declarations",
    "release_runners",
    "releases",
    "use_modules",
    "vllm_uses",
]

Kind = Literal["mirrors", "calls"]
KINDS: tuple[Kind, ...] = get_args(Kind)

Capability = Literal["catalog_v1", "catalog_mrv2", "resize", "refit", "serve", "plan", "startup"]
#: What the doctor reports on, in its order: the two stage catalogs (with the worker and
#: runner adapter each needs), live resize (engine side), weight refit (on the same live
#: transactions), their HTTP routes, ``initpipe plan``,
#: ``initpipe startup`` (the span names its report reads, its config timer).
CAPABILITIES: tuple[Capability, ...] = get_args(Capability)

#: The pipelines whose stages declare in ``meta``, by the capability they belong to:
#: ``module:factory`` of a zero-argument function returning the pipeline.
STAGE_CATALOGS: dict[Capability, tuple[str, ...]] = {
    "catalog_v1": ("initpipe_vllm:base_catalog",),
    "catalog_mrv2": ("initpipe_vllm.mrv2:base_catalog", "initpipe_vllm.mrv2:spec_pipeline"),
    "plan": (
        "initpipe_vllm.tools.plan:planning_pipeline",
        "initpipe_vllm.tools.plan:mrv2_planning_pipeline",
    ),
}
#: The runner whose catalog a pipeline of :data:`STAGE_CATALOGS` holds, where its
#: capability belongs to no one runner (``plan`` plans with either runner's catalog): its
#: stages are that runner's declarations, and a release without the runner reads none.
STAGE_CATALOG_RUNNER: dict[str, str] = {
    "initpipe_vllm.tools.plan:planning_pipeline": "v1",
    "initpipe_vllm.tools.plan:mrv2_planning_pipeline": "mrv2",
}

#: The capabilities that belong to one runner: their declarations are that runner's, and a
#: release without the runner has none of them.
CAPABILITY_RUNNER: dict[Capability, str] = {
    "catalog_v1": "v1",
    "catalog_mrv2": "mrv2",
}
#: Every runner a release can have (``initpipe_vllm.catalogs.RUNNERS``' keys).
_ALL_RUNNERS = ("v1", "mrv2")
#: The class that is each runner in vLLM: where the installed vLLM has it, the runner's
#: capabilities are not ``absent`` (the doctor's witness; the catalogs declare it too).
RUNNER_CLASSES = {
    "v1": "vllm.v1.worker.gpu_model_runner:GPUModelRunner",
    "mrv2": "vllm.v1.worker.gpu.model_runner:GPUModelRunner",
}

_NAME = re.compile(r"^vllm(\.\w+)*:\w+(\.\w+)*$")
_AFFECTS = re.compile(r"^\w+(\.\w+)*:\w+(\.\w+)*$")
_ATTR = "__initpipe_vllm_uses__"
#: Every declaration stacked on a function: (capabilities, names, (releases, replaces,
#: runner)), innermost first.
_DECLS = "__initpipe_vllm_declarations__"
#: This package's import name, and the folder its source is read from.
_PACKAGE = __name__.split(".")[0]
_ROOT = Path(__file__).resolve().parents[1]
#: The releases until the release modules' package (``initpipe_vllm.releases``) exists.
_FIRST_RELEASES = ("0.32.0",)
F = TypeVar("F", bound=Callable[..., Any])


def _releases_package() -> Any | None:
    """``initpipe_vllm.releases``, or None while that package does not exist."""
    try:
        return importlib.import_module(f"{_PACKAGE}.releases")
    except ModuleNotFoundError as err:
        if err.name != f"{_PACKAGE}.releases":
            raise
        return None


def releases() -> tuple[str, ...]:
    """The vLLM releases initpipe has a module for: ``initpipe_vllm.releases.RELEASES``
    (``("0.32.0",)`` while that package does not exist)."""
    module = _releases_package()
    return _FIRST_RELEASES if module is None else tuple(module.RELEASES)


def release_runners(release: str) -> tuple[str, ...]:
    """The runners vLLM ``release`` has (``initpipe_vllm.releases.runners``; every runner
    while that package does not exist or does not know the release)."""
    module = _releases_package()
    if module is None or release not in module.RELEASES:
        return _ALL_RUNNERS
    return tuple(module.runners(release))


def absent_capabilities(release: str) -> frozenset[str]:
    """The capabilities of the runners vLLM ``release`` does not have (none for 0.32.0 and
    0.33.0; ``catalog_v1`` for a release without Model Runner V1)."""
    has = release_runners(release)
    return frozenset(c for c, r in CAPABILITY_RUNNER.items() if r not in has)


def _declares(tree: ast.Module) -> bool:
    """Whether a module's source calls :func:`vllm_uses` (under any name it imports it as)."""
    names = {"vllm_uses"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.update(a.asname for a in node.names if a.name == "vllm_uses" and a.asname)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name in names:
                return True
    return False


@functools.cache
def use_modules() -> tuple[str, ...]:
    """Every module of the package that declares with :func:`vllm_uses`, sorted: found by
    reading the source (``ast``; nothing is imported), so none can be left out."""
    found = []
    for path in sorted(_ROOT.rglob("*.py")):
        text = path.read_bytes()
        if b"vllm_uses" not in text or path == Path(__file__).resolve():
            continue
        if _declares(ast.parse(text, str(path))):
            parts = path.relative_to(_ROOT).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found.append(".".join((_PACKAGE, *parts)))
    return tuple(sorted(found))


def __getattr__(name: str) -> Any:
    if name == "USE_MODULES":  # the modules holding functions decorated with vllm_uses
        return use_modules()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _names(value: Iterable[str]) -> tuple[str, ...]:
    names = tuple(value)
    for name in names:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(
                f"{name!r} is not a vLLM name: write 'module:qualname', e.g. "
                "'vllm.v1.worker.gpu_model_runner:GPUModelRunner.load_model'."
            )
    return names


def _capabilities(value: str | Iterable[str]) -> tuple[Capability, ...]:
    caps = (value,) if isinstance(value, str) else tuple(value)
    bad = [c for c in caps if c not in CAPABILITIES]
    if bad or not caps:
        raise ValueError(f"capability {bad or caps!r}: use one or more of {CAPABILITIES}.")
    return caps  # type: ignore[return-value]


@attrs.frozen
class Use:
    """One declared dependency on vLLM.

    Attributes:
        name: the vLLM name, ``module:qualname``.
        kind: ``"mirrors"`` (its code is replaced or replayed: the source is fingerprinted)
            or ``"calls"`` (called or read: the signature is fingerprinted).
        capabilities: the capabilities that depend on it.
        affects: the initpipe code that declares it: ``pipeline:stage`` for a stage,
            ``module:qualname`` for a decorated function.
        release: the one release it applies to; None (a base declaration): every release
            whose own declarations do not replace it.
        replaces: the base declarations (their ``affects``) that this release's
            declaration replaces in its release.
        runner: the runner it belongs to (``"v1"``, ``"mrv2"``): it applies only to the
            releases that have that runner; None: to every release.
    """

    name: str
    kind: Kind = attrs.field(validator=attrs.validators.in_(KINDS))
    capabilities: tuple[Capability, ...]
    affects: str
    release: str | None = None
    replaces: tuple[str, ...] = ()
    runner: str | None = None


def vllm_uses(
    capability: Capability | Sequence[Capability],
    *,
    mirrors: Sequence[str] = (),
    calls: Sequence[str] = (),
    release: str | Sequence[str] | None = None,
    replaces: Sequence[str] = (),
    runner: str | None = None,
) -> Callable[[F], F]:
    """Declare what vLLM code the decorated function mirrors and calls.

    Returns the function unchanged (the declaration rides on an attribute), so it costs
    nothing when the function runs. Its module is found by :func:`use_modules`.

    Args:
        capability: the capability (or capabilities) that depend on the function.
        mirrors: vLLM names whose code the function replaces, replays or patches.
        calls: vLLM names it calls or reads.
        release: the vLLM release this declaration applies to (a release's variant), or
            several (a variant a later release carries forward unchanged: one
            declaration per release); None: every release (unless one replaces it).
        replaces: with ``release``: the base declarations (``module:qualname`` of the
            initpipe functions) this variant stands in for in its release.
        runner: the runner whose code this is (``"v1"``, ``"mrv2"``): declared only for
            the releases that have it (``use_v2_model_runner``, which exists only where
            both runners do, is ``runner="v1"``). None: the runner of the capability when
            ``capability`` is one catalog's (``"catalog_v1"`` -> ``"v1"``), else every
            release's.

    Raises:
        ValueError: a name that is not ``module:qualname`` of a vLLM module, an unknown
            capability or runner, nothing declared, or ``replaces`` without a ``release``.
    """
    caps = _capabilities(capability)
    declared = {"mirrors": _names(mirrors), "calls": _names(calls)}
    if runner is not None and runner not in _ALL_RUNNERS:
        raise ValueError(f"vllm_uses: runner={runner!r}: use one of {_ALL_RUNNERS} or None.")
    owners = {CAPABILITY_RUNNER.get(c) for c in caps}
    if runner is not None and None not in owners and runner not in owners:
        raise ValueError(
            f"vllm_uses: runner={runner!r} contradicts capability {caps!r}, which belongs to "
            f"{sorted(o for o in owners if o)}: drop runner= or name a capability of it."
        )
    if runner is None and len(owners) == 1:
        (runner,) = owners
    if not any(declared.values()):
        raise ValueError("vllm_uses: declare at least one name in mirrors= or calls=.")
    scope = (release,) if isinstance(release, str) else None if release is None else tuple(release)
    if scope is not None and (not scope or not all(isinstance(r, str) for r in scope)):
        raise ValueError(f"vllm_uses: release={release!r}: name one release or several.")
    replaced = tuple(replaces)
    if replaced and release is None:
        raise ValueError(
            f"vllm_uses: replaces={replaced!r} needs release=: only one release's variant "
            "replaces a base declaration."
        )
    bad = [r for r in replaced if not isinstance(r, str) or not _AFFECTS.match(r)]
    if bad:
        raise ValueError(
            f"vllm_uses: replaces={bad!r}: name the replaced initpipe function as "
            "'module:qualname', e.g. 'initpipe_vllm.compat:plan_kv_cache_configs'."
        )

    def mark(func: F) -> F:
        # Several declarations may be stacked on one function (each its own runner or
        # release scope): each is kept, and _ATTR holds their union.
        stacked = [*getattr(func, _DECLS, ()), (caps, declared, (scope, replaced, runner))]
        setattr(func, _DECLS, tuple(stacked))
        union_caps = tuple(dict.fromkeys(c for d in stacked for c in d[0]))
        union = {k: tuple(dict.fromkeys(n for d in stacked for n in d[1][k])) for k in KINDS}
        setattr(func, _ATTR, (union_caps, union))
        return func

    return mark


def _pipeline(factory: str, release: str) -> Any:
    """The pipeline ``module:factory`` returns for ``release``: a factory taking
    ``release=`` is asked for a known release's catalog, any other is called without."""
    module, _, attr = factory.partition(":")
    make = getattr(importlib.import_module(module), attr)
    if release in releases() and "release" in inspect.signature(make).parameters:
        return make(release=release)
    return make()


def _stage_uses(capability: Capability, factory: str, release: str) -> list[Use]:
    runner = CAPABILITY_RUNNER.get(capability) or STAGE_CATALOG_RUNNER.get(factory)
    if runner is not None and runner not in release_runners(release):
        return []  # that runner's catalog does not exist in this release
    pipeline = _pipeline(factory, release)
    out = []
    for name, spec in pipeline.specs.items():
        for kind in KINDS:
            for vllm_name in _names(spec.meta.get(kind, ())):
                out.append(
                    Use(
                        vllm_name,
                        kind,
                        (capability,),
                        f"{pipeline.name}:{name}",
                        runner=runner,
                    )
                )
    return out


def _uses_of(func: Any) -> list[Use]:
    """The declarations :func:`vllm_uses` put on ``func``."""
    where = f"{func.__module__}:{func.__qualname__}"
    return [
        Use(name, kind, caps, where, release, replaces, runner)
        for caps, declared, (scope, replaces, runner) in getattr(func, _DECLS)
        for release in scope or (None,)
        for kind in KINDS
        for name in declared[kind]
    ]


def _decorated_uses(module_name: str) -> list[Use]:
    module = importlib.import_module(module_name)
    return [use for func in _functions(module) for use in _uses_of(func)]


def _functions(module: Any) -> list[Any]:
    """The decorated functions of ``module``: module level and one class level deep."""
    found = []
    for value in vars(module).values():
        if hasattr(value, _ATTR) and callable(value):
            found.append(value)
        elif isinstance(value, type) and value.__module__ == module.__name__:
            found.extend(v for v in vars(value).values() if hasattr(v, _ATTR))
    return found


def _scoped(uses: Sequence[Use], release: str) -> list[Use]:
    """``uses`` as they apply to ``release``: its own declarations and every base one
    they do not replace, less those of a runner the release does not have (and less the
    capabilities of that runner in a declaration shared with others).

    Raises:
        ValueError: a declaration for a release initpipe has no module for, or one
            replacing a base declaration that does not exist.
    """
    known = releases()
    unknown = sorted(
        {
            f"{u.affects} (release={u.release!r})"
            for u in uses
            if u.release and u.release not in known
        }
    )
    if unknown:
        raise ValueError(
            f"declared for a release initpipe does not know ({', '.join(unknown)}): use one "
            f"of {known} or add the release's module to initpipe_vllm.releases."
        )
    own = [u for u in uses if u.release == release]
    replaced = {r: u.affects for u in own for r in u.replaces}
    base = {u.affects for u in uses if u.release is None}
    dangling = sorted(f"{r} (replaced by {by})" for r, by in replaced.items() if r not in base)
    if dangling:
        raise ValueError(
            f"release {release}: replaces= names no base declaration: {', '.join(dangling)}; "
            "name the replaced function as its module:qualname."
        )
    has = release_runners(release)
    gone = absent_capabilities(release)
    out = []
    for u in uses:
        if u.runner is not None and u.runner not in has:
            continue
        if not (u.release == release or (u.release is None and u.affects not in replaced)):
            continue
        if gone & set(u.capabilities):  # shared with a capability this release lacks
            caps = tuple(c for c in u.capabilities if c not in gone)
            if not caps:
                continue
            u = attrs.evolve(u, capabilities=caps)
        out.append(u)
    return out


@functools.cache
def declarations(
    capability: Capability | None = None, *, release: str | None = None
) -> tuple[Use, ...]:
    """Every declaration (of one capability, or of all), sorted by name, kind, affects:
    those of ``release`` (its own and the base ones it does not replace; the lock of a
    release is built from these), or, for None, those of every release together.

    Imports the catalogs and :func:`use_modules` (none imports vLLM at import time).
    """
    caps = CAPABILITIES if capability is None else _capabilities(capability)
    found: set[Use] = set()
    for scope in releases() if release is None else (release,):
        uses: list[Use] = []
        absent = absent_capabilities(scope)
        for cap in caps:
            if cap in absent:
                continue  # no such runner in this release: no such catalog
            for factory in STAGE_CATALOGS.get(cap, ()):
                uses.extend(_stage_uses(cap, factory, scope))
        for module_name in use_modules():
            uses.extend(u for u in _decorated_uses(module_name) if set(u.capabilities) & set(caps))
        found.update(_scoped(uses, scope))
    return tuple(
        sorted(
            found,
            key=lambda u: (
                u.name,
                u.kind,
                u.affects,
                u.release or "",
                u.capabilities,
                u.runner or "",
            ),
        )
    )
