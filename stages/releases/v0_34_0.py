"""vLLM 0.34.0: Model Runner V2 only, and the MRv2 stages whose mirrored code changed.

0.34.0 deleted Model Runner V1 (``gpu_model_runner.py``, ``cpu_model_runner.py``,
``VllmConfig.use_v2_model_runner``): :data:`RUNNERS` names MRv2 alone, so the v1 catalog,
its adapter and ``initpipe plan`` are refused on it by name, and the contract declares
none of their vLLM names for it. Each change below was decided name by name in
``docs/maintainers/port-0.34.md``.

0.34 is a new release, not a patch of 0.33: what 0.33 changed holds in 0.34 too, so every
0.33 MRv2 overlay is carried forward (the 0.33 variants are reused, unchanged, where 0.34
did not touch them again), and what 0.34 changed on top:

- MRv2 ``load_model``: ``BatchSharder`` takes the draft model's ``draft_logits`` cache
  (:func:`batch_sharder`); a model state's custom sampler is refused over batch-sharded
  draft logits (:func:`samplers`).
- MRv2 ``initialize_kv_cache``: ``get_block_table_width`` moved to
  ``vllm.v1.kv_cache_interface`` (:func:`block_table_geometry`); the CUDA-graph mode is
  resolved without ``use_v2_model_runner`` and breakable CUDA graphs are a config setting
  (:func:`cudagraph_mode`); ``ModelCudaGraphManager`` takes ``decode_query_lens``
  (:func:`cudagraph_manager`); the HiSparse caches are unbound by
  ``unbind_hisparse_caches`` (:func:`kv_caches_by_layer`'s teardown); the ReplaySSM
  block-copy tensors are gathered after the model state's KV hook
  (:func:`replayssm_block_copy_tensors`); the aux-output connector is created once (by
  ``profile_run`` or the first real KV phase) and only re-initialized per phase
  (:func:`aux_output_connector`, over the runner's current one, the KV input
  ``runner_aux_output_connector``).
- The extensible (VMM-backed) KV cache: not mirrored. The pipelined worker declines it by
  vLLM's own switch (``extensible_kv_cache_unsupported_reason``), so the engine turns it
  off on every rank and logs why (:mod:`initpipe_vllm.hook.worker`); the pipelined runner
  refuses ``initialize_kv_cache(extensible=True)`` by name.

No torch or vllm import at module import time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from initpipe import KV, MODEL, Extension, stage

from ..catalogs import respec, runner_step
from ..mrv2 import (
    INITPIPE_INPUTS as _MRV2_INPUTS,
    kv_phase as _mrv2_kv,
    kv_tensors as _mrv2_kv_tensors,
    model_phase as _mrv2_model,
)
from ..mrv2.types import BlockTableGeometry, RunnerV2Settings
from ..vllm_names import DRAFT_SPECULATOR as _DRAFT, MRV2_RUNNER as _MRV2, MRV2_TEARDOWN
from . import overlay, v0_33_0 as _v0_33_0, variant_meta

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

__all__ = [
    "INPUTS",
    "OVERLAYS",
    "RELEASE",
    "RUNNERS",
    "aux_output_connector",
    "batch_sharder",
    "block_table_geometry",
    "cudagraph_manager",
    "cudagraph_mode",
    "kv_caches_by_layer",
    "replayssm_block_copy_tensors",
    "runner_kv_caches_by_layer",
    "samplers",
]

#: The release this module describes (checked against its name and ``RELEASES``).
RELEASE = "0.34.0"
#: The runners this release has (catalog names): Model Runner V2 only.
RUNNERS = ("mrv2",)

_INIT_KV = f"{_MRV2}.initialize_kv_cache"
_AUX = "vllm.distributed.aux_output_connector.worker"


def _draft_logits(speculator: Any) -> Any:
    """The draft model's logits cache (0.34's ``load_model``: ``speculator.draft_logits``
    for a ``DraftModelSpeculator``, else None)."""
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    return speculator.draft_logits if isinstance(speculator, DraftModelSpeculator) else None


# -- Model Runner V2: the model phase ------------------------------------------------------
@stage(
    needs=MODEL,
    name="batch_sharder",
    provides="batch_sharder",
    meta=variant_meta(_v0_33_0.batch_sharder, _DRAFT, f"{_DRAFT}.draft_logits"),
)
def batch_sharder(
    vllm_config: VllmConfig,
    model: Any,
    runner_settings: RunnerV2Settings,
    decode_query_len: int,
    device: Any,
    speculator: Any,
) -> Any:
    """0.33's variant, ``BatchSharder`` also given the draft model's logits cache (it then
    assigns each request to the rank that cached its draft logits, not round-robin). The
    speculator loaded its draft model, and allocated that cache, with the weights."""
    spec = vllm_config.speculative_config
    return _mrv2_model.build_batch_sharder(
        vllm_config,
        model,
        runner_settings,
        decode_query_len,
        device,
        adaptive_verification_enabled=spec is not None and spec.enable_adaptive_verification,
        draft_logits=_draft_logits(speculator),
    )


@stage(
    needs=MODEL,
    name="samplers",
    provides=("sampler", "rejection_sampler"),
    meta=variant_meta(_v0_33_0.samplers, _DRAFT, f"{_DRAFT}.draft_logits"),
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
    speculator: Any,
) -> Any:
    """0.33's variant; a model state's own sampler is adopted only where no batch-sharded
    draft logits exist (0.34 asserts it: a custom rejection sampler cannot read them)."""

    def check_custom() -> None:
        draft_logits = _draft_logits(speculator)
        assert draft_logits is None or draft_logits.row_mapping is None, (
            "A custom rejection sampler cannot read batch-sharded draft logits"
        )

    _v0_33_0.cuda_speculative_warmups(vllm_config, runner_settings, jit_warmup_registry)
    return _mrv2_model.build_samplers(
        vllm_config,
        device,
        runner_settings,
        req_states,
        model_state,
        decode_query_len,
        custom_logits_processors,
        jit_warmup_registry,
        check_custom=check_custom,
    )


# -- Model Runner V2: the KV phase ---------------------------------------------------------
_OLD_WIDTH = "vllm.v1.worker.block_table:get_block_table_width"


@stage(
    needs=KV,
    name="block_table_geometry",
    provides="block_table_geometry",
    meta=variant_meta(
        _v0_33_0.block_table_geometry,
        "vllm.v1.kv_cache_interface:get_block_table_width",
        drop=(_OLD_WIDTH,),
    ),
)
def block_table_geometry(
    vllm_config: VllmConfig,
    kv_cache_config: KVCacheConfig,
    max_model_len: int,
    runner_settings: RunnerV2Settings,
) -> BlockTableGeometry:
    """0.33's variant (the sliding-window reach), ``get_block_table_width`` read where 0.34
    moved it (``vllm.v1.kv_cache_interface``; ``vllm/v1/worker/block_table.py`` is gone)."""
    from vllm.v1.kv_cache_interface import get_block_table_width

    geometry = _mrv2_kv.build_block_table_geometry(
        vllm_config, kv_cache_config, max_model_len, runner_settings, get_block_table_width
    )
    return _v0_33_0.with_sliding_window_reach(geometry, kv_cache_config)


_BREAKABLE = "vllm.compilation.breakable_cudagraph:is_breakable_cudagraph_enabled"


@stage(
    needs=KV,
    name="cudagraph_mode",
    provides="cudagraph_mode",
    after=("mamba_ssu_backend",),
    effects=("compilation_config.cudagraph_mode", "compilation_config capture sizes"),
    meta=variant_meta(
        _mrv2_kv.cudagraph_mode, _BREAKABLE, drop=("vllm.envs:VLLM_USE_BREAKABLE_CUDAGRAPH",)
    ),
)
def cudagraph_mode(
    vllm_config: VllmConfig,
    model: Any,
    attn_cg_support: Any,
    adaptive_verification: Any,
    decode_query_len: int,
    runner_kv_cache_config: KVCacheConfig,
    runner_settings: RunnerV2Settings,
    is_profiling: bool,
) -> Any:
    """The base stage as 0.34 resolves the mode: piecewise capture is available where
    breakable CUDA graphs are enabled (now a compilation-config setting, the environment
    variable its fallback) or the model has a compiled submodule; no
    ``use_v2_model_runner`` argument (0.34 has one runner)."""
    from vllm.compilation.breakable_cudagraph import is_breakable_cudagraph_enabled
    from vllm.v1.worker.gpu.cudagraph_utils import has_compiled_submodule

    piecewise = bool(
        is_breakable_cudagraph_enabled(vllm_config.compilation_config)
        or has_compiled_submodule(model)
    )
    return _mrv2_kv.resolve_cudagraph_mode(
        vllm_config,
        piecewise,
        attn_cg_support,
        adaptive_verification,
        decode_query_len,
        runner_kv_cache_config,
        runner_settings,
        is_profiling,
    )


@stage(
    needs=KV,
    name="cudagraph_manager",
    provides="cudagraph_manager",
    meta=variant_meta(
        _mrv2_kv.cudagraph_manager, "vllm.config.vllm:VllmConfig.get_decode_cudagraph_query_lens"
    ),
)
def cudagraph_manager(
    vllm_config: VllmConfig,
    device: Any,
    cudagraph_mode: Any,
    decode_query_len: int,
    lora_capture_cases: Any,
    adaptive_verification: Any,
    ubatch_runner: Any,
) -> Any:
    """The base stage, the manager given 0.34's ``decode_query_lens`` (the config's map of
    decode query length -> batch size: ``{decode_query_len: max_num_seqs}`` but under
    dynamic speculative decoding)."""
    return _mrv2_kv.build_cudagraph_manager(
        vllm_config,
        device,
        cudagraph_mode,
        lora_capture_cases,
        adaptive_verification,
        ubatch_runner,
        decode_query_lens=vllm_config.get_decode_cudagraph_query_lens(decode_query_len),
    )


_HISPARSE_OLD = "vllm.v1.hisparse.binding:release_hisparse_profiling_cache"
_HISPARSE = "vllm.v1.hisparse.binding:unbind_hisparse_caches"


def _unbind_layers(kv_caches_by_layer: dict[str, Any], vllm_config: VllmConfig, model: Any) -> None:
    """The base teardown, HiSparse caches unbound as 0.34's ``_teardown_profiling_state``
    does (``unbind_hisparse_caches``)."""
    from vllm.v1.hisparse.binding import unbind_hisparse_caches

    _mrv2_kv_tensors.unbind_layers(kv_caches_by_layer, vllm_config, model, unbind_hisparse_caches)


#: The base stage's body and edges, with 0.34's teardown (and its declaration).
kv_caches_by_layer = respec(
    _mrv2_kv_tensors.kv_caches_by_layer,
    teardown=_unbind_layers,
    meta=variant_meta(_mrv2_kv_tensors.kv_caches_by_layer, _HISPARSE, drop=(_HISPARSE_OLD,)),
)


@runner_step(KV, _INIT_KV, after=("runner_kv_caches",))
def runner_kv_caches_by_layer(
    kv_caches_by_layer: dict[str, Any], is_profiling: bool
) -> dict[str, Any] | None:
    """The runner's ``kv_caches_by_layer`` (0.34: the same dict, kept on a real KV phase
    for ``extend_kv_cache`` and ``shutdown``); None while profiling, where stock leaves the
    attribute alone. The dict is emptied in place by :func:`kv_caches_by_layer`'s
    teardown, as stock's ``_teardown_profiling_state`` empties it."""
    return None if is_profiling else kv_caches_by_layer


def _clear_list(replayssm_block_copy_tensors: list[Any]) -> None:
    replayssm_block_copy_tensors.clear()


@runner_step(
    KV,
    (_INIT_KV, MRV2_TEARDOWN),
    "vllm.v1.worker.replayssm_utils:get_replayssm_block_copy_tensors",
    "vllm.config.compilation:CompilationConfig.static_forward_context",
    after=("model_state_kv",),
    teardown=_clear_list,
)
def replayssm_block_copy_tensors(vllm_config: VllmConfig, model_state_kv: bool) -> list[Any]:
    """The ReplaySSM block-copy tensors of the bound layers (0.34's
    ``get_replayssm_block_copy_tensors`` over the forward context; empty without
    FlashInfer ReplaySSM Mamba layers), the runner's ``replayssm_block_copy_tensors``:
    ``update_requests`` reads it unguarded. Every phase, profiling included, as stock.
    ``model_state_kv`` orders it after the model state's KV hook."""
    from vllm.v1.worker.replayssm_utils import (  # type: ignore[import-not-found, unused-ignore]
        get_replayssm_block_copy_tensors,
    )

    return list(
        get_replayssm_block_copy_tensors(vllm_config.compilation_config.static_forward_context)
    )


def _close_aux(aux_output_connector: Any) -> None:
    if aux_output_connector is not None:
        aux_output_connector.close()


@runner_step(
    KV,
    _INIT_KV,
    f"{_AUX}:get_aux_output_connector",
    f"{_AUX}:AuxOutputWorkerConnector.initialize_output_storage",
    f"{_AUX}:AuxOutputWorkerConnector.close",
    after=("kv_connector",),
    teardown=_close_aux,
)
def aux_output_connector(
    vllm_config: VllmConfig,
    model: Any,
    runner_kv_cache_config: KVCacheConfig,
    is_profiling: bool,
    runner_aux_output_connector: Any,
) -> Any:
    """The aux-output (R3 capture) connector when enabled and not profiling (else None: the
    runner keeps its own). 0.34 creates it once, in ``profile_run`` or the first real KV
    phase (its constructor binds a capturer into the model), and each real KV phase only
    re-initializes its storage over the new config: the runner's current connector
    (``runner_aux_output_connector``) is reused when there is one. The teardown closes it
    (its store and pending outputs only: the next phase re-initializes it)."""
    if is_profiling or not vllm_config.aux_output_config.enabled:
        return None
    from vllm.distributed.aux_output_connector.worker import get_aux_output_connector

    connector = runner_aux_output_connector
    if connector is None:
        connector = get_aux_output_connector(model, vllm_config)
    connector.initialize_output_storage(runner_kv_cache_config)
    return connector


#: The KV-phase inputs of the MRv2 catalog on 0.34.0: 0.32's and the runner's current
#: aux-output connector (created once; each real KV phase re-initializes it).
_MRV2_KV = {**_MRV2_INPUTS["kv_cache_config"], "runner_aux_output_connector": None}

#: The catalog inputs 0.34.0 declares anew: 0.33's start inputs (the PCP manager its
#: runner's ``__init__`` builds) and the KV inputs above.
INPUTS: Mapping[str, Mapping[str, Any]] = {
    "initpipe_vllm.mrv2": {
        "start": _v0_33_0.INPUTS["initpipe_vllm.mrv2"]["start"],
        "kv_cache_config": _MRV2_KV,
    }
}


#: The stage overlays for this release, applied by ``initpipe_vllm.catalogs.build``: 0.33's
#: MRv2 variants carried forward, 0.34's replacing three of them, and 0.34's own.
OVERLAYS: tuple[Extension, ...] = (
    overlay(
        RELEASE,
        "initpipe_vllm.mrv2",
        {
            "batch_sharder": batch_sharder,
            "samplers": samplers,
            "structured_outputs_worker": _v0_33_0.structured_outputs_worker,
            "block_table_geometry": block_table_geometry,
            "block_tables": _v0_33_0.block_tables,
            "adaptive_verification": _v0_33_0.adaptive_verification,
            "pcp_manager": _v0_33_0.pcp_manager,
            "cudagraph_mode": cudagraph_mode,
            "cudagraph_manager": cudagraph_manager,
            "kv_caches_by_layer": kv_caches_by_layer,
            "aux_output_connector": aux_output_connector,
        },
        add=(runner_kv_caches_by_layer, replayssm_block_copy_tensors),
    ),
)
