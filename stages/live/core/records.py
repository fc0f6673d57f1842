"""What a worker rank answers to each call of a live transaction: typed attrs records.

What belongs here: one record per rank function of :mod:`.rank` (its answer when it
worked) and :class:`RankFailure` (its answer when it did not). A rank function runs in the
worker's process and its answer crosses ``collective_rpc`` as plain data, so a rank builds
its record and returns :meth:`~RankRecord.to_dict`; the engine core reads it back with
:meth:`~RankRecord.from_dict` (one of these or a :class:`RankFailure`), and from then on
reads attributes, never string keys. Nothing here imports torch or vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

import attrs

__all__ = [
    "RankAllocation",
    "RankFailure",
    "RankRecord",
    "RankRecordError",
    "RankRequests",
    "RankStash",
    "RankStatus",
    "RankTeardown",
    "RankUnstash",
    "RankWarmUp",
    "answered",
]

R = TypeVar("R", bound="RankRecord")


class RankRecordError(ValueError):
    """A rank's answer that is not the record it should be (names the record and keys).

    Attributes:
        record: the record class's name.
        missing: fields the answer lacks.
        unknown: keys the record does not have.
    """

    def __init__(self, record: str, missing: list[str], unknown: list[str]) -> None:
        self.record, self.missing, self.unknown = record, missing, unknown
        super().__init__(
            f"a rank's answer is not a {record}: missing {missing}, unknown {unknown}; the "
            "worker and the engine core must run the same initpipe_vllm (restart both)"
        )


@attrs.frozen(kw_only=True)
class RankRecord:
    """Base of the rank records: the rank, and the wire form with its ``ok`` flag."""

    #: False only on :class:`RankFailure`
    ok: ClassVar[bool] = True

    rank: int

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``collective_rpc``: the fields and ``ok``."""
        return {"ok": self.ok, **attrs.asdict(self, recurse=False)}

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R | RankFailure:
        """The record ``data`` describes: a ``cls``, or a :class:`RankFailure` when the
        rank reports ``ok: False``.

        Raises:
            RankRecordError: ``data`` lacks a field or has a key the record does not.
        """
        target: type[RankRecord] = cls if data.get("ok", False) else RankFailure
        names = {a.name for a in attrs.fields(target)}
        required = [a.name for a in attrs.fields(target) if a.default is attrs.NOTHING]
        missing = [k for k in required if k not in data]
        unknown = sorted(k for k in data if k not in names and k != "ok")
        if missing or unknown:
            raise RankRecordError(target.__name__, missing, unknown)
        return target(**{k: v for k, v in data.items() if k != "ok"})  # type: ignore[return-value]


@attrs.frozen(kw_only=True)
class RankFailure(RankRecord):
    """A rank call that raised: the rank caught it and says so (rank functions never
    raise, see :mod:`.rank`). ``rank`` is None when the failure is not a rank's (the
    engine core's own step failed)."""

    ok: ClassVar[bool] = False

    rank: int | None  # type: ignore[assignment]
    step: str
    stage: str | None = None
    error: str
    traceback: str = ""
    seconds: float = 0.0


def answered(records: list[R | RankFailure]) -> list[R]:
    """The records of ranks that answered (their failures left out)."""
    return [r for r in records if not isinstance(r, RankFailure)]


@attrs.frozen(kw_only=True)
class RankStatus(RankRecord):
    """Whether a rank can take part, and what it holds (``rank_status``)."""

    pipelined: bool
    model_runner: str | None
    worker_class: str
    runner_class: str
    requests: list[str]
    kv_bytes: int
    kv_in_place: bool | None
    num_blocks: int | None
    available_memory: int | None
    rss: int | None
    froze_heap: bool


@attrs.frozen(kw_only=True)
class RankRequests(RankRecord):
    """The requests a rank's runner still holds (``rank_requests``)."""

    requests: list[str]


@attrs.frozen(kw_only=True)
class RankTeardown(RankRecord):
    """A rank's KV cache released (``rank_teardown``)."""

    bytes_freed: int
    graphs_released: int
    seconds: float
    rss_before: int | None
    rss_after: int | None


@attrs.frozen(kw_only=True)
class RankAllocation(RankRecord):
    """A rank's new KV cache allocated by its KV phase (``rank_initialize``)."""

    bytes_allocated: int
    seconds: float


@attrs.frozen(kw_only=True)
class RankWarmUp(RankRecord):
    """A rank warmed up on its new KV cache (``rank_warm_up``)."""

    seconds: float
    rss_after: int | None


@attrs.frozen(kw_only=True)
class RankStash(RankRecord):
    """A rank set its cached blocks' bytes aside (``rank_stash``), or refused to.

    ``refused``: why memory cannot hold the stash (nothing was kept; ``bytes`` is 0)."""

    bytes: int
    seconds: float
    available_memory: int | None = None
    refused: str | None = None


@attrs.frozen(kw_only=True)
class RankUnstash(RankRecord):
    """A rank wrote its stash into the new KV cache (``rank_unstash``), or dropped it."""

    bytes: int
    seconds: float
