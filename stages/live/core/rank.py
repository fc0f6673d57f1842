"""The worker side of a resize: functions the engine core sends to every rank.

What belongs here: what runs inside a worker process (or the in-process worker) through
``collective_rpc`` — vLLM passes the worker wrapper first. Every function here returns its
record of :mod:`.records` as plain data (``to_dict()``; a :class:`~.records.RankFailure`'s
when it failed) and NEVER raises: ``collective_rpc`` stops reading replies at the first
failing rank and leaves the other ranks' replies queued for the next call, so a raise on
one rank would desynchronize the next resize. The engine core reads the statuses and decides
the rollback (the room's engine module); a rank that could not answer refuses the resize.

Both runners (v1 and Model Runner V2) are driven through one interface, the KV lifecycle
of :class:`~initpipe_vllm.hook.runner.PipelineHost`: ``initpipe_requests()``,
``initpipe_kv_in_place()``, ``initpipe_release_cuda_graphs()`` and
``initpipe_release_kv_cache()`` (the catalog's reverse teardowns); the new cache comes
from vLLM's own ``Worker.initialize_from_config`` (the runner's ``initialize_kv_cache`` —
the catalog — and ``_init_kv_zero_meta``), then vLLM's ``compile_or_warm_up_model``.
Nothing here names a runner version.

GPU: every captured CUDA graph holds the old KV addresses and the old builders' buffers, so
the teardown releases them all first (v1: ``CUDAGraphWrapper.clear_all_graphs()``; MRv2:
its ``CudaGraphManager``s' ``release_graphs()`` — both as vLLM's elastic-EP path does) and
the warm-up unlocks the workspace, re-captures (``compile_or_warm_up_model``; MRv2's
``capture_model`` locks it itself) and locks it again. That path has never run on a GPU (no
GPU machine could install vLLM here); the graph releases are unit-tested on CPU with real
wrapper and manager objects.
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

import attrs

from ...contract.declare import vllm_uses
from .records import (
    RankAllocation,
    RankFailure,
    RankRequests,
    RankStatus,
    RankTeardown,
    RankWarmUp,
)

__all__ = [
    "available_memory",
    "failure_of",
    "freeze_startup_heap",
    "rank_initialize",
    "rank_requests",
    "rank_status",
    "rank_teardown",
    "rank_warm_up",
    "rss",
    "trim_memory",
    "worker_of",
]


def worker_of(wrapper: Any) -> tuple[Any, int]:
    worker = getattr(wrapper, "worker", None) or wrapper
    rank: Any = getattr(wrapper, "global_rank", None)
    if rank is None:
        rank = getattr(worker, "rank", 0)
    return worker, int(rank)


def rss() -> int | None:
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


def failure_of(rank: int, err: BaseException, step: str) -> RankFailure:
    from initpipe import StageError

    return RankFailure(
        rank=rank,
        step=step,
        stage=err.stage if isinstance(err, StageError) else None,
        error=f"{type(err).__name__}: {err}",
        traceback=traceback.format_exc(limit=8),
    )


@vllm_uses(
    "resize",
    calls=("vllm.utils.cpu_resource_utils:get_allowed_cpu_list",),
)
@functools.cache
def _numa_node() -> int:
    """This worker's NUMA node, as vLLM's CPU worker finds it (``lscpu``: once a process)."""
    from vllm.utils.cpu_resource_utils import get_allowed_cpu_list

    return int(get_allowed_cpu_list()[0].numa_node)


@vllm_uses(
    "resize",
    calls=(
        "vllm.platforms:current_platform",
        "vllm.utils.cpu_resource_utils:get_memory_node_info",
    ),
)
def available_memory(worker: Any) -> int | None:
    """Memory a new KV cache could take on this rank, read as vLLM's worker reads it."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from vllm.utils.cpu_resource_utils import get_memory_node_info

        return int(get_memory_node_info(_numa_node()).available_memory)
    import torch

    free, _total = torch.accelerator.get_memory_info()  # type: ignore[attr-defined]
    return int(free)


def _pipelined(runner: Any) -> bool:
    from ...hook.runner import PipelineHost

    return isinstance(runner, PipelineHost)


def rank_status(wrapper: Any, own_process: bool = False) -> dict[str, Any]:
    """Whether this rank can resize now, and what it holds. ``own_process``: the worker
    runs apart from the engine core (whose heap vLLM froze already): freeze its heap once."""
    worker, rank = worker_of(wrapper)
    try:
        froze = freeze_startup_heap() if own_process else False
        runner = worker.model_runner
        pipelined = _pipelined(runner)
        return RankStatus(
            rank=rank,
            pipelined=pipelined,
            model_runner=getattr(runner, "initpipe_runner_version", None),
            worker_class=f"{type(worker).__module__}.{type(worker).__qualname__}",
            runner_class=type(runner).__name__,
            requests=runner.initpipe_requests() if pipelined else [],
            kv_bytes=_kv_bytes(runner),
            kv_in_place=runner.initpipe_kv_in_place() if pipelined else None,
            num_blocks=runner.cache_config.num_gpu_blocks,
            available_memory=available_memory(worker),
            rss=rss(),
            froze_heap=froze,
        ).to_dict()
    except Exception as err:
        return failure_of(rank, err, "status").to_dict()


def rank_requests(wrapper: Any) -> dict[str, Any]:
    """The requests this rank's runner still holds (cheap: asked again after the pause)."""
    worker, rank = worker_of(wrapper)
    try:
        return RankRequests(rank=rank, requests=worker.model_runner.initpipe_requests()).to_dict()
    except Exception as err:
        return failure_of(rank, err, "status").to_dict()


def rank_teardown(wrapper: Any) -> dict[str, Any]:
    """Release this rank's KV cache: graphs, then the catalog's KV teardowns."""
    worker, rank = worker_of(wrapper)
    try:
        runner = worker.model_runner
        rss_before = rss()
        start = time.perf_counter()
        freed = _kv_bytes(runner)
        graphs = runner.initpipe_release_cuda_graphs()
        runner.initpipe_release_kv_cache()
        trim_memory()
        return RankTeardown(
            rank=rank,
            bytes_freed=freed,
            graphs_released=graphs,
            seconds=time.perf_counter() - start,
            rss_before=rss_before,
            rss_after=rss(),
        ).to_dict()
    except Exception as err:
        return failure_of(rank, err, "teardown").to_dict()


@vllm_uses(
    "resize",
    calls=("vllm.config:set_current_vllm_config",),
)
@contextlib.contextmanager
def _vllm_config(worker: Any) -> Iterator[None]:
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(worker.vllm_config):
        yield


@vllm_uses(
    "resize",
    calls=("vllm.v1.worker.gpu_worker:Worker.initialize_from_config",),
)
def rank_initialize(wrapper: Any, kv_cache_configs: list[Any]) -> dict[str, Any]:
    """Run this rank's KV phase for its config, through vLLM's ``initialize_from_config``.

    On failure the run has rolled the phase back; whatever vLLM's code around it left (a
    zeroer built after the phase) is torn down too, so the rank holds no KV cache.
    """
    worker, rank = worker_of(wrapper)
    start = time.perf_counter()
    try:
        runner = worker.model_runner
        held = runner.initpipe_requests()
        if held:
            raise RuntimeError(f"rank {rank}'s runner still holds requests {held}")
        with _vllm_config(worker):
            worker.initialize_from_config(kv_cache_configs[rank])
        return RankAllocation(
            rank=rank, bytes_allocated=_kv_bytes(runner), seconds=time.perf_counter() - start
        ).to_dict()
    except Exception as err:
        failure = failure_of(rank, err, "kv_phase")
        with contextlib.suppress(Exception):
            if worker.model_runner.initpipe_kv_in_place():
                worker.model_runner.initpipe_release_kv_cache()
        trim_memory()
        return attrs.evolve(failure, seconds=time.perf_counter() - start).to_dict()


@vllm_uses(
    "resize",
    calls=(
        "vllm.platforms:current_platform",
        "vllm.v1.worker.workspace:is_workspace_manager_initialized",
        "vllm.v1.worker.workspace:lock_workspace",
        "vllm.v1.worker.workspace:unlock_workspace",
    ),
)
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


@vllm_uses(
    "resize",
    calls=("vllm.v1.worker.gpu_worker:Worker.compile_or_warm_up_model",),
)
def rank_warm_up(wrapper: Any) -> dict[str, Any]:
    """vLLM's warm-up after a new KV cache (on GPU: re-capture the CUDA graphs)."""
    worker, rank = worker_of(wrapper)
    start = time.perf_counter()
    try:
        with _vllm_config(worker), _workspace_unlocked():
            worker.compile_or_warm_up_model()
        trim_memory()
        return RankWarmUp(rank=rank, seconds=time.perf_counter() - start, rss_after=rss()).to_dict()
    except Exception as err:
        return failure_of(rank, err, "warmup").to_dict()
