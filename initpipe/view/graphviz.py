"""Run Graphviz's ``dot`` on a DOT drawing (:func:`.render.render_dot`) for SVG/PNG output.

Graphviz is an optional system tool: it is looked up only when called, and its absence is
a :class:`~initpipe.errors.GraphvizError` that gives the install command.
"""

from __future__ import annotations

from ..errors import GraphvizError

__all__ = ["graphviz"]


def graphviz(dot_source: str, fmt: str, *, purpose: str | None = None) -> bytes:
    """Lay out ``dot_source`` with Graphviz's ``dot`` and return the ``svg``/``png`` bytes.

    Args:
        dot_source: the DOT text.
        fmt: a ``dot -T`` output format.
        purpose: the ``--format`` the output is for, named in the error (default: ``fmt``).

    Raises:
        GraphvizError: ``dot`` is not installed (the message gives the install command), or
            it failed.
    """
    import shutil  # here, not at the top: `initpipe graph` start-up must not pay for them
    import subprocess

    exe = shutil.which("dot")
    if exe is None:
        raise GraphvizError(
            f"--format {purpose or fmt} needs Graphviz's dot program, which is not on PATH. "
            f"Install it with: apt-get install graphviz (macOS: brew install graphviz), or use "
            f"--format dot or mermaid."
        )
    try:
        proc = subprocess.run(
            [exe, f"-T{fmt}"],
            input=dot_source.encode(),
            capture_output=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise GraphvizError(f"running {exe} failed: {err}") from err
    if proc.returncode != 0:
        raise GraphvizError(
            f"{exe} -T{fmt} exited with {proc.returncode}: "
            f"{proc.stderr.decode(errors='replace').strip()}"
        )
    return proc.stdout
