"""Resolve a command-line TARGET (``module`` or ``module:attribute``) to a Pipeline.

A target names either a module (every ``@stage`` function at its top level, with its
``INITPIPE_INPUTS``) or ``module:attribute`` where the attribute is a :class:`Pipeline`, a
list/tuple of stages, or a zero-argument function returning one of those. Only the
target's own imports run: nothing here imports torch or vLLM.
"""

from __future__ import annotations

import difflib
import importlib
import types
from typing import Any

from .._pipeline import Pipeline, module_inputs
from .._stage import get_spec
from ..errors import TargetError

__all__ = ["DEFAULT_TARGET", "load_pipeline"]

#: The vLLM stage catalog.
DEFAULT_TARGET = "initpipe_vllm:catalog"


def _import(name: str) -> types.ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name is not None and (name == err.name or name.startswith(err.name + ".")):
            msg = (
                f"no module named {name!r}: check the spelling, and that its folder is on "
                f"PYTHONPATH (or installed)"
            )
        else:
            msg = f"importing {name!r} failed: it needs {err.name!r}, which is not installed"
        raise TargetError(msg) from err


def _resolve(mod: types.ModuleType, path: str) -> Any:
    obj: Any = mod
    for part in path.split("."):
        if not hasattr(obj, part):
            where = f"{mod.__name__}:{path}"
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=3)
            hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise TargetError(
                f"{where}: {obj.__name__ if obj is mod else path!r} has no "
                f"attribute {part!r}.{hint}"
            )
        obj = getattr(obj, part)
    return obj


def _from_object(obj: Any, mod: types.ModuleType, target: str) -> Pipeline:
    if isinstance(obj, Pipeline):
        return obj
    if isinstance(obj, (list, tuple)):
        return Pipeline(obj, name=target, **module_inputs(mod))
    if callable(obj) and get_spec(obj) is None and not isinstance(obj, type):
        made = obj()
        if isinstance(made, (Pipeline, list, tuple)):
            return _from_object(made, mod, target)
        raise TargetError(
            f"{target}() returned {type(made).__name__}, not a Pipeline or a list of stages"
        )
    raise TargetError(
        f"{target} is of type {type(obj).__name__}; expected a Pipeline, a list of "
        f"stages, or a function returning one"
    )


def load_pipeline(target: str | None = None) -> Pipeline:
    """Import ``target`` and return its pipeline (validated).

    Args:
        target: ``package.module`` or ``package.module:attribute`` (default: the vLLM
            catalog, ``initpipe_vllm``).

    Returns:
        The validated pipeline.

    Raises:
        TargetError: the module or attribute does not exist or is not a pipeline.
        PipelineValidationError: the pipeline is invalid (``.problems`` lists each).
        StageDeclarationError: a ``@stage`` in the target is malformed.
    """
    target = target or DEFAULT_TARGET
    modname, _, attr = target.partition(":")
    if not modname or (":" in target and not attr):
        raise TargetError(
            f"bad target {target!r}: use 'package.module' or 'package.module:attribute'"
        )
    mod = _import(modname)
    if attr:
        return _from_object(_resolve(mod, attr), mod, target)
    if not any(get_spec(v) is not None for v in vars(mod).values()):
        raise TargetError(
            f"module {modname!r} declares no stages at its top level; name a "
            f"pipeline with '{modname}:ATTRIBUTE'"
        )
    return Pipeline.from_module(mod)
