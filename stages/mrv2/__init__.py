"""The Model Runner V2 catalog: vLLM 0.32.0's default runner, as initpipe stages.

What belongs here: MRv2's initialization (``vllm/v1/worker/gpu/model_runner.py``,
``GPUModelRunner``; on CPU its subclass ``vllm/v1/worker/cpu/model_runner.py``) rebuilt as
stages that call vLLM's own building blocks whole — and nothing else. A separate package
from the v1 catalog (``initpipe_vllm``): ``Pipeline.from_module("initpipe_vllm")`` never
sees these stages, and no v1 stage function is decorated a second time (a second ``@stage``
would overwrite the spec on the same object). No v1 stage is shared: every candidate
differs in its inputs or its edges (MRv2's ``attention_cp_compatible`` takes the target's
layer names and runs in the KV phase; its Mamba SSU backend runs before the CUDA-graph mode,
v1's after; its KV tensors come from ``init_kv_cache`` whole).

- :mod:`.model_phase` — what ``load_model`` builds after the weights, run inside
  ``load_model`` (MRv2 reads the block size there); and :func:`kv_cache_spec`, the
  one-stage :func:`spec_pipeline` run on each ``get_kv_cache_spec``;
- :mod:`.kv_phase` — ``initialize_kv_cache`` up to the CUDA-graph manager;
- :mod:`.kv_tensors` — the speculator's attention, ``init_kv_cache``, model-state KV,
  connectors and the KV block zeroer (``_init_kv_zero_meta``);
- :mod:`.types` — the plain records the stages read instead of runner attributes.

The runner adapter that writes the outputs onto vLLM's runner is
:mod:`initpipe_vllm.hook.runner_v2`. Importing this package imports neither torch nor
vllm: ``initpipe graph initpipe_vllm.mrv2:pipeline`` draws it at once.
"""

from __future__ import annotations

from typing import Any

from initpipe import REQUIRED, Pipeline

from . import kv_phase as _kv_phase
from . import kv_tensors as _kv_tensors
from . import model_phase as _model_phase

#: The catalog's external inputs per phase. Start: the runner's constructed parts. Model:
#: the loaded model and what the weight loading decided. KV: the engine's config and what
#: vLLM settles between the phases.
INITPIPE_INPUTS: dict[str, Any] = {
    "start": (
        "vllm_config",
        "device",
        "runner_settings",
        "encoder_cache",
        "req_states",
        "input_buffers",
        "speculator",
        "eplb",
        "jit_warmup_registry",
        "lora_capture_cases",
        "pcp_manager_cls",
    ),
    "model": ("model", "eplb_models_added", "load_dummy_weights"),
    "kv_cache_config": {
        "kv_cache_config": REQUIRED,
        "is_profiling": False,
        "kv_cache_allocation_context": None,
        "max_model_len": REQUIRED,
    },
}

MODEL_STAGES = (
    _model_phase.model_state,
    _model_phase.decode_query_len,
    _model_phase.batch_sharder,
    _model_phase.custom_logits_processors,
    _model_phase.samplers,
    _model_phase.prompt_logprobs_worker,
    _model_phase.structured_outputs_worker,
    _model_phase.pooling_runner,
    _model_phase.eplb_registration,
    _model_phase.intermediate_tensors,
    _model_phase.offloader_post_init,
    _model_phase.stock_torch_compile,
)

KV_STAGES = (
    _kv_phase.block_table_geometry,
    _kv_phase.speculator_layer_names,
    _kv_phase.attn_backend,
    _kv_phase.attn_cg_support,
    _kv_phase.adaptive_verification,
    _kv_phase.block_tables,
    _kv_phase.pcp_manager,
    _kv_phase.ubatch_runner,
    _kv_phase.mamba_ssu_backend,
    _kv_phase.cudagraph_mode,
    _kv_phase.cudagraph_manager,
    _kv_phase.fast_prefill,
    _kv_phase.attention_cp_compatible,
    _kv_tensors.speculator_attn,
    _kv_tensors.speculator_cudagraph_manager,
    _kv_tensors.kv_caches_by_layer,
    _kv_tensors.runner_kv_caches,
    _kv_tensors.model_state_kv,
    _kv_tensors.kv_connector,
    _kv_tensors.aux_output_connector,
    _kv_tensors.kv_block_zeroer,
)

STAGES = MODEL_STAGES + KV_STAGES

#: The start inputs of :func:`spec_pipeline` (its model phase has no external input).
SPEC_INPUTS = ("vllm_config", "speculator", "runner_settings")

_CATALOG: Pipeline | None = None
_SPEC: Pipeline | None = None
_EXTENDED: dict[tuple[str, ...] | str, Pipeline] = {}


def base_catalog() -> Pipeline:
    """The stock vLLM 0.32.0 Model Runner V2 initialization pipeline, without extensions."""
    global _CATALOG
    if _CATALOG is None:
        _CATALOG = Pipeline(
            STAGES,
            start_inputs=INITPIPE_INPUTS["start"],
            model_inputs=INITPIPE_INPUTS["model"],
            kv_inputs=INITPIPE_INPUTS["kv_cache_config"],
            name="initpipe_vllm.mrv2",
        )
    return _CATALOG


def catalog(extensions: list[str] | str | None = None) -> Pipeline:
    """The MRv2 pipeline with the enabled extensions that target it.

    Args:
        extensions: extension names (entry-point group ``initpipe.stages``), ``"all"``, or
            None to read ``INITPIPE_EXTENSIONS``. An extension applies to the catalog whose
            stages it replaces or extends; see the README ("Extensions and the two
            catalogs").

    Raises:
        initpipe.ExtensionError: an enabled extension is missing or breaks the graph.
    """
    from .. import _with_enabled_extensions

    return _with_enabled_extensions(base_catalog(), _EXTENDED, extensions)


def spec_pipeline() -> Pipeline:
    """The one-stage pipeline of ``get_kv_cache_spec``: run after the block size is final."""
    global _SPEC
    if _SPEC is None:
        _SPEC = Pipeline(
            (_model_phase.kv_cache_spec,),
            start_inputs=SPEC_INPUTS,
            model_inputs=(),
            kv_inputs=(),
            name="initpipe_vllm.mrv2.spec",
        )
    return _SPEC


def __getattr__(name: str) -> Any:
    # `initpipe graph initpipe_vllm.mrv2:pipeline` draws what MRv2 workers would run.
    if name == "pipeline":
        return catalog()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "INITPIPE_INPUTS",
    "KV_STAGES",
    "MODEL_STAGES",
    "SPEC_INPUTS",
    "STAGES",
    "base_catalog",
    "catalog",
    "spec_pipeline",
]
