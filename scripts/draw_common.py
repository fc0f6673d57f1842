"""What the docs' drawing scripts (``draw_resize.py``, ``draw_refit.py``) share: their
command line (write the SVG, or print the Graphviz source with ``--dot``) and the call to
Graphviz's ``dot``. Imports no vLLM."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def main(
    name: str, doc: str, dot_source: Callable[[], str], out: Path, argv: Sequence[str] | None
) -> int:
    """Run a drawing script: 0 once written (or printed), 2 without Graphviz's ``dot``."""
    parser = argparse.ArgumentParser(prog=name, description=doc.split("\n\n")[0])
    parser.add_argument("-o", "--output", type=Path, default=out, help="the SVG to write")
    parser.add_argument("--dot", action="store_true", help="print the Graphviz source only")
    args = parser.parse_args(argv)
    source = dot_source()
    if args.dot:
        sys.stdout.write(source)
        return 0
    dot = shutil.which("dot")
    if dot is None:
        print(f"{name}: Graphviz's dot is not installed", file=sys.stderr)
        return 2
    svg = subprocess.run([dot, "-Tsvg"], input=source, capture_output=True, text=True, check=True)
    args.output.write_text(svg.stdout)
    print(f"wrote {args.output}")
    return 0
