"""The live package's public API: every room's public names, in one place.

The calls and what they return are re-exported at ``initpipe_vllm``'s top level, lazily:
their list is the facade's ``RESIZE_API``, written there once; the records only found
inside those results (a rank's report, a refit's steps, a probe's result, the prefix-cache
carry) are added here. Each name is imported ``as`` itself: an explicit re-export."""

from __future__ import annotations

from .. import RESIZE_API
from .carry.report import PrefixCacheCarry as PrefixCacheCarry
from .core.report import RankReport as RankReport
from .refit.api import (
    refit as refit,
    refit_async as refit_async,
    weights_info as weights_info,
    weights_info_async as weights_info_async,
)
from .refit.probe import Probe as Probe, ProbeResult as ProbeResult
from .refit.receipt import (
    RefitReceipt as RefitReceipt,
    RefitStep as RefitStep,
    WeightsInfo as WeightsInfo,
)
from .resize.api import (
    kv_cache_info as kv_cache_info,
    kv_cache_info_async as kv_cache_info_async,
    release_kv_cache as release_kv_cache,
    release_kv_cache_async as release_kv_cache_async,
    resize_kv_cache as resize_kv_cache,
    resize_kv_cache_async as resize_kv_cache_async,
    resume_kv_cache as resume_kv_cache,
    resume_kv_cache_async as resume_kv_cache_async,
)
from .resize.report import KVCacheInfo as KVCacheInfo, ResizeReport as ResizeReport

__all__ = [*RESIZE_API, "PrefixCacheCarry", "ProbeResult", "RankReport", "RefitStep"]
