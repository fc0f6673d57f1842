"""The tree shows the architecture: imports point down, never in a circle.

The import graph is read from the source with ``ast`` (every import: module level, inside
functions, under ``TYPE_CHECKING``), so a lazy import that closes a circle counts too.
Layers, lowest first:

- ``initpipe``: core (``initpipe``, ``initpipe._*``, ``errors``, ``files``, ``testing``)
  <- ``initpipe.view`` <- ``initpipe.cli``;
- ``initpipe_vllm``: the catalog level <- ``contract`` (what the catalogs mirror of vLLM,
  and the check; ``compat``, the vLLM calls that move between releases bound once and
  declared through the contract, sits beside it) <- ``hook`` (with the
  ``worker``/``runner`` re-exports) <- ``live`` <- ``serve`` <- ``testing`` (with the
  ``pytest_plugin`` re-export) <- ``tools``;
- the live package, in its own order: its ``core`` (the driver, the engine-core entry,
  the rank side) <- the ``frontend`` <- the ``carry`` room <- the ``resize`` and ``refit``
  rooms, siblings that never import each other <- ``api`` (every public name), the
  ``plugin`` and the package;
- the catalog level, in its own order: the leaves (``errors``, ``vllm_names``)
  <- the shared machinery (``catalogs``, the ``releases`` index) <- the catalogs, siblings
  (``v1``, ``mrv2``: one may import the other's stage modules to re-spec a shared body,
  never its package, and never both ways) <- the release modules (``releases.v0_32_0``:
  overlays on the catalogs' stages) <- the facade (the package ``initpipe_vllm`` itself,
  which defines nothing: it re-exports);
- one exception, declared in :data:`FACADES`: the package ``initpipe_vllm`` re-exports the
  public resize and refit API from ``live.api`` lazily (PEP 562 ``__getattr__``). Imports inside a
  facade's module-level ``__getattr__`` run only when the name is looked up, never at
  import time, so they are left out of the graph; the test checks the names resolve;
- ``initpipe`` never imports ``initpipe_vllm`` (the CLI names it only as strings).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"initpipe": ROOT / "initpipe", "initpipe_vllm": ROOT / "stages"}


def _modules() -> dict[str, Path]:
    found = {}
    for name, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [name, *rel.parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_package(mod: str) -> bool:
    return MODULES[mod].name == "__init__.py"


#: Packages whose module-level ``__getattr__`` lazily re-exports names from higher layers,
#: and the attribute listing those names.
FACADES = {"initpipe_vllm": "RESIZE_API"}


def _lazy_nodes(mod: str, tree: ast.Module) -> set[int]:
    """ids of the nodes inside a facade's module-level ``__getattr__``."""
    if mod not in FACADES:
        return set()
    return {
        id(node)
        for fn in tree.body
        if isinstance(fn, ast.FunctionDef) and fn.name == "__getattr__"
        for node in ast.walk(fn)
    }


def _imports(mod: str) -> set[str]:
    """Internal modules that ``mod`` imports, anywhere in its source (except a facade's
    lazy re-exports)."""
    tree = ast.parse(MODULES[mod].read_text())
    base = mod if _is_package(mod) else mod.rpartition(".")[0]
    lazy = _lazy_nodes(mod, tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in lazy:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                target = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            # `from pkg import sub` imports the submodule when there is one
            names = [
                f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target
                for a in node.names
            ]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != mod:
                out.add(name)
    return out


def _graph() -> nx.DiGraph:
    g = nx.DiGraph()
    for mod in MODULES:
        g.add_node(mod)
        for dep in _imports(mod):
            g.add_edge(mod, dep)
    return g


#: ``initpipe_vllm``'s layers, lowest first: (pattern, (layer, order inside the layer)).
#: No catch-all: a new module at the catalog level must be placed here.
VLLM_LAYERS = [
    (r"initpipe_vllm\.tools\b", (6, 0)),
    (r"initpipe_vllm\.(testing|pytest_plugin)\b", (5, 0)),
    (r"initpipe_vllm\.(serve|integrations)\b", (4, 0)),
    (r"initpipe_vllm\.live(\.plugin|\.api)?$", (3, 4)),
    (r"initpipe_vllm\.live\.(resize|refit)\b", (3, 3)),
    (r"initpipe_vllm\.live\.carry\b", (3, 2)),
    (r"initpipe_vllm\.live\.frontend$", (3, 1)),
    (r"initpipe_vllm\.live\.core\b", (3, 0)),
    (r"initpipe_vllm\.(hook|worker|runner)\b", (2, 0)),
    (r"initpipe_vllm\.(contract|compat)\b", (1, 0)),
    (r"initpipe_vllm\.releases\.\w+$", (0, 3)),
    (r"initpipe_vllm\.(v1|mrv2)\b", (0, 2)),
    (r"initpipe_vllm\.(catalogs|releases)$", (0, 1)),
    (r"initpipe_vllm\.(errors|vllm_names|_import_time)$", (0, 0)),
    (r"initpipe_vllm\.real_model$", (0, 1)),  # the real model's cache: errors only
    (r"initpipe_vllm$", (0, 4)),
]
#: The catalog packages: siblings at the catalog level.
CATALOGS = ("initpipe_vllm.v1", "initpipe_vllm.mrv2")


def _layer(mod: str) -> tuple[int, tuple[int, int]]:
    """(package, layer): a module may import only its own package's layers at or below."""
    if mod.startswith("initpipe_vllm"):
        found = [n for pat, n in VLLM_LAYERS if re.match(pat, mod)]
        assert found, f"{mod} has no layer: place it in VLLM_LAYERS"
        return 1, found[0]
    rules = [(r"initpipe\.cli\b", 2), (r"initpipe\.view\b", 1), (r"initpipe\b", 0)]
    return 0, (next(n for pat, n in rules if re.match(pat, mod)), 0)


def test_the_import_graph_is_read() -> None:
    g = _graph()
    # a few known edges, so a broken reader cannot pass the checks below by seeing nothing
    assert ("initpipe._pipeline", "initpipe._run") in g.edges
    assert ("initpipe.cli.graph", "initpipe.view.export") in g.edges
    assert ("initpipe_vllm.worker", "initpipe_vllm.hook.worker") in g.edges
    assert ("initpipe_vllm.v1.kv_phase", "initpipe") in g.edges
    assert ("initpipe_vllm.mrv2.kv_phase", "initpipe_vllm.v1.kv_phase") in g.edges
    assert ("initpipe_vllm", "initpipe_vllm.catalogs") in g.edges
    assert g.number_of_edges() > 80


def test_no_import_circles() -> None:
    cycles = sorted(nx.simple_cycles(_graph()))
    assert cycles == [], "\n".join(" -> ".join([*c, c[0]]) for c in cycles)


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_imports_point_down(mod: str) -> None:
    package, layer = _layer(mod)
    up = sorted(
        dep for dep in _imports(mod) if _layer(dep)[0] == package and _layer(dep)[1] > layer
    )
    assert up == [], f"{mod} imports a higher layer: {up}"


def test_every_module_has_a_layer() -> None:
    for mod in MODULES:
        _layer(mod)  # fails naming the module


def _catalog_of(mod: str) -> str | None:
    return next((c for c in CATALOGS if mod == c or mod.startswith(c + ".")), None)


def test_the_catalogs_are_siblings() -> None:
    """A catalog may import another's stage modules (to re-spec a shared body), never its
    package (its CatalogDef), and no two catalogs import each other."""
    crossing = {
        (_catalog_of(m), d)
        for m, d in _graph().edges
        if _catalog_of(m) and _catalog_of(d) and _catalog_of(m) != _catalog_of(d)
    }
    assert [d for _, d in crossing if d in CATALOGS] == []
    pairs = {(src, _catalog_of(d)) for src, d in crossing}
    assert [(a, b) for a, b in pairs if (b, a) in pairs] == []


#: The live package's rooms (siblings: none imports another's modules, only the core,
#: the frontend and, for the resize, the carry below them).
LIVE_ROOMS = ("initpipe_vllm.live.resize", "initpipe_vllm.live.refit")


def _room_of(mod: str) -> str | None:
    return next((r for r in LIVE_ROOMS if mod == r or mod.startswith(r + ".")), None)


def test_the_live_rooms_are_siblings() -> None:
    crossing = sorted(
        (m, d)
        for m, d in _graph().edges
        if _room_of(m) and _room_of(d) and _room_of(m) != _room_of(d)
    )
    assert crossing == []
    # the rooms exist and import the core (a renamed package cannot pass by being empty)
    for room in LIVE_ROOMS:
        assert any(
            _room_of(m) == room and d.startswith("initpipe_vllm.live.core.")
            for m, d in _graph().edges
        ), room


def test_the_root_package_is_only_a_facade() -> None:
    """``initpipe_vllm/__init__.py`` defines no function but the lazy ``__getattr__``, no
    class and no stage: the catalogs live in their folders, the machinery in catalogs.py."""
    tree = ast.parse(MODULES["initpipe_vllm"].read_text())
    defined = [
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.name != "__getattr__"
    ]
    assert defined == []


@pytest.mark.parametrize("facade", sorted(FACADES))
def test_a_facades_lazy_names_resolve(facade: str) -> None:
    import importlib

    module = importlib.import_module(facade)
    names = getattr(module, FACADES[facade])
    assert names, f"{facade}.{FACADES[facade]} is empty"
    for name in names:
        assert getattr(module, name) is not None
        assert name in module.__all__


def test_initpipe_never_imports_initpipe_vllm() -> None:
    bad = sorted(
        (m, d)
        for m, d in _graph().edges
        if (m == "initpipe" or m.startswith("initpipe.")) and d.startswith("initpipe_vllm")
    )
    assert bad == []


@pytest.mark.parametrize("mod", sorted(m for m in MODULES if _is_package(m)))
def test_every_package_says_what_belongs_in_it(mod: str) -> None:
    doc = ast.get_docstring(ast.parse(MODULES[mod].read_text())) or ""
    assert len(doc.split()) >= 20, f"{MODULES[mod]} needs a docstring saying what belongs there"


#: The pages a reader is sent to: the README and the docs site.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_path_the_docs_name_exists() -> None:
    pattern = r"`((?:initpipe|initpipe_vllm|stages|tests|benchmarks|examples|docs)/[\w./-]*[\w/])"
    named = {
        (str(page.relative_to(ROOT)), p)
        for page in PAGES
        for p in re.findall(pattern, page.read_text())
    }
    assert len(named) > 10
    missing = sorted((page, p) for page, p in named if not (ROOT / p).exists())
    assert missing == []


def test_the_layout_lists_every_folder() -> None:
    guide = (ROOT / "docs" / "maintainers" / "index.md").read_text()
    layout = guide.split("## Layout", 1)[1].split("\n## ", 1)[0]
    folders = sorted(
        str(p.parent.relative_to(ROOT)) + "/"
        for folder in PACKAGES.values()
        for p in folder.rglob("__init__.py")
    )
    missing = [f for f in folders if f not in layout]
    assert missing == []


def test_the_readme_starts_with_the_two_commands_and_fits_on_three_screens() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150
    first = lines[: lines.index("```", 3) + 1]
    assert first[2].startswith("```")
    commands = [line.split("#")[0].strip() for line in first[3:-1]]
    assert commands == ["make run", "make test"]


def test_every_docs_page_is_in_the_site_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert [p for p in pages if f": {p}\n" not in nav] == []
