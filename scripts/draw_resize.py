"""Draw a KV cache shrink's blocks and memory, before and after: docs/images/resize.svg.

    python scripts/draw_resize.py [-o docs/images/resize.svg] [--dot]

The scenario is fixed: the tiny Llama that ships with initpipe (``stages/models/tiny-llama``,
float32, vLLM's CPU block size of 128 tokens) runs with 16 KV blocks; requests filled and
released blocks 1 to 10, oldest first, so they sit in the prefix cache; blocks 11 to 15
were never used; block 0 is vLLM's null block. It is shrunk to 8 blocks, keeping the
prefix cache. What the new cache keeps, and at which block id, is what the resize itself
computes: ``initpipe_vllm.live.carry.pool.plan_carry`` on that pool. The bytes of a block are
the model's (layers, KV heads, head size), so the picture cannot drift from the code:
tests/test_docs_pictures_resize.py fails while the committed picture differs from what
this draws. Needs Graphviz's ``dot``; imports no vLLM.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import draw_common

# the installed package's name (mypy reads stages/ as ``stages``): imported by name
carry: Any = importlib.import_module("initpipe_vllm.live.carry.pool")

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "images" / "resize.svg"
MODEL = ROOT / "stages" / "models" / "tiny-llama" / "config.json"

BLOCK_SIZE = 128  # tokens a block: vLLM's default on CPU
DTYPE_BYTES = 4  # float32
BEFORE, AFTER = 16, 8  # blocks
USED = tuple(range(1, 11))  # cached blocks, least recently used first
KIB, MIB = 1 << 10, 1 << 20

COLORS = {"null": "#d9d9d9", "free": "#ffffff", "kept": "#cfe3f7", "evicted": "#f6d2c8"}


def block_bytes() -> int:
    """One KV block's bytes on one rank: a key and a value per layer, KV head and token."""
    cfg = json.loads(MODEL.read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim
    return int(per_token) * BLOCK_SIZE * DTYPE_BYTES


def scenario() -> tuple[Any, Any]:
    """The pool before (``carry.PoolState``) and what the shrink keeps (``carry.CarryPlan``)."""
    never_used = tuple(b for b in range(1, BEFORE) if b not in USED)
    state = carry.PoolState(
        num_blocks=BEFORE,
        queue=never_used + USED,  # vLLM's free queue: evicted from the front
        primary={b: (f"prefix-{b}", BLOCK_SIZE) for b in USED},
        extras={},
        entries=tuple((f"prefix-{b}", (b,)) for b in USED),
    )
    return state, carry.plan_carry(state, AFTER)


def _size(n: int) -> str:
    return f"{n / MIB:g} MiB" if n >= MIB and n % (MIB // 8) == 0 else f"{n / KIB:g} KiB"


def _row(name: str, cells: list[tuple[str, str, str]], title: str, where: str) -> str:
    tds = "".join(
        f'<td port="b{port}" bgcolor="{COLORS[kind]}" width="34" height="30">{text}</td>'
        for port, kind, text in cells
    )
    return (
        f"  subgraph cluster_{name} {{ label=<<b>{title}</b>>; labeljust=l; "
        f'labelloc={where}; color="#ffffff";\n'
        f'    {name} [label=<<table border="0" cellborder="1" cellspacing="0" cellpadding="4">'
        f"<tr>{tds}</tr></table>>];\n  }}"
    )


def dot_source() -> str:
    state, plan = scenario()
    size = block_bytes()
    kept = dict(plan.moves)  # old id -> new id
    evicted = set(plan.evicted)
    rank = {b: i + 1 for i, b in enumerate(state.cached)}  # 1: least recently used

    def before(b: int) -> tuple[str, str, str]:
        if b == 0:
            return (str(b), "null", "0")
        if b in kept:
            return (str(b), "kept", f"{b}<br/><font point-size='8'>#{rank[b]}</font>")
        if b in evicted:
            return (str(b), "evicted", f"<s>{b}</s><br/><font point-size='8'>#{rank[b]}</font>")
        return (str(b), "free", str(b))

    new_of = {n: o for o, n in plan.moves}

    def after(b: int) -> tuple[str, str, str]:
        if b == 0:
            return (str(b), "null", "0")
        if b in new_of:
            return (str(b), "kept", f"{b}<br/><font point-size='8'>#{rank[new_of[b]]}</font>")
        return (str(b), "free", str(b))

    peak = max(BEFORE, AFTER) * size + len(kept) * size
    title_before = (
        f"before: {BEFORE} blocks x {_size(size)} = {_size(BEFORE * size)} per rank, "
        f"{len(state.cached)} cached"
    )
    title_after = (
        f"after resize_kv_cache(llm, num_blocks={AFTER}): {AFTER} blocks = "
        f"{_size(AFTER * size)} per rank, {len(kept)} kept, {len(evicted)} evicted"
    )
    out = [
        "digraph resize {",
        '  graph [rankdir=TB, fontname="Helvetica", fontsize=11, nodesep=0.3, ranksep=0.6];',
        '  node [shape=plain, fontname="Helvetica", fontsize=11];',
        '  edge [color="#3d6fa8", arrowsize=0.6];',
        _row("before", [before(b) for b in range(BEFORE)], title_before, "t"),
        _row("after", [after(b) for b in range(AFTER)], title_after, "b"),
    ]
    for old, new in plan.moves:
        out.append(f"  before:b{old}:s -> after:b{new}:n;")
    legend = (
        f"kept: the {len(kept)} most recently used cached blocks (#{rank[plan.old_ids[0]]}"
        f" to #{rank[plan.old_ids[-1]]}; #1 is the least recently used), copied aside and "
        'back;<br align="left"/>'
        f"evicted: the {len(evicted)} least recently used, as vLLM evicts; "
        f'block 0 is vLLM\'s null block.<br align="left"/>'
        f"peak during the resize: the larger cache plus the kept blocks = "
        f"{_size(BEFORE * size)} + {_size(len(kept) * size)} = {_size(peak)} per rank"
        '<br align="left"/>'
    )
    out += [
        f"  legend [label=<<font point-size='10'>{legend}</font>>];",
        "  after -> legend [style=invis];",
        "}",
    ]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    return draw_common.main("draw_resize", __doc__ or "", dot_source, OUT, argv)


if __name__ == "__main__":
    raise SystemExit(main())
