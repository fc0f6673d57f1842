"""The fenced code examples of the README and the docs pages (importable: tests/ is on
sys.path), for the tests that run them.

An example that cannot run in the suite says why on the line before its fence::

    <!-- illustrative: starts vLLM on a GPU -->
    ```bash
    ...

The README's first block, its two set-up commands, is illustrative without a marker (the
README starts with them, nothing before). Another test may run an example itself (the
pytest plugin's test runs the stage author's file from docs/how-to/test-stage.md): it says
so with ``<!-- run-by: tests/... -->``. A how-to example shows what it prints: the example is marked
``<!-- run-by: tests/test_docs_outputs.py -->`` and the ``text`` block after it
``<!-- output: ... -->``; that test runs the one and compares its output with the other. A
block marked ``<!-- file: NAME -->`` before such an example is written to ``NAME`` in the
example's folder first (a test file the example runs, say).
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_MARK = re.compile(r"<!--\s*(illustrative|run-by|output|file):\s*(.+?)\s*-->")


@attrs.frozen
class Block:
    """One fenced example: where it is, its language, its code, and why it is not run
    here (``marker``: ``("illustrative", reason)``, ``("run-by", test)`` or None)."""

    page: str
    line: int
    lang: str
    code: str
    marker: tuple[str, str] | None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


#: An opening fence: its indent and info string (the language word, maybe more, or none).
_FENCE = re.compile(r"^(\s*)```(.*)$")


def blocks(pages: list[Path] | None = None) -> list[Block]:
    """Every fenced block of ``pages`` (default: the README and docs/), in page order.

    A fence with no language word is kept with ``lang=""``: the docs test refuses it rather
    than letting an example go unchecked. Raises ValueError naming the page and line of a
    fence that is never closed.
    """
    out = []
    for page in pages or PAGES:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = _FENCE.match(lines[i])
            if not m:
                i += 1
                continue
            start = i
            end = next(
                (j for j in range(i + 1, len(lines)) if lines[j].lstrip().startswith("```")),
                None,
            )
            if end is None:
                msg = f"{page.relative_to(ROOT)}:{start + 1}: a fence that is never closed"
                raise ValueError(msg)
            prev = lines[start - 1] if start > 0 else ""
            mark = _MARK.search(prev)
            marker = (mark.group(1), mark.group(2)) if mark else None
            if page.name == "README.md" and not out and marker is None:
                # the README starts with exactly its two set-up commands, nothing before
                marker = (
                    "illustrative",
                    "the set-up commands (make run installs vLLM; make test is the suite itself)",
                )
            out.append(
                Block(
                    page=str(page.relative_to(ROOT)),
                    line=start + 1,
                    lang=(m.group(2).split() or [""])[0],
                    code="\n".join(_dedent(lines[start + 1 : end], len(m.group(1)))) + "\n",
                    marker=marker,
                )
            )
            i = end + 1
    return out


def _dedent(lines: list[str], indent: int) -> list[str]:
    """The lines of a fence indented by ``indent`` (in a list item), without that indent."""
    return [line[indent:] if not line[:indent].strip() else line.lstrip() for line in lines]


def block_run_by(test_file: str) -> Block:
    """The one example marked ``run-by: <test_file>``."""
    (found,) = [b for b in blocks() if b.marker == ("run-by", test_file)]
    return found
