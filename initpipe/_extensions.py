"""Third-party stages: replace or add stages by name, from the API or from installed packages.

A package declares, in its ``pyproject.toml``::

    [project.entry-points."initpipe.stages"]
    my_alloc = "my_pkg.stages:EXTENSION"     # an Extension, or a single @stage function

Installing a package changes nothing by itself: an extension takes effect only when it is
enabled, with ``INITPIPE_EXTENSIONS=my_alloc,other`` (or ``all``) in the environment, or
through the API (``pipeline.with_extensions(["my_alloc"])``, ``apply_extensions``).
A single stage function replaces the stage of the same name if there is one, else it is
added. An :class:`Extension` may also remove stages by name (a host's variant that drops a
step, or that provides other outputs: remove, then add). Every change is validated like
any stage; a failure names the package.

An :class:`Extension` may name the pipelines it is written for (``applies_to``, pipeline
names such as ``"initpipe_vllm"`` for vLLM's v1 catalog or ``"initpipe_vllm.mrv2"`` for
Model Runner V2's): enabled, it then changes only those and leaves any other pipeline as
it is (a host with several catalogs picks one per worker). Without ``applies_to`` (and for
a bare stage function) it applies to every pipeline it is enabled on.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeVar

import attrs

from ._stage import StageSpec, get_spec
from .errors import ExtensionError, InitpipeError

if TYPE_CHECKING:
    from importlib import metadata

__all__ = [
    "ENTRY_POINT_GROUP",
    "ENV_VAR",
    "Extension",
    "apply_extensions",
    "available",
    "enabled_names",
    "load_extension",
]

ENTRY_POINT_GROUP = "initpipe.stages"
ENV_VAR = "INITPIPE_EXTENSIONS"


class Extensible(Protocol):
    """What extensions change (:class:`initpipe.Pipeline` is one); declared here so this
    module sits below the pipeline, which applies extensions from ``with_extensions``."""

    @property
    def name(self) -> str: ...
    @property
    def specs(self) -> Mapping[str, StageSpec]: ...
    def replace(self, name: str, new: Any, *, package: str | None = None) -> Self: ...
    def remove(self, *names: str) -> Self: ...
    def add(
        self,
        new: Any,
        *,
        after: str | Iterable[str] = (),
        before: str | Iterable[str] = (),
        package: str | None = None,
    ) -> Self: ...


P = TypeVar("P", bound=Extensible)


def _stage_names(names: str | Iterable[str]) -> tuple[str, ...]:
    """One stage name or several, as a tuple (a lone string is one name, not letters)."""
    return (names,) if isinstance(names, str) else tuple(names)


@attrs.frozen(kw_only=True)
class Extension:
    """A set of changes to a pipeline, brought by one package.

    Attributes:
        name: the extension's name (its entry-point name when loaded from a package).
        replace: stage name -> replacement stage (same outputs and phase).
        add: stages to add; place them with their own ``after=``/``before=``.
        remove: names of stages to remove, all at once: no stage left may read their
            outputs or be ordered against them (remove its readers too, then add the
            variants). Applied first: remove, then replace, then add.
        package: the distribution that brought it (filled in when loaded from one).
        applies_to: names of the pipelines it changes (``Pipeline.name``); empty: every
            pipeline it is enabled on. Any other pipeline is returned unchanged.
    """

    name: str
    replace: dict[str, Any] = attrs.field(factory=dict, converter=dict)
    add: tuple[Any, ...] = attrs.field(default=(), converter=tuple)
    remove: tuple[str, ...] = attrs.field(
        default=(),
        converter=_stage_names,
        validator=attrs.validators.deep_iterable(attrs.validators.instance_of(str)),
    )
    package: str | None = None
    applies_to: tuple[str, ...] = attrs.field(
        default=(),
        converter=tuple,
        validator=attrs.validators.deep_iterable(attrs.validators.instance_of(str)),
    )

    def applies(self, pipeline_name: str) -> bool:
        """Whether this extension changes the pipeline called ``pipeline_name``."""
        return not self.applies_to or pipeline_name in self.applies_to


def available() -> dict[str, metadata.EntryPoint]:
    """Installed extensions by entry-point name (nothing is imported)."""
    from importlib import metadata  # lazily: it costs CLI start-up time

    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def enabled_names(environ: Mapping[str, str] | None = None) -> list[str] | str:
    """The extensions enabled by ``INITPIPE_EXTENSIONS``: names, ``"all"``, or ``[]``."""
    raw = (os.environ if environ is None else environ).get(ENV_VAR, "").strip()
    if raw.lower() == "all":
        return "all"
    return [n.strip() for n in raw.split(",") if n.strip()]


def load_extension(name: str, eps: Mapping[str, metadata.EntryPoint] | None = None) -> Extension:
    """Import the extension entry point ``name`` and return it as an Extension.

    Raises:
        ExtensionError: unknown name (lists the installed ones), import failure, or an
            object that is neither an Extension nor a stage.
    """
    eps = available() if eps is None else eps
    ep = eps.get(name)
    if ep is None:
        have = ", ".join(sorted(eps)) or "none installed"
        msg = (
            f"extension {name!r} is not installed (entry-point group {ENTRY_POINT_GROUP!r}; "
            f"installed: {have}). Check {ENV_VAR} or install the package."
        )
        raise ExtensionError(msg, extension=name, package=None)
    package = ep.dist.name if ep.dist is not None else ep.value.split(":")[0]
    try:
        obj = ep.load()
    except Exception as err:
        msg = f"extension {name!r} from package {package!r} failed to import ({ep.value}): {err}"
        raise ExtensionError(msg, extension=name, package=package) from err
    if isinstance(obj, Extension):
        return attrs.evolve(obj, name=name, package=package)
    if get_spec(obj) is not None:
        return Extension(name=name, add=(obj,), package=package)
    msg = (
        f"extension {name!r} from package {package!r} points at {ep.value}, which is "
        f"neither an initpipe.Extension nor a @stage function."
    )
    raise ExtensionError(msg, extension=name, package=package)


def apply_extensions(pipeline: P, extensions: Iterable[Extension]) -> P:
    """Return ``pipeline`` with each extension applied in turn.

    Each extension removes, then replaces, then adds. A stage in ``add`` whose name already
    exists replaces that stage. An extension whose ``applies_to`` does not name
    ``pipeline`` is skipped.

    Raises:
        ExtensionError: a change is invalid; names the extension and package, and chains the
            core error (``.__cause__``; its ``.problems`` when the graph became invalid).
    """
    for ext in extensions:
        if not ext.applies(pipeline.name):
            continue
        who = f"extension {ext.name!r}" + (f" from package {ext.package!r}" if ext.package else "")
        try:
            if ext.remove:
                pipeline = pipeline.remove(*ext.remove)
            for name, new in ext.replace.items():
                pipeline = pipeline.replace(name, new, package=ext.package or ext.name)
            for new in ext.add:
                spec = get_spec(new)
                if spec is not None and spec.name in pipeline.specs:
                    pipeline = pipeline.replace(spec.name, new, package=ext.package or ext.name)
                else:
                    pipeline = pipeline.add(new, package=ext.package or ext.name)
        except InitpipeError as err:
            problems = getattr(err, "problems", (err,))
            raise ExtensionError(
                f"{who} cannot be applied: {err}",
                extension=ext.name,
                package=ext.package,
                problems=problems,
            ) from err
    return pipeline
