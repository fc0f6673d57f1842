"""Concurrent KV re-initializations of one pipelined runner are serialized.

Each thread runs vLLM's sequence for a new KV cache — ``_cleanup_profiling_kv_cache()``
then ``initialize_kv_cache`` — under the runner's re-entrant lock (``Rig.reinit``). The
allocation stage is replaced (``catalog().replace``) by one that calls the real stage
but first waits until every other thread of the round is blocked on the runner's lock (or
done), so the others always arrive while the first is mid-phase, however slow the machine;
it records who is inside and weak references to every storage it allocated. The runner's
lock is wrapped (:class:`WatchedLock`) only to count who waits on it. Checked: the second
call waits for the first (no interleaving of their KV phases in the trace), never two
KV allocations alive at once, and the runner ends in a consistent, clean-run state. A
bare second ``initialize_kv_cache`` racing a KV phase is refused, never interleaved.
"""

from __future__ import annotations

import threading
import time
import weakref

import pytest
from relkit import Rig, frozen_gc
from waiting import HANG_S, WatchedLock, until

from initpipe import KV, PhaseOrderError, stage
from initpipe_vllm import catalog
from initpipe_vllm.v1.kv_tensors import allocated_kv_caches as real_allocation


class Probe:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside = 0
        self.max_inside = 0
        self.entered = threading.Event()
        self.runner_lock: WatchedLock | None = None
        self.threads = 0  # in the round
        self.finished = 0  # calls of the round that returned
        self.intervals: list[tuple[int, float, float]] = []  # (thread, enter, exit)
        self.storages: list[weakref.ref] = []
        self.alive_at_allocation: list[int] = []

    def alive(self) -> int:
        return sum(1 for r in self.storages if r() is not None)


PROBE = Probe()


@stage(
    needs=KV,
    provides="allocated_kv_caches",
    teardown=catalog().specs["allocated_kv_caches"].teardown,
)
def counting_allocation(
    vllm_config,
    device,
    runner_kv_cache_config,
    kernel_block_sizes,
    kv_cache_layout,
    kv_cache_allocation_context,
    jit_warmup_registry,
):
    """The real allocation stage, held open until every other thread of the round waits
    for the runner's lock or is done, and counted."""
    with PROBE.lock:
        PROBE.inside += 1
        PROBE.max_inside = max(PROBE.max_inside, PROBE.inside)
        PROBE.alive_at_allocation.append(PROBE.alive())
    t0 = time.perf_counter()
    PROBE.entered.set()
    watched = PROBE.runner_lock
    if watched is not None:  # None only while the rig itself is being built
        until(
            "the other threads blocked on the runner's lock or done",
            lambda: watched.blocked + PROBE.finished >= PROBE.threads - 1,
        )
    out = real_allocation(
        vllm_config,
        device,
        runner_kv_cache_config,
        kernel_block_sizes,
        kv_cache_layout,
        kv_cache_allocation_context,
        jit_warmup_registry,
    )
    with PROBE.lock:
        PROBE.storages.extend(
            weakref.ref(s)
            for s in {
                t.untyped_storage().data_ptr(): t.untyped_storage() for t in out.values()
            }.values()
        )
        PROBE.inside -= 1
        PROBE.intervals.append((threading.get_ident(), t0, time.perf_counter()))
    return out


@pytest.fixture(scope="module")
def rig():
    pipeline = catalog().replace("allocated_kv_caches", counting_allocation)
    with frozen_gc():
        r = Rig(pipeline=pipeline)
        assert r.runner.initpipe_pipeline is pipeline
        PROBE.runner_lock = r.runner._initpipe_lock = WatchedLock(r.runner._initpipe_lock)
        yield r


def _threads(rig, configs, call_with=None):
    errors: list[BaseException] = []
    calls: dict[int, float] = {}

    def call(cfg):
        calls[threading.get_ident()] = time.perf_counter()
        try:
            (call_with or rig.reinit)(cfg)
        except BaseException as err:  # reported below
            errors.append(err)
        finally:
            with PROBE.lock:
                PROBE.finished += 1

    threads = [threading.Thread(target=call, args=(c,)) for c in configs]
    PROBE.entered.clear()
    PROBE.threads, PROBE.finished = len(threads), 0
    threads[0].start()
    assert PROBE.entered.wait(HANG_S)  # the first is inside the allocation stage
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(HANG_S)
    assert not any(t.is_alive() for t in threads), "a thread hangs"
    if call_with is not None:
        return errors
    assert not errors, errors
    return calls


def test_two_concurrent_initializations_are_serialized(rig) -> None:
    rig.reinit()
    PROBE.intervals.clear()
    run = rig.runner.initpipe_run
    gen0 = run.kv_generation
    n_trace = len(run.trace)
    calls = _threads(rig, [rig.plan(32), rig.plan(48)])
    (a_tid, _a_in, a_out), (b_tid, b_in, _b_out) = PROBE.intervals
    assert a_tid != b_tid
    assert calls[b_tid] < a_out  # B called while A was inside the phase ...
    assert b_in > a_out  # ... and B's phase began only after A's
    assert PROBE.max_inside == 1
    # the trace: every event of A's KV phase ends before B's KV phase starts
    events = [e for e in run.trace.events[n_trace:] if e.phase == KV and e.kind == "stage"]
    gen_a = [e for e in events if e.generation == gen0 + 1]
    gen_b = [e for e in events if e.generation == gen0 + 2]
    assert gen_a and gen_b and len(gen_a) == len(gen_b) == len(catalog().phase_order(KV))
    assert max(e.start + e.duration for e in gen_a) <= min(e.start for e in gen_b)
    assert run.kv_generation == gen0 + 2


def test_never_two_kv_allocations_alive_at_once(rig) -> None:
    rig.reinit()
    PROBE.alive_at_allocation.clear()
    _threads(rig, [rig.plan(n) for n in (16, 64, 24, 128)])
    assert PROBE.alive_at_allocation == [0, 0, 0, 0]  # the previous cache was already freed
    assert PROBE.max_inside == 1
    assert PROBE.alive() == 1  # only the cache in place now
    runner = rig.runner
    assert runner.kv_caches[0].shape[0] == runner.kv_cache_config.num_blocks  # consistent


def test_after_the_race_a_clean_init_matches_a_clean_run(rig) -> None:
    _threads(rig, [rig.plan(8), None])
    rig.cleanup()
    rig.init()
    assert rig.diff(rig.clean) == []
    rig.cleanup()  # vLLM's cleanup collects garbage too
    assert PROBE.alive() == 0


def test_a_bare_second_initialize_racing_a_kv_phase_is_refused(rig) -> None:
    rig.cleanup()
    gen0 = rig.runner.initpipe_run.kv_generation
    PROBE.intervals.clear()
    errors = _threads(rig, [rig.plan(32), rig.plan(48)], call_with=rig.init)
    assert len(PROBE.intervals) == 1  # only the first call ran a KV phase
    assert len(errors) == 1 and isinstance(errors[0], PhaseOrderError)
    assert "_cleanup_profiling_kv_cache() first" in str(errors[0])
    runner = rig.runner
    assert runner.initpipe_run.kv_generation == gen0 + 1
    assert runner.kv_caches[0].shape[0] == runner.kv_cache_config.num_blocks == 32
