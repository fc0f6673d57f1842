"""A test facility: hold an engine core's steps, so a test *makes* the state it needs.

What belongs here: the one switch a test uses to keep requests in flight in an engine core
it cannot call (its own process) — nothing the product path calls. A test that needs
"every request holds KV blocks and is still running when the resize arrives" cannot wait
for it on a busy machine (the requests may finish first); it makes it true instead:

- set ``INITPIPE_HOLD_STEPS=<file>`` in the engine core's environment (the
  ``initpipe_resize`` plugin calls :func:`install_from_env` there, as ``INITPIPE_INJECT_FAULT``
  is read in the workers);
- while ``<file>`` exists, the busy loop of vLLM's ``EngineCoreProc`` runs a step only
  while a request is still *waiting* or has not produced its first token (with async
  scheduling that token comes a step after the one that scheduled it): every request gets
  its KV blocks and sends its first token; then it runs no step: the running requests keep
  their blocks and produce nothing more. Utility calls (a resize, ``kv_cache_info``) are
  still answered, between loop iterations, as vLLM answers them between steps; a resize's
  own steps (flushing finished requests) are not held;
- deleting ``<file>`` lets the engine go on. If the file's text is ``until-pause``, the hold
  also ends by itself once the scheduler is paused (a ``mode="wait"`` resize arrived): a
  test that cannot delete the file meanwhile (a blocking call) still gets a request that
  was in flight when the resize came.

While the scheduler is paused nothing is admitted, so a held, paused engine runs no step
at all. vLLM's ``EngineCore.step`` is untouched: in-process engines are never held.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...contract.declare import vllm_uses

__all__ = ["ENV_HOLD", "UNTIL_PAUSE", "held", "install", "install_from_env"]

#: The variable naming the hold file (read in the engine core's process at start).
ENV_HOLD = "INITPIPE_HOLD_STEPS"
#: The hold file's text that ends the hold once the scheduler is paused.
UNTIL_PAUSE = "until-pause"
#: How long a held busy-loop iteration sleeps (the loop would otherwise spin a core).
_IDLE_S = 0.002


@vllm_uses(
    "resize",
    calls=("vllm.v1.core.sched.interface:PauseState",),
)
def held(core: Any, path: str | os.PathLike[str]) -> bool:
    """Whether ``core``'s next step is held by the file at ``path`` (see the module)."""
    try:
        text = Path(path).read_text().strip()
    except FileNotFoundError:
        return False
    from vllm.v1.core.sched.interface import PauseState

    sched = core.scheduler
    paused = sched.pause_state != PauseState.UNPAUSED
    if paused:
        return text != UNTIL_PAUSE
    # admit the waiting requests first, and let each send its first token
    return len(sched.waiting) == 0 and all(r.num_output_tokens > 0 for r in sched.running)


@vllm_uses(
    "resize",
    mirrors=("vllm.v1.engine.core:EngineCoreProc._process_engine_step",),
    calls=("vllm.v1.engine.core:EngineCoreProc",),
)
@functools.cache
def install(path: str) -> None:
    """Wrap ``EngineCoreProc._process_engine_step`` so :func:`held` skips steps (idempotent
    for one path)."""
    from vllm.v1.engine.core import EngineCoreProc

    original = EngineCoreProc._process_engine_step

    @functools.wraps(original)
    def _process_engine_step(self: Any) -> bool:
        if held(self, path):
            time.sleep(_IDLE_S)
            return False
        return bool(original(self))

    EngineCoreProc._process_engine_step = _process_engine_step  # type: ignore[method-assign]


def install_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """:func:`install` the hold named by ``INITPIPE_HOLD_STEPS``, if set; True if installed."""
    path = (os.environ if environ is None else environ).get(ENV_HOLD, "").strip()
    if not path:
        return False
    install(path)
    return True
