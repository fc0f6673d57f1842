"""A runner's initialization state as plain data, for exact stock-vs-pipelined comparison.

What belongs here: :func:`runner_snapshot` and its helpers. It reads what vLLM's
``GPUModelRunner.initialize_kv_cache`` / ``get_kv_cache_spec`` (in
``vllm/v1/worker/gpu_model_runner.py``) leave on a runner and on its layers, and turns it
into JSON-able values: class names (dynamic backend subclasses by name), specs, every KV
view's shape/stride/dtype/storage offset and which views share storage, each layer's bound
``kv_cache``, attention groups with their builders' classes and scalar settings, kernel and
input-batch block sizes, cudagraph mode, capture sizes and dispatcher keys, the
runner-only / shared / fast-prefill sets, the KV block zeroer's address table (relative to
the live KV storages, or marked stale), the Mamba buffers and the Mamba SSU backend global,
the drafter's state, which KV blocks hold non-zero data and a digest of the KV bytes.
Replaces nothing in vLLM.

:data:`DELIBERATE_DIFFERENCES` lists where the pipelined runner differs from stock on
purpose; :func:`stock_differences` applies it.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

__all__ = [
    "DELIBERATE_DIFFERENCES",
    "SCHEDULER_HISTORY",
    "diff_snapshots",
    "runner_snapshot",
    "scheduler_snapshot",
    "stock_differences",
]

_SCALARS = (bool, int, float, str, type(None))


def _scalar(value: Any) -> Any:
    """A plain rendering of ``value`` if it is a setting-like scalar, else ``...``."""
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, (tuple, list)) and all(isinstance(v, _SCALARS) for v in value):
        return list(value)
    mod = type(value).__module__
    if mod == "torch" and type(value).__name__ == "dtype":
        return str(value)
    return ...


def _spec(spec: Any) -> Any:
    """A KV cache spec as a dict of its fields (nested specs too)."""
    if spec is None:
        return None
    if dataclasses.is_dataclass(spec):
        out: dict[str, Any] = {"type": type(spec).__name__}
        for f in dataclasses.fields(spec):
            v = getattr(spec, f.name)
            if isinstance(v, dict):
                out[f.name] = {k: _spec(x) for k, x in v.items()}
            else:
                s = _scalar(v)
                out[f.name] = s if s is not ... else repr(v)
        return out
    return repr(spec)


class _Storages:
    """Numbers storages in order of first appearance, so sharing compares across runs."""

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}

    def ranges(self, tensors: list[Any]) -> list[tuple[int, int, int]]:
        """``(start, end, storage id)`` of each distinct live storage among ``tensors``."""
        import torch

        out = {}
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.numel():
                st = t.untyped_storage()
                ptr = st.data_ptr()
                out[ptr] = (ptr, ptr + st.nbytes(), self.ids.setdefault(ptr, len(self.ids)))
        return sorted(out.values())

    def view(self, t: Any) -> Any:
        import torch

        if isinstance(t, (list, tuple)):
            return [self.view(x) for x in t]
        if not isinstance(t, torch.Tensor):
            return repr(type(t).__name__)
        ptr = t.untyped_storage().data_ptr() if t.numel() else 0
        sid = self.ids.setdefault(ptr, len(self.ids)) if t.numel() else None
        return {
            "shape": list(t.shape),
            "stride": list(t.stride()),
            "dtype": str(t.dtype),
            "storage_offset": t.storage_offset(),
            "storage": sid,
            "device": t.device.type,
        }


def _builder(b: Any) -> dict[str, Any]:
    settings = {}
    for k, v in sorted(vars(b).items()):
        s = _scalar(v)
        if s is not ...:
            settings[k] = s
        elif type(v).__name__ == "Tensor":
            settings[k] = {"tensor": list(v.shape), "dtype": str(v.dtype)}
    return {"class": type(b).__name__, "settings": settings}


def _attn_group(g: Any) -> dict[str, Any]:
    return {
        "backend": g.backend.get_name(),
        "backend_class": g.backend.__name__,
        "builder_class": g.backend.get_builder_cls().__name__,
        "layer_names": list(g.layer_names),
        "kv_cache_spec": _spec(g.kv_cache_spec),
        "kv_cache_group_id": g.kv_cache_group_id,
        "kernel_block_size": g.kernel_block_size,
        "kernel_block_stride": g.kernel_block_stride,
        "kernel_block_table": (
            None if g.kernel_block_table is None else list(g.kernel_block_table.shape)
        ),
        "builders": [_builder(b) for b in g.metadata_builders],
    }


def _nonzero_blocks(t: Any) -> list[int]:
    import torch

    if not isinstance(t, torch.Tensor) or t.dim() < 1 or not t.numel():
        return []
    flat = (
        t.reshape(t.shape[0], -1) if t.is_contiguous() else t.contiguous().reshape(t.shape[0], -1)
    )
    return torch.nonzero(flat.ne(0).any(dim=1)).flatten().tolist()


def _digest(t: Any) -> str | None:
    """sha256 of a KV view's bytes: equal digests mean bit-identical KV contents."""
    import hashlib

    import torch

    if not isinstance(t, torch.Tensor) or not t.numel():
        return None
    data = t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def _zeroer(runner: Any, storages: _Storages, live: list[Any]) -> Any:
    """The v1 runner's KV block zeroer (``_kv_block_zeroer``), see :func:`zeroer_table`."""
    return zeroer_table(getattr(runner, "_kv_block_zeroer", None), storages, live)


def zeroer_table(z: Any, storages: _Storages, live: list[Any]) -> Any:
    """A KV block zeroer's segment table, each address as ``[storage, offset]`` into a
    live KV storage, or ``"freed"`` when it points into no live KV memory."""
    if z is None:
        return None
    meta = getattr(z, "_meta", None)
    if meta is None:
        return {"class": type(z).__name__, "segments": None}
    addrs, block_strides, page_sizes, max_chunks, blk_size, n_segs = meta
    ranges = storages.ranges(live)
    segments = []
    for addr, stride, page in zip(
        addrs.tolist(), block_strides.tolist(), page_sizes.tolist(), strict=True
    ):
        addr &= (1 << 64) - 1  # uint64 read back through int64
        where: Any = "freed"
        for start, end, sid in ranges:
            if start <= addr < end:
                where = [sid, addr - start]
                break
        segments.append([where, stride, page])
    return {
        "class": type(z).__name__,
        "segments": segments,
        "max_chunks": max_chunks,
        "blk_size": blk_size,
        "n_segs": n_segs,
    }


def _drafter(runner: Any) -> Any:
    d = getattr(runner, "drafter", None)
    if d is None:
        return None
    disp = getattr(d, "cudagraph_dispatcher", None)
    return {
        "class": type(d).__name__,
        "draft_attn_groups": [_attn_group(g) for g in getattr(d, "draft_attn_groups", []) or []],
        "dispatcher": None if disp is None else _dispatcher(disp),
    }


def _dispatcher(disp: Any) -> dict[str, Any]:
    return {
        "keys_initialized": disp.keys_initialized,
        "mode": _scalar(disp.cudagraph_mode),
        "keys": {str(m): sorted(repr(k) for k in ks) for m, ks in disp.cudagraph_keys.items()},
    }


def _process_globals() -> dict[str, Any]:
    """Process-wide state the KV phase writes: the Mamba SSU backend selection."""
    from vllm.model_executor.layers.mamba.ops import ssu_dispatch

    backend = ssu_dispatch._mamba_ssu_backend
    kernel = ssu_dispatch._flashinfer_replayssm_kernel
    return {
        "mamba_ssu_backend": None if backend is None else type(backend).__name__,
        "flashinfer_replayssm_kernel": None if kernel is None else repr(kernel),
    }


def kv_cache_config_data(kvc: Any) -> Any:
    """A runner's working ``KVCacheConfig`` as plain data (None when it has none)."""
    if kvc is None:
        return None
    return {
        "num_blocks": kvc.num_blocks,
        "groups": [
            {"layer_names": list(g.layer_names), "spec": _spec(g.kv_cache_spec)}
            for g in kvc.kv_cache_groups
        ],
        "tensors": [
            {
                "size": t.size,
                "layers": list(t.layers),
                "layer_stride": t.layer_stride,
                "block_stride": t.block_stride,
                "offset": t.offset,
            }
            for t in kvc.kv_cache_tensors
        ],
    }


def layer_bindings(runner: Any, storages: _Storages) -> tuple[dict[str, Any], list[Any]]:
    """Each forward-context layer's bound ``kv_cache`` (as views) and the flat views."""
    layers = {}
    views = []
    for name, layer in runner.vllm_config.compilation_config.static_forward_context.items():
        if hasattr(layer, "kv_cache"):
            backend = getattr(layer, "attn_backend", None)
            layers[name] = {
                "kv_cache": storages.view(layer.kv_cache),
                "class": type(layer).__name__,
                "backend": backend.get_name() if backend is not None else None,
            }
            views.append(layer.kv_cache)
    return layers, _flat(views)


def _vllm_base(cls: type) -> str:
    for c in cls.__mro__:
        if c.__module__.startswith("vllm."):
            return c.__name__
    return cls.__name__


def runner_config_data(runner: Any) -> dict[str, Any]:
    """What every runner (v1 or MRv2) holds of the config: its vLLM base class, the cache
    and CUDA-graph settings, the model length."""
    cc = runner.vllm_config.compilation_config
    cache = runner.cache_config
    return {
        "runner_base_class": _vllm_base(type(runner)),
        "block_size": cache.block_size,
        "num_gpu_blocks": cache.num_gpu_blocks,
        "kv_cache_layout": cache.kv_cache_layout,
        "max_model_len": runner.max_model_len,
        "cudagraph_mode": _scalar(cc.cudagraph_mode),
        "cudagraph_capture_sizes": _scalar(cc.cudagraph_capture_sizes),
        "max_cudagraph_capture_size": cc.max_cudagraph_capture_size,
    }


def runner_snapshot(runner: Any, *, blocks: bool = True) -> dict[str, Any]:
    """Turn a runner's initialization state into plain, JSON-able data.

    Args:
        runner: a v1 ``GPUModelRunner`` (stock or pipelined; Model Runner V2's is read by
            :func:`~initpipe_vllm.testing.snapshot_v2.runner_snapshot_v2`).
        blocks: include which KV blocks of each runner view hold non-zero data.

    Returns:
        A dict; two runners initialized the same way give equal dicts.
    """
    storages = _Storages()
    kv_list = list(getattr(runner, "kv_caches", []))
    snap: dict[str, Any] = {
        **runner_config_data(runner),
        "dispatcher": _dispatcher(runner.cudagraph_dispatcher),
        "shared_kv_cache_layers": dict(sorted(runner.shared_kv_cache_layers.items())),
        "runner_only_attn_layers": sorted(runner.runner_only_attn_layers),
        "kv_sharing_fast_prefill_eligible_layers": sorted(
            runner.kv_sharing_fast_prefill_eligible_layers
        ),
        "reorder_batch_threshold": runner.reorder_batch_threshold,
        "kernel_block_sizes": list(getattr(runner, "_kernel_block_sizes", []) or []),
        "init_block_sizes": list(runner._init_block_sizes),
        "init_max_num_blocks": list(runner._init_max_num_blocks),
        "init_slot_mapping_modes": [_scalar(m) for m in runner._init_slot_mapping_modes],
    }
    snap["kv_cache_config"] = kv_cache_config_data(getattr(runner, "kv_cache_config", None))
    snap["attn_groups"] = [[_attn_group(g) for g in gs] for gs in runner.attn_groups]
    snap["runner_kv_caches"] = [storages.view(t) for t in kv_list]
    snap["layers"], layer_views = layer_bindings(runner, storages)
    snap["kv_block_zeroer"] = _zeroer(runner, storages, kv_list + layer_views)
    snap["mamba_bufs"] = _present(getattr(runner, "_mamba_bufs", None))
    snap["mamba_state_copy_funcs"] = _present(getattr(runner, "_mamba_state_copy_funcs", None))
    snap["process_globals"] = _process_globals()
    snap["drafter"] = _drafter(runner)
    batch = runner.input_batch
    snap["input_batch"] = {
        "class": type(batch).__name__,
        "max_model_len": batch.max_model_len,
        "max_num_reqs": batch.max_num_reqs,
        "block_sizes": [bt.block_size for bt in batch.block_table.block_tables],
        "max_num_blocks_per_req": [
            bt.max_num_blocks_per_req for bt in batch.block_table.block_tables
        ],
    }
    if blocks:
        snap["nonzero_blocks"] = [_nonzero_blocks(t) for t in kv_list]
        snap["kv_digest"] = [_digest(t) for t in kv_list]
    return snap


#: Scheduler attributes that count what an engine has done so far (steps), not how it is
#: configured: left out of :func:`scheduler_snapshot`, two engines with different pasts
#: differ there by design (vLLM 0.33.0 adds ``num_executed_steps`` and the step of the
#: last prefill, ``last_prefill_step``).
SCHEDULER_HISTORY = frozenset(
    {
        "current_step",
        "sched_step_seq",
        "processed_step_seq",
        "num_executed_steps",
        "last_prefill_step",
    }
)


def _object_settings(obj: Any) -> dict[str, Any]:
    """An object's class and scalar attributes (what it was built with)."""
    out: dict[str, Any] = {"class": type(obj).__name__}
    for name, value in sorted(vars(obj).items()):
        rendered = _scalar(value)
        if rendered is not ...:
            out[name] = rendered
    return out


def _aux_connector(aux: Any, pool: Any) -> dict[str, Any] | None:
    """The scheduler's auxiliary-output connector: its settings, and whether it works on
    the scheduler's current block pool (vLLM 0.33.0 builds it on the KV cache manager)."""
    if aux is None:
        return None
    return {**_object_settings(aux), "on_current_pool": getattr(aux, "_block_pool", None) is pool}


def scheduler_snapshot(core: Any) -> dict[str, Any]:
    """An engine core's scheduler-side KV state as plain data: the block pool (blocks, free
    blocks in queue order, cached blocks), the KV cache config and groups, each group
    manager, every scalar setting on the scheduler (those derived from the KV config
    included; :data:`SCHEDULER_HISTORY` excluded), on its KV cache manager, coordinator,
    block pool, group managers and auxiliary-output connector, and the engine's capacity
    figures.
    Replaces nothing in vLLM; reads ``vllm/v1/core/sched/scheduler.py`` and
    ``vllm/v1/core/block_pool.py`` state."""
    sched = core.scheduler
    mgr = sched.kv_cache_manager
    pool = mgr.block_pool
    cfg = sched.kv_cache_config
    cache = core.vllm_config.cache_config
    scalars = {}
    for name, value in sorted(vars(sched).items()):
        rendered = _scalar(value)
        if rendered is not ... and name not in SCHEDULER_HISTORY:
            scalars[name] = rendered
    return {
        "pool": {
            "num_gpu_blocks": pool.num_gpu_blocks,
            "free_blocks": pool.get_num_free_blocks(),
            "free_queue": [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
            "cached_blocks": sorted(
                b.block_id for b in pool.blocks if b.block_hash is not None and not b.is_null
            ),
            "enable_caching": pool.enable_caching,
            "hash_block_size": pool.hash_block_size,
        },
        "kv_cache_config": {
            "num_blocks": cfg.num_blocks,
            "groups": [
                {"layer_names": list(g.layer_names), "spec": _spec(g.kv_cache_spec)}
                for g in cfg.kv_cache_groups
            ],
            "tensors": [{"size": t.size, "layers": list(t.layers)} for t in cfg.kv_cache_tensors],
            "hash_block_size": cfg.hash_block_size,
            "cache_hit_alignment_tokens": cfg.cache_hit_alignment_tokens,
        },
        "managers": [
            {"class": type(m).__name__, "block_size": m.block_size, "spec": _spec(m.kv_cache_spec)}
            for m in mgr.coordinator.single_type_managers
        ],
        "scalars": scalars,
        "settings": {
            "kv_cache_manager": _object_settings(mgr),
            "coordinator": _object_settings(mgr.coordinator),
            "block_pool": _object_settings(pool),
            "single_type_managers": [
                _object_settings(m) for m in mgr.coordinator.single_type_managers
            ],
            "aux_output_connector": _aux_connector(
                getattr(sched, "aux_output_connector", None), pool
            ),
        },
        "cache_config": {
            k: _scalar(getattr(cache, k, None))
            for k in (
                "num_gpu_blocks",
                "num_gpu_blocks_override",
                "block_size",
                "hash_block_size",
                "cache_hit_alignment_tokens",
                "kv_cache_size_tokens",
                "kv_cache_max_concurrency",
                "effective_attention_block_size",
                "enable_prefix_caching",
            )
        },
    }


def _flat(views: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in views:
        out.extend(_flat(list(v)) if isinstance(v, (list, tuple)) else [v])
    return out


def _present(value: Any) -> Any:
    return None if value is None else type(value).__name__


#: Where the pipelined runner differs from stock on purpose: snapshot key -> why
#: (README: "Differences from stock cleanup"). :func:`stock_differences` skips it only
#: where stock has a value and the pipelined runner None.
DELIBERATE_DIFFERENCES = {
    "kv_block_zeroer": (
        "after a KV teardown stock keeps its KVBlockZeroer, whose absolute addresses point "
        "into the freed KV cache (or, by allocator reuse, into whatever lies there next); "
        "the pipelined runner drops it with the KV phase, and each real KV phase builds "
        "a new one"
    ),
    "fast_prefill": (
        "Model Runner V2: after a KV teardown stock keeps its FastPrefillHelper, holding the "
        "CUDA-graph manager the teardown dropped; the pipelined runner drops it with the KV "
        "phase, and the next KV phase builds a new one"
    ),
}


def _stale(value: Any) -> bool:
    segments = value.get("segments") if isinstance(value, dict) else None
    return isinstance(segments, list) and bool(segments) and all(s[0] == "freed" for s in segments)


def stock_differences(
    stock: Any, pipelined: Any, path: str = "", *, torn_down: bool = False
) -> list[str]:
    """:func:`diff_snapshots` of a stock and a pipelined snapshot, minus the
    :data:`DELIBERATE_DIFFERENCES`.

    A stock zeroer where the pipelined runner has none is accepted when it points into
    freed memory, or when ``torn_down``: the caller knows stock's KV phase was torn down
    since its worker last built the zeroer (after a cleanup, or a profiling pass after
    one), so it addresses a cache that is gone even if the allocator reused the address.
    """
    if isinstance(stock, dict) and isinstance(pipelined, dict):
        out = []
        for k in sorted(set(stock) | set(pipelined), key=str):
            if k not in stock or k not in pipelined:
                out.append(f"{path}/{k}: only in {'b' if k not in stock else 'a'}")
            elif (
                k in DELIBERATE_DIFFERENCES
                and stock[k] is not None
                and pipelined[k] is None
                and (torn_down or _stale(stock[k]))
            ):
                continue
            else:
                out += stock_differences(stock[k], pipelined[k], f"{path}/{k}", torn_down=torn_down)
        return out
    return diff_snapshots(stock, pipelined, path)


def diff_snapshots(a: Any, b: Any, path: str = "") -> list[str]:
    """Every path where two snapshots differ, as ``path: a != b`` lines."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{path}/{k}: only in {'b' if k not in a else 'a'}")
            else:
                out += diff_snapshots(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            out += diff_snapshots(x, y, f"{path}[{i}]")
        return out
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]
