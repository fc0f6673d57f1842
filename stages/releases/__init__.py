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
    "overlays",
    "release_module",
    "require_runner",
    "runners",
]

#: The vLLM releases with catalogs, oldest first.
RELEASES: tuple[str, ...] = ("0.32.0", "0.33.0")
#: The release zero-argument entry points build.
DEFAULT_RELEASE = "0.32.0"
#: What each runner is called in a message, and how a user asks for it.
_RUNNER_NAMES = {
    "v1": "Model Runner V1 (`--model-runner v1`, VLLM_USE_V2_MODEL_RUNNER=0)",
    "mrv2": "Model Runner V2 (`--model-runner v2`)",
}


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
        UnsupportedRunnerError: an unknown release.
    """
    found: tuple[str, ...] = tuple(release_module(release).RUNNERS)
    return found


def require_runner(release: str, runner: str) -> None:
    """Refuse a catalog that vLLM ``release`` has no runner for.

    Raises:
        UnsupportedRunnerError: ``release`` lacks ``runner`` (names the release, the
            runners it has and how to ask for one), or ``release`` is unknown.
    """
    have = runners(release)
    if runner in have:
        return
    name = _RUNNER_NAMES.get(runner, repr(runner))
    has = ", ".join(_RUNNER_NAMES.get(r, repr(r)) for r in have)
    elsewhere = ", ".join(r for r in RELEASES if runner in runners(r))
    raise UnsupportedRunnerError(
        f"vLLM {release} has no {name}: its runners are {has}. Ask for one of those, or "
        f"install a vLLM release that has it ({elsewhere})."
    )
