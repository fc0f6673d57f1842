"""Example extension: replace the catalog's KV allocation stage by name.

A hardware-backend author who today overrides vLLM's whole ``initialize_kv_cache`` only to
change how KV memory is obtained replaces ONE stage instead. This one keeps vLLM's layout
(it calls the catalog's own stage) and adds an accounting of what was allocated, with a
teardown that releases it the catalog's way. Enable with ``INITPIPE_EXTENSIONS=example_alloc``.
"""

from __future__ import annotations

from typing import Any

from initpipe import Extension, stage
from initpipe_vllm.v1 import kv_tensors

#: (event, bytes) of every allocation and release, for the operator (and the tests)
LEDGER: list[tuple[str, int]] = []


def _distinct_bytes(views: dict[str, Any]) -> int:
    seen = {v.untyped_storage().data_ptr(): v.untyped_storage().nbytes() for v in views.values()}
    return sum(seen.values())


def _release(views: dict[str, Any]) -> None:
    LEDGER.append(("release", _distinct_bytes(views)))
    kv_tensors.allocated_kv_caches.__initpipe_stage__.teardown(views)


@stage(needs="kv_cache_config", provides="allocated_kv_caches", teardown=_release)
def accounted_allocation(
    vllm_config,
    device,
    runner_kv_cache_config,
    kernel_block_sizes,
    kv_cache_layout,
    kv_cache_allocation_context,
    jit_warmup_registry,
):
    """vLLM's allocation (through the catalog stage), with every byte accounted for."""
    views = kv_tensors.allocated_kv_caches(
        vllm_config,
        device,
        runner_kv_cache_config,
        kernel_block_sizes,
        kv_cache_layout,
        kv_cache_allocation_context,
        jit_warmup_registry,
    )
    LEDGER.append(("allocate", _distinct_bytes(views)))
    return views


EXTENSION = Extension(
    name="example_alloc",
    replace={"allocated_kv_caches": accounted_allocation},
    # a v1 catalog stage: Model Runner V2's catalog (initpipe_vllm.mrv2) is left alone
    applies_to=("initpipe_vllm",),
)
