"""Resize pieces that need no engine: arguments, records, errors, the CUDA graph releases,
the rank statuses' reading.

The CUDA graph releases cannot run on a GPU here (no GPU machine could install vLLM): v1's
is tested with real ``CUDAGraphWrapper`` / ``BreakableCUDAGraphWrapper`` objects built on
CPU (the platform's global graph pool set by hand first) whose entries are filled by hand,
Model Runner V2's with real ``CudaGraphManager`` / ``SpeculatorCudaGraphManager`` /
``EncoderCudaGraphManager`` objects (made without their GPU-bound ``__init__``) whose graph
tables are filled by hand.
"""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

import initpipe_vllm as ip
from initpipe_vllm import (
    KVCacheReleasedError,
    RefitError,
    RefitRefusedError,
    ResizeError,
    ResizeRefusedError,
)
from initpipe_vllm.live.core.entry import error_dict, error_from_dict
from initpipe_vllm.live.resize.report import KVCacheInfo, PrefixCacheCarry, RankReport, ResizeReport


class _NotAnEngine:
    pass


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "pass the new size"),
        ({"num_blocks": 8, "kv_cache_memory_bytes": 1 << 20}, "exactly one"),
        ({"num_blocks": 0}, r"num_blocks=0: expected a positive int"),
        ({"num_blocks": 2.5}, r"num_blocks=2.5"),
        ({"num_blocks": True}, r"num_blocks=True"),
        ({"kv_cache_memory_bytes": -1}, r"kv_cache_memory_bytes=-1"),
        ({"num_blocks": 8, "mode": "soon"}, r"mode='soon': expected 'wait'"),
        ({"num_blocks": 8, "keep_prefix_cache": "yes"}, r"keep_prefix_cache='yes': expected"),
    ],
)
def test_bad_arguments_are_refused_before_the_engine_is_touched(
    kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ResizeRefusedError, match=match) as info:
        ip.resize_kv_cache(_NotAnEngine(), **kwargs)
    assert info.value.step == "arguments" and info.value.rolled_back is False
    assert isinstance(info.value, ValueError)  # callers catching ValueError keep working


def test_something_that_is_not_an_engine_is_named() -> None:
    with pytest.raises(ResizeRefusedError, match="_NotAnEngine is not a vLLM LLM"):
        ip.resize_kv_cache(_NotAnEngine(), num_blocks=8)
    with pytest.raises(ResizeRefusedError, match="mode='later'"):
        ip.release_kv_cache(_NotAnEngine(), mode="later")


def _report() -> ResizeReport:
    return ResizeReport(
        action="resize",
        mode="abort",
        blocks_before=24,
        blocks_after=12,
        bytes_freed=24 << 17,
        bytes_allocated=12 << 17,
        total_s=0.2,
        steps={"pause": 0.01, "teardown": 0.05},
        ranks=(
            RankReport(
                rank=0, bytes_freed=24 << 17, bytes_allocated=12 << 17, rss_after=5, stash_bytes=7
            ),
        ),
        requests_aborted=("r1",),
        prefix_cache=PrefixCacheCarry(
            kept=True, cached_before=8, blocks_kept=5, blocks_evicted=3, bytes_copied=5 << 17
        ),
    )


def test_reports_travel_as_plain_data_and_come_back_equal() -> None:
    import json

    rep = _report()
    assert ResizeReport.from_dict(json.loads(json.dumps(rep.to_dict()))) == rep
    info = KVCacheInfo(
        state="released",
        num_blocks=0,
        free_blocks=0,
        block_size=16,
        bytes_per_rank=(),
        resume_blocks=12,
        last_report=rep,
    )
    assert KVCacheInfo.from_dict(json.loads(json.dumps(info.to_dict()))) == info
    text = str(rep)
    assert "resize (abort): 24 -> 12 blocks" in text and "aborted: r1" in text
    assert "prefix cache kept: 5 of 8 cached blocks (3 evicted, 0.62 MiB copied" in text


def test_errors_keep_their_facts_across_processes() -> None:
    err = ResizeError(
        "failed at stage 'kv_caches'",
        step="kv_phase",
        stage="kv_caches",
        rank=1,
        reason="boom",
        rolled_back=True,
    )
    back = pickle.loads(pickle.dumps(err))
    assert (back.step, back.stage, back.rank, back.reason, back.rolled_back) == (
        "kv_phase",
        "kv_caches",
        1,
        "boom",
        True,
    )
    # an engine core's answer carries each typed error as plain data, and back, whole
    refit_failed = RefitError("failed", step="load", reason="boom", rank=1, serving=False)
    for sent in (
        err,
        ResizeRefusedError("no", step="memory", reason="no room"),
        refit_failed,
        RefitRefusedError("refused", step="weights", reason="a shape differs"),
    ):
        plain = error_dict(sent)
        assert json.loads(json.dumps(plain)) == plain  # plain data
        got = error_from_dict(plain)
        assert type(got) is type(sent) and str(got) == str(sent)
        assert got.__reduce__()[1][2] == sent.__reduce__()[1][2]  # every field
    assert issubclass(KVCacheReleasedError, RuntimeError)


def test_the_released_error_is_also_vllms_graceful_http_error() -> None:
    from http import HTTPStatus

    from vllm.exceptions import GracefulHTTPError

    from initpipe_vllm.live.frontend import released_error

    err = released_error()
    assert isinstance(err, KVCacheReleasedError) and isinstance(err, GracefulHTTPError)
    assert err.http_status == HTTPStatus.SERVICE_UNAVAILABLE
    assert "resume_kv_cache" in str(err) and "resume_kv_cache" in err.message


def test_the_cuda_graph_release_drops_every_captured_graph() -> None:
    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.config import CUDAGraphMode, VllmConfig
    from vllm.forward_context import BatchDescriptor
    from vllm.platforms import current_platform

    from initpipe_vllm.hook.runner import release_cuda_graphs

    cls = type(current_platform)
    saved = cls._global_graph_pool
    cls._global_graph_pool = object()  # CPU has no graph pool handle: set one by hand
    try:
        cfg = VllmConfig()
        full = CUDAGraphWrapper(lambda x: x, cfg, CUDAGraphMode.FULL)
        piece = CUDAGraphWrapper(lambda x: x, cfg, CUDAGraphMode.PIECEWISE)
        breakable = BreakableCUDAGraphWrapper(lambda x: x, cfg)
        empty = CUDAGraphWrapper(lambda x: x, cfg, CUDAGraphMode.FULL)
        for n, w in enumerate((full, piece)):
            w.concrete_cudagraph_entries[BatchDescriptor(num_tokens=8 + n)] = object()
        breakable.entries[BatchDescriptor(num_tokens=4)] = object()

        class Runner:
            class encoder_cudagraph_manager:
                cleared = False

                @classmethod
                def clear(cls) -> None:
                    cls.cleared = True

        assert release_cuda_graphs(Runner()) == 3
        assert not full.concrete_cudagraph_entries and not piece.concrete_cudagraph_entries
        assert not breakable.entries and not empty.concrete_cudagraph_entries
        assert Runner.encoder_cudagraph_manager.cleared
        assert release_cuda_graphs(Runner()) == 0
    finally:
        cls._global_graph_pool = saved


def test_the_mrv2_graph_release_drops_every_managers_graphs() -> None:
    """MRv2's owners, as vLLM's elastic EP releases them: the runner's manager, every
    manager the speculator holds, and the model state's encoder graphs."""
    from types import SimpleNamespace

    from vllm.v1.worker.encoder_cudagraph import EncoderCudaGraphManager
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager
    from vllm.v1.worker.gpu.mm.encoder_runner import EncoderRunner

    try:  # 0.34.0 moved it
        from vllm.v1.worker.gpu.spec_decode.autoregressive.cudagraph_utils import (  # type: ignore[import-not-found, unused-ignore]
            SpeculatorCudaGraphManager,
        )
    except ImportError:
        from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.cudagraph_utils import (
            SpeculatorCudaGraphManager,
        )

    from initpipe_vllm.hook.runner_v2 import release_cuda_graphs_v2

    def manager(cls: type, graphs: int) -> Any:
        m = cls.__new__(cls)  # the real class; its __init__ needs a distributed group
        m.graphs = {f"desc{i}": object() for i in range(graphs)}
        m._graphs_captured = bool(graphs)
        m.breakable_cg_runner = None
        return m

    main = manager(CudaGraphManager, 3)
    prefill, decode = manager(SpeculatorCudaGraphManager, 2), manager(SpeculatorCudaGraphManager, 0)
    speculator = SimpleNamespace(prefill_cudagraph_manager=prefill, decode_cudagraph_manager=decode)
    enc = EncoderCudaGraphManager.__new__(EncoderCudaGraphManager)
    enc.budget_graphs = {"vision": {64: object(), 128: object()}}
    enc.graph_pool = object()
    # 0.34.0's clear() also empties the buffers its graphs share
    enc._shared_input_buffers, enc._shared_output_buffers, enc._shared_input_keys = {}, {}, {}
    encoder = EncoderRunner.__new__(EncoderRunner)
    encoder.cudagraph_manager = enc
    runner = SimpleNamespace(
        cudagraph_manager=main,
        speculator=speculator,
        model_state=SimpleNamespace(supports_mm_inputs=True, encoder_runner=encoder),
    )
    assert release_cuda_graphs_v2(runner) == 3  # main, prefill, encoder (decode held none)
    assert main.graphs == {} and prefill.graphs == {} and not main._graphs_captured
    assert enc.budget_graphs == {"vision": {}} and enc.graph_pool is None
    assert release_cuda_graphs_v2(runner) == 0
    # after a KV teardown the runner holds no manager and no speculator: nothing to do
    bare = SimpleNamespace(
        cudagraph_manager=None,
        speculator=None,
        model_state=SimpleNamespace(supports_mm_inputs=False),
    )
    assert release_cuda_graphs_v2(bare) == 0


def test_0_34s_graph_release_moves_every_owner_to_a_fresh_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """0.34.0's elastic EP captures again into a fresh CUDA-graph pool after releasing the
    graphs (libraries may keep the old pool's tensors alive): its variant of the release
    re-points the global pool, every manager that had one and every graph wrapper. Without
    a global pool (CPU, eager) it is the base release. A stand-in pool: no GPU here."""
    from types import SimpleNamespace

    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.platforms import current_platform
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    from initpipe_vllm.hook.runner_v2 import release_cuda_graphs_v2_0_34_0

    def manager(pool: Any) -> Any:
        m = CudaGraphManager.__new__(CudaGraphManager)
        m.graphs, m._graphs_captured, m.breakable_cg_runner, m.pool = (
            {"d": object()},
            True,
            None,
            pool,
        )
        return m

    class Wrapper:  # stands in for a captured model's wrapper (weakly held by the class)
        graph_pool: Any = "old"

    old, new = object(), object()
    main, draft, eager = manager(old), manager(old), manager(None)
    runner = SimpleNamespace(
        cudagraph_manager=main,
        speculator=SimpleNamespace(draft=draft, eager=eager),
        model_state=SimpleNamespace(supports_mm_inputs=False),
    )
    platform_cls = type(current_platform)
    assert platform_cls._global_graph_pool is None  # CPU: the base release only
    assert release_cuda_graphs_v2_0_34_0(runner) == 3 and main.pool is old
    monkeypatch.setattr(platform_cls, "_global_graph_pool", old)
    monkeypatch.setattr(current_platform, "graph_pool_handle", lambda: new, raising=False)
    wrappers = [Wrapper(), Wrapper()]
    for wrapper, cls in zip(wrappers, (CUDAGraphWrapper, BreakableCUDAGraphWrapper), strict=True):
        cls._all_instances.add(wrapper)  # type: ignore[arg-type]
    main.graphs = {"d": object()}
    assert release_cuda_graphs_v2_0_34_0(runner) == 1
    assert platform_cls._global_graph_pool is new
    assert main.pool is new and draft.pool is new and eager.pool is None
    assert [w.graph_pool for w in wrappers] == [new, new]


def test_a_rank_that_cannot_report_its_requests_refuses_the_resize() -> None:
    """Only a rank that answered and holds nothing lets a resize go on: a failed status
    (an unknown runner state) refuses it as surely as held requests do."""
    from initpipe_vllm.live.core.records import RankFailure, RankRequests
    from initpipe_vllm.live.core.steps import check_runners_idle

    idle = RankRequests(rank=0, requests=[])
    check_runners_idle([idle])
    failed = RankFailure(rank=1, step="status", error="AttributeError: no req_states")
    with pytest.raises(ResizeRefusedError, match="rank 1 could not report") as info:
        check_runners_idle([idle, failed])
    assert info.value.step == "requests" and "no req_states" in str(info.value)
    with pytest.raises(ResizeRefusedError, match=r"rank 0's runner still holds requests \['r1'\]"):
        check_runners_idle([RankRequests(rank=0, requests=["r1"])])


def test_both_pipelined_runners_are_driven_through_one_interface() -> None:
    """The rank code recognizes the MRv2 class as pipelined and reads its requests from
    ``req_states`` (v1's from ``requests``), through the methods both implement."""
    from types import SimpleNamespace

    from initpipe_vllm.hook.runner import PipelinedRunnerMixin, PipelineHost
    from initpipe_vllm.hook.runner_v2 import PipelinedRunnerV2Mixin, resolve_v2_class
    from initpipe_vllm.live.core.rank import _pipelined
    from initpipe_vllm.runner import PipelinedCPUModelRunner

    v2 = resolve_v2_class("PipelinedCPUModelRunnerV2")
    assert v2 is not None and issubclass(v2, PipelineHost)
    assert v2.initpipe_runner_version == "v2"
    assert PipelinedCPUModelRunner.initpipe_runner_version == "v1"
    lifecycle = (
        "initpipe_requests",
        "initpipe_kv_in_place",
        "initpipe_release_cuda_graphs",
        "initpipe_release_kv_cache",
    )
    for name in lifecycle:  # the shared mixin's, or the runner's own: never a stub
        for mixin in (PipelinedRunnerMixin, PipelinedRunnerV2Mixin):
            assert issubclass(mixin, PipelineHost)
            assert name in vars(PipelineHost) or name in vars(mixin), (mixin, name)
    # the one stub: what requests a runner holds is each runner's own
    with pytest.raises(NotImplementedError):
        PipelineHost.initpipe_requests(object())  # type: ignore[arg-type]
    assert "initpipe_requests" in vars(PipelinedRunnerMixin)
    assert "initpipe_requests" in vars(PipelinedRunnerV2Mixin)
    runner = v2.__new__(v2)
    runner.req_states = SimpleNamespace(req_id_to_index={"b": 0, "a": 3})
    assert _pipelined(runner) and runner.initpipe_requests() == ["a", "b"]
    assert not _pipelined(SimpleNamespace())


def test_held_steps_admit_each_request_and_its_first_token_then_hold(tmp_path: Any) -> None:
    """The rule of ``INITPIPE_HOLD_STEPS`` (``initpipe_vllm.live.core.hold.held``) on a
    scheduler's state: the real engines in test_serve/test_resize_multiprocess rely on it."""
    from types import SimpleNamespace

    from vllm.v1.core.sched.interface import PauseState

    from initpipe_vllm.live.core.hold import UNTIL_PAUSE, held, install_from_env

    def core(waiting: int = 0, tokens: tuple[int, ...] = (), pause: Any = None) -> Any:
        running = [SimpleNamespace(num_output_tokens=n) for n in tokens]
        sched = SimpleNamespace(
            waiting=[object()] * waiting,
            running=running,
            pause_state=pause or PauseState.UNPAUSED,
        )
        return SimpleNamespace(scheduler=sched)

    path = tmp_path / "hold"
    assert not held(core(tokens=(3,)), path)  # no file: never held
    path.write_text("held")
    assert held(core(), path) and held(core(tokens=(1, 5)), path)
    assert not held(core(waiting=1, tokens=(1,)), path)  # a request waits to be scheduled
    assert not held(core(tokens=(1, 0)), path)  # one has not sent its first token yet
    assert held(core(tokens=(1,), pause=PauseState.PAUSED_NEW), path)
    path.write_text(UNTIL_PAUSE)
    assert held(core(tokens=(1,)), path)
    assert not held(core(tokens=(1,), pause=PauseState.PAUSED_NEW), path)  # the pause ends it
    assert not held(core(tokens=(1,), pause=PauseState.PAUSED_ALL), path)
    assert install_from_env({}) is False and install_from_env({"INITPIPE_HOLD_STEPS": " "}) is False


# -- the live-transaction driver and the rank records (no engine) -------------------------
def _txn(log: list[str], fail: str | None = None, bad_undo: str | None = None) -> Any:
    from initpipe_vllm.live.core.txn import Step, Transaction

    def act(name: str) -> Any:
        def do(ctx: list[str]) -> None:
            ctx.append(f"do {name}")
            if name == fail:
                raise RuntimeError(f"{name} broke")

        return do

    def undo(name: str) -> Any:
        def back(ctx: list[str]) -> None:
            ctx.append(f"undo {name}")
            if name == bad_undo:
                raise OSError(f"{name} cannot go back")

        return back

    return Transaction(
        name="demo",
        pause=Step(name="pause", do=act("pause"), undo=undo("pause")),
        steps=(
            Step(name="a", do=act("a"), undo=undo("a")),
            Step(name="b", do=act("b")),
            Step(name="c", do=act("c"), undo=undo("c")),
        ),
        commit=lambda ctx: ctx.append("commit"),
    )


def test_the_driver_runs_pause_steps_commit_in_order() -> None:
    from initpipe_vllm.live.core.txn import drive

    log: list[str] = []
    drive(_txn(log), log)
    assert log == ["do pause", "do a", "do b", "do c", "commit"]


def test_a_failed_step_is_undone_with_every_step_before_it_newest_first() -> None:
    """The failed step's own undo runs too (its do may have changed part of the engine);
    a step without an undo is left to an earlier one's; the pause is lifted last."""
    from initpipe_vllm.live.core.txn import TransactionFailed, drive

    log: list[str] = []
    with pytest.raises(TransactionFailed, match="demo failed at step 'c'") as info:
        drive(_txn(log, fail="c"), log)
    assert log == ["do pause", "do a", "do b", "do c", "undo c", "undo a", "undo pause"]
    err = info.value
    assert (err.step, err.completed, err.rolled_back) == ("c", ("a", "b"), ("c", "a"))
    assert err.rolled_back_cleanly and err.__cause__ is err.cause
    assert str(err.cause) == "c broke" and "completed: a, b" in str(err)


def test_every_undo_runs_when_one_fails_and_the_failure_is_reported() -> None:
    from initpipe_vllm.live.core.txn import TransactionFailed, drive

    log: list[str] = []
    with pytest.raises(TransactionFailed, match="rollback of 'c' failed: OSError") as info:
        drive(_txn(log, fail="c", bad_undo="c"), log)
    assert log[-3:] == ["undo c", "undo a", "undo pause"]
    assert not info.value.rolled_back_cleanly
    assert [(s, type(e)) for s, e in info.value.rollback_errors] == [("c", OSError)]


def test_a_failed_pause_propagates_as_it_is_with_nothing_undone() -> None:
    from initpipe_vllm.live.core.txn import drive

    log: list[str] = []
    with pytest.raises(RuntimeError, match="pause broke"):
        drive(_txn(log, fail="pause"), log)
    assert log == ["do pause"]


def test_a_transaction_with_two_steps_of_one_name_is_refused() -> None:
    from initpipe_vllm.live.core.txn import Step, Transaction

    step = Step(name="same", do=print)
    with pytest.raises(ValueError, match=r"distinct names; given twice: \['same'\]"):
        Transaction(name="t", pause=step, steps=(step, step), commit=print)


def test_resize_release_and_resume_are_step_lists_on_the_driver() -> None:
    """One undo brings the ranks back: the old cache's teardown's (resize, release), the KV
    phase's when there is no old cache (resume)."""
    from initpipe_vllm.live.resize.steps import TRANSACTIONS

    lists = {
        name: [(s.name, s.undo is not None) for s in t.steps] for name, t in TRANSACTIONS.items()
    }
    assert lists == {
        "resize": [
            ("teardown", True),
            ("kv_phase", False),
            ("warmup", False),
            ("scheduler", False),
        ],
        "release": [("teardown", True)],
        "resume": [("kv_phase", True), ("warmup", False), ("scheduler", False)],
    }
    undo = TRANSACTIONS["resize"].steps[0].undo
    assert TRANSACTIONS["resume"].steps[0].undo is undo


def test_a_resize_that_keeps_the_prefix_cache_sets_blocks_aside_and_writes_them_back() -> None:
    """The resize's steps with the carry before the teardown and the write-back after the
    warm-up (which may write into the new cache), before the scheduler's pool is rebuilt."""
    from initpipe_vllm.live.resize.steps import RESIZE, WARM_RESIZE

    assert WARM_RESIZE.name == RESIZE.name == "resize"
    assert [(s.name, s.undo is not None) for s in WARM_RESIZE.steps] == [
        ("carry", True),
        ("teardown", True),
        ("kv_phase", False),
        ("warmup", False),
        ("unstash", False),
        ("scheduler", False),
    ]
    assert WARM_RESIZE.steps[1].undo is not RESIZE.steps[0].undo  # writes the stash back


def test_rank_records_cross_as_plain_data_and_a_failure_reads_back_as_one() -> None:
    from initpipe_vllm.live.core.records import RankFailure, RankRequests, RankTeardown

    torn = RankTeardown(
        rank=1, bytes_freed=8, graphs_released=0, seconds=0.5, rss_before=None, rss_after=3
    )
    wire = pickle.loads(pickle.dumps(torn.to_dict()))
    assert wire["ok"] is True and RankTeardown.from_dict(wire) == torn
    failed = RankFailure(rank=1, step="teardown", error="OSError: gone")
    assert failed.to_dict()["ok"] is False
    assert RankTeardown.from_dict(failed.to_dict()) == failed  # whichever record was asked
    assert RankRequests.from_dict({"ok": True, "rank": 0, "requests": ["r"]}).requests == ["r"]


def test_a_rank_answer_that_is_not_its_record_names_the_keys() -> None:
    from initpipe_vllm.live.core.records import RankRecordError, RankRequests

    with pytest.raises(RankRecordError, match=r"not a RankRequests: missing \['requests'\], "):
        RankRequests.from_dict({"ok": True, "rank": 0, "reqs": []})
    with pytest.raises(RankRecordError, match=r"unknown \['reqs'\]") as info:
        RankRequests.from_dict({"ok": True, "rank": 0, "requests": [], "reqs": []})
    assert (info.value.record, info.value.missing) == ("RankRequests", [])


# -- the replayed Scheduler.__init__ against a fresh scheduler ------------------------------
def _scheduler_for(cfg: Any, plan: Any, *, log_stats: bool) -> Any:
    """vLLM's own ``Scheduler`` for ``plan``, as ``EngineCore.__init__`` builds it after
    ``_initialize_kv_caches``."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    cfg.cache_config.num_gpu_blocks = plan.num_blocks
    return Scheduler(
        vllm_config=cfg,
        kv_cache_config=plan.scheduler_config,
        structured_output_manager=StructuredOutputManager(cfg),
        block_size=plan.scheduler_block_size,
        hash_block_size=plan.hash_block_size,
        log_stats=log_stats,
    )


def _engine_core(cfg: Any) -> Any:
    """What the resize replays read of an ``EngineCore``: its config, its executor's KV
    specs (tiny-llama's layers, one full-attention spec each), the memory it profiled and
    vLLM's own ``_initialize_effective_attention_block_size``."""
    import types

    from vllm.v1.attention.backends.utils import record_kv_cache_layout
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    model = cfg.model_config
    spec = FullAttentionSpec(
        block_size=cfg.cache_config.block_size,
        num_kv_heads=model.get_num_kv_heads(cfg.parallel_config),
        head_size=model.get_head_size(),
        dtype=model.dtype,
    )
    layers = model.get_num_layers(cfg.parallel_config)
    specs = {f"model.layers.{i}.self_attn.attn": spec for i in range(layers)}
    record_kv_cache_layout(cfg.cache_config, "LBHNC")  # the CPU backend's one layout
    core = types.SimpleNamespace(
        vllm_config=cfg,
        scheduler=None,
        model_executor=types.SimpleNamespace(get_kv_cache_specs=lambda: [specs]),
        available_gpu_memory_for_kv_cache=1 << 30,
    )
    core._initialize_effective_attention_block_size = lambda: (
        EngineCore._initialize_effective_attention_block_size(core)
    )
    return core


@pytest.mark.parametrize("case", ["default", "log_stats", "aux_output_connector", "hash_lookahead"])
def test_the_rebuilt_scheduler_is_a_fresh_scheduler_of_the_new_size(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rebuild_scheduler_kv`` (the variant of the release the contract matched) leaves
    vLLM's ``Scheduler`` for 64 blocks, resized to 32, equal to a ``Scheduler`` built for 32
    blocks: every scheduler setting, its KV cache manager, coordinator, block pool, group
    managers and auxiliary-output connector. The cases switch on what 0.33.0's
    ``Scheduler.__init__`` derives besides 0.32.0's: the auxiliary-output connector (a
    config field set after validation, which asks for an MoE model on Model Runner V2; the
    scheduler side needs neither) and the manager's hash lookahead (vLLM derives it only
    for an EAGLE drafter, which no embedded model has: the config's property is set)."""
    from vllm.config import VllmConfig

    from initpipe_vllm.live.core.replay import plan, rebuild_scheduler_kv
    from initpipe_vllm.testing import tiny_vllm_config
    from initpipe_vllm.testing.snapshot import diff_snapshots, scheduler_snapshot

    cfg = tiny_vllm_config("tiny-llama", enable_prefix_caching=True)
    if case == "aux_output_connector":
        cfg.aux_output_config.enable_return_routed_experts = True
    if case == "hash_lookahead":
        monkeypatch.setattr(
            VllmConfig, "num_hash_lookahead_tokens", property(lambda self: 3), raising=False
        )
    log_stats = case == "log_stats"
    core = _engine_core(cfg)
    core.scheduler = _scheduler_for(cfg, plan(core, num_blocks=64), log_stats=log_stats)
    new = plan(core, num_blocks=32)
    rebuild_scheduler_kv(core, new)
    rebuilt = scheduler_snapshot(core)

    fresh = _engine_core(cfg)
    fresh.scheduler = _scheduler_for(cfg, new, log_stats=log_stats)
    fresh._initialize_effective_attention_block_size()
    want = scheduler_snapshot(fresh)
    assert want["kv_cache_config"]["num_blocks"] == 32
    assert diff_snapshots(want, rebuilt) == []
    if case == "aux_output_connector":
        assert want["settings"]["aux_output_connector"] is not None
    if case == "hash_lookahead" and hasattr(core.scheduler, "num_hash_lookahead_tokens"):
        assert want["settings"]["block_pool"]["num_hash_lookahead_tokens"] == 3


def test_planning_goes_through_the_platforms_kv_cache_config_builder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where vLLM plans through a platform's ``KVCacheConfigBuilder`` (0.33.0:
    ``Platform.get_kv_cache_config_builder_cls``), so does initpipe — a resize's plan and
    the test kit's profiling-size cache — and the builder's placement is what they get.
    On a release without one (0.32.0: the contract says which), the base binding runs."""
    import sys
    import types

    from initpipe_vllm import compat
    from initpipe_vllm.contract.report import installed_release
    from initpipe_vllm.live.core.replay import plan
    from initpipe_vllm.testing import tiny_vllm_config

    release = installed_release("resize")
    if release == "0.32.0":
        assert (
            compat.plan_kv_cache_configs.for_release(release) is compat.plan_kv_cache_configs.base
        )
        return
    from vllm.platforms import current_platform
    from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder

    calls: list[str] = []

    class PlatformBuilder(DefaultKVCacheConfigBuilder):  # a platform's own placement
        def get_kv_cache_groups(self, vllm_config: Any, kv_cache_spec: Any) -> Any:
            calls.append("groups")
            return super().get_kv_cache_groups(vllm_config, kv_cache_spec)

        def get_kv_cache_config_from_groups(
            self, vllm_config: Any, kv_cache_groups: Any, num_blocks: int
        ) -> Any:
            calls.append("placement")
            config = super().get_kv_cache_config_from_groups(
                vllm_config, kv_cache_groups, num_blocks
            )
            config.placed_by = "platform"
            return config

    module = types.ModuleType("initpipe_platform_builder")
    module.PlatformBuilder = PlatformBuilder  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(
        type(current_platform),
        "get_kv_cache_config_builder_cls",
        classmethod(lambda cls, vllm_config: f"{module.__name__}.PlatformBuilder"),
    )
    cfg = tiny_vllm_config("tiny-llama", enable_prefix_caching=True)
    core = _engine_core(cfg)
    planned = plan(core, num_blocks=32)
    assert planned.num_blocks == 32
    assert [c.placed_by for c in planned.worker_configs] == ["platform"]
    assert {"groups", "placement"} <= set(calls)
    calls.clear()
    (specs,) = core.model_executor.get_kv_cache_specs()
    groups = compat.kv_cache_groups(cfg, specs)
    minimal = compat.kv_cache_config_from_groups(cfg, groups, num_blocks=4)
    assert (minimal.num_blocks, minimal.placed_by, calls) == (
        4,
        "platform",
        ["groups", "placement"],
    )
