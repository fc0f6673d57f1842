"""MkDocs hooks: the parts of the docs that are generated, not written.

- ``<!-- cli-reference -->``: every ``initpipe`` command's ``--help``, from the real
  parsers (the core's ``initpipe.cli.app.build_parser`` and each delegated command's
  ``build_parser``), so the reference cannot drift from the code.
- ``<!-- benchmarks-json -->``: every row of ``benchmarks.json``.
- the API reference of ``initpipe_vllm``: :func:`on_config` makes its import name resolve.
- ``<!-- stage-table: v1 -->`` / ``<!-- stage-table: mrv2 -->``: the catalog's stages in
  order, from the catalog itself: phase, stage, outputs, the first sentence of its
  docstring, and the vLLM functions it declares it mirrors (``meta["mirrors"]``).

Run by ``mkdocs build`` (``hooks:`` in mkdocs.yml; initpipe_vllm is imported by name: this
file is not part of either package); imports initpipe and initpipe_vllm,
never vLLM or torch.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
from pathlib import Path
from typing import Any

CLI = "<!-- cli-reference -->"
TABLE = re.compile(r"<!-- stage-table: (v1|mrv2) -->")


def _help(parser: argparse.ArgumentParser) -> str:
    os.environ["COLUMNS"] = "96"  # one width, whatever the terminal
    return parser.format_help().rstrip()


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    out: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:  # argparse keeps subcommands there
        if isinstance(action, argparse._SubParsersAction):
            out.update(action.choices)
    return out


def _section(title: str, parser: argparse.ArgumentParser) -> list[str]:
    out = [f"### `{title}`", "", "```text", _help(parser), "```", ""]
    for name, sub in _subparsers(parser).items():
        if title == "initpipe" and name in _delegated():
            continue  # documented from its own parser below
        out += _section(f"{title} {name}", sub)
    return out


def _delegated() -> dict[str, tuple[str, str]]:
    from initpipe.cli.app import DELEGATED

    return DELEGATED


def cli_reference() -> str:
    from initpipe.cli.app import build_parser

    out = _section("initpipe", build_parser())
    for name, (module, _) in _delegated().items():
        mod = importlib.import_module(module)
        parser = getattr(mod, "build_parser", None)
        if parser is None:
            out += [f"### `initpipe {name}`", "", (mod.main.__doc__ or "").strip(), ""]
            continue
        out += _section(f"initpipe {name}", parser())
    return "\n".join(out)


def _first_sentence(doc: str) -> str:
    text = " ".join((doc or "").split())
    head = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    return head.replace("``", "`").replace("|", "\\|")


def stage_table(which: str) -> str:
    module = "initpipe_vllm" if which == "v1" else "initpipe_vllm.mrv2"
    pipeline = importlib.import_module(module).base_catalog()
    rows = ["| phase | stage | outputs | what it does | mirrors in vLLM |", "|---|---|---|---|---|"]
    for name in pipeline.order:
        spec = pipeline.specs[name]
        phase = "model" if spec.needs == "model" else "KV"
        mirrors = ", ".join(f"`{m.split(':', 1)[1]}`" for m in (spec.meta or {}).get("mirrors", ()))
        outputs = ", ".join(f"`{p}`" for p in spec.provides)
        rows.append(f"| {phase} | `{name}` | {outputs} | {_first_sentence(spec.doc)} | {mirrors} |")
    return "\n".join(rows)


BENCH = "<!-- benchmarks-json -->"


def benchmarks_table(root: Path) -> str:
    """Every row of ``benchmarks.json`` (the last full ``make bench``), as a table."""
    data = json.loads((root / "benchmarks.json").read_text())
    m = data.get("machine", {})
    out = [
        f"From `benchmarks.json` ({m.get('date', '?')}, {m.get('cpus', '?')} CPUs, Python "
        f"{m.get('python', '?')}):",
        "",
        "| benchmark | figure | value | target | detail |",
        "|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        met = "" if r.get("met") is None else (" (met)" if r["met"] else " (missed)")
        target = (r.get("target") or "reported") + met
        value = f"{r['value']:.4g} {r['unit']}"
        cells = [r["bench"], r["name"], value, target, r.get("detail", "")]
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out)


def on_config(config: Any) -> Any:
    """mkdocstrings reads sources by import name, and ``initpipe_vllm`` lives in ``stages/``
    (``[tool.setuptools.package-dir]``): give it a folder where the name resolves."""
    root = Path(config["config_file_path"]).parent
    names = root / ".docs-api"
    names.mkdir(exist_ok=True)
    link = names / "initpipe_vllm"
    if not link.is_symlink():
        link.symlink_to(root / "stages", target_is_directory=True)
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if CLI in markdown:
        markdown = markdown.replace(CLI, cli_reference())
    if BENCH in markdown:
        root = Path(config["config_file_path"]).parent
        markdown = markdown.replace(BENCH, benchmarks_table(root))
    return TABLE.sub(lambda m: stage_table(m.group(1)), markdown)
