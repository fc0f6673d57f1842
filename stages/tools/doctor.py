"""``initpipe doctor``: which of initpipe's capabilities a vLLM supports, read from source.

What belongs here: the command line over :func:`initpipe_vllm.contract.report.compare` —
an installed vLLM (default), a folder holding ``vllm/`` or a vLLM wheel (read as a zip:
nothing installed, nothing imported) compared with the locks initpipe ships, printed per
capability (or as JSON), and ``--write-lock``, the maintainer's command that records the
lock of a vLLM release (see the README: "Porting to a new vLLM release").

A capability the compared release does not have (the v1 catalog and ``plan`` on a release
without Model Runner V1) is ``absent``: neither ok nor broken, and not a failure.

Exit status: 0 when every capability is ok (or absent), 1 when one is broken, 2 on bad input (a path
that holds no vLLM, a declaration that does not resolve when writing a lock).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ..contract.declare import CAPABILITIES, CAPABILITY_RUNNER
from ..contract.lock import LockError, build, write
from ..contract.report import Entry, Report, compare
from ..contract.source import open_source
from ..errors import VllmSourceError
from ..releases import runner_title
from ._cli import command_parser, parse

__all__ = ["TITLES", "build_parser", "main", "render"]

#: What each capability is, in the text report.
TITLES = {
    "catalog_v1": "v1 runner catalog (worker, runner adapter, stages)",
    "catalog_mrv2": "Model Runner V2 catalog (worker, runner adapter, stages)",
    "resize": "live KV resize, release and resume (engine core, ranks)",
    "refit": "live weight refit (engine core, ranks, probe)",
    "serve": "the HTTP routes (initpipe_vllm.serve)",
    "plan": "initpipe plan",
    "startup": "initpipe startup (the vLLM spans its report names, its config timer)",
}
assert set(TITLES) == set(CAPABILITIES)


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(__doc__)
    p.add_argument(
        "--source",
        metavar="PATH",
        help="an installed vLLM's site-packages folder, a folder holding vllm/, or a vLLM "
        ".whl file (default: the installed vLLM, found without importing it)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--all", action="store_true", help="list identical functions too (text report)")
    p.add_argument(
        "--write-lock",
        metavar="DIR",
        nargs="?",
        const="",
        help="maintainers: record the lock of this vLLM (its distribution and version) into "
        "DIR (default: the package's contract/locks/) instead of checking",
    )
    return p


def _line(e: Entry) -> list[str]:
    out = [f"    {e.status:<10} {e.kind:<8} {e.name}"]
    if e.status != "identical":
        if e.moved_to:
            out.append(f"        now at: {', '.join(e.moved_to)}")
        if e.detail:
            out.append(f"        why: {e.detail}")
        out.append(f"        affects: {', '.join(e.affects)}")
    return out


def render(report: Report, *, show_all: bool = False) -> str:
    """The text report: a header, then per capability its verdict and its functions."""
    base = f"compared with the lock {report.baseline}" if report.baseline else "no lock applies"
    out = [f"vLLM {report.vllm} ({report.distribution}) at {report.source}: {base}", ""]
    for cap, verdict in report.capabilities.items():
        mine = [e for e in report.functions if cap in e.capabilities]
        bad = [e for e in mine if e.status != "identical"]
        if verdict == "absent":
            title = runner_title(CAPABILITY_RUNNER[cap])  # type: ignore[index]
            head = f"absent: vLLM {report.vllm} has no {title}, nor has {report.baseline}"
        elif verdict != "ok":
            head = f"BROKEN: {len(bad)} of {len(mine)} differ"
        elif report.matched.get(cap, report.baseline) != report.baseline:
            head = (
                f"ok: identical to {report.matched[cap]} (the lines below compare with "
                f"{report.baseline})"
            )
        else:
            head = "ok"
        out.append(f"{TITLES[cap]} [{cap}]: {head} ({len(mine)} declared functions)")
        for e in mine if show_all else bad:
            out.extend(_line(e))
    broken = [c for c, v in report.capabilities.items() if v == "broken"]
    out += ["", f"verdict: {'all ok' if not broken else 'broken: ' + ', '.join(broken)}"]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """``initpipe doctor``; returns the exit status (0 ok, 1 broken, 2 bad input)."""
    args = parse(build_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        source = open_source(args.source)
    except VllmSourceError as err:
        print(f"Error: {err}", file=sys.stderr)
        return 2
    if args.write_lock is not None:
        from ..contract.declare import declarations

        if "unknown" in (source.distribution, source.version):
            print(
                f"Error: {source.path} does not say which vLLM it is (distribution "
                f"{source.distribution!r}, version {source.version!r}): a lock is named by "
                "both. Give an installed vLLM or a wheel (their dist-info says it).",
                file=sys.stderr,
            )
            return 2
        try:
            lock = build(source, declarations(release=source.version))
        except LockError as err:
            print(f"Error: {err}", file=sys.stderr)
            return 2
        path = write(lock, args.write_lock or None)
        print(f"wrote {path}: {len(lock.entries)} declared names of {lock.label}")
        return 0
    print(f"initpipe doctor: reading {source.path} ...", file=sys.stderr)
    report = compare(source)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        print(render(report, show_all=args.all))
        print(f"({report.seconds:.1f} s)", file=sys.stderr)
    return 0 if report.ok else 1
