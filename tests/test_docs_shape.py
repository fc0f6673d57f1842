"""The docs read in minutes: short paragraphs on user pages, how-to pages task first.

- User pages (the README and every page of docs/ outside the maintainers' guide): no prose
  paragraph over :data:`MAX_PARAGRAPH` words, no list item and no table cell over
  :data:`MAX_ITEM` words. Code blocks, headings and HTML comments are not prose.
- How-to pages (docs/how-to/): the first paragraph is the task, in one sentence; the first
  example on the page is run by ``tests/test_docs_outputs.py`` (so it shows its real
  output), and it comes before the page's second section.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from doc_blocks import ROOT, blocks

MAX_PARAGRAPH = 120
MAX_ITEM = 60
USER_PAGES = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").rglob("*.md") if "maintainers" not in p.parts),
]
HOW_TO = sorted((ROOT / "docs" / "how-to").glob("*.md"))
_ITEM = re.compile(r"^\s*(?:[-*]|\d+\.)\s+")
_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)(?<!etc)[.!?](?=\s|$)")


def prose(page: Path) -> list[tuple[int, str]]:
    """The page's prose paragraphs, each with its first line number; a list item counts
    as its own paragraph."""
    text = re.sub(
        r"<!--.*?-->", lambda m: "\n" * m.group(0).count("\n"), page.read_text(), flags=re.S
    )
    out: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    fenced = False

    def flush() -> None:
        if current:
            out.append((start, " ".join(current)))
            current.clear()

    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            flush()
            continue
        skip = not line.strip() or line.lstrip().startswith(("#", "|", "![", ":::"))
        if fenced or skip or (line.startswith("    ") and not current):
            flush()
            continue
        if _ITEM.match(line):
            flush()
        if not current:
            start = n
        current.append(line.strip())
    flush()
    return out


def cells(page: Path) -> list[tuple[int, str]]:
    """Every cell of the page's tables (outside code blocks), with its line number."""
    out = []
    fenced = False
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.lstrip().startswith("|"):
            out += [(n, cell.strip()) for cell in line.strip().strip("|").split("|")]
    return out


def _words(text: str) -> int:
    return len(text.split())


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_long_paragraph_on_a_user_page(page: Path) -> None:
    long = [
        f"{page.relative_to(ROOT)}:{line}: {_words(text)} words"
        for line, text in prose(page)
        if _words(text) > (MAX_ITEM if _ITEM.match(text) else MAX_PARAGRAPH)
    ]
    long += [
        f"{page.relative_to(ROOT)}:{line}: a table cell of {_words(cell)} words"
        for line, cell in cells(page)
        if _words(cell) > MAX_ITEM
    ]
    assert long == [], "split these (a paragraph <= 120 words, a list item or cell <= 60)"


def test_the_shape_check_sees_paragraphs_items_and_skips_code(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "# T\n\nOne two.\nThree.\n\n- a b\n- c\n  d\n\n```python\nx = 1\n```\n| t | u |\n"
    )
    assert prose(page) == [(3, "One two. Three."), (6, "- a b"), (7, "- c d")]
    assert cells(page) == [(13, "t"), (13, "u")]


@pytest.mark.parametrize("page", HOW_TO, ids=lambda p: p.name)
def test_a_how_to_page_opens_with_its_task_and_a_tested_example(page: Path) -> None:
    name = page.relative_to(ROOT)
    paragraphs = prose(page)
    assert paragraphs, f"{name}: empty"
    first = paragraphs[0][1]
    assert len(_SENTENCE_END.findall(first)) == 1, f"{name}: open with the task in one sentence"
    lines = page.read_text().splitlines()
    sections = [n for n, line in enumerate(lines, 1) if line.startswith("## ")]
    examples = [b for b in blocks([page]) if b.marker is None or b.marker[0] != "file"]
    assert examples, f"{name}: no example"
    assert examples[0].marker == ("run-by", "tests/test_docs_outputs.py"), (
        f"{examples[0].where}: a how-to page's first example shows its real output "
        "(run-by: tests/test_docs_outputs.py)"
    )
    assert len(sections) < 2 or examples[0].line < sections[1], (
        f"{name}: the example comes before the page's second section"
    )


def test_there_are_how_to_pages() -> None:
    assert len(HOW_TO) >= 8
