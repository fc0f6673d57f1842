"""The contract's declarations cover the code: every stage and declared function names
the vLLM code it mirrors, and its declared calls cover every vLLM name its body imports.

Read from the source with ``ast`` (nothing imports vLLM): a function's body, its stage's
teardown, and the module-level helpers of the same module it calls (transitively). A
``from vllm.x import y`` must be declared as ``vllm.x:y``; ``import vllm.x as m`` followed
by ``m.attr`` as ``vllm.x:attr``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from initpipe_vllm.contract import declare

ROOT = Path(__file__).resolve().parents[2]


@cache
def _module_tree(module: str) -> ast.Module:
    return ast.parse(Path(inspect.getfile(sys.modules[module])).read_text())


def _top_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _find(tree: ast.Module, qualname: str) -> ast.FunctionDef:
    body: list[ast.stmt] = tree.body
    node: Any = None
    for part in qualname.split("."):
        node = next(
            n
            for n in body
            if isinstance(n, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
            and n.name == part
        )
        body = node.body
    return node  # type: ignore[no-any-return]


def _vllm_names(func: ast.AST) -> set[str]:
    """vLLM names a function's body imports (``from`` imports; attributes of module aliases)."""
    names: set[str] = set()
    aliases: dict[str, str] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm"):
            for a in node.names:
                module = f"{node.module}.{a.name}"
                if _is_module(module):
                    aliases[a.asname or a.name] = module
                else:
                    names.add(f"{node.module}:{a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("vllm") and a.asname:
                    aliases[a.asname] = a.name
    for node in ast.walk(func):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in aliases:
                names.add(f"{aliases[node.value.id]}:{node.attr}")
    return names


@cache
def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` is a vLLM module, read from the files (``find_spec`` of a
    submodule would import its parents, vLLM itself)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    base = Path(spec.submodule_search_locations[0]).parent.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _with_helpers(module: str, roots: list[ast.AST]) -> Iterator[ast.AST]:
    """The roots and every helper of ``module`` they use, transitively: a module-level
    function that is not a stage (a stage's input is often named like the stage) and
    declares nothing itself (a declared helper answers for its own body)."""
    from initpipe import is_stage

    mod = sys.modules[module]
    functions = {
        name: node
        for name, node in _top_functions(_module_tree(module)).items()
        if not is_stage(getattr(mod, name, None))
        and not hasattr(getattr(mod, name, None), "__initpipe_vllm_uses__")
    }
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        node = todo.pop()
        yield node
        args = {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
        for sub in ast.walk(node):
            name = sub.id if isinstance(sub, ast.Name) else None
            if name in functions and name not in args and name not in seen:
                seen.add(name)
                todo.append(functions[name])


def _imported(func: Any, *extra: Any) -> set[str]:
    """The vLLM names ``func`` and ``extra`` (a teardown, perhaps another module's: MRv2's
    zeroer shares v1's) import, with their module's helpers."""
    out: set[str] = set()
    for f in (func, *extra):
        if f:
            module = f.__module__
            root: ast.AST = _find(_module_tree(module), f.__qualname__)
            out = out.union(*(_vllm_names(n) for n in _with_helpers(module, [root])))
    return out


def _stage_cases() -> list[Any]:
    """Each stage declaration once (the planning pipeline reuses the v1 catalog's stages;
    a body re-specced for MRv2 is checked against each catalog's declaration)."""
    cases: dict[Any, Any] = {}
    for cap, factories in declare.STAGE_CATALOGS.items():
        for factory in factories:
            module, _, attr = factory.partition(":")
            pipeline = getattr(importlib.import_module(module), attr)()
            for name, spec in pipeline.specs.items():
                key = (spec.func, spec.meta.get("calls"), spec.meta.get("mirrors"))
                cases.setdefault(key, pytest.param(spec, id=f"{cap}:{name}"))
    return list(cases.values())


def _decorated_cases() -> list[Any]:
    cases = []
    for module_name in declare.USE_MODULES:
        for func in declare._functions(importlib.import_module(module_name)):
            cases.append(pytest.param(func, id=f"{module_name}:{func.__qualname__}"))
    return cases


STAGES = _stage_cases()
DECORATED = _decorated_cases()


@pytest.mark.parametrize("spec", STAGES)
def test_every_stage_declares_what_it_mirrors(spec: Any) -> None:
    assert spec.meta.get("mirrors"), (
        f"stage {spec.name} ({spec.qualname}) declares no meta['mirrors']: name the vLLM "
        "code whose orchestration it replaces"
    )


@pytest.mark.parametrize("spec", STAGES)
def test_a_stages_calls_cover_the_vllm_names_its_body_imports(spec: Any) -> None:
    declared = set(spec.meta.get("calls", ())) | set(spec.meta.get("mirrors", ()))
    missing = sorted(_imported(spec.func, spec.teardown) - declared)
    assert missing == [], f"stage {spec.name}: add to meta['calls']: {missing}"


@pytest.mark.parametrize("func", DECORATED)
def test_a_declared_functions_calls_cover_its_vllm_imports(func: Any) -> None:
    _, uses = func.__initpipe_vllm_uses__
    declared = set(uses["calls"]) | set(uses["mirrors"])
    missing = sorted(_imported(func) - declared)
    assert missing == [], f"{func.__qualname__}: add to calls=: {missing}"


def test_the_checker_sees_imports() -> None:
    # so that the coverage tests above cannot pass by reading nothing
    from initpipe import get_spec
    from initpipe_vllm.v1 import kv_tensors

    spec = get_spec(kv_tensors.runner_kv_caches)
    assert spec is not None
    names = _imported(spec.func, spec.teardown)
    assert "vllm.v1.worker.utils:bind_kv_cache" in names
    assert "vllm.v1.worker.utils:clear_layer_kv_caches" in names  # from its teardown
    assert len(STAGES) > 50
    assert len(DECORATED) > 5


def test_no_catalog_module_keeps_a_second_list_in_its_docstring() -> None:
    stale = []
    for path in sorted((ROOT / "stages").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if re.search(r"Replaces,? in ``vllm/", doc):
            stale.append(str(path.relative_to(ROOT)))
    assert stale == [], "the declarations (meta / vllm_uses) replace these lists"


@pytest.mark.parametrize(
    "bad", ["GPUModelRunner.load_model", "torch.nn:Module", "vllm.x:", "vllm:a b"]
)
def test_a_malformed_name_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="module:qualname"):
        declare.vllm_uses("catalog_v1", calls=(bad,))


def test_an_unknown_capability_is_refused() -> None:
    with pytest.raises(ValueError, match="catalog_v1"):
        declare.vllm_uses("v3", calls=("vllm.config:VllmConfig",))  # type: ignore[arg-type]
