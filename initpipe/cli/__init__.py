"""The ``initpipe`` command line.

What belongs here: argument parsing and the commands that drive the core — nothing a
library user needs. :mod:`.app` holds ``main`` and the parser (one ``add_*`` function per
subcommand, handlers imported when they run); :mod:`.graph` is ``initpipe graph``;
:mod:`.target` resolves a ``module[:attribute]`` target to a pipeline. Drawing and
exporting live in :mod:`initpipe.view`, below this package. The vLLM subcommands
(``run``, ``plan``, ``worker-cls``) belong to ``initpipe_vllm``: the CLI names their
modules as strings and imports them only when asked, so nothing here imports torch,
vLLM or ``initpipe_vllm`` statically.
"""

from __future__ import annotations

from .app import COMMANDS, DELEGATED, build_parser, main

__all__ = ["COMMANDS", "DELEGATED", "build_parser", "main"]
