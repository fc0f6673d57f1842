"""Start a real vLLM CPU engine in-process and print its runner's KV caches as JSON.

Run as a script in its own process (the engine binds process-global state):
``python _real_cpu.py MODEL_DIR KV_BYTES``. Prints one JSON object on the last line.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def main() -> None:
    model_dir, kv_bytes = sys.argv[1], int(sys.argv[2])
    from vllm import LLM

    from initpipe_vllm.testing.stock import require_stock, runner_classes

    llm = LLM(
        model=model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype="float32",
        max_model_len=256,
        max_num_seqs=4,
        seed=0,
        kv_cache_memory_bytes=kv_bytes,
    )
    # the caller cleared INITPIPE_VLLM: the oracle must be vLLM's own runner
    require_stock(llm, "the real CPU engine (the plan's oracle)")
    core = llm.llm_engine.engine_core.engine_core
    runner = core.model_executor.driver_worker.worker.model_runner
    cfg = runner.kv_cache_config
    layers = [
        {
            "shape": list(t.shape),
            "stride": list(t.stride()),
            "dtype": str(t.dtype),
            "bytes": t.numel() * t.element_size(),
        }
        for t in runner.kv_caches
    ]
    out = {
        "runners": runner_classes(llm),
        "num_blocks": cfg.num_blocks,
        "block_size": runner.cache_config.block_size,
        "layout": runner.cache_config.kv_cache_layout,
        "kernel_block_sizes": list(runner._kernel_block_sizes),
        "total_bytes": runner.kv_caches[0].untyped_storage().nbytes(),
        "tensor_sizes": [t.size for t in cfg.kv_cache_tensors],
        "builders": [
            type(g.get_metadata_builder()).__name__ for gs in runner.attn_groups for g in gs
        ],
        "layers": layers,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
