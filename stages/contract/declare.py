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
and the decorated functions from :data:`USE_MODULES` (imported by name, so this layer does
not import the layers above it; none of them imports vLLM at import time).
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, TypeVar, get_args

import attrs

__all__ = [
    "CAPABILITIES",
    "KINDS",
    "STAGE_CATALOGS",
    "USE_MODULES",
    "Capability",
    "Kind",
    "Use",
    "declarations",
    "vllm_uses",
]

Kind = Literal["mirrors", "calls"]
KINDS: tuple[Kind, ...] = get_args(Kind)

Capability = Literal["catalog_v1", "catalog_mrv2", "resize", "serve", "plan", "startup"]
#: What the doctor reports on, in its order: the two stage catalogs (with the worker and
#: runner adapter each needs), live resize (engine side), its HTTP routes, ``initpipe plan``,
#: ``initpipe startup`` (the span names its report reads, its config timer).
CAPABILITIES: tuple[Capability, ...] = get_args(Capability)

#: The pipelines whose stages declare in ``meta``, by the capability they belong to:
#: ``module:factory`` of a zero-argument function returning the pipeline.
STAGE_CATALOGS: dict[Capability, tuple[str, ...]] = {
    "catalog_v1": ("initpipe_vllm:base_catalog",),
    "catalog_mrv2": ("initpipe_vllm.mrv2:base_catalog", "initpipe_vllm.mrv2:spec_pipeline"),
    "plan": ("initpipe_vllm.tools.plan:planning_pipeline",),
}

#: The modules holding functions decorated with :func:`vllm_uses`.
USE_MODULES: tuple[str, ...] = (
    "initpipe_vllm.hook.adapter",
    "initpipe_vllm.hook.marks",
    "initpipe_vllm.hook.plugin",
    "initpipe_vllm.hook.worker",
    "initpipe_vllm.hook.runner",
    "initpipe_vllm.hook.runner_v2",
    "initpipe_vllm.resize.api",
    "initpipe_vllm.resize.engine",
    "initpipe_vllm.resize.hold",
    "initpipe_vllm.resize.rank",
    "initpipe_vllm.resize.replay",
    "initpipe_vllm.serve.routes",
    "initpipe_vllm.tools.plan",
    "initpipe_vllm.tools.startup_report",
)

_NAME = re.compile(r"^vllm(\.\w+)*:\w+(\.\w+)*$")
_ATTR = "__initpipe_vllm_uses__"
F = TypeVar("F", bound=Callable[..., Any])


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
    """

    name: str
    kind: Kind = attrs.field(validator=attrs.validators.in_(KINDS))
    capabilities: tuple[Capability, ...]
    affects: str


def vllm_uses(
    capability: Capability | Sequence[Capability],
    *,
    mirrors: Sequence[str] = (),
    calls: Sequence[str] = (),
) -> Callable[[F], F]:
    """Declare what vLLM code the decorated function mirrors and calls.

    Returns the function unchanged (the declaration rides on an attribute), so it costs
    nothing when the function runs. The function's module must be in :data:`USE_MODULES`.

    Args:
        capability: the capability (or capabilities) that depend on the function.
        mirrors: vLLM names whose code the function replaces, replays or patches.
        calls: vLLM names it calls or reads.

    Raises:
        ValueError: a name that is not ``module:qualname`` of a vLLM module, an unknown
            capability, or nothing declared.
    """
    caps = _capabilities(capability)
    declared = {"mirrors": _names(mirrors), "calls": _names(calls)}
    if not any(declared.values()):
        raise ValueError("vllm_uses: declare at least one name in mirrors= or calls=.")

    def mark(func: F) -> F:
        setattr(func, _ATTR, (caps, declared))
        return func

    return mark


def _stage_uses(capability: Capability, factory: str) -> list[Use]:
    module, _, attr = factory.partition(":")
    pipeline = getattr(importlib.import_module(module), attr)()
    out = []
    for name, spec in pipeline.specs.items():
        for kind in KINDS:
            for vllm_name in _names(spec.meta.get(kind, ())):
                out.append(Use(vllm_name, kind, (capability,), f"{pipeline.name}:{name}"))
    return out


def _decorated_uses(module_name: str) -> list[Use]:
    module = importlib.import_module(module_name)
    out: list[Use] = []
    for obj in _functions(module):
        caps, declared = getattr(obj, _ATTR)
        where = f"{obj.__module__}:{obj.__qualname__}"
        for kind in KINDS:
            out.extend(Use(name, kind, caps, where) for name in declared[kind])
    return out


def _functions(module: Any) -> list[Any]:
    """The decorated functions of ``module``: module level and one class level deep."""
    found = []
    for value in vars(module).values():
        if hasattr(value, _ATTR) and callable(value):
            found.append(value)
        elif isinstance(value, type) and value.__module__ == module.__name__:
            found.extend(v for v in vars(value).values() if hasattr(v, _ATTR))
    return found


@functools.cache
def declarations(capability: Capability | None = None) -> tuple[Use, ...]:
    """Every declaration (of one capability, or of all), sorted by name, kind, affects.

    Imports the catalogs and :data:`USE_MODULES` (none imports vLLM at import time).
    """
    caps = CAPABILITIES if capability is None else _capabilities(capability)
    uses: list[Use] = []
    for cap in caps:
        for factory in STAGE_CATALOGS.get(cap, ()):
            uses.extend(_stage_uses(cap, factory))
    for module_name in USE_MODULES:
        uses.extend(u for u in _decorated_uses(module_name) if set(u.capabilities) & set(caps))
    return tuple(sorted(set(uses), key=lambda u: (u.name, u.kind, u.affects)))
