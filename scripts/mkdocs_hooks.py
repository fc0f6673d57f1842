"""MkDocs hooks: the parts of the docs that are generated, not written.

- ``<!-- cli-reference -->``: every ``initpipe`` command's ``--help``, from the real
  parsers (the core's ``initpipe.cli.app.build_parser`` and each delegated command's
  ``build_parser``), so the reference cannot drift from the code.
- ``<!-- benchmarks-json -->``: every row of ``benchmarks.json``.
- the API reference of ``initpipe_vllm``: :func:`on_config` makes its import name resolve.
- ``<!-- stage-table: v1 -->`` / ``<!-- stage-table: mrv2 -->``: the catalog's stages in
  order, from the catalog itself: phase, stage, outputs, the first sentence of its
  docstring, and the vLLM functions it declares it mirrors (``meta["mirrors"]``).
- ``<!-- errors: MODULE Name ... -->``: those error classes of MODULE, from the classes
  themselves: bases, the docstring's first paragraph, the attributes it lists.
- ``<!-- startup-phases -->`` / ``<!-- startup-probes -->``: the start-up report's phases
  with what counts in each, and its probes, from ``initpipe_vllm.tools.startup_report`` and
  ``initpipe_vllm.hook.probes``.
- ``<!-- http-routes -->`` / ``<!-- http-answers -->`` / ``<!-- http-refusals -->``: every
  HTTP route the middleware answers (method, path, body fields, answer), each answer's
  fields, and a refusal's status by step, from ``initpipe_vllm.serve.routes``.

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
    """Every row of ``benchmarks.json`` (the last ``make bench``, with the benchmarks run
    since by ``--only``), as a table with the date of the run behind each benchmark."""
    data = json.loads((root / "benchmarks.json").read_text())
    m = data.get("machine", {})
    runs = data.get("runs", {})
    out = [
        f"From `benchmarks.json` ({m.get('cpus', '?')} CPUs, Python {m.get('python', '?')}; "
        "each benchmark's rows from one run, dated in the first column):",
        "",
        "| benchmark | figure | value | target | detail |",
        "|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        date = runs.get(r["bench"], m).get("date", "?")
        met = "" if r.get("met") is None else (" (met)" if r["met"] else " (missed)")
        target = (r.get("target") or "reported") + met
        value = f"{r['value']:.4g} {r['unit']}"
        cells = [f"{r['bench']} ({date})", r["name"], value, target, r.get("detail", "")]
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out)


STARTUP_PHASES = "<!-- startup-phases -->"
STARTUP_PROBES = "<!-- startup-probes -->"


def startup_phases() -> str:
    """The report's phases in order, with the vLLM spans, named intervals and probes that
    count in each (the report's own tables)."""
    report = importlib.import_module("initpipe_vllm.tools.startup_report")
    probes = importlib.import_module("initpipe_vllm.hook.probes")
    rows = ["| phase | vLLM spans | initpipe's named intervals | probes |", "|---|---|---|---|"]
    timed = {
        "imports and config": "every import of 1 ms or more",
        "garbage collection": "every collection of 1 ms or more",
    }
    for phase in report.PHASES:
        spans = [n for n, ph in report.SPAN_PHASES.items() if ph == phase]
        names = [n for n, ph in report.INTERVAL_PHASES.items() if ph == phase]
        probed = list(dict.fromkeys(p.name for p in probes.PROBES if p.phase == phase))
        probed += [timed[phase]] if phase in timed else []
        cells = [", ".join(f"`{n}`" for n in c) for c in (spans, names)]
        cells.append(", ".join(f"`{n}`" if n.split()[0] != "every" else n for n in probed))
        rows.append(f"| {phase} | " + " | ".join(c or "-" for c in cells) + " |")
    return "\n".join(rows)


def startup_probes() -> str:
    """Every function probe: its span's name, phase, what it names, and where it lives."""
    probes = importlib.import_module("initpipe_vllm.hook.probes")
    rows = ["| span | phase | what it names | vLLM module |", "|---|---|---|---|"]
    for p in probes.PROBES:
        why = p.why.replace("|", "\\|")
        rows.append(f"| `{p.name}` | {p.phase} | {why} | `{p.module}` |")
    return "\n".join(rows)


ERRORS = re.compile(r"<!-- errors: ([\w.]+) ([\w ]+?) -->")


def errors_table(module: str, names: list[str]) -> str:
    """``<!-- errors: MODULE Name Name ... -->``: each error class's direct bases, the first
    paragraph of its docstring and the attributes its ``Attributes:`` section lists."""
    import inspect

    mod = importlib.import_module(module)
    rows = ["| error | catch it as | what it means | attributes |", "|---|---|---|---|"]
    for name in names:
        cls = getattr(mod, name)
        doc = inspect.getdoc(cls) or ""
        head, _, rest = doc.partition("Attributes:")
        summary = " ".join(head.split("\n\n", 1)[0].split()).replace("``", "`")
        summary = re.sub(r":(?:class|func|mod|data|meth):`~?([^`]+)`", r"`\1`", summary)
        fields = re.findall(r"^    ([\w /]+?):", rest, flags=re.M)
        attrs = ", ".join(f"`.{f.strip()}`" for fs in fields for f in fs.split("/"))
        bases = ", ".join(f"`{b.__name__}`" for b in cls.__bases__)
        cells = [f"`{name}`", bases, summary, attrs or "-"]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


HTTP = re.compile(r"<!-- http-(routes|answers|refusals) -->")
#: What each route's call answers (the route table names the call; a new call needs a line).
HTTP_ANSWERS = {
    "_info": "initpipe_vllm.live.resize.report:KVCacheInfo",
    "_resize": "initpipe_vllm.live.resize.report:ResizeReport",
    "_release": "initpipe_vllm.live.resize.report:ResizeReport",
    "_resume": "initpipe_vllm.live.resize.report:ResizeReport",
    "weights_info": "initpipe_vllm.live.refit.receipt:WeightsInfo",
    "refit": "initpipe_vllm.live.refit.receipt:RefitReceipt",
}


def _answer(path: str, route: Any) -> tuple[str, type]:
    where = HTTP_ANSWERS.get(route.call.__name__)
    if where is None:
        raise KeyError(f"route {path}: add its answer to HTTP_ANSWERS in mkdocs_hooks.py")
    module, name = where.split(":")
    return name, getattr(importlib.import_module(module), name)


def http_table(part: str) -> str:
    """From the middleware's route table (``initpipe_vllm.serve.routes``): ``routes``, one
    row a route; ``answers``, each answer's fields; ``refusals``, a refusal's status by the
    step that refused (``REFUSED_STATUS``)."""
    import attrs

    routes = importlib.import_module("initpipe_vllm.serve.routes")
    if part == "refusals":
        rows = ["| a refusal at step | status |", "|---|---|"]
        for step, status in routes.REFUSED_STATUS.items():
            rows.append(f"| `{step}` | {int(status)} {status.phrase} |")
        return "\n".join(rows)
    if part == "answers":
        answers = dict(_answer(p, r) for p, r in routes.ROUTES.items())
        rows = ["| answer | fields |", "|---|---|"]
        for name, cls in answers.items():
            fields = ", ".join(f"`{f.name}`" for f in attrs.fields(cls))
            rows.append(f"| `{name}` | {fields} |")
        return "\n".join(rows)
    rows = ["| method | path | body fields (a JSON object) | answer |", "|---|---|---|---|"]
    for path, route in routes.ROUTES.items():
        body = ", ".join(f"`{f}`" for f in route.fields) or "none"
        rows.append(f"| {route.method} | `{path}` | {body} | `{_answer(path, route)[0]}` |")
    return "\n".join(rows)


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
    if STARTUP_PHASES in markdown:
        markdown = markdown.replace(STARTUP_PHASES, startup_phases())
    if STARTUP_PROBES in markdown:
        markdown = markdown.replace(STARTUP_PROBES, startup_probes())
    markdown = ERRORS.sub(lambda m: errors_table(m.group(1), m.group(2).split()), markdown)
    markdown = HTTP.sub(lambda m: http_table(m.group(1)), markdown)
    return TABLE.sub(lambda m: stage_table(m.group(1)), markdown)
