"""Run a command while other processes keep every core busy: the suite's stress check.

    python scripts/under_load.py [--busy N] -- COMMAND [ARGS...]

Starts ``N`` busy loops (default: one per core, ``os.cpu_count()``), each a
``python -c "while True: pass"`` at normal priority, runs COMMAND, stops the loops (also on
Ctrl-C or when COMMAND fails) and exits with COMMAND's status. ``make test-loaded`` runs the
README's test command this way: a test that passes only on a quiet machine depends on speed,
and fails here.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

BUSY_LOOP = "while True: pass"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="under_load.py", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--busy", type=int, default=os.cpu_count() or 1, help="busy loops (default: the cores)"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    if args.busy < 0:
        parser.error(f"--busy {args.busy}: give a count >= 0")
    loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(args.busy)]
    print(f"under_load: {len(loops)} busy loop(s) running: {' '.join(command)}", flush=True)
    start = time.monotonic()
    try:
        rc = subprocess.call(command)
    except KeyboardInterrupt:
        rc = 130
    finally:
        for p in loops:
            p.kill()
        for p in loops:
            p.wait()
    print(f"under_load: exit {rc} after {time.monotonic() - start:.0f} s", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
