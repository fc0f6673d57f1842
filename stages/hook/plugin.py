"""The ``vllm.general_plugins`` entry point: opt-in use of the pipelined worker.

What belongs here: only the switch. vLLM calls :func:`register` once per process (engine
front end, engine core, each worker; ``vllm/plugins/__init__.py``: ``load_general_plugins``)
before it builds its config. When the user opted in with ``INITPIPE_VLLM=1``, it wraps the
current platform's ``check_and_update_config`` (``vllm/platforms/cpu.py``, ``cuda.py``,
``rocm.py``, ``xpu.py``), which is where vLLM turns ``worker_cls="auto"`` into its stock
worker, so that ``"auto"`` becomes ``initpipe_vllm.worker.PipelinedWorker`` — but only
where the pipelined worker can run (:func:`initpipe_vllm.hook.worker.why_not_pipelined`).
Where it cannot (another vLLM version, a platform without a pipelined worker, Model Runner
V2's ``MMEncoderModelRunner``), the stock worker stays and one warning says why, instead of
handing vLLM a worker that would refuse to start. Without the opt-in nothing changes; a
``worker_cls`` the user chose explicitly is left alone (``PipelinedWorker`` chosen explicitly
refuses what it cannot run, by name).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from ..contract.declare import vllm_uses
from . import PIPELINED_WORKER

__all__ = ["ENV_VAR", "PIPELINED_WORKER", "enabled", "main", "register", "route_worker"]

# Under vLLM's logger tree, so the lines use vLLM's handler, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.initpipe")

ENV_VAR = "INITPIPE_VLLM"
_PATCHED = "_initpipe_patched"

#: The platforms' ``check_and_update_config``, where vLLM resolves ``worker_cls="auto"``.
_CONFIG_HOOKS = (
    "vllm.platforms.cpu:CpuPlatform.check_and_update_config",
    "vllm.platforms.cuda:CudaPlatformBase.check_and_update_config",
    "vllm.platforms.rocm:RocmPlatform.check_and_update_config",
    "vllm.platforms.xpu:XPUPlatform.check_and_update_config",
)
_WORKER_CLS = "vllm.config.parallel:ParallelConfig.worker_cls"


def enabled(environ: Any = None) -> bool:
    """True when ``INITPIPE_VLLM`` is set to 1/true/yes/on."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    return value.strip().lower() in {"1", "true", "yes", "on"}


@vllm_uses(
    ("catalog_v1", "catalog_mrv2"),
    mirrors=_CONFIG_HOOKS,
    calls=("vllm.platforms:current_platform", _WORKER_CLS),
)
def register() -> None:
    """Entry point: when opted in, have the platform's config hook call :func:`route_worker`.
    Under ``initpipe startup run`` (``INITPIPE_STARTUP_MARKS`` set), also record the
    process's start-up marks (:mod:`.marks`), opted in or not."""
    if os.environ.get("INITPIPE_STARTUP_MARKS"):
        from . import marks

        marks.install()
    if not enabled():
        return
    from vllm.platforms import current_platform

    platform_cls = type(current_platform)
    if getattr(platform_cls, _PATCHED, False):
        return
    original = platform_cls.check_and_update_config  # a bound classmethod

    def check_and_update_config(cls: type, vllm_config: Any) -> None:
        # read before the platform resolves it
        was_auto = vllm_config.parallel_config.worker_cls == "auto"
        original(vllm_config)
        # Read again at each config: an engine started after the opt-in was unset (a test's
        # stock oracle, say) must stay stock although this process patched the hook before.
        if enabled():
            route_worker(vllm_config, was_auto=was_auto)

    # Patching vLLM's platform class on purpose: vLLM looks this classmethod up on the
    # class each time it builds a config.
    platform_cls.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[method-assign,assignment]
    setattr(platform_cls, _PATCHED, True)


@vllm_uses(("catalog_v1", "catalog_mrv2"), calls=(_WORKER_CLS,))
def route_worker(vllm_config: Any, *, was_auto: bool) -> None:
    """Give vLLM the pipelined worker where it can run; else keep the stock one, say why.

    Runs right after the platform's ``check_and_update_config`` resolved ``worker_cls``, so
    it sees the worker and the config vLLM will use. Logs one line on ``vllm.initpipe``:
    info when ``"auto"`` became :data:`PIPELINED_WORKER`; a warning naming the reason and
    the fix when the stock worker is kept; a warning when the user chose another worker.
    It never raises for a config initpipe does not cover: that is the opt-in's promise.

    Args:
        vllm_config: the ``VllmConfig`` being built.
        was_auto: whether ``worker_cls`` was ``"auto"`` before the platform resolved it.
    """
    from .adapter import which_runner
    from .worker import contract_match, why_not_pipelined

    parallel = vllm_config.parallel_config
    if not was_auto:
        if parallel.worker_cls != PIPELINED_WORKER:
            logger.warning(
                "initpipe: %s=1 but worker_cls=%r was chosen explicitly; leaving it.",
                ENV_VAR,
                parallel.worker_cls,
            )
        return
    refusal = why_not_pipelined(vllm_config, parallel.worker_cls)
    if refusal is not None:
        logger.warning(
            "initpipe: %s=1, but vLLM's stock worker %s is kept: %s",
            ENV_VAR,
            parallel.worker_cls,
            refusal.message,
        )
        return
    parallel.worker_cls = PIPELINED_WORKER
    catalog = which_runner(vllm_config).labels.log
    logger.info(
        "initpipe: vLLM workers initialize through the initpipe pipeline (%s=1; worker_cls=%s; "
        "the %s catalog). %s.",
        ENV_VAR,
        PIPELINED_WORKER,
        catalog,
        contract_match(vllm_config),
    )


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
