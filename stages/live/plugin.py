"""The ``initpipe_resize`` entry point: every room's ``EngineCore`` methods, in every process.

What belongs here: :func:`install` (the rooms' methods on vLLM's ``EngineCore``: the core's
:func:`~.core.entry.install`, which checks the contract first) and :func:`register`, the
``vllm.general_plugins`` entry point — the only code that reaches an engine core running in
its own process. The name stays ``initpipe_resize`` (a user's ``VLLM_PLUGINS`` names it).
"""

from __future__ import annotations

import logging
import os

from ..errors import UnsupportedRunnerError
from .core import entry
from .core.hold import ENV_HOLD, install_from_env
from .refit import engine as refit
from .resize import engine as resize

__all__ = ["PLUGIN_NAME", "install", "register"]

logger = logging.getLogger("vllm.initpipe")

PLUGIN_NAME = entry.PLUGIN_NAME


def install() -> None:
    """Add every room's utility methods to vLLM's ``EngineCore`` (idempotent). They change
    nothing until called.

    Raises:
        UnsupportedRunnerError: the installed vLLM's engine-core and scheduler code that the
            live transactions replay differs from every release initpipe has locked.
    """
    entry.install(*resize.METHODS, *refit.METHODS)


def register() -> None:
    """``vllm.general_plugins`` entry point ``initpipe_resize``: :func:`install`, in every
    process (the engine core's own process is reached by nothing else), and the test
    facility :mod:`.core.hold` where ``INITPIPE_HOLD_STEPS`` is set. Never raises: on
    another vLLM it installs nothing (a resize or a refit then says why)."""
    try:
        install()
    except UnsupportedRunnerError as err:
        logger.debug("initpipe: live KV resize not installed: %s", err)
    except Exception:
        logger.warning("initpipe: live KV resize not installed", exc_info=True)
    if install_from_env():  # a test facility: INITPIPE_HOLD_STEPS (see .core.hold)
        logger.warning("initpipe: engine core steps held while %s exists", os.environ[ENV_HOLD])
