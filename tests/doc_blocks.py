"""The fenced code examples of the README and the docs pages (importable: tests/ is on
sys.path), for the tests that run them.

An example that cannot run in the suite says why on the line before its fence::

    <!-- illustrative: starts vLLM on a GPU -->
    ```bash
    ...

The README's first block, its two set-up commands, is illustrative without a marker (the
README starts with them, nothing before). Another test may run an example itself (the
pytest plugin's test runs the stage author's file from docs/extending.md): it says so with
``<!-- run-by: tests/... -->``.
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_MARK = re.compile(r"<!--\s*(illustrative|run-by):\s*(.+?)\s*-->")


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


def blocks(pages: list[Path] | None = None) -> list[Block]:
    out = []
    for page in pages or PAGES:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = re.match(r"^```(\w+)\s*$", lines[i])
            if not m:
                i += 1
                continue
            start = i
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
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
                    lang=m.group(1),
                    code="\n".join(lines[start + 1 : end]) + "\n",
                    marker=marker,
                )
            )
            i = end + 1
    return out


def block_run_by(test_file: str) -> Block:
    """The one example marked ``run-by: <test_file>``."""
    (found,) = [b for b in blocks() if b.marker == ("run-by", test_file)]
    return found
