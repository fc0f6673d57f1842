"""``initpipe run``'s view of vLLM's log: vLLM's warnings that say nothing about a run on
this kind of set-up (:data:`KNOWN_NOISE`: a CPU machine, an in-process engine, the embedded
tiny model) are hidden and counted (:data:`NOISE`); every other line is shown as it is.

What belongs here: that filter and the one call that installs it (:func:`quiet`). Imports
vLLM only inside :func:`quiet`.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

__all__ = ["KNOWN_NOISE", "NOISE", "known_noise", "quiet"]


#: vLLM's warnings that say nothing about the run on this kind of set-up (a CPU machine, an
#: in-process engine, the embedded tiny model): hidden unless ``--verbose``, and counted.
#: Each is the start of the message; every other warning and error is shown as it is.
KNOWN_NOISE = (
    "Triton is installed, but doesn't include CPU backend",  # CPU build of vLLM
    "Triton is not installed. triton-cpu is expected",
    "Model Runner V2 requires Triton; using the V1 model runner",
    "The global random seed is set to",  # in-process engine: the seed is the run's own
    "Enforce eager set, disabling torch.compile",  # what initpipe run asks for
    "Inductor compilation was disabled by user settings",
    "Reset SSM cache type to float32",
    "libtcmalloc is not found in LD_PRELOAD",  # CPU performance advice
    "libiomp is not found in LD_PRELOAD",
    "CPU backend doesn't allow to use `torch.set_num_threads`",
    # a second engine in this process (--compare-stock, --resize): the first one's CPU
    # worker set VLLM_DIST_IDENT in the environment, and vLLM's Triton kernels register anew
    "Unknown vLLM environment variable detected: VLLM_DIST_IDENT",
    "Kernel vllm.",
)


class _KnownNoise:
    """A logging filter that drops :data:`KNOWN_NOISE` and counts what it dropped."""

    def __init__(self) -> None:
        self.hidden = 0

    def filter(self, record: Any) -> bool:
        if record.levelno < logging.ERROR and record.getMessage().startswith(KNOWN_NOISE):
            self.hidden += 1
            return False
        return True


NOISE = _KnownNoise()


def known_noise() -> _KnownNoise:
    """The one :class:`_KnownNoise` of this process (vLLM's logging config names it)."""
    return NOISE


def quiet(folder: Path) -> None:
    """Hide :data:`KNOWN_NOISE` (counted in :data:`NOISE`).

    vLLM rebuilds its log handler whenever an engine starts, from the Python logging config
    file named by ``VLLM_LOGGING_CONFIG_PATH``: that file is vLLM's default config plus
    this filter, written into ``folder``. Python's last-resort handler gets the filter too
    (vLLM logs a few lines while it imports, before its handler exists); torch's C++
    warnings are raised to errors (``TORCH_CPP_LOG_LEVEL``); a deprecation warning vLLM's
    CPU dispatcher triggers in torch is dropped.
    """
    import copy
    import warnings

    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    warnings.filterwarnings(
        "ignore", message=".*torch.distributed.reduce_op", category=FutureWarning
    )
    if logging.lastResort is not None:
        logging.lastResort.addFilter(NOISE)
    if (
        os.environ.get("VLLM_LOGGING_CONFIG_PATH")
        or os.environ.get("VLLM_CONFIGURE_LOGGING") == "0"
    ):
        return  # the user's own logging config wins
    from vllm.logger import DEFAULT_LOGGING_CONFIG

    config = copy.deepcopy(DEFAULT_LOGGING_CONFIG)
    config["filters"] = {"initpipe_known_noise": {"()": f"{__name__}.known_noise"}}
    for handler in config["handlers"].values():
        handler["filters"] = ["initpipe_known_noise"]
    path = folder / "vllm-logging.json"
    path.write_text(json.dumps(config))
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(path)
