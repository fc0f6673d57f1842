"""The Model Runner V2 catalog: vLLM 0.32.0's default runner, as initpipe stages.

What belongs here: MRv2's initialization (``vllm/v1/worker/gpu/model_runner.py``,
``GPUModelRunner``; on CPU its subclass ``vllm/v1/worker/cpu/model_runner.py``) rebuilt as
stages that call vLLM's own building blocks whole — and nothing else. A sibling of the v1
catalog (:mod:`initpipe_vllm.v1`): ``Pipeline.from_module("initpipe_vllm")`` never sees
these stages. Where vLLM's two runners run the same code, the v1 stage's body is shared,
re-specced for MRv2 with ``attrs.evolve`` (:func:`initpipe_vllm.catalogs.respec`: its
edges and the runner it mirrors), never decorated a second time (a second ``@stage`` would
overwrite the spec on the same object): ``mamba_ssu_backend`` (before the CUDA-graph mode
here, after it in v1) and the zeroer's teardown. The others differ in what vLLM passes
(MRv2's ``attention_cp_compatible`` checks the target's layers only and runs in the KV
phase; its ``KVBlockZeroer`` skips no runner-only layer; its KV tensors come from
``init_kv_cache`` whole).

- :mod:`.model_phase` — what ``load_model`` builds after the weights, run inside
  ``load_model`` (MRv2 reads the block size there); and :func:`kv_cache_spec`, the
  one-stage :func:`spec_pipeline` run on each ``get_kv_cache_spec``;
- :mod:`.kv_phase` — ``initialize_kv_cache`` up to the CUDA-graph manager;
- :mod:`.kv_tensors` — the speculator's attention, ``init_kv_cache``, model-state KV,
  connectors and the KV block zeroer (``_init_kv_zero_meta``);
- :mod:`.types` — the plain records the stages read instead of runner attributes;
- :mod:`.steps` — the two stock methods the stages stand for, and a ``@stage`` for a step
  of each (``load_step``, ``kv_step``).

:data:`CATALOG` and :data:`SPEC_CATALOG` declare the two pipelines;
:mod:`initpipe_vllm.catalogs` builds them per vLLM release. The runner adapter that writes
the outputs onto vLLM's runner is :mod:`initpipe_vllm.hook.runner_v2`. Importing this
package imports neither torch nor vllm: ``initpipe graph initpipe_vllm.mrv2:pipeline``
draws it at once.
"""

from __future__ import annotations

from typing import Any

from initpipe import REQUIRED, Pipeline

from .. import catalogs
from ..catalogs import CatalogDef, build
from ..releases import DEFAULT_RELEASE
from . import kv_phase as _kv_phase, kv_tensors as _kv_tensors, model_phase as _model_phase

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

#: The MRv2 catalog as data, and its one-stage ``get_kv_cache_spec`` pipeline: built per
#: release by :func:`initpipe_vllm.catalogs.build`.
CATALOG = CatalogDef(
    name="initpipe_vllm.mrv2", stages=STAGES, inputs=INITPIPE_INPUTS, runner="mrv2"
)
SPEC_CATALOG = CatalogDef(
    name="initpipe_vllm.mrv2.spec",
    stages=(_model_phase.kv_cache_spec,),
    inputs={"start": SPEC_INPUTS, "model": (), "kv_cache_config": ()},
    runner="mrv2",
)


def base_catalog(*, release: str = DEFAULT_RELEASE) -> Pipeline:
    """The stock Model Runner V2 initialization pipeline of vLLM ``release``, without
    extensions (built once per release)."""
    return build(CATALOG, release)


def catalog(
    extensions: list[str] | str | None = None, *, release: str = DEFAULT_RELEASE
) -> Pipeline:
    """The MRv2 pipeline with the enabled extensions that target it.

    Args:
        extensions: extension names (entry-point group ``initpipe.stages``), ``"all"``, or
            None to read ``INITPIPE_EXTENSIONS``. An extension applies to the catalog whose
            stages it replaces or extends; see the README ("Extensions and the two
            catalogs").
        release: a vLLM release of ``initpipe_vllm.releases.RELEASES``.

    Raises:
        initpipe.ExtensionError: an enabled extension is missing or breaks the graph.
        UnsupportedRunnerError: an unknown release.
    """
    return catalogs.catalog(extensions, runner="mrv2", release=release)


def spec_pipeline(*, release: str = DEFAULT_RELEASE) -> Pipeline:
    """The one-stage pipeline of ``get_kv_cache_spec``: run after the block size is final."""
    return build(SPEC_CATALOG, release)


def __getattr__(name: str) -> Any:
    # `initpipe graph initpipe_vllm.mrv2:pipeline` draws what MRv2 workers would run.
    if name == "pipeline":
        return catalog()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CATALOG",
    "INITPIPE_INPUTS",
    "KV_STAGES",
    "MODEL_STAGES",
    "SPEC_CATALOG",
    "SPEC_INPUTS",
    "STAGES",
    "base_catalog",
    "catalog",
    "spec_pipeline",
]
