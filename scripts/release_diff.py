"""The porting checklist: vLLM's own diff of each declared function a new release changed.

    python scripts/release_diff.py OLD NEW [--out DIR]

``OLD`` and ``NEW`` are vLLM sources as ``initpipe doctor --source`` takes them (a
site-packages folder, a folder holding ``vllm/``, or a ``.whl``). Runs the doctor on ``NEW``
(compared with the locks initpipe ships, i.e. with ``OLD``'s release), and for every declared
name that is not ``identical`` prints the unified diff of its source between ``OLD`` and
``NEW`` (a class, a function or a method, found by its qualified name), with the initpipe
functions and stages it affects. ``--out DIR`` also writes one ``.diff`` file per name.
A maintainers' tool (docs/maintainers/porting.md: Porting to a new vLLM release); reads files only,
imports no vLLM.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import sys
from pathlib import Path
from typing import Any

# the installed package's name (mypy reads stages/ as ``stages``): imported by name
contract_report: Any = importlib.import_module("initpipe_vllm.contract.report")
contract_source: Any = importlib.import_module("initpipe_vllm.contract.source")

NO_TEXT = "no textual difference in its own source: a base class, field or re-export changed"


def segment(source: Any, dotted: str) -> str | None:
    """The source text of ``module:Qual.name`` in ``source``, or None where it is not."""
    module, _, qual = dotted.partition(":")
    base = module.replace(".", "/")
    for rel in (f"{base}.py", f"{base}/__init__.py"):
        raw = source.read(rel)
        if raw is None:
            continue
        text = raw.decode()
        node: ast.AST = ast.parse(text)
        for part in qual.split("."):
            found = [
                n
                for n in ast.iter_child_nodes(node)
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                and n.name == part
            ]
            if not found:
                return None
            node = found[-1]
        return ast.get_source_segment(text, node)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="release_diff.py", description=__doc__.split("\n")[0])
    parser.add_argument("old", type=Path, help="the locked release's vLLM source")
    parser.add_argument("new", type=Path, help="the new release's vLLM source")
    parser.add_argument("--out", type=Path, help="also write NAME.diff files here")
    args = parser.parse_args(argv)
    try:
        old, new = contract_source.open_source(args.old), contract_source.open_source(args.new)
    except contract_source.VllmSourceError as err:
        print(f"Error: {err}", file=sys.stderr)
        return 2
    report = contract_report.compare(new)
    todo = sorted({(e.name, e.status) for e in report.functions if e.status != "identical"})
    affects: dict[str, set[str]] = {}
    for e in report.functions:
        affects.setdefault(e.name, set()).update(e.affects)
    print(f"# vllm {old.version} -> {new.version}: {len(todo)} declared names differ")
    for name, status in todo:
        a, b = segment(old, name) or "", segment(new, name) or ""
        diff = "".join(
            difflib.unified_diff(
                a.splitlines(True),
                b.splitlines(True),
                f"{old.version}/{name}",
                f"{new.version}/{name}",
            )
        )
        print(f"\n## {status} {name}\n# affects: {', '.join(sorted(affects[name]))}")
        print(diff or f"# {NO_TEXT}")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{name.replace(':', '__')}.diff").write_text(diff)
    return 0


if __name__ == "__main__":
    sys.exit(main())
