"""Live resize of a running vLLM engine's KV cache: resize, release, resume, inspect.

What belongs here: everything a resize does above the runner — the public API
(:mod:`.api`, re-exported at ``initpipe_vllm``'s top level), the engine-core side that
plans the new cache with vLLM's functions and rebuilds the scheduler's KV cache manager
(:mod:`.engine`, the one module that patches vLLM's ``EngineCore``; its replays of vLLM's
planning and scheduler set-up are in :mod:`.replay`), the one live-transaction driver
(:mod:`.txn`: pause, steps, commit, or undo in reverse) and the resize, release and resume
as step lists on it (:mod:`.steps`), the worker side run on every rank through
``collective_rpc`` (:mod:`.rank`, answering in the typed records of :mod:`.records`), and
the records they return (:mod:`.report`); a resize that keeps the prefix cache — the
scheduler's block pool carried (:mod:`.carry`) and the kept blocks' bytes copied on every
rank (:mod:`.kv_copy`); the weight refit on the same driver — its steps
and engine-core side (:mod:`.refit_core`), its probe (:mod:`.probe`), the weights' checks, digest
and rank side (:mod:`.weights`), its receipt (:mod:`.receipt`) and public API
(:mod:`.refit_api`); and one test facility, :mod:`.hold`
(``INITPIPE_HOLD_STEPS``: an engine core that keeps its requests in flight on purpose, the
only other patch of vLLM's engine core, installed only where that variable is set). The KV
phase itself is the catalog's: torn down and re-run by the pipelined runner.

Importing this package imports neither torch nor vllm.
"""

from __future__ import annotations

from .api import (
    kv_cache_info,
    kv_cache_info_async,
    release_kv_cache,
    release_kv_cache_async,
    resize_kv_cache,
    resize_kv_cache_async,
    resume_kv_cache,
    resume_kv_cache_async,
)
from .probe import Probe, ProbeResult
from .receipt import RefitReceipt, RefitStep, WeightsInfo
from .refit_api import refit, refit_async, weights_info, weights_info_async
from .report import KVCacheInfo, PrefixCacheCarry, RankReport, ResizeReport

__all__ = [
    "KVCacheInfo",
    "PrefixCacheCarry",
    "Probe",
    "ProbeResult",
    "RankReport",
    "RefitReceipt",
    "RefitStep",
    "ResizeReport",
    "WeightsInfo",
    "kv_cache_info",
    "kv_cache_info_async",
    "refit",
    "refit_async",
    "release_kv_cache",
    "release_kv_cache_async",
    "resize_kv_cache",
    "resize_kv_cache_async",
    "resume_kv_cache",
    "resume_kv_cache_async",
    "weights_info",
    "weights_info_async",
]
