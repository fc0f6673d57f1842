"""Digests of the vLLM definitions initpipe declares, read from source with ``ast`` alone.

What belongs here: the canonical text of a syntax tree (:func:`canonical`: no formatting,
comments, docstrings or positions; the same on Python 3.11 to 3.13), and resolving a
declared ``"module:qualname"`` the way Python would find it (re-exports, class MROs, the
subclasses initpipe instantiates) to a :class:`Found` with a digest of its whole source
(kind ``"mirrors"``: initpipe replaces or replays it) or of its signature only (kind
``"calls"``: initpipe calls it) (:class:`Index`); where a name that is gone went
(:meth:`Index.candidates`) and how near two definitions are (:func:`similarity`). Finding
and reading the files is :mod:`.source`'s; nothing here imports vLLM.

A ``"calls"`` digest of a dataclass-like class covers its fields' names, order and whether
each has a default, not the default values (a new default value keeps the digest; a field
losing or gaining one changes it). A function's covers its parameters' default values.
"""

from __future__ import annotations

import ast
import builtins
import difflib
import hashlib
import re
from collections.abc import Iterator, Sequence

import attrs

from .source import Source, module_path

__all__ = ["KINDS", "Found", "Index", "canonical", "similarity"]

#: The kinds of declaration: initpipe replaces/replays the code, or calls/uses it.
KINDS = ("mirrors", "calls")
_MAX_HOPS = 10
_BODIED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_LITERALS = (ast.Constant, ast.MatchSingleton)  # where a None value is the literal None
#: A class is dataclass-like by a decorator or a base whose dotted name ends so.
_DATACLASS_DECORATORS = frozenset("dataclass define frozen mutable s attrs config".split())
_FIELD_BASES = frozenset("NamedTuple TypedDict Struct BaseModel".split())
#: Bases outside vLLM known to add no attributes or ``__init__`` worth looking for.
_EMPTY_BASES = frozenset(
    "builtins.object abc.ABC typing.Generic typing.Protocol typing_extensions.Protocol".split()
)


def canonical(node: ast.AST) -> str:
    """The text of ``node`` without positions, ``type_comment``, ``Constant.kind``, fields
    that are None or ``[]``, and the docstring of every module, class and function body.

    Written over ``node._fields`` (not ``ast.dump``, whose output changed in 3.13), so it
    is the same on Python 3.11, 3.12 and 3.13. A body left empty by its docstring drops
    out (``FunctionDef(name='f', args=arguments())``), unlike a ``pass`` body.
    """
    fields = []
    for name in node._fields:
        if name == "type_comment" or (name == "kind" and isinstance(node, ast.Constant)):
            continue
        value = getattr(node, name, None)
        value = _body(node) if name == "body" and isinstance(node, _BODIED) else value
        if (value is None and not isinstance(node, _LITERALS)) or value == []:
            continue
        if isinstance(value, list):
            text = ", ".join(canonical(v) if isinstance(v, ast.AST) else repr(v) for v in value)
            text = f"[{text}]"
        else:
            text = canonical(value) if isinstance(value, ast.AST) else repr(value)
        fields.append(f"{name}={text}")
    return f"{type(node).__name__}({', '.join(fields)})"


@attrs.frozen
class Found:
    """What a declared name resolved to in one vLLM.

    Attributes:
        name: the name as declared (``"vllm.config:get_layers_from_vllm_config"``).
        kind: ``"mirrors"`` or ``"calls"``.
        status: ``"found"``, ``"missing"`` (vLLM has no such thing) or ``"unknown"`` (it may
            exist, but only at run time: a lazy ``__getattr__``, a base outside vLLM...).
        digest: sha256 hex of the canonical text (mirrors) or of the signature (calls),
            overrides in ``via`` classes folded in; None unless found.
        defined_in: ``"module:qualname"`` of the definition after re-exports and the MRO.
        files: every relpath read to resolve it, sorted.
        parts: 12-hex digests of each top-level statement of the definition's body
            (mirrors only), for :func:`similarity`.
        detail: why missing or unknown, or ``"overridden in vllm.x:Sub.f"``.
    """

    name: str
    kind: str
    status: str
    digest: str | None
    defined_in: str | None
    files: tuple[str, ...]
    parts: tuple[str, ...]
    detail: str = ""


def similarity(a: Sequence[str], b: Sequence[str]) -> float:
    """How near two :attr:`Found.parts` are: 1.0 equal, 0.0 disjoint."""
    return difflib.SequenceMatcher(None, list(a), list(b), autojunk=False).ratio()


@attrs.frozen
class _Def:
    """A definition: def(s), a class or assignment(s) of one name, in ``module``."""

    module: str
    qualname: str
    nodes: tuple[ast.stmt, ...] = attrs.field(eq=False)
    #: for an instance attribute (``self.x = ...`` in methods): the methods that set it
    set_in: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.module}:{self.qualname}"

    @property
    def cls(self) -> ast.ClassDef | None:
        return self.nodes[-1] if isinstance(self.nodes[-1], ast.ClassDef) else None


@attrs.frozen
class _ModRef:
    module: str


@attrs.frozen
class _External:
    dotted: str  # "torch.nn.Module", "builtins.Exception"


_Target = _Def | _ModRef | _External


class _Unresolved(Exception):
    def __init__(self, status: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@attrs.frozen
class _Binding:
    node: ast.stmt
    runtime: bool  # False under ``if TYPE_CHECKING:``
    module: str | None = None  # an import: the module imported (from)
    attr: str | None = None  # ... and the name taken from it (None: the module itself)


class _Module:
    """One parsed module's top-level names (imports resolved to absolute modules)."""

    def __init__(self, name: str, relpath: str, data: bytes) -> None:
        self.name, self.relpath = name, relpath
        self.package = name if relpath.endswith("/__init__.py") else name.rpartition(".")[0]
        self.bindings: dict[str, list[_Binding]] = {}
        self.stars: list[str] = []
        self.error = ""
        try:
            body = ast.parse(data, relpath).body
        except (SyntaxError, ValueError) as exc:
            self.error, body = f"cannot parse {relpath}: {exc}", []
        for stmt, runtime in _statements(body):
            if isinstance(stmt, ast.Import) and runtime:
                for alias in stmt.names:  # `import a.b` binds a; `import a.b as c` binds c
                    top = alias.name.partition(".")[0]
                    target = alias.name if alias.asname else top
                    self._bind(alias.asname or top, _Binding(stmt, True, target))
            elif isinstance(stmt, ast.ImportFrom) and runtime:
                source = self._absolute(stmt)
                for alias in stmt.names if source else ():
                    if alias.name == "*":
                        self.stars.append(source)
                    else:
                        self._bind(
                            alias.asname or alias.name, _Binding(stmt, True, source, alias.name)
                        )
            for bound in _bound(stmt):
                self._bind(bound, _Binding(stmt, runtime))
        lazy = self.binding("__getattr__")
        self.lazy = lazy is not None and isinstance(lazy.node, _FUNCTIONS)

    def _bind(self, name: str, binding: _Binding) -> None:
        self.bindings.setdefault(name, []).append(binding)

    def _absolute(self, stmt: ast.ImportFrom) -> str:
        if not stmt.level:
            return stmt.module or ""
        parts = self.package.split(".")
        if stmt.level - 1 >= len(parts):
            return ""
        base = ".".join(parts[: len(parts) - stmt.level + 1])
        return f"{base}.{stmt.module}" if stmt.module else base

    def binding(self, name: str) -> _Binding | None:
        """The last runtime binding of ``name``, else the last under TYPE_CHECKING."""
        found = self.bindings.get(name, [])
        chosen = [b for b in found if b.runtime] or found
        return chosen[-1] if chosen else None


class Index:
    """Resolves declared names in one :class:`~.source.Source`; each file is parsed once."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self._modules: dict[str, _Module | None] = {}
        self._sets: dict[int, tuple[ast.ClassDef, dict[str, list[tuple[str, ast.stmt]]]]] = {}

    def resolve(self, name: str, kind: str, via: Sequence[str] = ()) -> Found:
        """Find ``name`` (``"module:qualname"``) and digest it as ``kind``.

        Args:
            name: the declared name, e.g. ``"vllm.v1.core.sched.scheduler:Scheduler.__init__"``.
            kind: ``"mirrors"`` (digest of the whole source) or ``"calls"`` (signature).
            via: ``"module:Class"`` subclasses initpipe instantiates: where one resolves
                the attribute to another definition, that override is folded into the
                digest and named in ``detail``.
        """
        module, qualname = _split(name, kind)
        rest = qualname.partition(".")[2]
        if via and not rest:
            raise ValueError(f"via needs a Class.attribute name, not {name!r}")
        files: set[str] = set()
        try:
            found = self._find(module, qualname, files)
            text = self._text(found, kind, files)
        except _Unresolved as exc:
            return Found(name, kind, exc.status, None, None, tuple(sorted(files)), (), exc.detail)
        details = []
        for cls in via:
            sub = self.resolve(f"{cls}.{rest}", kind)
            files.update(sub.files)
            if sub.defined_in != found.name:
                text += f"\nvia {cls}->{sub.defined_in or sub.status} {sub.digest or sub.detail}"
                details.append(
                    f"overridden in {sub.defined_in}"
                    if sub.status == "found"
                    else f"via {cls}: {sub.status} ({sub.detail})"
                )
        parts = _parts(found) if kind == "mirrors" else ()
        where, read = found.name, tuple(sorted(files))
        return Found(name, kind, "found", _sha(text), where, read, parts, "; ".join(details))

    def candidates(self, name: str, kind: str) -> list[Found]:
        """Where ``name`` may have moved: the same qualname found in other modules whose
        source defines its first part (``def X``/``class X``), once per definition."""
        module, qualname = _split(name, kind)
        first = qualname.partition(".")[0].encode()
        pattern = re.compile(rb"\b(?:def|class)\s+" + re.escape(first) + rb"\b")
        own = {module.replace(".", "/") + end for end in ("/__init__.py", ".py")}
        out: dict[str, Found] = {}
        for relpath in self.source.files():
            data = self.source.read(relpath) if relpath not in own else None
            if not data or first not in data or not pattern.search(data):
                continue
            found = self.resolve(f"{_module_name(relpath)}:{qualname}", kind)
            where = found.defined_in or ""
            if found.status == "found" and where.partition(":")[0] != module:
                out.setdefault(where, found)
        return list(out.values())

    def file_digest(self, relpath: str) -> str | None:
        """sha256 hex of the raw bytes of ``relpath``, or None if the source has no such file."""
        data = self.source.read(relpath)
        return None if data is None else hashlib.sha256(data).hexdigest()

    def _module(self, name: str, files: set[str]) -> _Module | None:
        if name not in self._modules:
            relpath = module_path(self.source, name)
            data = None if relpath is None else self.source.read(relpath)
            self._modules[name] = (
                None if relpath is None or data is None else _Module(name, relpath, data)
            )
        module = self._modules[name]
        if module is not None:
            files.add(module.relpath)
        return module

    def _attr(self, module: str, name: str, files: set[str], seen: tuple[str, ...] = ()) -> _Target:
        """``module``'s top-level ``name``, re-exports followed to the definition."""
        here = f"{module}:{name}"
        if here in seen or len(seen) > _MAX_HOPS:
            chain = " -> ".join((*seen, here))
            raise _Unresolved("unknown", f"re-exports go round or too deep: {chain}")
        mod = self._module(module, files)
        if mod is None:
            hop = f" (imported by {seen[-1]})" if seen else ""
            raise _Unresolved("unknown" if seen else "missing", f"no module {module}{hop}")
        if mod.error:
            raise _Unresolved("unknown", mod.error)
        binding = mod.binding(name)
        if binding is None:
            return self._unbound(mod, name, files, (*seen, here))
        if binding.module is None:
            return _Def(module, name, (binding.node,))
        if not _internal(binding.module):
            return _External(".".join(filter(None, (binding.module, binding.attr))))
        if binding.attr is None:
            return _ModRef(binding.module)
        return self._attr(binding.module, binding.attr, files, (*seen, here))

    def _unbound(self, mod: _Module, name: str, files: set[str], seen: tuple[str, ...]) -> _Target:
        """A name no statement binds: from a star import, a submodule, or ``__getattr__``."""
        outside = []
        for star in reversed(mod.stars if not name.startswith("_") else []):
            if not _internal(star):
                outside.append(star)
                continue
            try:
                return self._attr(star, name, files, seen)
            except _Unresolved as exc:
                if exc.status != "missing":
                    raise
        if module_path(self.source, f"{mod.name}.{name}") is not None:
            return _ModRef(f"{mod.name}.{name}")
        if outside:
            raise _Unresolved("unknown", f"{name} may come from 'from {outside[0]} import *'")
        if mod.lazy:
            raise _Unresolved("unknown", f"no {name} in {mod.name}; lazy module __getattr__")
        raise _Unresolved("missing", f"no {name} in {mod.name}")

    def _find(self, module: str, qualname: str, files: set[str]) -> _Def:
        first, *rest = qualname.split(".")
        target = self._attr(module, first, files)
        for part in rest:
            target = self._member(target, part, files)
        if isinstance(target, _External):
            raise _Unresolved("unknown", f"{module}:{qualname} is {target.dotted}, outside vllm")
        if isinstance(target, _ModRef):
            raise _Unresolved("missing", f"{module}:{qualname} is the module {target.module}")
        return target

    def _member(self, target: _Target, attr: str, files: set[str]) -> _Target:
        if isinstance(target, _External):
            return _External(f"{target.dotted}.{attr}")
        if isinstance(target, _ModRef):
            return self._attr(target.module, attr, files)
        if target.cls is None:
            raise _Unresolved("missing", f"{target.name} is not a class, so has no {attr}")
        own = _members(target.cls, attr)  # the class's own body first: no base read then
        if own:
            return _Def(target.module, f"{target.qualname}.{attr}", own)
        mro, unreadable = self._mro(target, files)
        for cls in mro[1:]:
            nodes = _members(cls.cls, attr)
            if nodes:
                return _Def(cls.module, f"{cls.qualname}.{attr}", nodes)
        for cls in mro:  # an instance attribute: set as ``self.attr`` in the methods
            sets = self._instance_sets(cls.cls).get(attr)
            if sets:
                methods = tuple(dict.fromkeys(m for m, _ in sets))
                return _Def(
                    cls.module, f"{cls.qualname}.{attr}", tuple(n for _, n in sets), methods
                )
        if unreadable:
            raise _Unresolved("unknown", f"no {attr} in {target.name}'s MRO; {unreadable[0]}")
        raise _Unresolved("missing", f"no {attr} in {target.name} or its bases")

    def _instance_sets(self, cls: ast.ClassDef | None) -> dict[str, list[tuple[str, ast.stmt]]]:
        """Per attribute, ``(method, statement)`` of each ``self.attr = ...`` in ``cls``'s
        methods (read once per class)."""
        if cls is None:
            return {}
        if id(cls) not in self._sets:
            self._sets[id(cls)] = (cls, _instance_sets(cls))
        return self._sets[id(cls)][1]

    def _mro(
        self, cls: _Def, files: set[str], below: tuple[str, ...] = ()
    ) -> tuple[list[_Def], list[str]]:
        """``cls``'s linearization over the bases that resolve (C3, else depth-first), and
        why each other base could not be read."""
        if cls.name in below:
            raise _Unresolved("unknown", f"{cls.name} inherits from itself")
        bases: list[_Def] = []
        unreadable: list[str] = []
        for expr in cls.cls.bases if cls.cls else []:
            base = expr.value if isinstance(expr, ast.Subscript) else expr
            try:
                target = self._expr(cls.module, base, files)
            except _Unresolved as exc:
                unreadable.append(f"base {ast.unparse(expr)} of {cls.name}: {exc.detail}")
                continue
            if isinstance(target, _Def) and target.cls is not None:
                bases.append(target)
            elif not isinstance(target, _External) or target.dotted not in _EMPTY_BASES:
                what = target.dotted if isinstance(target, _External) else "not a class in vllm"
                unreadable.append(f"base {ast.unparse(expr)} of {cls.name} is {what}")
        lines = []
        for klass in bases:
            line, more = self._mro(klass, files, (*below, cls.name))
            lines.append(line)
            unreadable += more
        merged = _c3([*lines, bases])
        if merged is None:
            merged = list(dict.fromkeys(c for line in lines for c in line))
        return [cls, *merged], unreadable

    def _expr(self, module: str, expr: ast.expr, files: set[str]) -> _Target:
        """What a (dotted) name in ``module`` refers to."""
        if isinstance(expr, ast.Attribute):
            return self._member(self._expr(module, expr.value, files), expr.attr, files)
        if not isinstance(expr, ast.Name):
            raise _Unresolved("unknown", f"{ast.unparse(expr)} is not a dotted name")
        mod = self._module(module, files)
        if mod is not None and mod.binding(expr.id) is None and hasattr(builtins, expr.id):
            return _External(f"builtins.{expr.id}")
        return self._attr(module, expr.id, files)

    def _text(self, found: _Def, kind: str, files: set[str]) -> str:
        if found.set_in and kind == "calls":  # an instance attribute's "signature"
            return f"instance attribute set in {', '.join(found.set_in)}"
        if kind == "mirrors":
            return "\n".join(canonical(node) for node in found.nodes)
        texts = []
        for node in found.nodes:
            if isinstance(node, _FUNCTIONS):
                texts.append(_signature(node))
            elif isinstance(node, ast.ClassDef):
                texts.append(
                    self._class_signature(_Def(found.module, found.qualname, (node,)), files)
                )
            else:
                value = getattr(node, "value", None)
                texts.append(canonical(value) if isinstance(value, ast.AST) else "")
        return "\n".join(texts)

    def _class_signature(self, cls: _Def, files: set[str]) -> str:
        """The first ``__init__`` along the MRO, or the fields where a dataclass-like class
        comes first (its dataclass-like bases' fields before its own); ``"()"`` if neither."""
        mro, unreadable = self._mro(cls, files)
        like = [_decorated(c) or any(_field_base(b) for b in mro[i:]) for i, c in enumerate(mro)]
        for i, klass in enumerate(mro):
            inits = [n for n in _members(klass.cls, "__init__") if isinstance(n, _FUNCTIONS)]
            if inits:
                return "\n".join(_signature(n) for n in inits)
            if like[i]:
                fields: dict[str, bool] = {}
                for j in reversed(range(i, len(mro))):
                    fields.update(_fields(mro[j]) if like[j] else {})
                return f"fields({', '.join(f + '=...' * d for f, d in fields.items())})"
        if _enum(cls):  # an enum's "signature": its members, in order
            return f"members({', '.join(_enum_members(cls))})"
        if unreadable:
            raise _Unresolved("unknown", f"no __init__ in {cls.name}'s MRO; {unreadable[0]}")
        return "()"


def _split(name: str, kind: str) -> tuple[str, str]:
    module, sep, qualname = name.partition(":")
    if not (sep and module and qualname):
        raise ValueError(f"{name!r} is not a 'module:qualname' name")
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")
    return module, qualname


def _internal(module: str) -> bool:
    return module == "vllm" or module.startswith("vllm.")


def _module_name(relpath: str) -> str:
    return relpath.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _body(node: ast.AST) -> list[ast.stmt]:
    """``node``'s body without its docstring (a first ``Expr`` of a ``str`` constant)."""
    body: list[ast.stmt] = getattr(node, "body", [])
    if body and isinstance(first := body[0], ast.Expr) and isinstance(first.value, ast.Constant):
        return body[1:] if isinstance(first.value.value, str) else body
    return body


def _statements(body: list[ast.stmt], runtime: bool = True) -> Iterator[tuple[ast.stmt, bool]]:
    """The statements of ``body`` and of the ``if``/``try``/``with`` blocks in it, each with
    whether it runs (False under ``if TYPE_CHECKING:``)."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            test = stmt.test
            checking = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
            )
            yield from _statements(stmt.body, runtime and not checking)
            yield from _statements(stmt.orelse, runtime)
        elif isinstance(stmt, (ast.Try, ast.TryStar)):
            for block in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                yield from _statements(block, runtime)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            yield from _statements(stmt.body, runtime)
        else:
            yield stmt, runtime


def _bound(stmt: ast.stmt) -> list[str]:
    """The names a definition or assignment binds (imports are bound apart)."""
    if isinstance(stmt, (*_FUNCTIONS, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, ast.AnnAssign):
        return [stmt.target.id] if isinstance(stmt.target, ast.Name) else []
    targets = list(stmt.targets) if isinstance(stmt, ast.Assign) else []
    names = []
    while targets:  # names, and names inside (starred) tuples and lists; not `a.b = ...`
        target = targets.pop(0)
        if isinstance(target, ast.Name):
            names.append(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            targets[:0] = target.elts
        elif isinstance(target, ast.Starred):
            targets.insert(0, target.value)
    return names


def _members(cls: ast.ClassDef | None, attr: str) -> tuple[ast.stmt, ...]:
    """Every statement of ``cls``'s body binding ``attr``, in order (a property's getter,
    setter, deleter); the runtime ones where there are any."""
    found = [(s, rt) for s, rt in _statements(cls.body if cls else []) if attr in _bound(s)]
    return tuple([s for s, rt in found if rt] or [s for s, _ in found])


def _instance_sets(cls: ast.ClassDef) -> dict[str, list[tuple[str, ast.stmt]]]:
    """Per attribute, ``(method, statement)`` of each ``self.attr = ...`` (or annotated /
    augmented) in the methods of ``cls``, ``self`` being each method's first parameter."""
    out: dict[str, list[tuple[str, ast.stmt]]] = {}
    for fn, _ in _statements(cls.body):
        if not isinstance(fn, _FUNCTIONS) or not fn.args.args:
            continue
        me = fn.args.args[0].arg
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            else:
                continue
            flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            for t in flat:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                    if t.value.id == me:
                        out.setdefault(t.attr, []).append((fn.name, node))
    return out


_ENUM_BASES = frozenset({"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"})


def _enum(cls: _Def) -> bool:
    return any(_last(b) in _ENUM_BASES for b in (cls.cls.bases if cls.cls else []))


def _enum_members(cls: _Def) -> list[str]:
    names = []
    for stmt, _ in _statements(cls.cls.body if cls.cls else []):
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and getattr(stmt, "value", None):
            names += [n for n in _bound(stmt) if not n.startswith("_")]
    return names


def _c3(sequences: list[list[_Def]]) -> list[_Def] | None:
    """C3 merge of the bases' linearizations and the base list; None if there is none."""
    seqs = [list(s) for s in sequences if s]
    out: list[_Def] = []
    while seqs:
        head = next((s[0] for s in seqs if not any(s[0] in t[1:] for t in seqs)), None)
        if head is None:
            return None
        out.append(head)
        seqs = [t for t in (s[1:] if s[0] == head else s for s in seqs) if t]
    return out


def _dotted(expr: ast.expr) -> str:
    """``a.b.c`` of a decorator or base (a call's callee), else its canonical text."""
    if isinstance(expr, ast.Call):
        return _dotted(expr.func)
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return f"{_dotted(expr.value)}.{expr.attr}"
    return canonical(expr)


def _last(expr: ast.expr) -> str:
    return _dotted(expr.value if isinstance(expr, ast.Subscript) else expr).rpartition(".")[2]


def _decorated(cls: _Def) -> bool:
    return any(
        _last(d) in _DATACLASS_DECORATORS for d in (cls.cls.decorator_list if cls.cls else [])
    )


def _field_base(cls: _Def) -> bool:
    return any(_last(b) in _FIELD_BASES for b in (cls.cls.bases if cls.cls else []))


def _fields(cls: _Def) -> dict[str, bool]:
    """The annotated class-level names of ``cls`` (not ``ClassVar``), each: has a default."""
    out = {}
    for stmt in cls.cls.body if cls.cls else []:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            note = stmt.annotation
            text = note.value if isinstance(note, ast.Constant) else _last(note)
            if not re.match(r"(typing\.)?ClassVar\b", str(text)):
                out[stmt.target.id] = stmt.value is not None
    return out


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """Decorators' dotted names, async or not, and each parameter's kind, name and default
    (canonical); no annotations."""
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    params = [
        _param("posonly" if i < len(args.posonlyargs) else "normal", arg, default)
        for i, (arg, default) in enumerate(
            zip(positional, [*defaults, *args.defaults], strict=True)
        )
    ]
    if args.vararg:
        params.append(f"vararg {args.vararg.arg}")
    params += [
        _param("kwonly", a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    ]
    if args.kwarg:
        params.append(f"kwarg {args.kwarg.arg}")
    decorators = "".join(f"@{_dotted(d)} " for d in fn.decorator_list)
    prefix = "async def" if isinstance(fn, ast.AsyncFunctionDef) else "def"
    return f"{decorators}{prefix} {fn.name}({', '.join(params)})"


def _param(kind: str, arg: ast.arg, default: ast.expr | None) -> str:
    return f"{kind} {arg.arg}" + ("" if default is None else f"={canonical(default)}")


def _parts(found: _Def) -> tuple[str, ...]:
    stmts = [s for n in found.nodes for s in (_body(n) if isinstance(n, _BODIED) else [n])]
    return tuple(_sha(canonical(s))[:12] for s in stmts)
