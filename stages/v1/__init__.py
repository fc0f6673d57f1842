"""The v1 runner's catalog: vLLM's ``GPUModelRunner`` initialization, as initpipe stages.

What belongs here: ``GPUModelRunner``'s initialization (``vllm/v1/worker/gpu_model_runner.py``:
``get_kv_cache_spec`` and ``initialize_kv_cache`` with everything they call) rebuilt as
stages that call vLLM's own building blocks — stages and the values they pass, nothing
else:

- :mod:`.model_phase` — facts about the loaded model's attention layers (needs ``model``);
- :mod:`.kv_phase` — the runner's working config, attention groups, cudagraph mode,
  kernel block sizes, metadata builders and input batch (needs ``kv_cache_config``);
- :mod:`.kv_tensors` — allocation, KV-sharing aliases, binding, connector registration;
- :mod:`.types` — the plain records stages read instead of runner attributes.

:data:`CATALOG` declares the pipeline; :mod:`initpipe_vllm.catalogs` builds it per vLLM
release (the release's overlays from :mod:`initpipe_vllm.releases`), and the package
``initpipe_vllm`` re-exports it (``initpipe_vllm.catalog()``, ``initpipe_vllm:pipeline``).
The sibling catalog :mod:`initpipe_vllm.mrv2` never is imported from here; it re-specs a
stage of this one where vLLM's two runners run the same code. Importing this package
imports neither torch nor vllm.
"""

from __future__ import annotations

from typing import Any

from initpipe import REQUIRED

from ..catalogs import CatalogDef
from .kv_phase import (
    attention_groups,
    cudagraph_mode,
    drafter_attn_groups,
    encoder_only_kv_cache_group,
    kernel_block_sizes,
    mamba_ssu_backend,
    metadata_builders,
    reinitialize_input_batch,
    reorder_batch_threshold,
    runner_kv_cache_config,
)
from .kv_tensors import (
    allocated_kv_caches,
    extract_hidden_states_check,
    kv_block_zeroer,
    kv_caches,
    kv_connector_registration,
    runner_kv_caches,
)
from .model_phase import (
    attention_cp_compatible,
    attention_layers,
    attn_backends,
    encoder_only_layers,
    kv_cache_spec,
    kv_sharing_fast_prefill_eligible_layers,
    runner_only_attn_layers,
    shared_kv_cache_layers,
)

#: The catalog's external inputs per phase (read by ``Pipeline.from_module``).
#: Start: fixed when the runner is constructed. Model: the loaded model. KV: the engine's
#: config plus every value vLLM may change between the phases (layout, max_model_len) and
#: the runner's current input batch, read when ``initialize_kv_cache`` is called.
INITPIPE_INPUTS: dict[str, Any] = {
    "start": (
        "vllm_config",
        "device",
        "runner_settings",
        "cudagraph_dispatcher",
        "drafter",
        "jit_warmup_registry",
    ),
    "model": ("model",),
    "kv_cache_config": {
        "kv_cache_config": REQUIRED,
        "is_profiling": False,
        "kv_cache_allocation_context": None,
        "kv_cache_layout": None,
        "max_model_len": REQUIRED,
        "current_input_batch": REQUIRED,
        "current_input_batch_geometry": REQUIRED,
    },
}

STAGES = (
    attention_layers,
    shared_kv_cache_layers,
    kv_cache_spec,
    encoder_only_layers,
    kv_sharing_fast_prefill_eligible_layers,
    runner_only_attn_layers,
    attn_backends,
    attention_cp_compatible,
    encoder_only_kv_cache_group,
    runner_kv_cache_config,
    attention_groups,
    cudagraph_mode,
    mamba_ssu_backend,
    kernel_block_sizes,
    metadata_builders,
    reorder_batch_threshold,
    drafter_attn_groups,
    reinitialize_input_batch,
    allocated_kv_caches,
    kv_caches,
    runner_kv_caches,
    extract_hidden_states_check,
    kv_connector_registration,
    kv_block_zeroer,
)

#: The v1 catalog as data: built per release by :func:`initpipe_vllm.catalogs.build`.
CATALOG = CatalogDef(name="initpipe_vllm", stages=STAGES, inputs=INITPIPE_INPUTS, runner="v1")

__all__ = [
    "CATALOG",
    "INITPIPE_INPUTS",
    "STAGES",
    *(s.__name__ for s in STAGES),
]
