"""Weights a CPU kernel packs away, recorded as they are packed (for the refit's digest).

What belongs here: :func:`recording_packed_weights`, the context in which the pipelined
worker loads (and a refit reloads) a model, and :func:`packed_weight_hash`, what it
recorded for a layer. On the CPU platform vLLM hands each unquantized linear layer's weight,
in kernel format after the post-load processing, to a CPU GEMM kernel (oneDNN, sgl-kernel
or zentorch: ``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``) and leaves an
empty parameter behind; the packed copy is opaque (a oneDNN handle). A digest of the
model's parameters would then skip every linear layer. So while a load runs, each such
weight's bytes are hashed just before vLLM packs them, and the digest reads the record.
Nothing else changes: vLLM's own function then runs as it would. The hash is taken at once,
on the loading thread: a queued hash once read the bytes after the load had moved on and
written over them (a refit's digest then differed from a fresh engine's on the same weights
in about half the runs of ``tests/vllm/test_refit.py``).

A layer that keeps its weight (``remove_weight=False``: an embedding, a language-model head)
is recorded too: its kernel holds a copy of the weight *as it was packed*,
and a tied head whose weight changed under it without being packed again (vLLM's layerwise
reload skips it) computes with the old copy. The digest lists that record beside the
weight, so it covers what the kernel computes with.
Elsewhere than CPU nothing is packed away and the context does nothing.

Importing this module imports neither torch nor vLLM.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any

from ..contract.declare import vllm_uses

__all__ = ["packed_weight_hash", "recording_packed_weights", "tensor_hash"]

#: layer -> the hash of the weight vLLM packed (dtype, shape and bytes), as it was packed
_PACKED: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
_DEPTH = 0


def tensor_hash(t: Any) -> str:
    """sha256 of a tensor's dtype, shape and bytes (copied to the CPU first if needed)."""
    import torch

    h = hashlib.sha256(f"{t.dtype}|{list(t.shape)}\0".encode())
    data = t.detach().contiguous().to("cpu").reshape(-1).view(torch.uint8)
    h.update(memoryview(data.numpy()))
    return h.hexdigest()


def packed_weight_hash(layer: Any) -> str | None:
    """What :func:`recording_packed_weights` recorded for ``layer`` (None: nothing)."""
    return _PACKED.get(layer)


@vllm_uses(
    ("catalog_v1", "catalog_mrv2", "refit"),
    mirrors=("vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm",),
    calls=("vllm.platforms:current_platform",),
)
@contextlib.contextmanager
def recording_packed_weights() -> Iterator[None]:
    """Record the hash of each weight vLLM's CPU GEMM dispatch packs away, while inside."""
    global _DEPTH
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        yield
        return
    import vllm.model_executor.layers.utils as layer_utils

    with _LOCK:
        _DEPTH += 1
        if _DEPTH == 1:
            original = layer_utils.dispatch_cpu_unquantized_gemm

            def recording(layer: Any, remove_weight: bool) -> None:
                weight = getattr(layer, "weight", None)
                if weight is not None and not weight.is_meta:
                    # the bytes packed now: the load may write over them right after
                    _PACKED[layer] = tensor_hash(weight.detach())
                original(layer, remove_weight)

            recording.__wrapped__ = original  # type: ignore[attr-defined]
            layer_utils.dispatch_cpu_unquantized_gemm = recording
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0:
                current = layer_utils.dispatch_cpu_unquantized_gemm
                layer_utils.dispatch_cpu_unquantized_gemm = getattr(current, "__wrapped__", current)
