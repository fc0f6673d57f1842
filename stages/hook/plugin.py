"""The ``vllm.general_plugins`` entry point: opt-in use of the pipelined worker.

What belongs here: only the switch. vLLM calls :func:`register` once per process (engine
front end, engine core, each worker; ``vllm/plugins/__init__.py``: ``load_general_plugins``)
before it builds its config. When the user opted in with ``INITPIPE_VLLM=1``, it wraps the
current platform's ``check_and_update_config`` (``vllm/platforms/cpu.py`` /
``vllm/platforms/cuda.py``), which is where vLLM turns ``worker_cls="auto"`` into its stock
worker, so that ``"auto"`` becomes ``initpipe_vllm.worker.PipelinedWorker``. Without the
opt-in nothing changes; a ``worker_cls`` the user chose explicitly is left alone.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from . import PIPELINED_WORKER

__all__ = ["ENV_VAR", "PIPELINED_WORKER", "STOCK_WORKERS", "enabled", "main", "register"]

# Under vLLM's logger tree, so the lines use vLLM's handler, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.initpipe")

ENV_VAR = "INITPIPE_VLLM"
#: What vLLM 0.32.0's platforms resolve ``worker_cls="auto"`` to.
STOCK_WORKERS = frozenset(
    {"vllm.v1.worker.cpu_worker.CPUWorker", "vllm.v1.worker.gpu_worker.Worker"}
)
_PATCHED = "_initpipe_patched"


def enabled(environ: Any = None) -> bool:
    """True when ``INITPIPE_VLLM`` is set to 1/true/yes/on."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    return value.strip().lower() in {"1", "true", "yes", "on"}


def register() -> None:
    """Entry point: route the stock worker to the pipelined one when opted in."""
    if not enabled():
        return
    from vllm.platforms import current_platform

    platform_cls = type(current_platform)
    if getattr(platform_cls, _PATCHED, False):
        return
    original = platform_cls.check_and_update_config  # a bound classmethod

    def check_and_update_config(cls: type, vllm_config: Any) -> None:
        parallel = vllm_config.parallel_config
        auto = parallel.worker_cls == "auto"  # read before the platform resolves it
        original(vllm_config)
        if auto and parallel.worker_cls in STOCK_WORKERS:
            parallel.worker_cls = PIPELINED_WORKER
            logger.info(
                "initpipe: vLLM workers initialize through the initpipe pipeline "
                "(%s=1; worker_cls=%s).",
                ENV_VAR,
                PIPELINED_WORKER,
            )
        elif parallel.worker_cls != PIPELINED_WORKER:
            logger.warning(
                "initpipe: %s=1 but worker_cls=%r was chosen explicitly; leaving it.",
                ENV_VAR,
                parallel.worker_cls,
            )

    # Patching vLLM's platform class on purpose: vLLM looks this classmethod up on the
    # class each time it builds a config.
    platform_cls.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[method-assign,assignment]
    setattr(platform_cls, _PATCHED, True)


def main(argv: list[str] | None = None) -> int:
    """``initpipe worker-cls``: print the qualname to pass to vLLM (``--usage`` explains)."""
    argv = list(argv or [])
    if argv in ([], ["--qualname"]):
        print(PIPELINED_WORKER)
        return 0
    if argv in (["--usage"], ["-h"], ["--help"]):
        print(
            f"usage: initpipe worker-cls [--usage]\n\n"
            f'  LLM(..., worker_cls="{PIPELINED_WORKER}")\n'
            f"  vllm serve MODEL --worker-cls {PIPELINED_WORKER}\n"
            f"  or, with no code change: {ENV_VAR}=1 vllm serve MODEL"
        )
        return 0
    print(f"Error: unknown arguments {argv}; try `initpipe worker-cls --usage`", file=sys.stderr)
    return 2
