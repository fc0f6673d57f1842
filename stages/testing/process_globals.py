"""Process-wide vLLM state an engine leaves behind, and resetting it between two engines.

What belongs here: the one list of module globals that a runner's initialization sets in
the process it runs in (:data:`KNOWN_PROCESS_GLOBALS`), each with the value vLLM's module
assigns when it is imported, and :func:`reset_process_globals`, which puts them back.
Replaces nothing in vLLM.

Why: the equivalence harness (:mod:`.equivalence`) runs stock, then pipelined, in one
process (an in-process engine: the worker runs in the harness's process). Whatever stock
set there, a pipelined catalog that forgot to set it would silently inherit, and compare
equal. So the harness resets every known global to its import-time value before each
engine: each side starts from what a fresh process would hold. (Engines whose workers run
in processes of their own — ``--multiprocess``, several ranks — start fresh anyway.)

Adding one: when a catalog stage declares an ``effects=`` entry on a module global (or a
vLLM function the runner calls sets one), add a :class:`ProcessGlobal` with the module's
dotted name, the attribute and the value the module assigns at import. The test
``tests/vllm/test_engine_equivalence.py::test_the_known_process_globals_reset_to_what_vllm_assigns_at_import``
reads vLLM's source and fails if the declared value is not the one the module assigns
at top level, or if the module or attribute is gone.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path
from typing import Any

import attrs

__all__ = [
    "KNOWN_PROCESS_GLOBALS",
    "ProcessGlobal",
    "current_values",
    "declared_value_problems",
    "reset_process_globals",
]


@attrs.frozen(kw_only=True)
class ProcessGlobal:
    """A module global that initializing a runner sets.

    Attributes:
        module: the module's dotted name (imported only to reset it).
        name: the attribute.
        import_value: what the module assigns at import (a literal: None, a number ...).
        set_by: which stages (or vLLM functions) set it, for the reader.
    """

    module: str
    name: str
    import_value: Any = None
    set_by: str = ""

    @property
    def path(self) -> str:
        """``module:name``, as the catalog's ``meta["calls"]`` write it."""
        return f"{self.module}:{self.name}"


_SSU = "vllm.model_executor.layers.mamba.ops.ssu_dispatch"

#: Every module global a runner's initialization is known to set in its process.
KNOWN_PROCESS_GLOBALS: tuple[ProcessGlobal, ...] = (
    ProcessGlobal(
        module=_SSU,
        name="_mamba_ssu_backend",
        set_by="stage mamba_ssu_backend (v1 and MRv2 catalogs): initialize_mamba_ssu_backend",
    ),
    ProcessGlobal(
        module=_SSU,
        name="_flashinfer_replayssm_kernel",
        set_by="stage mamba_ssu_backend (v1 and MRv2 catalogs): initialize_mamba_ssu_backend",
    ),
)


def reset_process_globals(
    known: tuple[ProcessGlobal, ...] = KNOWN_PROCESS_GLOBALS,
) -> dict[str, Any]:
    """Set each known global back to its import-time value; return the values replaced.

    A module not imported yet is left alone: it still holds its import-time value.
    """
    import sys

    replaced = {}
    for g in known:
        mod = sys.modules.get(g.module)
        if mod is None:
            continue
        replaced[g.path] = getattr(mod, g.name)
        setattr(mod, g.name, g.import_value)
    return replaced


def _source_file(module: str) -> Path | None:
    """The ``.py`` file of ``module``, found from its top-level package's folder without
    importing the packages in between (vLLM's import them heavily)."""
    top, *inner = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or spec.origin is None:
        return None
    if not inner:
        return Path(spec.origin)
    base = Path(spec.origin).parent.joinpath(*inner)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def declared_value_problems(known: tuple[ProcessGlobal, ...] = KNOWN_PROCESS_GLOBALS) -> list[str]:
    """Where :data:`KNOWN_PROCESS_GLOBALS` disagrees with vLLM's source, as lines.

    Reads each module's source (nothing is imported) for the top-level assignment of the
    attribute and compares its literal value with ``import_value``.
    """
    problems = []
    for g in known:
        source = _source_file(g.module)
        if source is None:
            problems.append(f"{g.path}: module not found")
            continue
        tree = ast.parse(source.read_text(), str(source))
        values = [
            node.value
            for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            and g.name
            in [
                t.id
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(t, ast.Name)
            ]
        ]
        if len(values) != 1 or values[0] is None:
            problems.append(f"{g.path}: {len(values)} top-level assignments (expected 1)")
            continue
        try:
            value = ast.literal_eval(values[0])
        except ValueError:
            problems.append(f"{g.path}: assigned {ast.unparse(values[0])}, not a literal")
            continue
        if value != g.import_value:
            problems.append(f"{g.path}: vLLM assigns {value!r}, declared {g.import_value!r}")
    return problems


def current_values(known: tuple[ProcessGlobal, ...] = KNOWN_PROCESS_GLOBALS) -> dict[str, Any]:
    """Each known global's value now (importing its module)."""
    return {g.path: getattr(importlib.import_module(g.module), g.name) for g in known}
