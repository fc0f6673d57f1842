"""The KV phase with the backend forced to FLASH_ATTN, TRITON_ATTN and CPU_ATTN.

The CPU platform picks CPU_ATTN for every layer. To exercise the FlashAttention and Triton
metadata builders here, the pipelined side replaces the ``attn_backends`` stage with a
wrapper that swaps the class; the stock side is a second runner whose layers'
``attn_backend`` was patched the same way, initialized by vLLM's own runner methods. Both
get the same engine ``KVCacheConfig``, so the block size (128) and the KV layout (LBHNC)
stay the CPU platform's — only the backend classes, their kernel block sizes, builders
and cudagraph support differ from a CPU run. Builders construct with ``device=cpu``;
``build()`` and the kernels are not exercised (they need CUDA/Triton).
"""

from __future__ import annotations

import copy

import pytest

from initpipe import MODEL, stage
from initpipe_vllm import catalog
from initpipe_vllm.runner import pipelined_runner_class
from initpipe_vllm.testing import build_runner, plan_kv_cache_config, tiny_vllm_config
from initpipe_vllm.testing.snapshot import diff_snapshots, runner_snapshot
from initpipe_vllm.v1.model_phase import attn_backends as real_attn_backends

BUILDERS = {
    "FLASH_ATTN": "FlashAttentionMetadataBuilder",
    "TRITON_ATTN": "TritonAttentionMetadataBuilder",
    "CPU_ATTN": "CPUAttentionMetadataBuilder",
}


def _backend(name: str) -> type:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return AttentionBackendEnum[name].get_class()


def forced(name: str):
    """A replacement ``attn_backends`` stage: the real one, then every Attention layer forced."""

    @stage(needs=MODEL, name="attn_backends", provides="attn_backends")
    def forced_attn_backends(attention_layers, kv_sharing_fast_prefill_eligible_layers):
        """The per-layer backends with every ``Attention`` layer forced to one backend."""
        from vllm.model_executor.layers.attention import Attention

        out = real_attn_backends(attention_layers, kv_sharing_fast_prefill_eligible_layers)
        cls = _backend(name)
        return {n: cls if isinstance(attention_layers[n], Attention) else b for n, b in out.items()}

    return forced_attn_backends


def _without_layer_backends(snap):
    # The stock runner's layers were patched; the pipelined runner's layers keep CPU_ATTN.
    return {
        **snap,
        "layers": {
            n: {k: v for k, v in d.items() if k != "backend"} for n, d in snap["layers"].items()
        },
    }


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gemma2"])
@pytest.mark.parametrize("backend", ["FLASH_ATTN", "TRITON_ATTN", "CPU_ATTN"])
def test_forced_backend_kv_phase_matches_stock_runner_methods(model, backend) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention import Attention

    cls = _backend(backend)
    stock_cfg = tiny_vllm_config(model)
    stock = build_runner(stock_cfg)
    kv = plan_kv_cache_config(stock)  # planned with the CPU backends
    for layer in stock_cfg.compilation_config.static_forward_context.values():
        if isinstance(layer, Attention):
            layer.attn_backend = cls
    piped_cfg = tiny_vllm_config(model)
    pipeline = catalog().replace("attn_backends", forced(backend))
    piped = build_runner(piped_cfg, pipelined_runner_class(), pipeline=pipeline)
    plan_kv_cache_config(piped)  # layout + model phase, as the engine does

    with set_current_vllm_config(stock_cfg):
        stock.initialize_kv_cache(copy.deepcopy(kv))
    with set_current_vllm_config(piped_cfg):
        piped.initialize_kv_cache(copy.deepcopy(kv))

    a = _without_layer_backends(runner_snapshot(stock))
    b = _without_layer_backends(runner_snapshot(piped))
    assert diff_snapshots(a, b) == []
    groups = [g for gs in b["attn_groups"] for g in gs]
    assert {g["backend"] for g in groups} == {backend}
    assert {g["builders"][0]["class"] for g in groups} == {BUILDERS[backend]}
    assert b["kv_cache_layout"] == "LBHNC" and b["block_size"] == 128
    assert b["kernel_block_sizes"] == [128] * len(b["attn_groups"])
    if backend == "TRITON_ATTN":  # scratch tensors on the config's device
        settings = groups[0]["builders"][0]["settings"]
        assert any(isinstance(v, dict) and "tensor" in v for v in settings.values())


def test_cudagraph_resolution_with_flash_attention_matches_stock_and_survives_teardown() -> None:
    """A configured FULL mode meets FlashAttention's UNIFORM_BATCH support (as on a GPU
    without FA3): both runners downgrade to FULL_DECODE_ONLY and build the same keys; the
    KV teardown keeps the resolved mode and, as stock's cleanup, the keys; after vLLM's
    profiling-pass ending (keys cleared, then the cleanup) on both, the re-run resolves the
    same mode and keys again (resolution is a fixed point)."""
    from vllm.config import CUDAGraphMode, set_current_vllm_config
    from vllm.model_executor.layers.attention import Attention

    def full(cfg):
        cc = cfg.compilation_config
        cc.cudagraph_mode = CUDAGraphMode.FULL
        cc.cudagraph_capture_sizes, cc.max_cudagraph_capture_size = [1, 2, 4], 4

    stock_cfg, piped_cfg = tiny_vllm_config("tiny-llama"), tiny_vllm_config("tiny-llama")
    stock = build_runner(stock_cfg)
    kv = plan_kv_cache_config(stock)
    for layer in stock_cfg.compilation_config.static_forward_context.values():
        if isinstance(layer, Attention):
            layer.attn_backend = _backend("FLASH_ATTN")
    piped = build_runner(
        piped_cfg,
        pipelined_runner_class(),
        pipeline=catalog().replace("attn_backends", forced("FLASH_ATTN")),
    )
    plan_kv_cache_config(piped)
    full(stock_cfg), full(piped_cfg)

    def init_both():
        for cfg, runner in ((stock_cfg, stock), (piped_cfg, piped)):
            with set_current_vllm_config(cfg):
                runner.initialize_kv_cache(copy.deepcopy(kv))
        a, b = runner_snapshot(stock), runner_snapshot(piped)
        assert diff_snapshots(_without_layer_backends(a), _without_layer_backends(b)) == []
        return b

    first = init_both()
    assert first["cudagraph_mode"] == "CUDAGraphMode.FULL_DECODE_ONLY"
    assert len(first["dispatcher"]["keys"]["FULL"]) == 3
    piped._cleanup_profiling_kv_cache()
    assert piped.cudagraph_dispatcher.keys_initialized is True  # as stock's cleanup leaves
    assert len(piped.cudagraph_dispatcher.cudagraph_keys[CUDAGraphMode.FULL]) == 3
    assert piped_cfg.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY
    stock._cleanup_profiling_kv_cache()
    a, b = runner_snapshot(stock), runner_snapshot(piped)
    assert diff_snapshots(_without_layer_backends(a), _without_layer_backends(b)) == []
    for runner in (stock, piped):  # vLLM's profiling end: keys cleared, then the cleanup
        for keys in runner.cudagraph_dispatcher.cudagraph_keys.values():
            keys.clear()
        runner.cudagraph_dispatcher.keys_initialized = False
        runner._cleanup_profiling_kv_cache()
    for cfg in (stock_cfg, piped_cfg):  # the worker sets it before each real KV init
        cfg.cache_config.num_gpu_blocks = kv.num_blocks
    assert init_both() == first
