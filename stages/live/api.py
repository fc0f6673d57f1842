"""The live package's public API: every room's public names, in one place (re-exported at
``initpipe_vllm``'s top level, lazily)."""

from __future__ import annotations

from .carry.report import PrefixCacheCarry
from .core.report import RankReport
from .refit.api import refit, refit_async, weights_info, weights_info_async
from .refit.probe import Probe, ProbeResult
from .refit.receipt import RefitReceipt, RefitStep, WeightsInfo
from .resize.api import (
    kv_cache_info,
    kv_cache_info_async,
    release_kv_cache,
    release_kv_cache_async,
    resize_kv_cache,
    resize_kv_cache_async,
    resume_kv_cache,
    resume_kv_cache_async,
)
from .resize.report import KVCacheInfo, ResizeReport

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
