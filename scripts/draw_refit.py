"""Draw a weight refit's steps: docs/images/refit.svg.

    python scripts/draw_refit.py [-o docs/images/refit.svg]

The steps, their order and where a failure stops being a refusal come from the refit's own
step lists (``initpipe_vllm.live.refit.engine``: ``REFIT``, ``REFIT_RELEASED`` and the
transaction driver's rules), so the picture cannot drift from the code: a step the code
gains without a line in :data:`WHAT` here stops this script, and
tests/test_docs_pictures_refit.py fails while the committed picture differs from what this
draws. Needs Graphviz's ``dot``; imports no vLLM.
"""

from __future__ import annotations

import importlib
import itertools
from pathlib import Path
from typing import Any

import draw_common

# the installed package's name (mypy reads stages/ as ``stages``): imported by name
refit_core: Any = importlib.import_module("initpipe_vllm.live.refit.engine")

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "images" / "refit.svg"

#: What each step does, in a few words (the receipt's step names). ``plan`` is
#: ``refit_core.prepare``, which runs before the transaction; the others are its steps.
WHAT = {
    "plan": "check the weights, engine,\nKV size and memory",
    "pause": "stop admitting requests\n(wait or abort)",
    "teardown": "release the KV cache\non every rank",
    "load": "vLLM's reload_weights,\nin place, every rank;\ntied heads re-derived",
    "verify": "compare with the fresh\nload: coverage, ties",
    "digest": "sha256 of what each\nrank loaded",
    "kv_phase": "a new KV cache\n(default: the old size)",
    "warmup": "vLLM's warm-up\non the new cache",
    "scheduler": "a fresh block pool,\nempty prefix cache",
    "caches": "empty every cache from\nthe old weights, check it",
    "probe": "serve fixed prompts:\ncold = warm",
}


def steps() -> tuple[list[str], list[str], str]:
    """The refusal steps, the fail-closed steps (in order) and where a refit of an engine
    with no KV cache (released, or failed) starts, from the code."""
    refit, released = refit_core.REFIT, refit_core.REFIT_RELEASED
    names = [s.name for s in refit.steps]
    # the driver undoes the failed step and every completed one: from the first step with
    # an undo on, every failure runs it (the refit's undo is its fail-closed one)
    first = next(i for i, s in enumerate(refit.steps) if s.undo is not None)
    if refit.steps[first].undo.__name__ != "_fail_closed":
        raise SystemExit(f"the refit's undo is not _fail_closed but {refit.steps[first].undo}")
    if first != 0:
        raise SystemExit(f"steps before {names[first]!r} have no undo: update this drawing")
    entry = released.steps[0].name
    if [s.name for s in released.steps] != names[names.index(entry) :]:
        raise SystemExit("REFIT_RELEASED is no longer REFIT's tail: update this drawing")
    checks = ["plan", refit.pause.name]
    unknown = [n for n in checks + names if n not in WHAT]
    if unknown:
        raise SystemExit(f"steps with no description in scripts/draw_refit.py WHAT: {unknown}")
    return checks, names, entry


def _node(name: str, color: str) -> str:
    label = f"<<b>{name}</b><br/>" + WHAT[name].replace("\n", "<br/>") + ">"
    label = label.replace("&", "&amp;").replace("'", "&#39;")
    return f'  "{name}" [label={label}, fillcolor="{color}"];'


def dot_source() -> str:
    checks, changes, entry = steps()
    out = [
        "digraph refit {",
        '  graph [rankdir=TB, fontname="Helvetica", fontsize=12, nodesep=0.35, ranksep=0.3,'
        " compound=true, newrank=true];",
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=11, width=2.3];',
        '  edge [fontname="Helvetica", fontsize=10];',
        '  start [label="ip.refit(llm, weights)\\nPOST /initpipe/weights/refit",'
        ' shape=plain, style=""];',
        "  subgraph cluster_checks {",
        '    label="a failure here is a refusal:\\nnothing changed"; style="rounded,dashed";'
        ' color="#5b8c5a"; fontcolor="#3d6b3c";',
        *("  " + _node(n, "#e4f1e3") for n in checks),
        "  }",
        "  subgraph cluster_changes {",
        '    label="a failure here fails closed"; style="rounded,dashed";'
        ' color="#b5533c"; fontcolor="#8a3a26";',
        *("  " + _node(n, "#fbe9e4") for n in changes),
        "  }",
        "  serving [label=<<b>commit</b><br/>serve the new weights;<br/>answer the receipt>,"
        ' fillcolor="#dfe9f7", shape=box];',
        "  refused [label=<<b>RefitRefusedError</b><br/>serves on with<br/>the old weights>,"
        ' fillcolor="white", color="#5b8c5a"];',
        "  failed [label=<<b>RefitError</b><br/>KV cache dropped; every request<br/>"
        "refused (HTTP 503) until<br/>a refit succeeds>, "
        'fillcolor="white", color="#b5533c"];',
    ]
    chain = ["start", *checks, *changes, "serving"]
    out += [f'  "{a}" -> "{b}";' for a, b in itertools.pairwise(chain)]
    out += [
        f'  "{checks[-1]}" -> refused [ltail=cluster_checks, style=dashed, color="#5b8c5a",'
        ' label=" fails"];',
        f'  "{changes[-1]}" -> failed [ltail=cluster_changes, style=dashed, color="#b5533c",'
        ' label=" fails"];',
        f'  "{checks[-1]}" -> "{entry}" [style=dotted, constraint=false,'
        ' label=" no KV cache (released,\\l or failed closed):\\l no teardown\\l"];',
        f'  {{ rank=same; "{checks[-1]}"; refused; }}',
        f'  {{ rank=same; "{changes[-1]}"; failed; }}',
        "}",
    ]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    return draw_common.main("draw_refit", __doc__ or "", dot_source, OUT, argv)


if __name__ == "__main__":
    raise SystemExit(main())
