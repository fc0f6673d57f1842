"""The vLLM 0.32.0 stage catalog: folder ``stages/``, import name ``initpipe_vllm``.

Why two names: vLLM resolves ``worker_cls="initpipe_vllm.worker.PipelinedWorker"`` by its
qualified name inside every spawned worker process, where a user's own module called
``stages`` on the path could shadow a bare ``import stages``. The folder keeps the
design's name; ``pyproject.toml`` (``[tool.setuptools.package-dir]``) installs it as
``initpipe_vllm``. Every path below is relative to ``stages/``.

``GPUModelRunner``'s initialization (``vllm/v1/worker/gpu_model_runner.py``:
``get_kv_cache_spec`` and ``initialize_kv_cache`` with everything they call) rebuilt as
initpipe stages that call vLLM's own building blocks. What belongs at this level is the
catalog itself — stages and the values they pass — and nothing else:

- :mod:`.model_phase` — facts about the loaded model's attention layers (needs ``model``);
- :mod:`.kv_phase` — the runner's working config, attention groups, cudagraph mode,
  kernel block sizes, metadata builders and input batch (needs ``kv_cache_config``);
- :mod:`.kv_tensors` — allocation, KV-sharing aliases, binding, connector registration;
- :mod:`.types` — the plain records stages read instead of runner attributes;
- :mod:`.errors` — the catalog's error tree (rooted in ``initpipe.InitpipeError``).

Around it, one folder per concern, imports pointing down (catalog <- hook <- resize <-
serve <- testing <- tools):

- ``mrv2/`` — the Model Runner V2 catalog (vLLM's default runner where Triton exists), a
  second catalog beside this one, kept out of this package's namespace;
- ``hook/`` — the vLLM integration: pipelined runners (v1 and MRv2) and worker, plugin,
  progress;
- ``testing/`` — the test kit: pytest plugin, ``runner_snapshot``, the stock-vs-pipelined
  equivalence harness, runner builders;
- ``resize/`` — live resize of a running engine's KV cache (the public
  ``resize_kv_cache``, ``release_kv_cache``, ``resume_kv_cache``, ``kv_cache_info``,
  re-exported here lazily);
- ``serve/`` — the same over HTTP: ``initpipe_vllm.serve.kv_cache_routes``, middleware for
  ``vllm serve --middleware``;
- ``tools/`` — ``initpipe run`` and ``initpipe plan``;
- ``models/`` — the embedded tiny model configs.

``worker.py``, ``runner.py`` and ``pytest_plugin.py`` are thin re-exports that keep the
dotted names vLLM, pickling and users' tests resolve (``initpipe_vllm.worker.PipelinedWorker``,
``initpipe_vllm.runner.Pipelined*``, ``initpipe_vllm.pytest_plugin``).

Importing this package imports neither torch nor vllm, so the graph can be drawn at once:
``Pipeline.from_module("initpipe_vllm")`` or :func:`catalog`.
"""

from __future__ import annotations

from typing import Any

from initpipe import REQUIRED, Pipeline
from initpipe._extensions import enabled_names

from .errors import (
    CatalogError,
    InitpipeVllmError,
    KVCacheConfigError,
    KVCacheReleasedError,
    ModelPhaseError,
    ResizeError,
    ResizeRefusedError,
    UnsupportedRunnerError,
)
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

_CATALOG: Pipeline | None = None
_EXTENDED: dict[tuple[str, ...] | str, Pipeline] = {}


def base_catalog() -> Pipeline:
    """The stock vLLM 0.32.0 runner-initialization pipeline, without any extension."""
    global _CATALOG
    if _CATALOG is None:
        _CATALOG = Pipeline(
            STAGES,
            start_inputs=INITPIPE_INPUTS["start"],
            model_inputs=INITPIPE_INPUTS["model"],
            kv_inputs=INITPIPE_INPUTS["kv_cache_config"],
            name="initpipe_vllm",
        )
    return _CATALOG


def catalog(extensions: list[str] | str | None = None) -> Pipeline:
    """The vLLM 0.32.0 runner-initialization pipeline, with the enabled extensions.

    Args:
        extensions: extension names (entry-point group ``initpipe.stages``), ``"all"``, or
            None to read ``INITPIPE_EXTENSIONS`` (unset: none — installing a package never
            changes the pipeline by itself).

    Pipelines are immutable and built once per extension set; derive variants with
    ``catalog().replace(...)`` / ``.add(...)``.

    Raises:
        initpipe.ExtensionError: an enabled extension is missing or breaks the graph.
    """
    return _with_enabled_extensions(base_catalog(), _EXTENDED, extensions)


def _with_enabled_extensions(
    base: Pipeline,
    cache: dict[tuple[str, ...] | str, Pipeline],
    extensions: list[str] | str | None,
) -> Pipeline:
    """``base`` with the enabled extensions applied, built once per extension set in
    ``cache`` (each catalog keeps its own); ``extensions`` as for :func:`catalog`."""
    wanted = enabled_names() if extensions is None else extensions
    if not wanted:
        return base
    key = wanted if isinstance(wanted, str) else tuple(wanted)
    if key not in cache:
        cache[key] = base.with_extensions(wanted)
    return cache[key]


#: The live-resize API, re-exported lazily from ``resize/`` (a higher layer).
RESIZE_API = (
    "KVCacheInfo",
    "ResizeReport",
    "kv_cache_info",
    "kv_cache_info_async",
    "release_kv_cache",
    "release_kv_cache_async",
    "resize_kv_cache",
    "resize_kv_cache_async",
    "resume_kv_cache",
    "resume_kv_cache_async",
)


def __getattr__(name: str) -> Any:
    # `initpipe graph initpipe_vllm:pipeline` draws what workers would run (extensions too).
    if name == "pipeline":
        return catalog()
    if name in RESIZE_API:
        from . import resize

        return getattr(resize, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "INITPIPE_INPUTS",
    "STAGES",
    "CatalogError",
    "InitpipeVllmError",
    "KVCacheConfigError",
    "KVCacheInfo",
    "KVCacheReleasedError",
    "ModelPhaseError",
    "ResizeError",
    "ResizeRefusedError",
    "ResizeReport",
    "UnsupportedRunnerError",
    "base_catalog",
    "kv_cache_info",
    "kv_cache_info_async",
    "release_kv_cache",
    "release_kv_cache_async",
    "resize_kv_cache",
    "resize_kv_cache_async",
    "resume_kv_cache",
    "resume_kv_cache_async",
    "catalog",
    *(s.__name__ for s in STAGES),
]
