"""What the vLLM subcommands' parsers share: usage errors raised, not printed and exited.

Each ``main(argv)`` catches :class:`initpipe.errors.UsageError` (the core CLI's own) and
prints one ``Error: ...`` line with exit status 2, so a bad flag reads like every other bad
input of that command.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from initpipe.errors import UsageError

__all__ = ["Parser", "UsageError", "add_model_runner", "parse"]


class Parser(argparse.ArgumentParser):
    """``argparse`` that raises :class:`UsageError` instead of exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def command_parser(doc: str | None) -> Parser:
    """A command's parser, named and described by its module docstring's first line
    (```initpipe plan``: what a vLLM worker would allocate ...``): the help says what the
    reference says, written once."""
    prog, _, what = (doc or "").strip().splitlines()[0].partition(": ")
    what = what.replace("``", "")
    return Parser(prog=prog.strip("`"), description=what[:1].upper() + what[1:])


def add_model_runner(parser: argparse.ArgumentParser) -> None:
    """``--model-runner auto|v1|v2``: the runner vLLM builds (``run`` and ``startup``)."""
    parser.add_argument(
        "--model-runner",
        choices=("auto", "v1", "v2"),
        default="auto",
        help="vLLM's model runner: auto (vLLM decides: Model Runner V2 where Triton "
        "exists, v1 on CPU), v1, or v2 (on a machine without a GPU through Triton's "
        "interpreter, a test device: slow)",
    )


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace | int:
    """``parser``'s arguments, or the exit status a ``main`` returns instead: 2 after one
    ``Error: ...`` line for a bad flag, 0 after ``--help``."""
    try:
        return parser.parse_args(argv)
    except UsageError as err:
        print(f"Error: {err}", file=sys.stderr)
        return 2
    except SystemExit as exit_:  # --help
        return int(exit_.code or 0)
