"""A resize that keeps the prefix cache, the ranks' side: the kept blocks' bytes set aside
before the old KV cache is freed and written into the new one at their new ids.

What belongs here: the rank functions :func:`rank_stash`, :func:`rank_unstash` and
:func:`rank_drop_stash` (sent through ``collective_rpc`` like :mod:`..core.rank`'s, answering in
:mod:`..core.records`, never raising), and the one piece of geometry they share, read from vLLM's
``KVCacheConfig``: every ``KVCacheTensor`` places layer ``l`` of block ``b`` at
``offset + l * layer_stride + b * block_stride`` bytes of the one backing allocation
(``vllm.v1.worker.utils.allocate_kv_cache``, both runners), one page per layer. So a block's
bytes are found without knowing the attention backend, the layout, or the group kind:
every tensor is viewed as ``(layers, blocks, page)`` and copied on the block axis, one
strided copy of whole pages per run of consecutive block ids (:func:`runs`).
Tensors that alias the same bytes (cache groups overlay each other) are copied once.

Why a stash and not both caches alive: the stash holds only the kept blocks, so the peak is
the larger cache plus the kept bytes, where both caches alive would be the old plus the
new. A rank refuses the stash (the resize then drops the prefix cache, and says why) when
its free memory cannot hold it now, or the new cache with it after the old is freed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from ...contract.declare import vllm_uses
from ..core.rank import available_memory, failure_of, worker_of
from ..core.records import RankStash, RankUnstash

__all__ = ["block_views", "rank_drop_stash", "rank_stash", "rank_unstash", "runs"]

#: where a rank keeps its stash between the two calls (an attribute of vLLM's worker)
_STASH = "_initpipe_kv_stash"


def _page_bytes(cfg: Any, layer: str) -> int:
    for group in cfg.kv_cache_groups:
        if layer in group.layer_names:
            spec = group.kv_cache_spec
            per_layer = getattr(spec, "kv_cache_specs", None)
            return int((per_layer[layer] if per_layer else spec).page_size_bytes)
    raise ValueError(f"layer {layer!r} of a KV cache tensor is in no KV cache group")


@vllm_uses(
    "resize",
    calls=(
        "vllm.v1.kv_cache_interface:KVCacheConfig",
        "vllm.v1.kv_cache_interface:KVCacheTensor",
        "vllm.v1.worker.utils:allocate_kv_cache",
    ),
)
def block_views(runner: Any, cfg: Any = None) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Each distinct KV cache tensor of ``runner``'s cache as ``(its layers, a view of
    shape (layers, num_blocks, page bytes))`` over the backing int8 allocation.
    ``cfg``: the ``KVCacheConfig`` the cache was allocated for (default: the pipelined
    runner's KV phase's; a stock runner's is its ``kv_cache_config``).

    Raises:
        ValueError: no KV cache, or a host-resident (HiSparse) tensor.
    """
    import torch

    if cfg is None:
        cfg = runner.initpipe_run.outputs["runner_kv_cache_config"]
    views = list(getattr(runner, "kv_caches", None) or ())
    if not views or not cfg.kv_cache_tensors:
        raise ValueError("the runner holds no KV cache")
    first = views[0]
    while isinstance(first, (list, tuple)):
        first = first[0]
    storage = first.untyped_storage()
    buf = torch.empty(0, dtype=torch.int8, device=first.device).set_(storage)
    seen: set[tuple[int, ...]] = set()
    for t in cfg.kv_cache_tensors:
        if t.host_resident:
            raise ValueError("a host-resident (HiSparse) KV cache tensor cannot be carried")
        page = _page_bytes(cfg, t.layers[0])
        key = (t.offset, t.layer_stride, t.block_stride, len(t.layers), page)
        if key in seen:
            continue
        seen.add(key)
        view = buf.as_strided(
            (len(t.layers), cfg.num_blocks, page), (t.layer_stride, t.block_stride, 1), t.offset
        )
        yield tuple(t.layers), view


def runs(ids: list[int]) -> list[tuple[int, int, int]]:
    """``ids`` as maximal runs of consecutive ids: ``(position in ids, first id, length)``.
    A run is one strided copy of whole pages (memory speed); a grow keeps ids, so its kept
    blocks form few runs."""
    out: list[tuple[int, int, int]] = []
    for i, b in enumerate(ids):
        if out and out[-1][1] + out[-1][2] == b:
            pos, first, n = out[-1]
            out[-1] = (pos, first, n + 1)
        else:
            out.append((i, b, 1))
    return out


def _gather(view: Any, ids: list[int]) -> Any:
    """Blocks ``ids`` of a ``(layers, blocks, page)`` view, in that order, as a new tensor."""
    import torch

    out = torch.empty(
        (view.shape[0], len(ids), view.shape[2]), dtype=view.dtype, device=view.device
    )
    for pos, first, n in runs(ids):
        out[:, pos : pos + n].copy_(view[:, first : first + n])
    return out


def _scatter(view: Any, ids: list[int], data: Any) -> None:
    """Write ``data`` (``(layers, len(ids), page)``) into blocks ``ids`` of ``view``."""
    for pos, first, n in runs(ids):
        view[:, first : first + n].copy_(data[:, pos : pos + n])


def rank_stash(wrapper: Any, old_ids: list[int], need: list[int]) -> dict[str, Any]:
    """Copy blocks ``old_ids`` of this rank's KV cache aside. ``need``: per rank, the new
    cache's bytes. Refused (``refused`` set, nothing kept) where memory does not hold it."""
    worker, rank = worker_of(wrapper)
    start = time.perf_counter()
    try:
        runner = worker.model_runner
        views = list(block_views(runner))
        size = sum(v.shape[0] * v.shape[2] for _, v in views) * len(old_ids)
        old = int(runner.initpipe_run.outputs["runner_kv_cache_config"].kv_cache_tensors[0].size)
        room = available_memory(worker)
        refused = None
        if room is not None and (size > room or size + need[rank] - old > room):
            refused = (
                f"rank {rank} has {room:,} bytes free: the {len(old_ids)} cached blocks "
                f"({size:,} bytes) do not fit beside the new cache ({need[rank]:,} bytes, "
                f"{old:,} freed first)"
            )
        else:
            setattr(worker, _STASH, [(layers, _gather(v, old_ids)) for layers, v in views])
        return RankStash(
            rank=rank,
            bytes=0 if refused else size,
            seconds=time.perf_counter() - start,
            available_memory=room,
            refused=refused,
        ).to_dict()
    except Exception as err:
        _drop(worker)
        return failure_of(rank, err, "carry").to_dict()


def rank_unstash(wrapper: Any, new_ids: list[int]) -> dict[str, Any]:
    """Write the stash into this rank's new KV cache at blocks ``new_ids``; drop it."""
    worker, rank = worker_of(wrapper)
    start = time.perf_counter()
    try:
        stash = getattr(worker, _STASH, None)
        if stash is None:
            raise RuntimeError(f"rank {rank} holds no stash to write back")
        views = dict(block_views(worker.model_runner))
        written = 0
        for layers, data in stash:
            view = views.get(layers)
            if view is None or view.shape[0] != data.shape[0] or view.shape[2] != data.shape[2]:
                raise ValueError(f"the new KV cache has no tensor shaped like {layers[0]!r}'s")
            _scatter(view, new_ids, data)
            written += data.numel() * data.element_size()
        _drop(worker)
        return RankUnstash(rank=rank, bytes=written, seconds=time.perf_counter() - start).to_dict()
    except Exception as err:
        _drop(worker)
        return failure_of(rank, err, "carry").to_dict()


def rank_drop_stash(wrapper: Any) -> dict[str, Any]:
    """Forget this rank's stash (a rollback, or a stash refused on another rank)."""
    worker, rank = worker_of(wrapper)
    _drop(worker)
    return RankUnstash(rank=rank, bytes=0, seconds=0.0).to_dict()


def _drop(worker: Any) -> None:
    if hasattr(worker, _STASH):
        delattr(worker, _STASH)
