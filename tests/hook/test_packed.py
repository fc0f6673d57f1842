"""What the refit's digest reads of a weight vLLM's CPU GEMM dispatch packs away: the bytes
as they were packed, even when the load writes over them right after
(``initpipe_vllm.hook.packed``, on vLLM's own ``dispatch_cpu_unquantized_gemm``)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from requires import installed

installed("vllm")


@pytest.mark.parametrize("remove_weight", [True, False])
def test_the_record_is_the_bytes_packed_not_what_the_load_writes_next(
    monkeypatch: pytest.MonkeyPatch, remove_weight: bool
) -> None:
    import torch
    import vllm.model_executor.layers.utils as layer_utils

    from initpipe_vllm.hook import packed

    main = threading.current_thread()
    written_over = threading.Event()
    hash_now = packed.tensor_hash

    def hash_late_off_the_loading_thread(t: Any) -> str:
        # a hash run anywhere but the loading thread reads the bytes only after the load
        # wrote over them: the order that made a refit's digest differ from a fresh one's
        if threading.current_thread() is not main:
            assert written_over.wait(timeout=600), "the test never wrote over the weight"
        return hash_now(t)

    monkeypatch.setattr(packed, "tensor_hash", hash_late_off_the_loading_thread)
    layer = torch.nn.Linear(64, 128, bias=False, dtype=torch.bfloat16)
    torch.nn.init.normal_(layer.weight, generator=torch.Generator().manual_seed(0))
    storage = layer.weight.detach()
    as_packed = hash_now(storage.clone())
    with packed.recording_packed_weights():
        layer_utils.dispatch_cpu_unquantized_gemm(layer, remove_weight)
        storage.fill_(0)  # the load moves on and reuses the bytes (a reload writes in place)
        written_over.set()
        recorded = packed.packed_weight_hash(layer)
    assert recorded == as_packed != hash_now(storage)
    # outside the context nothing is recorded, and vLLM's function is its own again
    assert getattr(layer_utils.dispatch_cpu_unquantized_gemm, "__wrapped__", None) is None
