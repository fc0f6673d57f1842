"""What a resize returns and what :func:`kv_cache_info` says: plain attrs records.

They travel from the engine core process as plain dicts (``to_dict``/``from_dict``), since a
utility call's result arrives as plain data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from ..carry.report import PrefixCacheCarry
from ..core.report import STEPS, RankReport

__all__ = [
    "STEPS",
    "Action",
    "KVCacheInfo",
    "PrefixCacheCarry",
    "RankReport",
    "ResizeReport",
    "State",
]

Action = Literal["resize", "release", "resume"]
State = Literal["serving", "released", "resizing", "failed"]


@attrs.frozen(kw_only=True)
class ResizeReport:
    """What one ``resize_kv_cache`` / ``release_kv_cache`` / ``resume_kv_cache`` did.

    Attributes:
        action: ``resize``, ``release`` or ``resume``.
        mode: ``wait`` or ``abort`` (what happened to requests in flight).
        blocks_before / blocks_after: the engine's KV blocks (0 while released).
        bytes_freed / bytes_allocated: KV bytes per rank, summed over ranks.
        total_s: wall seconds of the whole call, in the engine core.
        steps: seconds per step (:data:`STEPS`; a rank step is the slowest rank's).
        ranks: each rank's part.
        requests_waited: ids of requests that were queued and ran on the new cache.
        requests_aborted: ids of requests aborted (``mode="abort"``).
        prefix_cache: what happened to the prefix cache (None: there was none to keep, a
            release or a resume).
    """

    action: Action
    mode: str
    blocks_before: int
    blocks_after: int
    bytes_freed: int = 0
    bytes_allocated: int = 0
    total_s: float = 0.0
    steps: Mapping[str, float] = attrs.field(factory=dict, hash=False)
    ranks: tuple[RankReport, ...] = ()
    requests_waited: tuple[str, ...] = ()
    requests_aborted: tuple[str, ...] = ()
    prefix_cache: PrefixCacheCarry | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-able), the form a utility call returns."""
        return attrs.asdict(self, recurse=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ResizeReport:
        """Rebuild a report from :meth:`to_dict`'s output."""
        fields = dict(data)
        fields["ranks"] = tuple(RankReport(**r) for r in fields.get("ranks", ()))
        fields["steps"] = dict(fields.get("steps", {}))
        for key in ("requests_waited", "requests_aborted"):
            fields[key] = tuple(fields.get(key, ()))
        carry = fields.get("prefix_cache")
        fields["prefix_cache"] = None if carry is None else PrefixCacheCarry(**carry)
        return cls(**fields)

    def __str__(self) -> str:
        mib = 1 << 20
        head = (
            f"{self.action} ({self.mode}): {self.blocks_before} -> {self.blocks_after} blocks, "
            f"freed {self.bytes_freed / mib:.1f} MiB, allocated {self.bytes_allocated / mib:.1f} "
            f"MiB, {self.total_s * 1e3:.1f} ms"
        )
        steps = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in self.steps.items())
        lines = [head, f"  steps (ms): {steps}"]
        if self.prefix_cache is not None:
            lines.append(f"  {self.prefix_cache}")
        if self.requests_aborted:
            lines.append(f"  aborted: {', '.join(self.requests_aborted)}")
        if self.requests_waited:
            lines.append(f"  waited: {', '.join(self.requests_waited)}")
        return "\n".join(lines)


@attrs.frozen(kw_only=True)
class KVCacheInfo:
    """The engine's KV cache now (:func:`initpipe_vllm.kv_cache_info`).

    Attributes:
        state: ``serving``, ``released``, or ``resizing`` while a resize, release, resume
            or refit is accepted and not yet answered (e.g. waiting for requests to finish;
            the figures are still the current size's); ``failed`` when the last weight
            refit failed (no KV cache; a refit brings it back).
        num_blocks: the scheduler's KV blocks (0 while released).
        free_blocks: blocks no request holds now (prefix-cached ones count as free).
        block_size: tokens per block.
        bytes_per_rank: KV bytes allocated on each worker rank (0 while released).
        resume_blocks: the size ``resume_kv_cache()`` returns to (while released).
        last_report: the last resize/release/resume, if any.
        model_runner: which vLLM model runner the workers run: ``"v1"`` or ``"v2"``
            (Model Runner V2); None when the workers are not initpipe's pipelined ones.
    """

    state: State
    num_blocks: int
    free_blocks: int
    block_size: int
    bytes_per_rank: tuple[int, ...]
    resume_blocks: int | None = None
    last_report: ResizeReport | None = None
    model_runner: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-able)."""
        return attrs.asdict(self, recurse=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KVCacheInfo:
        """Rebuild from :meth:`to_dict`'s output."""
        fields = dict(data)
        fields["bytes_per_rank"] = tuple(fields["bytes_per_rank"])
        last = fields.get("last_report")
        fields["last_report"] = None if last is None else ResizeReport.from_dict(last)
        return cls(**fields)
