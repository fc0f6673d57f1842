"""The worker side of a resize: functions the engine core sends to every rank.

What belongs here: what runs inside a worker process (or the in-process worker) through
``collective_rpc`` — vLLM passes the worker wrapper first. Every function here returns a
plain status dict and NEVER raises: ``collective_rpc`` stops reading replies at the first
failing rank and leaves the other ranks' replies queued for the next call, so a raise on
one rank would desynchronize the next resize. The engine core reads the statuses and decides
the rollback (:mod:`.engine`).

The KV phase itself goes through the pipelined runner: ``_cleanup_profiling_kv_cache()``
(the catalog's reverse teardowns) and vLLM's own ``Worker.initialize_from_config`` (which
calls the runner's ``initialize_kv_cache`` — the catalog — and ``_init_kv_zero_meta``), then
vLLM's ``compile_or_warm_up_model``.

GPU: every captured CUDA graph holds the old KV addresses and the old builders' buffers, so
the teardown releases them all (``CUDAGraphWrapper.clear_all_graphs()``, as vLLM's
elastic-EP path does) and the warm-up unlocks the workspace, re-captures
(``compile_or_warm_up_model``) and locks it again. That path has never run on a GPU (no GPU
machine could install vLLM here); the graph release is unit-tested on CPU with real
``CUDAGraphWrapper`` objects.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import os
import time
import traceback
from collections.abc import Iterator
from typing import Any

__all__ = [
    "freeze_startup_heap",
    "rank_initialize",
    "rank_requests",
    "rank_status",
    "rank_teardown",
    "rank_warm_up",
    "release_cuda_graphs",
    "trim_memory",
]


def _worker(wrapper: Any) -> tuple[Any, int]:
    worker = getattr(wrapper, "worker", None) or wrapper
    rank: Any = getattr(wrapper, "global_rank", None)
    if rank is None:
        rank = getattr(worker, "rank", 0)
    return worker, int(rank)


def _rss() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def trim_memory() -> None:
    """Give freed heap pages back to the OS (glibc ``malloc_trim``). The runner's KV
    teardown already ran ``gc.collect()``, as vLLM's cleanup does."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


_FROZEN = False


def freeze_startup_heap() -> bool:
    """Once per worker process: collect, then move everything alive to the permanent
    generation, as vLLM's ``EngineCore.__init__`` does for its own process
    (``freeze_gc_heap``). vLLM does not do it in spawned worker processes, where the KV
    teardown's ``gc.collect()`` would otherwise walk vLLM's whole startup heap on every
    resize (about a second here). Objects allocated later are collected as before; True
    when this call froze the heap. (A flag, not ``gc.get_freeze_count()``: that walks the
    frozen objects, 0.16 s here.)"""
    global _FROZEN
    if _FROZEN:
        return False
    gc.collect()
    gc.freeze()
    _FROZEN = True
    return True


def _kv_bytes(runner: Any) -> int:
    kvc = getattr(runner, "kv_cache_config", None)
    if kvc is None:
        return 0
    return sum(int(t.size) for t in kvc.kv_cache_tensors)


def _failure(rank: int, err: BaseException, step: str) -> dict[str, Any]:
    from initpipe import StageError

    return {
        "ok": False,
        "rank": rank,
        "step": step,
        "stage": err.stage if isinstance(err, StageError) else None,
        "error": f"{type(err).__name__}: {err}",
        "traceback": traceback.format_exc(limit=8),
    }


@functools.cache
def _numa_node() -> int:
    """This worker's NUMA node, as vLLM's CPU worker finds it (``lscpu``: once a process)."""
    from vllm.utils.cpu_resource_utils import get_allowed_cpu_list

    return int(get_allowed_cpu_list()[0].numa_node)


def _available_memory(worker: Any) -> int | None:
    """Memory a new KV cache could take on this rank, read as vLLM's worker reads it."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from vllm.utils.cpu_resource_utils import get_memory_node_info

        return int(get_memory_node_info(_numa_node()).available_memory)
    import torch

    free, _total = torch.accelerator.get_memory_info()  # type: ignore[attr-defined]
    return int(free)


def rank_status(wrapper: Any, own_process: bool = False) -> dict[str, Any]:
    """Whether this rank can resize now, and what it holds. ``own_process``: the worker
    runs apart from the engine core (whose heap vLLM froze already): freeze its heap once."""
    worker, rank = _worker(wrapper)
    try:
        from ..hook.runner import PipelinedRunnerMixin

        froze = freeze_startup_heap() if own_process else False
        runner = worker.model_runner
        batch = getattr(runner, "input_batch", None)
        return {
            "ok": True,
            "rank": rank,
            "pipelined": isinstance(runner, PipelinedRunnerMixin),
            "worker_class": f"{type(worker).__module__}.{type(worker).__qualname__}",
            "runner_class": type(runner).__name__,
            "requests": sorted(getattr(runner, "requests", {})),
            "batch_requests": int(getattr(batch, "num_reqs", 0) or 0),
            "kv_bytes": _kv_bytes(runner),
            "kv_in_place": bool(getattr(runner, "kv_caches", None)),
            "num_blocks": runner.cache_config.num_gpu_blocks,
            "available_memory": _available_memory(worker),
            "rss": _rss(),
            "froze_heap": froze,
        }
    except Exception as err:
        return _failure(rank, err, "status")


def rank_requests(wrapper: Any) -> dict[str, Any]:
    """The requests this rank's runner still holds (cheap: asked again after the pause)."""
    worker, rank = _worker(wrapper)
    try:
        return {"ok": True, "rank": rank, "requests": sorted(worker.model_runner.requests)}
    except Exception as err:
        return _failure(rank, err, "status")


def release_cuda_graphs(runner: Any) -> int:
    """Drop every captured CUDA graph (they hold the old KV addresses); return how many
    wrappers held graphs. A no-op where none was captured (CPU, ``enforce_eager``)."""
    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
    from vllm.compilation.cuda_graph import CUDAGraphWrapper

    held = 0
    for cls in (CUDAGraphWrapper, BreakableCUDAGraphWrapper):
        for wrapper in list(cls._all_instances):
            entries = getattr(wrapper, "concrete_cudagraph_entries", None)
            if entries is None:  # the breakable wrapper names them `entries`
                entries = getattr(wrapper, "entries", None)
            held += bool(entries)
        cls.clear_all_graphs()
    encoder = getattr(runner, "encoder_cudagraph_manager", None)
    if encoder is not None:
        encoder.clear()
    return held


def rank_teardown(wrapper: Any) -> dict[str, Any]:
    """Release this rank's KV cache: graphs, then the catalog's KV teardowns."""
    worker, rank = _worker(wrapper)
    try:
        runner = worker.model_runner
        rss_before = _rss()
        start = time.perf_counter()
        freed = _kv_bytes(runner)
        graphs = release_cuda_graphs(runner)
        runner._cleanup_profiling_kv_cache()
        trim_memory()
        return {
            "ok": True,
            "rank": rank,
            "bytes_freed": freed,
            "graphs_released": graphs,
            "seconds": time.perf_counter() - start,
            "rss_before": rss_before,
            "rss_after": _rss(),
        }
    except Exception as err:
        return _failure(rank, err, "teardown")


@contextlib.contextmanager
def _vllm_config(worker: Any) -> Iterator[None]:
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(worker.vllm_config):
        yield


def rank_initialize(wrapper: Any, kv_cache_configs: list[Any]) -> dict[str, Any]:
    """Run this rank's KV phase for its config, through vLLM's ``initialize_from_config``.

    On failure the run has rolled the phase back; whatever vLLM's code around it left (a
    zeroer built after the phase) is torn down too, so the rank holds no KV cache.
    """
    worker, rank = _worker(wrapper)
    start = time.perf_counter()
    try:
        runner = worker.model_runner
        if getattr(runner, "requests", None):
            msg = f"rank {rank}'s runner still holds requests {sorted(runner.requests)}"
            raise RuntimeError(msg)
        with _vllm_config(worker):
            worker.initialize_from_config(kv_cache_configs[rank])
        return {
            "ok": True,
            "rank": rank,
            "bytes_allocated": _kv_bytes(runner),
            "seconds": time.perf_counter() - start,
        }
    except Exception as err:
        status = _failure(rank, err, "kv_phase")
        with contextlib.suppress(Exception):
            if worker.model_runner.kv_caches or worker.model_runner.initpipe_run.kv_ready:
                worker.model_runner._cleanup_profiling_kv_cache()
        trim_memory()
        status["seconds"] = time.perf_counter() - start
        return status


@contextlib.contextmanager
def _workspace_unlocked() -> Iterator[None]:
    """GPU: vLLM's workspace unlocked around a re-capture (the builders' buffers may grow
    with the new cache) and locked again, as its elastic-EP path does; else nothing."""
    from vllm.platforms import current_platform

    if not (current_platform.is_cuda_alike() or current_platform.is_xpu()):
        yield
        return
    from vllm.v1.worker.workspace import (
        is_workspace_manager_initialized,
        lock_workspace,
        unlock_workspace,
    )

    if not is_workspace_manager_initialized():
        yield
        return
    unlock_workspace()
    try:
        yield
    finally:
        lock_workspace()


def rank_warm_up(wrapper: Any) -> dict[str, Any]:
    """vLLM's warm-up after a new KV cache (on GPU: re-capture the CUDA graphs)."""
    worker, rank = _worker(wrapper)
    start = time.perf_counter()
    try:
        with _vllm_config(worker), _workspace_unlocked():
            worker.compile_or_warm_up_model()
        trim_memory()
        return {
            "ok": True,
            "rank": rank,
            "seconds": time.perf_counter() - start,
            "rss_after": _rss(),
        }
    except Exception as err:
        return _failure(rank, err, "warmup")
