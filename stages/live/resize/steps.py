"""Resize, release and resume as step lists on the live-transaction driver.

What belongs here: the four transactions a resize room drives — :data:`RESIZE`,
:data:`RELEASE`, :data:`RESUME` and :data:`WARM_RESIZE`, the resize that keeps the prefix
cache — built from the core's shared steps (:mod:`initpipe_vllm.live.core.steps`) and the
carry's (:mod:`initpipe_vllm.live.carry.steps`). Checks and planning come before, in
:mod:`.engine`.
"""

from __future__ import annotations

import attrs

from ..carry.steps import CARRY, SCHEDULER_KEEPING, TEARDOWN_KEEPING, UNSTASH, Resize
from ..core.steps import (
    KV_PHASE,
    PAUSE,
    SCHEDULER,
    TEARDOWN,
    WARMUP,
    commit_released,
    commit_serving,
    restore,
)
from ..core.txn import Transaction

__all__ = ["RELEASE", "RESIZE", "RESUME", "TRANSACTIONS", "WARM_RESIZE"]

RESIZE: Transaction[Resize] = Transaction(
    name="resize",
    pause=PAUSE,
    steps=(TEARDOWN, KV_PHASE, WARMUP, SCHEDULER),
    commit=commit_serving,
)
RELEASE: Transaction[Resize] = Transaction(
    name="release",
    pause=PAUSE,
    steps=(TEARDOWN,),
    commit=commit_released,
)
#: no cache to tear down: the KV phase's undo goes back to released
RESUME: Transaction[Resize] = Transaction(
    name="resume",
    pause=PAUSE,
    steps=(attrs.evolve(KV_PHASE, undo=restore), WARMUP, SCHEDULER),
    commit=commit_serving,
)
#: a resize that keeps the prefix cache: the kept blocks are set aside before the teardown
#: and written back after the warm-up (which may write into the new cache), before the
#: scheduler's pool is rebuilt to hold them; a rollback writes them back into the old cache
WARM_RESIZE: Transaction[Resize] = Transaction(
    name="resize",
    pause=PAUSE,
    steps=(CARRY, TEARDOWN_KEEPING, KV_PHASE, WARMUP, UNSTASH, SCHEDULER_KEEPING),
    commit=commit_serving,
)
#: every live transaction on the KV cache, by the action that asks for it
TRANSACTIONS: dict[str, Transaction[Resize]] = {t.name: t for t in (RESIZE, RELEASE, RESUME)}
