"""What the vLLM subcommands' parsers share: usage errors raised, not printed and exited.

Each ``main(argv)`` catches :class:`initpipe.errors.UsageError` (the core CLI's own) and
prints one ``Error: ...`` line with exit status 2, so a bad flag reads like every other bad
input of that command.
"""

from __future__ import annotations

import argparse

from initpipe.errors import UsageError

__all__ = ["Parser", "UsageError"]


class Parser(argparse.ArgumentParser):
    """``argparse`` that raises :class:`UsageError` instead of exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)
