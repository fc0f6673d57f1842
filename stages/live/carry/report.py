"""What a resize did with the prefix cache: a plain attrs record (part of its report)."""

from __future__ import annotations

import attrs

__all__ = ["PrefixCacheCarry"]


@attrs.frozen(kw_only=True)
class PrefixCacheCarry:
    """What a resize did with the prefix cache.

    Attributes:
        kept: True when the cached blocks were carried into the new cache (their contents
            and vLLM's block pool state); False when the prefix cache was emptied.
        cached_before: cached blocks in the pool when the resize began (after the pause).
        blocks_kept: cached blocks the new cache holds.
        blocks_evicted: cached blocks that did not fit (a shrink), evicted as vLLM evicts:
            least recently used first.
        bytes_copied: KV bytes copied per rank (the largest rank's).
        reason: why the cache was emptied (None when kept): not asked
            (``keep_prefix_cache=False``), or why it could not be kept.
    """

    kept: bool
    cached_before: int = 0
    blocks_kept: int = 0
    blocks_evicted: int = 0
    bytes_copied: int = 0
    reason: str | None = None

    def __str__(self) -> str:
        if not self.kept:
            return f"prefix cache emptied: {self.reason}"
        return (
            f"prefix cache kept: {self.blocks_kept} of {self.cached_before} cached blocks "
            f"({self.blocks_evicted} evicted, {self.bytes_copied / (1 << 20):.2f} MiB copied "
            "per rank)"
        )
