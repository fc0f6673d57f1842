"""KV-phase stages of Model Runner V2, up to the CUDA-graph manager.

What belongs here: the steps of MRv2's ``GPUModelRunner.initialize_kv_cache``
(``vllm/v1/worker/gpu/model_runner.py``) that decide how the KV cache is read — the
block-table geometry, the speculator's layer split, ``init_attn_backend`` (working copy of
the config, attention groups, kernel block sizes, metadata builders), CUDA-graph support,
adaptive verification, ``BlockTables``, the PCP manager, the microbatch runner, the Mamba
SSU backend, the resolved CUDA-graph mode, ``ModelCudaGraphManager``, fast prefill and the
context-parallel check. The tensor half (speculator attention, allocation and binding,
model-state KV, connectors, zeroer) is in :mod:`.kv_tensors`.

Order: MRv2 builds the metadata builders (inside ``init_attn_backend``) *before* it
resolves the CUDA-graph mode — the reverse of v1 — and its ModelCudaGraphManager reads the
resolved mode. Where stock's order is not implied by data, ordering-only edges
(``after=``) keep it (e.g. the Mamba SSU backend, a process global, is selected after the
microbatch runner and before the mode is resolved, as in stock).

Each stage declares the part of ``initialize_kv_cache`` it replaces and the vLLM names it
calls (``meta``: ``mirrors`` and ``calls``, shown by ``initpipe graph``). vLLM's building
blocks are called whole: ``init_attn_backend``, ``BlockTables``,
``maybe_build_pcp_manager``, ``maybe_build_ubatch_runner``, ``initialize_mamba_ssu_backend``,
``resolve_cudagraph_mode_and_sizes``, ``ModelCudaGraphManager``, ``FastPrefillHelper``,
``check_attention_cp_compatibility``. torch and vllm are imported inside stage bodies only.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..catalogs import respec
from ..v1 import kv_phase as _v1_kv_phase
from ..vllm_names import (
    DRAFT_SPECULATOR as _DRAFT,
    MODEL_STATE as _MODEL_STATE,
    MRV2_RUNNER as _RUNNER,
)
from .steps import kv_step as _kv_step
from .types import BlockTableGeometry, RunnerV2Settings

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

#: The vLLM module and method the stages below call into (MRv2's runner, speculator and
#: model state come from :mod:`initpipe_vllm.vllm_names`).
_ATTN = "vllm.v1.worker.gpu.attn_utils"
_JIT_ACTIVATE = "vllm.model_executor.warmup.jit_warmup:JitWarmupRegistry.activate"

__all__ = [
    "adaptive_verification",
    "attention_cp_compatible",
    "attn_backend",
    "attn_cg_support",
    "block_table_geometry",
    "block_tables",
    "cudagraph_manager",
    "cudagraph_mode",
    "fast_prefill",
    "mamba_ssu_backend",
    "pcp_manager",
    "speculator_layer_names",
    "ubatch_runner",
]


def _draft_speculator(speculator: Any) -> bool:
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    return isinstance(speculator, DraftModelSpeculator)


@_kv_step(
    "vllm.v1.kv_cache_interface:UniformTypeKVCacheSpecs",
    "vllm.v1.kv_cache_interface:UniformTypeKVCacheSpecs.first_spec",
    "vllm.v1.kv_cache_interface:KVCacheSpec.uses_slot_mapping",
    "vllm.v1.kv_cache_interface:KVCacheSpec.max_num_blocks_per_req",
    "vllm.v1.kv_cache_interface:KVCacheSpec.block_table_token_alignment",
    "vllm.v1.worker.block_table:get_block_table_width",
)
def block_table_geometry(
    vllm_config: VllmConfig,
    kv_cache_config: KVCacheConfig,
    max_model_len: int,
    runner_settings: RunnerV2Settings,
) -> BlockTableGeometry:
    """Each KV cache group's block size, block-table width, slot-mapping and DCP flags.

    Encoder-decoder models index encoder tokens through cross-attention block tables, so
    their width covers ``max_num_encoder_input_tokens`` (and ``max_source_positions``).
    """
    from vllm.v1.worker.block_table import get_block_table_width

    return build_block_table_geometry(
        vllm_config, kv_cache_config, max_model_len, runner_settings, get_block_table_width
    )


def build_block_table_geometry(
    vllm_config: VllmConfig,
    kv_cache_config: KVCacheConfig,
    max_model_len: int,
    runner_settings: RunnerV2Settings,
    get_block_table_width: Callable[..., int],
) -> BlockTableGeometry:
    """The body of :func:`block_table_geometry`, over vLLM's ``get_block_table_width``
    (a later release moved it: its variant passes it from there)."""
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs

    table_len = max_model_len
    if runner_settings.is_encoder_decoder:
        table_len = max(
            table_len,
            vllm_config.scheduler_config.max_num_encoder_input_tokens,
            getattr(vllm_config.model_config.hf_config, "max_source_positions", 0),
        )
    block_sizes, widths, slot_mapping, dcp_sharded = [], [], [], []
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        block_sizes.append(spec.block_size)
        layer_spec = spec.first_spec if isinstance(spec, UniformTypeKVCacheSpecs) else spec
        slot_mapping.append(layer_spec.uses_slot_mapping)
        dcp_sharded.append(spec.dcp_sharded)
        width = spec.max_num_blocks_per_req(vllm_config, table_len)
        widths.append(
            get_block_table_width(
                width, spec.block_size, token_alignment=spec.block_table_token_alignment
            )
        )
    return BlockTableGeometry(
        block_sizes=block_sizes,
        max_num_blocks_per_group=widths,
        slot_mapping_enabled=slot_mapping,
        dcp_sharded=dcp_sharded,
        cp_interleave=vllm_config.parallel_config.cp_kv_cache_interleave_size,
    )


@_kv_step(
    _DRAFT,
    f"{_DRAFT}.draft_attn_layer_names",
    provides=("target_attn_layer_names", "draft_attn_layer_names"),
)
def speculator_layer_names(speculator: Any, kv_cache_config: KVCacheConfig) -> dict[str, Any]:
    """With a draft-model speculator: the target's and the draft's attention layer names.

    Read from the engine's config, before the KV-sharing layers join their groups (as
    stock reads them); both None without a draft model.
    """
    if not _draft_speculator(speculator):
        return {"target_attn_layer_names": None, "draft_attn_layer_names": None}
    draft = set(speculator.draft_attn_layer_names)
    grouped = {name for g in kv_cache_config.kv_cache_groups for name in g.layer_names}
    return {"target_attn_layer_names": grouped - draft, "draft_attn_layer_names": draft}


@_kv_step(
    f"{_ATTN}:init_attn_backend",
    _JIT_ACTIVATE,
    provides=("runner_kv_cache_config", "attn_groups", "backend_cg_support", "kernel_block_sizes"),
)
def attn_backend(
    vllm_config: VllmConfig,
    device: Any,
    kv_cache_config: KVCacheConfig,
    draft_attn_layer_names: Any,
    jit_warmup_registry: Any,
) -> dict[str, Any]:
    """vLLM's ``init_attn_backend`` on the runner's working copy of the config.

    The copy is deep (the engine and KV connector keep the original); vLLM's call adds the
    KV-sharing layers to their targets' groups in it, groups the layers by backend, spec
    and query heads, picks each group's kernel block size and builds the metadata builders
    (inside the JIT warm-up capture, as stock). ``runner_kv_cache_config`` is that copy.
    """
    from vllm.v1.worker.gpu.attn_utils import init_attn_backend

    working = copy.deepcopy(kv_cache_config)
    with jit_warmup_registry.activate():
        groups, support, kernel_block_sizes = init_attn_backend(
            working, vllm_config, device, draft_layer_names=draft_attn_layer_names
        )
    return {
        "runner_kv_cache_config": working,
        "attn_groups": groups,
        "backend_cg_support": support,
        "kernel_block_sizes": kernel_block_sizes,
    }


@_kv_step(
    f"{_ATTN}:AttentionCGSupportInfo.narrow",
    f"{_MODEL_STATE}.get_additional_cg_support",
)
def attn_cg_support(backend_cg_support: Any, model_state: Any) -> Any:
    """The backends' CUDA-graph support narrowed by the model state's own attention
    groups (e.g. encoder-only layers built outside ``init_attn_backend``)."""
    return backend_cg_support.narrow(*model_state.get_additional_cg_support())


@_kv_step(
    "vllm.v1.worker.gpu.spec_decode.adaptive_verification:maybe_create_adaptive_verification_manager",
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler:get_max_chunk_logits",
    f"{_DRAFT}.enable_adaptive_verification",
    "vllm.v1.worker.gpu.input_batch:InputBuffers.query_start_loc",
    f"{_MODEL_STATE}.num_new_sampled_tokens_per_step",
    f"{_MODEL_STATE}.get_additional_cg_support",
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
) -> Any:
    """The adaptive-verification manager of a speculator that enables it (else None)."""
    return build_adaptive_verification(
        vllm_config,
        speculator,
        attn_groups,
        req_states,
        input_buffers,
        model_state,
        runner_settings,
        target_attn_layer_names,
    )


def build_adaptive_verification(
    vllm_config: VllmConfig,
    speculator: Any,
    attn_groups: list[list[Any]],
    req_states: Any,
    input_buffers: Any,
    model_state: Any,
    runner_settings: RunnerV2Settings,
    target_attn_layer_names: Any,
    **release_kwargs: Any,
) -> Any:
    """The body of :func:`adaptive_verification`; ``release_kwargs`` go to vLLM's
    ``maybe_create_adaptive_verification_manager`` (what a later release adds)."""
    from vllm.v1.worker.gpu.spec_decode.adaptive_verification import (
        maybe_create_adaptive_verification_manager,
    )
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import get_max_chunk_logits

    return maybe_create_adaptive_verification_manager(
        enable_adaptive_verification=getattr(speculator, "enable_adaptive_verification", False),
        attn_groups=attn_groups,
        req_states=req_states,
        query_start_loc=input_buffers.query_start_loc,
        num_bonus_tokens=model_state.num_new_sampled_tokens_per_step,
        max_total_logits=get_max_chunk_logits(runner_settings.vocab_size),
        vllm_config=vllm_config,
        target_layer_names=target_attn_layer_names,
        additional_attn_cg_support=model_state.get_additional_cg_support(),
        **release_kwargs,
    )


@_kv_step(
    "vllm.v1.worker.gpu.block_table:BlockTables",
    after=("adaptive_verification",),
)
def block_tables(
    device: Any, block_table_geometry: BlockTableGeometry, runner_settings: RunnerV2Settings
) -> Any:
    """vLLM's ``BlockTables`` for this KV cache's groups (rebuilt by every KV phase)."""
    return build_block_tables(device, block_table_geometry, runner_settings)


def build_block_tables(
    device: Any,
    block_table_geometry: BlockTableGeometry,
    runner_settings: RunnerV2Settings,
    **release_kwargs: Any,
) -> Any:
    """The body of :func:`block_tables`; ``release_kwargs`` go to ``BlockTables`` (what a
    later release's constructor adds)."""
    from vllm.v1.worker.gpu.block_table import BlockTables

    g, s = block_table_geometry, runner_settings
    return BlockTables(
        block_sizes=list(g.block_sizes),
        max_num_reqs=s.max_num_reqs,
        max_num_batched_tokens=s.max_num_tokens,
        max_num_blocks_per_group=list(g.max_num_blocks_per_group),
        device=device,
        slot_mapping_enabled=list(g.slot_mapping_enabled),
        dcp_sharded=list(g.dcp_sharded),
        cp_size=s.dcp_size,
        cp_rank=s.dcp_rank,
        cp_interleave=g.cp_interleave,
        **release_kwargs,
    )


def _unset_speculator_pcp(pcp_manager: Any, speculator: Any) -> None:
    if speculator is not None:
        speculator.pcp_manager = None


@_kv_step(
    "vllm.v1.worker.gpu.pcp_manager:maybe_build_pcp_manager",
    f"{_DRAFT}.pcp_manager",
    teardown=_unset_speculator_pcp,
    effects=("speculator.pcp_manager",),
)
def pcp_manager(
    vllm_config: VllmConfig,
    device: Any,
    runner_settings: RunnerV2Settings,
    block_tables: Any,
    pcp_manager_cls: Any,
    speculator: Any,
) -> Any:
    """The prefill-context-parallel manager (None without PCP); the speculator gets it too.

    Never run with PCP here (CPU, one worker): written from vLLM's code.
    """
    from vllm.v1.worker.gpu import pcp_manager as pcp

    manager = pcp.maybe_build_pcp_manager(
        vllm_config,
        device,
        runner_settings.supports_mm_inputs,
        block_tables,
        cls=pcp_manager_cls,
    )
    if speculator is not None:
        speculator.pcp_manager = manager
    return manager


@_kv_step(
    "vllm.v1.worker.gpu.ubatch_utils:maybe_build_ubatch_runner",
)
def ubatch_runner(
    vllm_config: VllmConfig,
    device: Any,
    model_state: Any,
    attn_groups: list[list[Any]],
    runner_kv_cache_config: KVCacheConfig,
    runner_settings: RunnerV2Settings,
) -> Any:
    """The dual-batch-overlap microbatch runner (None unless DBO with several DP ranks).

    Never run with DBO here: written from vLLM's code.
    """
    from vllm.v1.worker.gpu.ubatch_utils import maybe_build_ubatch_runner

    return maybe_build_ubatch_runner(
        vllm_config,
        device,
        model_state,
        attn_groups,
        runner_kv_cache_config,
        runner_settings.max_num_reqs,
    )


#: v1's stage, re-specced: the same vLLM call, before the CUDA-graph mode here (v1: after).
mamba_ssu_backend = respec(
    _v1_kv_phase.mamba_ssu_backend,
    after=("pcp_manager", "ubatch_runner"),
    meta={
        "mirrors": (f"{_RUNNER}.initialize_kv_cache",),
        "calls": (
            "vllm.model_executor.layers.mamba.ops.ssu_dispatch:initialize_mamba_ssu_backend",
            "vllm.model_executor.layers.mamba.ops.ssu_dispatch:_mamba_ssu_backend",
        ),
    },
)


@_kv_step(
    "vllm.envs:VLLM_USE_BREAKABLE_CUDAGRAPH",
    "vllm.v1.worker.gpu.cudagraph_utils:has_compiled_submodule",
    "vllm.v1.worker.gpu.spec_decode.adaptive_verification:resolve_adaptive_cudagraph_mode",
    "vllm.config.compilation:CompilationConfig.cudagraph_mode",
    "vllm.config.compilation:CompilationConfig.resolve_cudagraph_mode_and_sizes",
    f"{_ATTN}:AttentionCGSupportInfo.min_cg_support",
    f"{_ATTN}:AttentionCGSupportInfo.min_cg_attn_backend",
    after=("mamba_ssu_backend",),
    effects=("compilation_config.cudagraph_mode", "compilation_config capture sizes"),
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
    """Resolve the CUDA-graph mode and capture sizes (vLLM writes them into the config).

    With adaptive verification the requested mode first gets its separate decode route.
    No teardown, as in stock: ``_teardown_profiling_state`` leaves the resolved mode, and
    resolving a resolved mode again is a no-op.
    """
    import vllm.envs as envs
    from vllm.v1.worker.gpu.cudagraph_utils import has_compiled_submodule

    piecewise = bool(envs.VLLM_USE_BREAKABLE_CUDAGRAPH or has_compiled_submodule(model))
    return resolve_cudagraph_mode(
        vllm_config,
        piecewise,
        attn_cg_support,
        adaptive_verification,
        decode_query_len,
        runner_kv_cache_config,
        runner_settings,
        is_profiling,
        use_v2_model_runner=True,
    )


def resolve_cudagraph_mode(
    vllm_config: VllmConfig,
    piecewise: bool,
    attn_cg_support: Any,
    adaptive_verification: Any,
    decode_query_len: int,
    runner_kv_cache_config: KVCacheConfig,
    runner_settings: RunnerV2Settings,
    is_profiling: bool,
    **release_kwargs: Any,
) -> Any:
    """The body of :func:`cudagraph_mode` once ``piecewise`` (whether piecewise capture is
    available) is known; ``release_kwargs`` go to ``resolve_cudagraph_mode_and_sizes``
    (what a release's signature adds: 0.32/0.33 take ``use_v2_model_runner``, 0.34 not)."""
    from vllm.v1.worker.gpu.spec_decode.adaptive_verification import (
        resolve_adaptive_cudagraph_mode,
    )

    cc = vllm_config.compilation_config
    if adaptive_verification is not None:
        cc.cudagraph_mode = resolve_adaptive_cudagraph_mode(
            cc.cudagraph_mode, piecewise_capture_available=piecewise
        )
    return cc.resolve_cudagraph_mode_and_sizes(
        attn_cg_support.min_cg_support,
        attn_cg_support.min_cg_attn_backend,
        decode_query_len,
        kv_cache_config=runner_kv_cache_config,
        max_num_reqs=runner_settings.max_num_reqs,
        is_profiling=is_profiling,
        piecewise_capture_available=piecewise,
        **release_kwargs,
    )


@_kv_step(
    "vllm.v1.worker.gpu.cudagraph_utils:ModelCudaGraphManager",
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
    """vLLM's ``ModelCudaGraphManager`` for the resolved mode (captures nothing yet).

    Dropping it releases its graphs; the teardown leaves that to the run (the runner's
    reference goes with the KV phase, as stock's ``_teardown_profiling_state`` drops it).
    """
    return build_cudagraph_manager(
        vllm_config,
        device,
        cudagraph_mode,
        lora_capture_cases,
        adaptive_verification,
        ubatch_runner,
        decode_query_len=decode_query_len,
    )


def build_cudagraph_manager(
    vllm_config: VllmConfig,
    device: Any,
    cudagraph_mode: Any,
    lora_capture_cases: Any,
    adaptive_verification: Any,
    ubatch_runner: Any,
    **query_lens: Any,
) -> Any:
    """The body of :func:`cudagraph_manager`; ``query_lens`` is how the release's
    constructor takes the decode query length(s) (``decode_query_len=`` through 0.33,
    ``decode_query_lens=`` from 0.34)."""
    from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager

    return ModelCudaGraphManager(
        vllm_config,
        device,
        cudagraph_mode,
        lora_capture_cases=lora_capture_cases,
        varlen_decode=adaptive_verification is not None,
        ubatch_runner=ubatch_runner,
        **query_lens,
    )


@_kv_step(
    f"{_ATTN}:FastPrefillHelper",
)
def fast_prefill(
    vllm_config: VllmConfig,
    cudagraph_manager: Any,
    pcp_manager: Any,
    runner_settings: RunnerV2Settings,
) -> Any:
    """The KV-sharing fast-prefill helper (``kv_sharing_fast_prefill`` without PCP)."""
    if not vllm_config.cache_config.kv_sharing_fast_prefill or pcp_manager is not None:
        return None
    from vllm.v1.worker.gpu.attn_utils import FastPrefillHelper

    return FastPrefillHelper(cudagraph_manager, runner_settings.max_num_tokens)


@_kv_step(
    "vllm.v1.worker.cp_utils:check_attention_cp_compatibility",
    after=("fast_prefill",),
)
def attention_cp_compatible(vllm_config: VllmConfig, target_attn_layer_names: Any) -> bool:
    """vLLM's ``check_attention_cp_compatibility`` over the target's layers (True, or its
    AssertionError)."""
    from vllm.v1.worker.cp_utils import check_attention_cp_compatibility

    check_attention_cp_compatibility(vllm_config, target_attn_layer_names)
    return True
