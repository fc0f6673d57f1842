"""The vLLM releases the catalogs are built for, and what differs in each: one module each.

What belongs here: :data:`RELEASES` (version strings, oldest first) and one module per
release, named after it (``0.32.0`` -> ``v0_32_0.py``), holding what that release changes
in the catalogs as stage overlays: ``OVERLAYS``, a tuple of ``initpipe.Extension``, each
naming the catalog pipeline it changes in ``applies_to`` (``"initpipe_vllm"`` for v1,
``"initpipe_vllm.mrv2"`` / ``"initpipe_vllm.mrv2.spec"`` for Model Runner V2) and replacing,
adding or removing stages there (a variant stage sits in the release's module, or beside
the stage it varies, and reuses its body with ``catalogs.respec`` where it can). Where a
release's runner hands the catalog other inputs (an object its ``__init__`` now builds),
its module also declares ``INPUTS``: pipeline name -> phase -> that phase's inputs, which
replace the catalog's declaration of that phase for the release (absent: none differ).
:mod:`initpipe_vllm.catalogs` applies both when it builds a catalog for the release.

Adding a release is adding its module and its entry in :data:`RELEASES` (a test checks the
two agree). Which release a worker runs is the contract's answer (the lock the installed
vLLM matches), never a comparison of version strings; zero-argument entry points
(``catalog()``, ``initpipe_vllm:pipeline``) build :data:`DEFAULT_RELEASE`.

Each release module also declares ``RUNNERS``: the catalogs (``"v1"``, ``"mrv2"``, the keys
of ``catalogs.RUNNERS``) its vLLM has a runner for. 0.34.0 removed Model Runner V1, so a
release may have fewer: :func:`require_runner` refuses a catalog the release lacks, naming
the release, and the contract declares a runner's names only for the releases that have it.

The package itself imports no release module (they may import the catalogs' stage
modules, which sit below them): :func:`release_module` imports one by name.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import UnsupportedRunnerError

if TYPE_CHECKING:
    from initpipe import Extension

__all__ = [
    "DEFAULT_RELEASE",
    "RELEASES",
    "inputs",
    "module_name",
    "overlay",
    "overlays",
    "release_module",
    "releases_with",
    "require_runner",
    "runner_title",
    "runners",
    "variant_meta",
]

#: The vLLM releases with catalogs, oldest first.
RELEASES: tuple[str, ...] = ("0.32.0", "0.33.0", "0.34.0")
#: The release zero-argument entry points build.
DEFAULT_RELEASE = "0.32.0"
#: What each runner (a catalog key) is called in a message.
_RUNNER_TITLES = {"v1": "Model Runner V1", "mrv2": "Model Runner V2"}
#: How a user asks for each: the catalog key, and the command-line option.
_RUNNER_ASK = {
    "v1": "runner='v1' (`--model-runner v1`)",
    "mrv2": "runner='mrv2' (`--model-runner v2`)",
}


def variant_meta(base: Any, *calls: str, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """A release's variant's declaration: the ``meta`` of ``base`` (a stage: what it
    mirrors and calls) with ``calls`` added and ``drop`` removed."""
    from initpipe import get_spec

    spec = get_spec(base)
    if spec is None:
        raise TypeError(f"variant_meta: {base!r} is not a stage")
    meta = dict(spec.meta)
    kept = tuple(c for c in meta.get("calls", ()) if c not in drop)
    meta["calls"] = (*kept, *calls)
    return meta


def overlay(
    release: str, pipeline: str, replace: Mapping[str, Any], add: tuple[Any, ...] = ()
) -> Extension:
    """The overlay of vLLM ``release`` on the catalog pipeline ``pipeline``: its stages
    ``replace`` (name -> variant), and ``add``."""
    from initpipe import Extension

    fields: dict[str, Any] = {  # by keyword: mypy reads attrs' converters too narrowly
        "name": f"vllm {release} ({pipeline})",
        "applies_to": (pipeline,),
        "replace": dict(replace),
        "add": add,
    }
    return Extension(**fields)


def module_name(release: str) -> str:
    """The module of ``release`` in this package: ``"0.32.0"`` -> ``"v0_32_0"``."""
    return "v" + release.replace(".", "_")


def release_module(release: str) -> types.ModuleType:
    """The module holding what differs in vLLM ``release``.

    Raises:
        UnsupportedRunnerError: ``release`` is not one of :data:`RELEASES` (lists them).
    """
    if release not in RELEASES:
        msg = (
            f"vLLM release {release!r} has no catalog; the releases are "
            f"{', '.join(RELEASES)}. A new release is a module "
            f"initpipe_vllm/releases/{module_name(release)}.py listed in RELEASES."
        )
        raise UnsupportedRunnerError(msg)
    return importlib.import_module(f"{__name__}.{module_name(release)}")


def overlays(release: str) -> tuple[Extension, ...]:
    """The stage overlays of vLLM ``release`` (``OVERLAYS`` of its module).

    Raises:
        UnsupportedRunnerError: an unknown release.
    """
    found: tuple[Extension, ...] = release_module(release).OVERLAYS
    return found


def inputs(release: str, pipeline: str) -> Mapping[str, Any]:
    """The phases whose inputs vLLM ``release`` declares anew for the catalog pipeline
    called ``pipeline`` (``INPUTS`` of its module): phase -> inputs; empty when none differ.

    Raises:
        UnsupportedRunnerError: an unknown release.
    """
    declared: Mapping[str, Mapping[str, Any]] = getattr(release_module(release), "INPUTS", {})
    return declared.get(pipeline, {})


def runners(release: str) -> tuple[str, ...]:
    """The runners vLLM ``release`` has (``RUNNERS`` of its module): catalog names,
    ``"v1"`` and ``"mrv2"``.

    Raises:
        UnsupportedRunnerError: an unknown release, or a release module that does not
            declare ``RUNNERS``.
    """
    module = release_module(release)
    found = getattr(module, "RUNNERS", None)
    if not found:
        raise UnsupportedRunnerError(
            f"{module.__name__} declares no RUNNERS: add the catalogs vLLM {release} has a "
            'runner for, e.g. RUNNERS = ("v1", "mrv2").'
        )
    return tuple(found)


def runner_title(runner: str) -> str:
    """``"Model Runner V1"`` for ``"v1"``, ``"Model Runner V2"`` for ``"mrv2"``."""
    return _RUNNER_TITLES.get(runner, repr(runner))


def releases_with(runner: str) -> tuple[str, ...]:
    """The releases of :data:`RELEASES` that have ``runner``."""
    return tuple(r for r in RELEASES if runner in runners(r))


def require_runner(release: str, runner: str, *, what: str = "") -> None:
    """Refuse a catalog that vLLM ``release`` has no runner for.

    Args:
        what: what needs the runner, to open the message (default: the catalog asked for).

    Raises:
        UnsupportedRunnerError: ``release`` lacks ``runner`` (names the release, the
            runners it has and how to ask for one), or ``release`` is unknown.
    """
    have = runners(release)
    if runner in have:
        return
    opening = what or f"the {runner_title(runner)} catalog was asked for"
    has = ", ".join(f"{runner_title(r)}: ask for {_RUNNER_ASK.get(r, repr(r))}" for r in have)
    elsewhere = releases_with(runner)
    fix = f" or install a vLLM release that has it ({', '.join(elsewhere)})" if elsewhere else ""
    raise UnsupportedRunnerError(
        f"{opening}, and vLLM {release} has no {runner_title(runner)}; its runners: {has}{fix}."
    )
