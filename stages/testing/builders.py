"""Helpers to build real vLLM objects without an engine, for stage-level tests.

What belongs here: a tiny real ``VllmConfig`` from a local ``config.json``, a world-size-1
distributed setup, a loaded runner (stock or pipelined), and the engine-side steps between
the two phases (block-size update, KV layout resolution, ``get_kv_cache_configs``), so one
stage can be called directly with real inputs. It replays what ``EngineCore.__init__`` /
``_initialize_kv_caches`` (``vllm/v1/engine/core.py``) and the executor
(``vllm/v1/executor/uniproc_executor.py``) do around the runner. The pytest plugin's
fixtures (:mod:`.pytest_plugin`) are built on these. Importing it imports vllm; only test
code should.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "MODELS",
    "build_runner",
    "ensure_distributed",
    "installed_catalog",
    "model_dir",
    "plan_kv_cache_config",
    "tiny_vllm_config",
]

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

#: The folder holding the tiny model configs shipped with the catalog.
MODELS = Path(__file__).resolve().parents[1] / "models"


def model_dir(name: str) -> Path:
    """The folder of a tiny model shipped under ``initpipe_vllm/models``."""
    path = MODELS / name
    if not (path / "config.json").exists():
        known = sorted(p.name for p in MODELS.iterdir() if (p / "config.json").exists())
        raise FileNotFoundError(f"no tiny model {name!r}; known: {', '.join(known)}")
    return path


def tiny_vllm_config(model: str | os.PathLike[str], **overrides: Any) -> Any:
    """A real ``VllmConfig`` for a local tiny model (defaults as the equivalence harness)."""
    from vllm.engine.arg_utils import EngineArgs

    from .equivalence import engine_kwargs

    path = model if isinstance(model, Path) or os.sep in str(model) else model_dir(str(model))
    kwargs, _ = engine_kwargs(path, **overrides)
    return EngineArgs(**kwargs).create_engine_config()


def installed_catalog(runner: str = "v1") -> Any:
    """The catalog a pipelined ``runner`` (``"v1"`` or ``"v2"``) runs on the installed
    vLLM: its adapter's, for the release the contract matched
    (:func:`initpipe_vllm.hook.adapter.installed_adapter`). What a test that names, fails or
    replaces stages asks, so that on each release it exercises that release's variants —
    never a version string."""
    from ..hook.adapter import installed_adapter

    return installed_adapter(runner).pipeline()


_DIST_READY = False


def ensure_distributed(vllm_config: Any) -> None:
    """A world-size-1 gloo process group and model-parallel groups (once per process)."""
    global _DIST_READY
    if _DIST_READY:
        return
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    fd, path = tempfile.mkstemp(prefix="initpipe_dist_")
    os.close(fd)
    os.unlink(path)
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"file://{path}",
            backend="gloo",
        )
        ensure_model_parallel_initialized(1, 1)
    _DIST_READY = True


def build_runner(
    vllm_config: Any,
    runner_cls: type | None = None,
    *,
    update_block_size: bool = True,
    **runner_kwargs: Any,
) -> Any:
    """Construct and load a runner on the config's device, then fix the block size.

    Args:
        vllm_config: from :func:`tiny_vllm_config` (one config per runner: the model
            registers its layers in the config's forward context).
        runner_cls: default: the platform's stock runner class.
        update_block_size: run ``current_platform.update_block_size_for_backend`` after
            loading, as the executor does.
    """
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.platforms import current_platform

    from ..hook.runner import platform_runner_class

    ensure_distributed(vllm_config)
    cls = runner_cls or platform_runner_class()
    device = torch.device(
        vllm_config.device_config.device_type
        if current_platform.is_cpu()
        else current_platform.device_type
    )
    with set_current_vllm_config(vllm_config):
        runner = cls(vllm_config, device, **runner_kwargs)
        runner.load_model()
        if update_block_size:
            current_platform.update_block_size_for_backend(vllm_config)
    return runner


def plan_kv_cache_config(
    runner: Any, memory: int = 8 << 20, *, num_blocks: int | None = None
) -> Any:
    """The engine's steps 10-17 for one worker: specs, layout, the ``KVCacheConfig``.

    Calls ``runner.get_kv_cache_spec()`` (which, on a pipelined runner, runs the model
    phase), resolves and records the KV layout if not yet resolved, then plans with
    ``get_kv_cache_configs`` (``num_blocks`` overrides the block count).
    """
    from vllm.config import set_current_vllm_config
    from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        record_kv_cache_layout,
        resolve_kv_cache_layout,
    )
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs

    from ..compat import plan_kv_cache_configs

    cfg = runner.vllm_config
    with set_current_vllm_config(cfg):
        register_all_kvcache_specs(cfg)
        specs = runner.get_kv_cache_spec()
        if cfg.cache_config.kv_cache_layout is None:
            backends = get_current_attn_backends(cfg)
            supported = [kind.name for kind in get_supported_kv_cache_layouts(backends)]
            layout = resolve_kv_cache_layout(cfg, [supported], list(specs.values()))
            record_kv_cache_layout(cfg.cache_config, layout.name)
        (kv_cfg,) = plan_kv_cache_configs(cfg, [specs], [memory], num_blocks=num_blocks)
        kv_cfg.kv_cache_layout = cfg.cache_config.kv_cache_layout
        cfg.cache_config.num_gpu_blocks = kv_cfg.num_blocks
    return kv_cfg
