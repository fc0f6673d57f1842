"""Building what a plan needs on ``torch.device("meta")``: config, model, runner pieces.

What belongs here: the set-up :mod:`.plan` does before its pipeline runs — the engine
config (``EngineArgs.create_engine_config``), a world-size-1 process group, the model built
with vLLM's ``initialize_model`` on meta (what ``BaseModelLoader.load_model`` does before
loading weights, in ``vllm/model_executor/model_loader/base_loader.py``), a
``GPUModelRunner`` on meta for the catalog's start inputs, and the attention-backend
override that lets the CPU platform answer a CUDA backend while the model is built.
torch and vllm are imported inside the functions only.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import Any

from ..contract.declare import vllm_uses

__all__ = [
    "ASSUMED_CAPABILITY",
    "META_RUNNERS",
    "engine_config",
    "ensure_distributed",
    "meta_model",
    "meta_runner",
    "needs_override",
    "platform_answers",
    "rank_identity",
    "target_platform",
]

#: The runner class built on meta for each runner ``plan`` plans for.
META_RUNNERS = {
    "v1": "vllm.v1.worker.gpu_model_runner:GPUModelRunner",
    "v2": "vllm.v1.worker.gpu.model_runner:GPUModelRunner",
}

#: Compute capability assumed when validating a CUDA backend on a host without one.
ASSUMED_CAPABILITY = (9, 0)


def engine_config(model_dir: str, backend: str | None, **overrides: Any) -> Any:
    """The ``VllmConfig`` an engine would build (eager, dummy weights, no tokenizer).

    ``backend`` is recorded as ``attention_config.backend`` (``--attention-backend``);
    ``overrides`` are engine arguments, None meaning vLLM's default.
    """
    from vllm.engine.arg_utils import EngineArgs

    given = {k: v for k, v in overrides.items() if v is not None}
    args = EngineArgs(
        model=model_dir, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True, **given
    )
    cfg = args.create_engine_config()
    if backend is not None:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        cfg.attention_config.backend = AttentionBackendEnum[backend]
    return cfg


def ensure_distributed() -> None:
    """A world-size-1 gloo group and TP = PP = 1 model-parallel groups (once per process)."""
    import torch.distributed as dist
    from vllm.distributed import (
        ensure_model_parallel_initialized,
        init_distributed_environment,
    )
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    if model_parallel_is_initialized():
        return
    if not dist.is_initialized():
        store = os.path.join(tempfile.mkdtemp(prefix="initpipe-plan-"), "store")
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            backend="gloo",
            distributed_init_method=f"file://{store}",
        )
    ensure_model_parallel_initialized(1, 1)


@contextlib.contextmanager
def rank_identity(
    tensor_parallel_size: int, tp_rank: int, pipeline_parallel_size: int, pp_rank: int
) -> Iterator[None]:
    """While planning, the world-size-1 TP and PP groups answer one rank's identity (size,
    rank in group, first/last rank), so vLLM's own partitioning decides that rank's share:
    ``get_tensor_model_parallel_world_size`` splits the heads, ``get_pp_group`` and
    ``get_pp_indices`` pick the layers. Nothing communicates while a model is built on
    meta; collectives would fail (the group still has one process)."""
    from vllm.distributed import parallel_state as ps

    groups = (
        (ps.get_tp_group(), tensor_parallel_size, tp_rank),
        (ps.get_pp_group(), pipeline_parallel_size, pp_rank),
    )
    saved = [(g, g.world_size, g.rank_in_group, g.ranks, g.rank) for g, _, _ in groups]
    try:
        for g, size, rank in groups:
            g.world_size, g.rank_in_group, g.ranks, g.rank = size, rank, list(range(size)), rank
        yield
    finally:
        for g, size, rank, ranks, global_rank in saved:
            g.world_size, g.rank_in_group, g.ranks, g.rank = size, rank, ranks, global_rank


def needs_override(backend: str | None) -> bool:
    """True when the running platform would not answer ``backend`` (CUDA ones on CPU)."""
    from vllm.platforms import current_platform

    return backend is not None and current_platform.is_cpu() and backend != "CPU_ATTN"


@contextlib.contextmanager
def platform_answers(backend: str | None) -> Iterator[None]:
    """While building the model, the platform answers ``backend`` as CUDA would."""
    if backend is None or not needs_override(backend):
        yield
        return
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention import selector
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    wanted = AttentionBackendEnum[backend]
    platform_cls = type(current_platform)
    original = platform_cls.__dict__["get_attn_backend_cls"]

    def get_attn_backend_cls(
        cls: Any, selected_backend: Any, attn_selector_config: Any, num_heads: int | None = None
    ) -> str:
        if attn_selector_config.use_mla or attn_selector_config.use_sparse:
            raise NotImplementedError(
                f"{backend} cannot serve MLA or sparse attention layers; "
                f"plan this model without --backend (the running "
                f"platform then picks its own MLA backend)."
            )
        reasons = wanted.get_class().validate_configuration(
            device_capability=DeviceCapability(*ASSUMED_CAPABILITY),
            **attn_selector_config._asdict(),
        )
        if reasons:
            raise ValueError(
                f"Selected backend {backend} is not valid for this configuration. Reason: {reasons}"
            )
        return wanted.get_path()

    selector._cached_get_attn_backend.cache_clear()
    # Patching vLLM's platform class on purpose, for the duration of the build only.
    platform_cls.get_attn_backend_cls = classmethod(get_attn_backend_cls)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        platform_cls.get_attn_backend_cls = original  # type: ignore[method-assign]
        selector._cached_get_attn_backend.cache_clear()


def target_platform(backend: str | None) -> type:
    """The platform class whose block-size rules a worker for ``backend`` would run."""
    from vllm.platforms import current_platform
    from vllm.platforms.interface import Platform

    # CudaPlatform keeps Platform.update_block_size_for_backend in 0.32.0 (and cannot be
    # imported from the CPU build), so the base class carries CUDA's block-size rules.
    return Platform if needs_override(backend) else type(current_platform)


def meta_model(vllm_config: Any, backend: str | None) -> Any:
    """The model class built on meta in the model dtype; its layers hold ``backend``."""
    import torch
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    with (
        platform_answers(backend),
        set_default_torch_dtype(vllm_config.model_config.dtype),
        torch.device("meta"),
    ):
        return initialize_model(vllm_config)


@vllm_uses("plan", calls=(META_RUNNERS["v1"],), runner="v1")
@vllm_uses("plan", calls=(META_RUNNERS["v2"],), runner="mrv2")
@vllm_uses("plan", calls=("vllm.platforms:current_platform",))
def meta_runner(vllm_config: Any, runner: str = "v1") -> Any:
    """``runner``'s ``GPUModelRunner`` (``"v1"``, or ``"v2"``: Model Runner V2's) with
    ``device=meta``: the catalog's start and batch inputs."""
    import importlib

    import torch
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        import vllm.v1.worker.cpu_worker  # noqa: F401  (placeholder streams/events)
    module, _, name = META_RUNNERS[runner].partition(":")
    runner_class = getattr(importlib.import_module(module), name)
    return runner_class(vllm_config, torch.device("meta"))
