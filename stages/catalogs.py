"""What the catalogs share: each built once per (runner, release), extended once per set.

What belongs here: the machinery, never a stage. A catalog is a package beside this module
(``v1/``, ``mrv2/``) whose ``__init__`` declares its pipelines as data
(:class:`CatalogDef`: stages, inputs per phase, the pipeline's name); what differs in a
vLLM release is that release's overlays (:mod:`initpipe_vllm.releases`), applied through
the core's ``Extension`` (replace / add / remove, ``applies_to`` naming the pipeline). Here:

- :data:`RUNNERS` — the runner -> catalog package table (by name: this layer sits below the
  catalogs, which import it);
- :func:`build` — a :class:`CatalogDef` with one release's overlays, as a Pipeline, memoized:
  the same (definition, release) gives the same object;
- :func:`base_catalog` / :func:`catalog` — a runner's pipeline for a release, without or
  with the enabled extensions (one Pipeline per extension set);
- :func:`respec` — one stage body declared for a second catalog (``attrs.evolve`` of its
  spec: other edges, other ``meta``), instead of a copy of the body;
- :func:`runner_step` — ``@stage`` for one step of a stock runner method, its ``meta``
  (what it mirrors, what it calls) written in one line of arguments.

Imports neither torch nor vllm.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

import attrs

from initpipe import Phase, Pipeline, StageSpec, apply_extensions, get_spec, stage
from initpipe._extensions import enabled_names

from .errors import UnsupportedRunnerError
from .releases import DEFAULT_RELEASE, inputs, overlays, require_runner

__all__ = [
    "RUNNERS",
    "CatalogDef",
    "base_catalog",
    "build",
    "catalog",
    "catalog_def",
    "respec",
    "runner_step",
]

F = TypeVar("F", bound=Callable[..., Any])

#: Each runner's catalog package (it defines ``CATALOG``, a :class:`CatalogDef`). A test
#: checks this against the packages that define one.
RUNNERS: Mapping[str, str] = MappingProxyType(
    {"v1": "initpipe_vllm.v1", "mrv2": "initpipe_vllm.mrv2"}
)


@attrs.frozen(kw_only=True, eq=False)
class CatalogDef:
    """A catalog's pipeline as data, built by :func:`build` per release.

    Compared and hashed by identity: a definition is a module-level constant.

    Attributes:
        name: the pipeline's name (what ``Extension.applies_to``, the contract's
            ``affects`` and messages name; the same for every release).
        stages: ``@stage`` functions or specs (:func:`respec`).
        inputs: the external inputs per phase, as ``INITPIPE_INPUTS``
            (``start`` / ``model`` / ``kv_cache_config``).
        runner: the runner it mirrors (a key of :data:`RUNNERS`): a release without that
            runner has no such pipeline.
    """

    name: str
    stages: tuple[Any, ...]
    inputs: Mapping[str, Any]
    runner: str = attrs.field(validator=attrs.validators.in_(tuple(RUNNERS)))


@functools.cache
def build(definition: CatalogDef, release: str) -> Pipeline:
    """``definition`` as a Pipeline for vLLM ``release``, its overlays applied; built once.
    A phase whose inputs the release declares anew (``INPUTS`` of its module) takes them.

    Raises:
        UnsupportedRunnerError: ``release`` is not in ``initpipe_vllm.releases.RELEASES``,
            or it has no runner for this catalog (0.34.0 has no Model Runner V1).
        initpipe.ExtensionError: an overlay breaks the graph (names the release).
    """
    require_runner(release, definition.runner)
    declared = {**definition.inputs, **inputs(release, definition.name)}
    pipeline = Pipeline(
        definition.stages,
        start_inputs=declared["start"],
        model_inputs=declared["model"],
        kv_inputs=declared["kv_cache_config"],
        name=definition.name,
    )
    return apply_extensions(pipeline, overlays(release))


def catalog_def(runner: str) -> CatalogDef:
    """The :class:`CatalogDef` of ``runner``'s catalog (``"v1"`` or ``"mrv2"``).

    Raises:
        UnsupportedRunnerError: no catalog for ``runner`` (lists the runners).
    """
    if runner not in RUNNERS:
        msg = (
            f"no catalog for runner {runner!r}; the catalogs are "
            f"{', '.join(map(repr, RUNNERS))} (initpipe_vllm.catalogs.RUNNERS)."
        )
        raise UnsupportedRunnerError(msg)
    definition: CatalogDef = importlib.import_module(RUNNERS[runner]).CATALOG
    return definition


def base_catalog(*, runner: str = "v1", release: str = DEFAULT_RELEASE) -> Pipeline:
    """``runner``'s initialization pipeline for vLLM ``release``, without extensions.

    Raises:
        UnsupportedRunnerError: an unknown runner or release (lists the known ones), or a
            release without that runner.
    """
    return build(catalog_def(runner), release)


def catalog(
    extensions: list[str] | str | None = None,
    *,
    runner: str = "v1",
    release: str = DEFAULT_RELEASE,
) -> Pipeline:
    """``runner``'s pipeline for vLLM ``release`` with the enabled extensions.

    Args:
        extensions: extension names (entry-point group ``initpipe.stages``), ``"all"``, or
            None to read ``INITPIPE_EXTENSIONS`` (unset: none — installing a package never
            changes the pipeline by itself). An extension applies to the catalogs its
            ``applies_to`` names (all, without it).
        runner: ``"v1"`` or ``"mrv2"`` (:data:`RUNNERS`).
        release: a vLLM release of ``initpipe_vllm.releases.RELEASES``.

    Pipelines are immutable and built once per (runner, release, extension set); derive
    variants with ``.replace(...)`` / ``.add(...)`` / ``.remove(...)``.

    Raises:
        UnsupportedRunnerError: an unknown runner or release, or a release without that
            runner.
        initpipe.ExtensionError: an enabled extension is missing or breaks the graph.
    """
    base = base_catalog(runner=runner, release=release)
    wanted = enabled_names() if extensions is None else extensions
    if not wanted:
        return base
    return _extended(base, wanted if isinstance(wanted, str) else tuple(wanted))


@functools.cache
def _extended(base: Pipeline, key: tuple[str, ...] | str) -> Pipeline:
    return base.with_extensions(key)


def respec(stage: Any, **changes: Any) -> StageSpec:
    """``stage``'s spec with ``changes`` (``attrs.evolve``): the same body, declared again.

    For a stage whose body serves a second catalog unchanged while its edges (``after``,
    ``before``) or declarations (``meta``: the runner it mirrors) differ. The function is
    not decorated a second time (that would overwrite its spec in the first catalog).

    Raises:
        TypeError: ``stage`` is not a stage.
    """
    spec = get_spec(stage)
    if spec is None:
        raise TypeError(f"respec: {stage!r} is not a @stage function or a StageSpec.")
    if "meta" in changes:
        changes["meta"] = MappingProxyType(dict(changes["meta"]))
    return attrs.evolve(spec, **changes)


def runner_step(
    needs: Phase,
    mirrors: str | Iterable[str],
    *calls: str,
    **options: Any,
) -> Callable[[F], F]:
    """``@stage(needs=..., meta=...)`` for one step of a stock runner method.

    Args:
        needs: the phase (``MODEL`` or ``KV``).
        mirrors: the stock method(s) the stage reproduces (``meta["mirrors"]``).
        calls: the vLLM names its body calls (``meta["calls"]``, checked by the contract).
        options: the rest of :func:`initpipe.stage`'s keywords (``after``, ``provides``...).
    """
    mirrored = (mirrors,) if isinstance(mirrors, str) else tuple(mirrors)
    return stage(needs=needs, meta={"mirrors": mirrored, "calls": calls}, **options)
