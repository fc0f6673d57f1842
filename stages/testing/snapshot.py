"""A runner's initialization state as plain data, for exact stock-vs-pipelined comparison.

What belongs here: :func:`runner_snapshot` and its helpers. It reads what vLLM's
``GPUModelRunner.initialize_kv_cache`` / ``get_kv_cache_spec`` (in
``vllm/v1/worker/gpu_model_runner.py``) leave on a runner and on its layers, and turns it
into JSON-able values: class names (dynamic backend subclasses by name), specs, every KV
view's shape/stride/dtype/storage offset and which views share storage, each layer's bound
``kv_cache``, attention groups with their builders' classes and scalar settings, kernel and
input-batch block sizes, cudagraph mode and dispatcher keys, the runner-only / shared /
fast-prefill sets, which KV blocks hold non-zero data and a digest of the KV bytes.
Replaces nothing in vLLM.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

__all__ = ["diff_snapshots", "runner_snapshot"]

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


def _vllm_base(cls: type) -> str:
    for c in cls.__mro__:
        if c.__module__.startswith("vllm."):
            return c.__name__
    return cls.__name__


def runner_snapshot(runner: Any, *, blocks: bool = True) -> dict[str, Any]:
    """Turn a runner's initialization state into plain, JSON-able data.

    Args:
        runner: a ``GPUModelRunner`` (stock or pipelined).
        blocks: include which KV blocks of each runner view hold non-zero data.

    Returns:
        A dict; two runners initialized the same way give equal dicts.
    """
    storages = _Storages()
    cc = runner.vllm_config.compilation_config
    cache = runner.cache_config
    disp = runner.cudagraph_dispatcher
    kv_list = list(getattr(runner, "kv_caches", []))
    snap: dict[str, Any] = {
        "runner_base_class": _vllm_base(type(runner)),
        "block_size": cache.block_size,
        "num_gpu_blocks": cache.num_gpu_blocks,
        "kv_cache_layout": cache.kv_cache_layout,
        "max_model_len": runner.max_model_len,
        "cudagraph_mode": _scalar(cc.cudagraph_mode),
        "dispatcher": {
            "keys_initialized": disp.keys_initialized,
            "mode": _scalar(disp.cudagraph_mode),
            "keys": {str(m): sorted(repr(k) for k in ks) for m, ks in disp.cudagraph_keys.items()},
        },
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
    kvc = getattr(runner, "kv_cache_config", None)
    snap["kv_cache_config"] = (
        None
        if kvc is None
        else {
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
    )
    snap["attn_groups"] = [[_attn_group(g) for g in gs] for gs in runner.attn_groups]
    snap["runner_kv_caches"] = [storages.view(t) for t in kv_list]
    layers = {}
    for name, layer in runner.vllm_config.compilation_config.static_forward_context.items():
        if hasattr(layer, "kv_cache"):
            backend = getattr(layer, "attn_backend", None)
            layers[name] = {
                "kv_cache": storages.view(layer.kv_cache),
                "class": type(layer).__name__,
                "backend": backend.get_name() if backend is not None else None,
            }
    snap["layers"] = layers
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
