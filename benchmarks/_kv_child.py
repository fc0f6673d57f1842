"""Child process of :mod:`benchmarks.kv`: the KV re-init samples with glibc's allocator
thresholds pinned (:data:`~benchmarks._common.STEADY_ALLOCATOR`, read by glibc at process
start, hence a child).

Prints one JSON line after ``MARK``: the frozen-heap re-init samples per side, without and
with the default logging, as :func:`benchmarks.kv.reinit_samples` takes them.
"""

from __future__ import annotations

import json
import os
import sys

MARK = "INITPIPE_KV_REINIT_JSON "


def main(argv: list[str]) -> int:
    from . import kv

    repeats = int(argv[0])
    os.environ["INITPIPE_LOG_STAGES"] = "0"
    kv.live_pair()["initpipe"].runner.initpipe_startup_done()  # as the worker does
    quiet, info = kv.reinit_samples(repeats)
    os.environ.pop("INITPIPE_LOG_STAGES")
    logged, _ = kv.reinit_samples(repeats)
    print(MARK + json.dumps({"reinit": quiet, "logged": logged, **info}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
