"""vLLM 0.33.0: the catalog stages whose mirrored vLLM code changed in a way that matters.

Each overlay replaces a stage of a catalog pipeline with its 0.33.0 variant; the variant's
body sits here and reuses the base stage's body (it calls the base stage, or the base's
``build_*`` helper with what 0.33's constructor adds), declared for this release in its
``meta``. Functions outside the catalogs (live resize, planning, the start-up report) keep
their 0.33.0 variants beside the base function, registered with
:func:`initpipe_vllm.contract.variants.by_release`. Which release runs is the contract's
answer (the lock the installed vLLM matches), never a version string.

What 0.33.0 changed that matters to a stage, and the variant of each:

- v1 ``GPUModelRunner.get_kv_cache_spec`` marks a draft model's layers
  (``AttentionLayerBase.is_draft_layer``) with ``is_draft=True`` on their spec, which
  0.33's KV planning reads to mark the EAGLE groups: :func:`kv_cache_spec` does the same
  after the base stage.
- MRv2 ``initialize_kv_cache``: ``BlockTables`` takes each group's sliding-window reach
  (:func:`block_table_geometry` adds it, :func:`block_tables` passes it); the PCP manager
  is built by the runner's ``__init__`` (before memory profiling) and only gets the new
  block tables here (:func:`pcp_manager`, over the start input ``pcp_manager_at_init``
  that :data:`INPUTS` adds); adaptive verification copies the admitted drafts to the host under
  batch-sharded sampling (:func:`adaptive_verification`).
- MRv2 ``load_model``: ``BatchSharder`` takes ``adaptive_verification_enabled``
  (:func:`batch_sharder`), ``StructuredOutputsWorker`` lost ``num_bonus_tokens``
  (:func:`structured_outputs_worker`), and CUDA registers the native top-k/top-p warm-ups
  under speculative decoding as ROCm always did (:func:`samplers`).

No torch or vllm import at module import time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from initpipe import KV, MODEL, Extension, stage

from ..mrv2 import INITPIPE_INPUTS as _MRV2_INPUTS, kv_phase as _mrv2_kv, model_phase as _mrv2_model
from ..mrv2.types import BlockTableGeometry, RunnerV2Settings
from ..v1 import model_phase as _v1_model
from ..vllm_names import (
    DRAFT_SPECULATOR as _DRAFT,
    MODEL_STATE as _MODEL_STATE,
    MRV2_RUNNER as _MRV2,
)
from . import overlay, variant_meta

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec

__all__ = [
    "INPUTS",
    "OVERLAYS",
    "RELEASE",
    "RUNNERS",
    "adaptive_verification",
    "batch_sharder",
    "block_table_geometry",
    "block_tables",
    "kv_cache_spec",
    "pcp_manager",
    "samplers",
    "structured_outputs_worker",
]

#: The release this module describes (checked against its name and ``RELEASES``).
RELEASE = "0.33.0"
#: The runners this release has (catalog names): both.
RUNNERS = ("v1", "mrv2")

_KV_INTERFACE = "vllm.v1.kv_cache_interface"


# -- v1 --------------------------------------------------------------------------------
@stage(
    needs=MODEL,
    name="kv_cache_spec",
    provides="kv_cache_spec",
    meta=variant_meta(
        _v1_model.kv_cache_spec,
        "vllm.model_executor.layers.attention_layer_base:AttentionLayerBase.is_draft_layer",
        f"{_KV_INTERFACE}:KVCacheSpec.is_draft",
    ),
)
def kv_cache_spec(
    vllm_config: VllmConfig,
    attention_layers: Mapping[str, AttentionLayerBase],
    shared_kv_cache_layers: Mapping[str, str],
) -> dict[str, KVCacheSpec]:
    """The base stage's specs, a draft model's layers marked ``is_draft=True``, as 0.33's
    ``get_kv_cache_spec`` marks them (its KV planning groups the draft layers as EAGLE
    groups by it; the field is left out of spec equality, so nothing else sees it)."""
    from dataclasses import replace

    specs = _v1_model.kv_cache_spec(vllm_config, attention_layers, shared_kv_cache_layers)
    return {
        name: replace(spec, is_draft=True) if attention_layers[name].is_draft_layer else spec
        for name, spec in specs.items()
    }


# -- Model Runner V2: the model phase ------------------------------------------------------
@stage(
    needs=MODEL,
    name="batch_sharder",
    provides="batch_sharder",
    meta=variant_meta(
        _mrv2_model.batch_sharder,
        "vllm.config.speculative:SpeculativeConfig.enable_adaptive_verification",
    ),
)
def batch_sharder(
    vllm_config: VllmConfig,
    model: Any,
    runner_settings: RunnerV2Settings,
    decode_query_len: int,
    device: Any,
) -> Any:
    """The base stage, ``BatchSharder`` told whether adaptive verification is enabled."""
    spec = vllm_config.speculative_config
    return _mrv2_model.build_batch_sharder(
        vllm_config,
        model,
        runner_settings,
        decode_query_len,
        device,
        adaptive_verification_enabled=spec is not None and spec.enable_adaptive_verification,
    )


@stage(
    needs=MODEL,
    name="samplers",
    provides=("sampler", "rejection_sampler"),
    meta=variant_meta(_mrv2_model.samplers, "vllm.platforms.interface:Platform.is_cuda"),
)
def samplers(
    vllm_config: VllmConfig,
    device: Any,
    runner_settings: RunnerV2Settings,
    req_states: Any,
    model_state: Any,
    decode_query_len: int,
    custom_logits_processors: Any,
    jit_warmup_registry: Any,
) -> Any:
    """The base stage; first, on CUDA under speculative decoding, the native top-k/top-p
    warm-ups (speculative verification uses native masking there), as 0.33 registers them
    (ROCm's, always, the base stage registers)."""
    cuda_speculative_warmups(vllm_config, runner_settings, jit_warmup_registry)
    return _mrv2_model.samplers(
        vllm_config,
        device,
        runner_settings,
        req_states,
        model_state,
        decode_query_len,
        custom_logits_processors,
        jit_warmup_registry,
    )


def cuda_speculative_warmups(
    vllm_config: VllmConfig, runner_settings: RunnerV2Settings, jit_warmup_registry: Any
) -> None:
    """0.33's registration of the native top-k/top-p warm-ups on CUDA under speculative
    decoding (the part of :func:`samplers` before the base stage; 0.34's reuses it)."""
    from vllm.platforms import current_platform

    if (
        runner_settings.is_last_pp_rank
        and not runner_settings.is_pooling_model
        and current_platform.is_cuda()
        and vllm_config.speculative_config is not None
    ):
        from vllm.v1.sample.ops.topk_topp_sampler import register_top_k_top_p_warmups

        with jit_warmup_registry.activate():
            register_top_k_top_p_warmups()


@stage(
    needs=MODEL,
    name="structured_outputs_worker",
    provides="structured_outputs_worker",
    after=("prompt_logprobs_worker",),
    meta=variant_meta(
        _mrv2_model.structured_outputs_worker,
        drop=(f"{_MODEL_STATE}.num_new_sampled_tokens_per_step",),
    ),
)
def structured_outputs_worker(
    device: Any, runner_settings: RunnerV2Settings, decode_query_len: int
) -> Any:
    """The base stage without ``num_bonus_tokens`` (0.33's worker keys the grammar masks by
    request and position; it no longer takes it)."""
    return _mrv2_model.build_structured_outputs_worker(device, runner_settings, decode_query_len)


# -- Model Runner V2: the KV phase ---------------------------------------------------------
@stage(
    needs=KV,
    name="block_table_geometry",
    provides="block_table_geometry",
    meta=variant_meta(
        _mrv2_kv.block_table_geometry,
        f"{_KV_INTERFACE}:SlidingWindowSpec",
        f"{_KV_INTERFACE}:SlidingWindowSpec.num_retained_tokens",
    ),
)
def block_table_geometry(
    vllm_config: VllmConfig,
    kv_cache_config: KVCacheConfig,
    max_model_len: int,
    runner_settings: RunnerV2Settings,
) -> BlockTableGeometry:
    """The base stage's geometry plus each group's sliding-window reach
    (``SlidingWindowSpec.num_retained_tokens``, else 0), which 0.33's ``BlockTables`` masks
    the out-of-window block-table entries by."""
    geometry = _mrv2_kv.block_table_geometry(
        vllm_config, kv_cache_config, max_model_len, runner_settings
    )
    return with_sliding_window_reach(geometry, kv_cache_config)


def with_sliding_window_reach(
    geometry: BlockTableGeometry, kv_cache_config: KVCacheConfig
) -> BlockTableGeometry:
    """``geometry`` with each group's sliding-window reach (the body of
    :func:`block_table_geometry` after the base stage; 0.34's variant reuses it)."""
    from vllm.v1.kv_cache_interface import SlidingWindowSpec, UniformTypeKVCacheSpecs

    reach = []
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        layer_spec = spec.first_spec if isinstance(spec, UniformTypeKVCacheSpecs) else spec
        is_window = isinstance(layer_spec, SlidingWindowSpec)
        reach.append(layer_spec.num_retained_tokens if is_window else 0)
    return attrs.evolve(geometry, sliding_window_reach=reach)


@stage(
    needs=KV,
    name="block_tables",
    provides="block_tables",
    after=("adaptive_verification",),
    meta=variant_meta(_mrv2_kv.block_tables),
)
def block_tables(
    device: Any, block_table_geometry: BlockTableGeometry, runner_settings: RunnerV2Settings
) -> Any:
    """The base stage, ``BlockTables`` given the groups' sliding-window reach."""
    reach = block_table_geometry.sliding_window_reach
    return _mrv2_kv.build_block_tables(
        device,
        block_table_geometry,
        runner_settings,
        sliding_window_reach=None if reach is None else list(reach),
    )


@stage(
    needs=KV,
    name="adaptive_verification",
    provides="adaptive_verification",
    meta=variant_meta(_mrv2_kv.adaptive_verification),
)
def adaptive_verification(
    vllm_config: VllmConfig,
    speculator: Any,
    attn_groups: list[list[Any]],
    req_states: Any,
    input_buffers: Any,
    model_state: Any,
    runner_settings: RunnerV2Settings,
    target_attn_layer_names: Any,
    batch_sharder: Any,
) -> Any:
    """The base stage; the manager copies the admitted drafts to the host where sampling
    is batch-sharded (0.33's ``copy_admitted_drafts_to_host``)."""
    return _mrv2_kv.build_adaptive_verification(
        vllm_config,
        speculator,
        attn_groups,
        req_states,
        input_buffers,
        model_state,
        runner_settings,
        target_attn_layer_names,
        copy_admitted_drafts_to_host=batch_sharder is not None,
    )


def _unset_speculator_pcp(pcp_manager: Any, speculator: Any) -> None:
    if speculator is not None:
        speculator.pcp_manager = None


@stage(
    needs=KV,
    name="pcp_manager",
    provides="pcp_manager",
    teardown=_unset_speculator_pcp,
    effects=("speculator.pcp_manager", "pcp_manager_at_init: its block tables"),
    meta={
        "mirrors": (f"{_MRV2}.initialize_kv_cache",),
        "calls": (
            f"{_MRV2}.pcp_manager",
            "vllm.v1.worker.gpu.pcp_manager:PCPManager.set_block_tables",
            f"{_DRAFT}.pcp_manager",
        ),
    },
)
def pcp_manager(pcp_manager_at_init: Any, block_tables: Any, speculator: Any) -> Any:
    """The PCP manager the runner's ``__init__`` built (0.33 builds it before memory
    profiling; None without PCP), given this KV phase's block tables; the speculator gets
    it too. Stock keeps the same object across KV phases: so does this (the runner's
    ``pcp_manager`` is written back unchanged). Never run with PCP here (CPU, one worker):
    written from vLLM's code, its teardown exercised by fault injection."""
    if pcp_manager_at_init is not None:
        pcp_manager_at_init.set_block_tables(block_tables)
    if speculator is not None:
        speculator.pcp_manager = pcp_manager_at_init
    return pcp_manager_at_init


#: The start inputs of the MRv2 catalog on 0.33.0: 0.32.0's and the runner's
#: ``pcp_manager``, which its ``__init__`` builds there (the catalog is validated with its
#: 0.32.0 stages before the overlays replace them, so ``pcp_manager_cls`` stays declared).
_MRV2_START = (*_MRV2_INPUTS["start"], "pcp_manager_at_init")

#: The catalog inputs 0.33.0 declares anew: pipeline name -> phase -> inputs.
INPUTS: Mapping[str, Mapping[str, Any]] = {"initpipe_vllm.mrv2": {"start": _MRV2_START}}


#: The stage overlays for this release, applied by ``initpipe_vllm.catalogs.build``.
OVERLAYS: tuple[Extension, ...] = (
    overlay(RELEASE, "initpipe_vllm", {"kv_cache_spec": kv_cache_spec}),
    overlay(
        RELEASE,
        "initpipe_vllm.mrv2",
        {
            "batch_sharder": batch_sharder,
            "samplers": samplers,
            "structured_outputs_worker": structured_outputs_worker,
            "block_table_geometry": block_table_geometry,
            "block_tables": block_tables,
            "adaptive_verification": adaptive_verification,
            "pcp_manager": pcp_manager,
        },
    ),
)
