"""The per-rank figures every live transaction reports, and the steps a report times.

Plain attrs records; they travel from the engine core process as plain dicts.
"""

from __future__ import annotations

import attrs

__all__ = ["STEPS", "RankReport"]

#: The steps a resize's report times, in the order they run.
STEPS = ("plan", "pause", "carry", "teardown", "kv_phase", "warmup", "scheduler", "resume")


@attrs.frozen(kw_only=True)
class RankReport:
    """One worker rank's part of a resize.

    Attributes:
        rank: the worker's global rank.
        bytes_freed: KV bytes the teardown released on this rank.
        bytes_allocated: KV bytes the new KV phase allocated on this rank.
        teardown_s / kv_phase_s / warmup_s: seconds of each part on this rank.
        rss_before / rss_torn_down / rss_after: resident set size of the worker process
            (bytes) before the teardown, right after it (old cache freed, new one not yet
            allocated) and after the last step, read after ``malloc_trim``; None off Linux.
        stash_bytes: the kept prefix-cache blocks this rank set aside while its cache was
            rebuilt (``keep_prefix_cache``): the peak KV memory of the resize is the larger
            of the two caches plus these bytes.
    """

    rank: int
    bytes_freed: int = 0
    bytes_allocated: int = 0
    teardown_s: float = 0.0
    kv_phase_s: float = 0.0
    warmup_s: float = 0.0
    rss_before: int | None = None
    rss_torn_down: int | None = None
    rss_after: int | None = None
    stash_bytes: int = 0
