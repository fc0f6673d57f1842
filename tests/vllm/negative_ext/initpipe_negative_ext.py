"""Test-only extensions that make the pipelined engine wrong on purpose, by one detail.

The equivalence chain's negative tests (``tests/vllm/test_equivalence_negative.py``) enable
them with ``INITPIPE_EXTENSIONS`` (a dist-info written next to this folder names the entry
points); the stock engine has no pipeline, so only the pipelined side changes. Each wraps
the catalog's own stage and alters its result minimally:

- ``perturb_kv_block``: after vLLM's allocation, the last KV block of the first layer holds
  ones instead of zeros (the workload never reaches that block);
- ``swap_kv_bindings``: the first two layers' KV views are exchanged before binding, so
  layer 0 reads and writes layer 1's memory and the reverse (consistently: the outputs
  stay the same; only the runner state can show it).
"""

from __future__ import annotations

from typing import Any

from initpipe import Extension, get_spec, stage
from initpipe_vllm.v1 import kv_tensors

_ALLOC = get_spec(kv_tensors.allocated_kv_caches)


@stage(
    needs="kv_cache_config",
    provides="allocated_kv_caches",
    after=_ALLOC.after,
    teardown=kv_tensors.allocated_kv_caches.__initpipe_stage__.teardown,  # type: ignore[attr-defined]
)
def perturbed_allocation(
    vllm_config: Any,
    device: Any,
    runner_kv_cache_config: Any,
    kernel_block_sizes: Any,
    kv_cache_layout: Any,
    kv_cache_allocation_context: Any,
    jit_warmup_registry: Any,
) -> dict[str, Any]:
    """vLLM's allocation, then the first layer's last block (dim 0) filled with ones."""
    views = kv_tensors.allocated_kv_caches(
        vllm_config,
        device,
        runner_kv_cache_config,
        kernel_block_sizes,
        kv_cache_layout,
        kv_cache_allocation_context,
        jit_warmup_registry,
    )
    first = views[sorted(views)[0]]
    first[first.shape[0] - 1].fill_(1)
    return views


@stage(
    needs="kv_cache_config",
    provides="kv_caches",
    teardown=kv_tensors.kv_caches.__initpipe_stage__.teardown,  # type: ignore[attr-defined]
)
def swapped_kv_caches(allocated_kv_caches: Any, shared_kv_cache_layers: Any) -> dict[str, Any]:
    """The catalog's per-layer views with the first two layers' views exchanged."""
    out = kv_tensors.kv_caches(allocated_kv_caches, shared_kv_cache_layers)
    a, b = sorted(out)[:2]
    out[a], out[b] = out[b], out[a]
    return out


PERTURB_KV_BLOCK = Extension(
    name="perturb_kv_block",
    replace={"allocated_kv_caches": perturbed_allocation},
    applies_to=("initpipe_vllm",),
)
SWAP_KV_BINDINGS = Extension(
    name="swap_kv_bindings",
    replace={"kv_caches": swapped_kv_caches},
    applies_to=("initpipe_vllm",),
)
