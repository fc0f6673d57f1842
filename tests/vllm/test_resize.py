"""Live resize, in-process: after a resize the engine is a FRESH engine of the new size.

One subprocess (an in-process engine mutates its process) runs everything on tiny-llama
with seeded, KV-sensitive weights (``initpipe_vllm.testing.seeded_model``) and the
equivalence harness's workload (longer than a block, a prefix-cache hit, exact logprobs):

- the engine under test starts with the pipelined worker and ``num_gpu_blocks_override=A``,
  serves a workload (filling its prefix cache), then is resized A -> B (shrink), B -> C
  (grow), released and resumed, resized 50 times alternating B/C, and after each of these
  runs the workload again and records outputs, ``runner_snapshot`` and
  ``scheduler_snapshot``;
- fresh STOCK engines started with ``num_gpu_blocks_override=B`` and ``=C`` (the opt-in
  ``INITPIPE_VLLM`` unset, their runner checked to be vLLM's) run the same workload: the
  oracle. Outputs (tokens, logprobs, cached tokens), the block pool (blocks,
  free queue, groups, every scheduler setting) and the runner snapshot must be equal;
- failures: a fault injected once at every KV stage (before it runs, and after it ran) makes
  the resize fail naming that stage and roll back to the previous size: after each
  rollback the runner snapshot equals the one before the failed resize, and the engine
  keeps serving the oracle's outputs; so does a failure inside the scheduler step (the
  replayed ``Scheduler.__init__`` of the installed release), as it starts and at its
  end; a size too small for ``max_model_len`` and one larger than the machine are
  refused before anything changes; a fault that also hits the rollback leaves the engine
  released (requests refused), and a resume brings it back;
- requests: ``mode="wait"`` with a request holding KV blocks is refused in-process; with
  ``mode="abort"`` it is aborted and reported; a request queued but not started runs after
  the resize and gives the oracle's tokens; while released ``generate`` raises;
- leaks: every KV allocation's storages are weakref'd (``relkit.AllocationSpy``); after
  the cycles, and after the faults, only the current cache's are alive;
- with vLLM's ``ExampleConnector`` (tiny-llama-connector) a shrink equals a fresh engine
  with its own connector storage.

Run as a script (``python test_resize.py OUT.json WEIGHTS_DIR``) it is that subprocess.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

A, B, C = 24, 12, 40
MODEL = Path(__file__).resolve().parents[2] / "stages" / "models" / "tiny-llama"
#: The proof asks for 20 alternating resizes; v1's leak check runs 50 (MRv2's 20: its
#: interpreted kernels are slow, and each cycle's outputs are not what costs there).
CYCLES = {"v1": 50, "v2": 20}
#: The stage that allocates the KV tensors, in each runner's catalog (the double fault).
ALLOCATES = {"v1": "allocated_kv_caches", "v2": "kv_caches_by_layer"}
RUNNERS = ("v1", "v2")


def _runner_version() -> str:
    from initpipe_vllm.compat import runner_from_env

    return runner_from_env()


# -- the subprocess ------------------------------------------------------------------------
def _runner(llm: Any) -> Any:
    return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner


def _core(llm: Any) -> Any:
    return llm.llm_engine.engine_core.engine_core


def _state(llm: Any) -> dict[str, Any]:
    from initpipe_vllm.testing.equivalence import runner_snapshot
    from initpipe_vllm.testing.snapshot import scheduler_snapshot

    return {"runner": runner_snapshot(_runner(llm)), "scheduler": scheduler_snapshot(_core(llm))}


def _request_state(llm: Any) -> dict[str, Any]:
    """Right after a resize: the requests the runner holds and the non-zero entries of its
    per-request block tables (MRv2 keeps ``req_states`` across KV phases and rebuilds its
    ``BlockTables``; v1 rebuilds its input batch)."""
    runner = _runner(llm)
    if hasattr(runner, "req_states"):
        tables = runner.block_tables
        rows = [t.gpu for t in tables.block_tables] + list(tables.input_block_tables)
        return {
            "num_reqs": runner.req_states.num_reqs,
            "nonzero_table_entries": sum(int((t != 0).sum()) for t in rows)
            + int((tables.num_blocks.gpu != 0).sum()),
        }
    batch = runner.input_batch
    return {
        "num_reqs": batch.num_reqs,
        "nonzero_table_entries": sum(
            int((bt.block_table.cpu != 0).sum()) for bt in batch.block_table.block_tables
        ),
    }


@contextlib.contextmanager
def _initpipe_log() -> Iterator[list[str]]:
    """The ``vllm.initpipe`` log lines (INFO and up) emitted inside the block."""
    import logging

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("vllm.initpipe")
    handler = Keep(logging.INFO)
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


def _empty_step(llm: Any) -> str:
    """A zero-token step straight into the runner (what the engine's flush of finished
    requests is): "ok", or the error it raised."""
    from vllm.v1.core.sched.output import SchedulerOutput

    try:
        _runner(llm).execute_model(SchedulerOutput.make_empty())
        return "ok"
    except Exception as err:
        return f"{type(err).__name__}: {err}"


def _kv_storages_alive(llm: Any, spy: Any) -> dict[str, Any]:
    """Every KV allocation the spy saw (``relkit.AllocationSpy``: weakrefs to the backing
    storages ``allocate_kv_cache`` returned, whatever their size or dtype) that is still
    alive after a gc, against the storages of the runner's current cache."""
    runner = _runner(llm)
    current = sorted({t.untyped_storage().data_ptr() for t in runner.kv_caches})
    alive = spy.alive()
    return {
        "allocations": len(spy.allocations),
        "current": current,
        "alive": {str(i): [ptr for ptr, _ in st] for i, st in alive.items()},
    }


def _outputs(llm: Any, salt: int = 2) -> Any:
    from initpipe_vllm.testing.equivalence import run_workload

    return run_workload(llm, "generate", salt=salt)["outputs"]


def _error(err: BaseException) -> dict[str, Any]:
    return {
        "type": type(err).__name__,
        "message": str(err),
        "step": getattr(err, "step", None),
        "stage": getattr(err, "stage", None),
        "rank": getattr(err, "rank", None),
        "rolled_back": getattr(err, "rolled_back", None),
    }


def _stock_llm(kwargs: dict[str, Any]) -> Any:
    """An oracle engine that is certainly stock vLLM: started with the opt-in
    (``INITPIPE_VLLM``) unset, and refused unless its runner is vLLM's own."""
    from vllm import LLM

    from initpipe_vllm.testing.stock import require_stock, stock_environment

    with stock_environment():
        llm = LLM(**kwargs)
    require_stock(llm)
    return llm


def _fresh(folder: Path, extra: dict[str, Any], blocks: int, queued: list[int]) -> Any:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from initpipe_vllm.testing.equivalence import workload_engine_kwargs
    from initpipe_vllm.testing.stock import runner_classes

    kwargs, _ = workload_engine_kwargs(folder, num_gpu_blocks_override=blocks, **extra)
    llm = _stock_llm(kwargs)
    try:
        out = {"outputs": _outputs(llm), **_state(llm), "runner_classes": runner_classes(llm)}
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, detokenize=False)
        (q,) = llm.generate([TokensPrompt(prompt_token_ids=queued)], params, use_tqdm=False)
        out["queued_tokens"] = list(q.outputs[0].token_ids)
        return out
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm


def _engine_under_test(folder: Path, extra: dict[str, Any], queued: list[int], spy: Any) -> Any:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    import initpipe_vllm as ip
    from initpipe.testing import clear_faults, inject_fault
    from initpipe_vllm.hook import PIPELINED_WORKER
    from initpipe_vllm.testing.equivalence import runner_snapshot, workload_engine_kwargs
    from initpipe_vllm.testing.stock import runner_classes

    kwargs, _ = workload_engine_kwargs(
        folder, num_gpu_blocks_override=A, worker_cls=PIPELINED_WORKER, **extra
    )
    llm = LLM(**kwargs)
    rec: dict[str, Any] = {"info_start": ip.kv_cache_info(llm).to_dict()}
    _outputs(llm, salt=1)  # fill the prefix cache with another workload
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, detokenize=False)

    def checkpoint(name: str, report: Any) -> None:
        rec[name] = {
            "runner_classes": runner_classes(llm),
            "report": report.to_dict(),
            "info": ip.kv_cache_info(llm).to_dict(),
            "requests_after_resize": _request_state(llm),
            "outputs": _outputs(llm),
            **_state(llm),
        }

    with _initpipe_log() as lines:
        shrink = ip.resize_kv_cache(llm, keep_prefix_cache=False, num_blocks=B)
    rec["shrink_log"] = lines
    checkpoint("shrink", shrink)
    checkpoint("grow", ip.resize_kv_cache(llm, keep_prefix_cache=False, num_blocks=C))

    # release -> refused requests -> resume (to the previous size)
    rel = ip.release_kv_cache(llm)
    rec["released"] = {
        "report": rel.to_dict(),
        "info": ip.kv_cache_info(llm).to_dict(),
        "empty_step": _empty_step(llm),
    }
    try:
        llm.generate([TokensPrompt(prompt_token_ids=queued)], params, use_tqdm=False)
        rec["released"]["generate"] = "served"
    except Exception as err:
        rec["released"]["generate"] = _error(err)
    rec["released"]["unfinished_after_refusal"] = llm.llm_engine.has_unfinished_requests()
    checkpoint("resumed", ip.resume_kv_cache(llm))

    # alternating resizes, ending on C
    cycles = CYCLES[_runner_version()]
    reports = [
        ip.resize_kv_cache(llm, keep_prefix_cache=False, num_blocks=B if i % 2 == 0 else C)
        for i in range(cycles)
    ]
    checkpoint("cycled", reports[-1])
    rec["cycles"] = [r.to_dict() for r in reports]
    rec["leaks"] = _kv_storages_alive(llm, spy)

    # refusals before anything changes
    refusals = {}
    for name, call in {
        "too_small": lambda: ip.resize_kv_cache(llm, num_blocks=3),
        "too_large": lambda: ip.resize_kv_cache(llm, kv_cache_memory_bytes=1 << 50),
        "both_sizes": lambda: ip.resize_kv_cache(llm, num_blocks=8, kv_cache_memory_bytes=1 << 20),
        "no_size": lambda: ip.resize_kv_cache(llm),
        "bad_mode": lambda: ip.resize_kv_cache(llm, num_blocks=8, mode="later"),
        "resume_serving": lambda: ip.resume_kv_cache(llm),
    }.items():
        try:
            call()
            refusals[name] = "accepted"
        except Exception as err:
            refusals[name] = _error(err)
    refusals["info_after"] = ip.kv_cache_info(llm).to_dict()
    rec["refusals"] = refusals

    # a fault at every KV stage: the resize C -> B fails there and rolls back to C; after
    # each rollback the runner is as before the failed resize (its KV contents aside: the
    # served workload's before, a zeroed cache after)
    runner = _runner(llm)
    before = runner_snapshot(runner, blocks=False)
    faults = []
    stages = runner.initpipe_pipeline.phase_order("kv_cache_config")
    rec["kv_stages"] = list(stages)
    for stage in stages:
        for after in (False, True):
            inject_fault(runner.initpipe_run, stage, after=after, times=1)
            try:
                ip.resize_kv_cache(llm, keep_prefix_cache=False, num_blocks=B)
                res: dict[str, Any] = {"error": None}
            except Exception as err:
                res = {"error": _error(err)}
            finally:
                clear_faults(runner.initpipe_run)
            res.update(stage=stage, after=after, blocks=ip.kv_cache_info(llm).num_blocks)
            res["runner_diff"] = _same(before, runner_snapshot(runner, blocks=False))
            faults.append(res)
    rec["faults"] = faults
    rec["scheduler_faults"] = _scheduler_faults(llm)
    rec["leaks_after_faults"] = _kv_storages_alive(llm, spy)
    llm.reset_prefix_cache()
    rec["after_faults"] = {"outputs": _outputs(llm)}

    # a fault that hits the resize and its rollback: left released, then resumed
    inject_fault(runner.initpipe_run, ALLOCATES[_runner_version()])
    try:
        ip.resize_kv_cache(llm, keep_prefix_cache=False, num_blocks=B)
        rec["double_fault"] = {"error": None}
    except Exception as err:
        rec["double_fault"] = {"error": _error(err)}
    rec["double_fault"]["info"] = ip.kv_cache_info(llm).to_dict()
    try:
        llm.generate([TokensPrompt(prompt_token_ids=queued)], params, use_tqdm=False)
        rec["double_fault"]["generate"] = "served"
    except Exception as err:
        rec["double_fault"]["generate"] = _error(err)
    clear_faults(runner.initpipe_run)
    ip.resume_kv_cache(llm)
    rec["double_fault"]["outputs_after_resume"] = _outputs(llm)

    # requests: one holding KV blocks (mode=wait refused, abort aborts), one queued
    engine = llm.llm_engine
    llm.enqueue([TokensPrompt(prompt_token_ids=queued)], params, use_tqdm=False)
    engine.step()  # scheduled: it holds KV blocks now
    try:
        ip.resize_kv_cache(llm, keep_prefix_cache=False, num_blocks=B, mode="wait")
        rec["wait_holding"] = "accepted"
    except Exception as err:
        rec["wait_holding"] = _error(err)
    aborted = ip.resize_kv_cache(llm, keep_prefix_cache=False, num_blocks=B, mode="abort")
    rec["abort"] = {
        "report": aborted.to_dict(),
        "unfinished": engine.has_unfinished_requests(),
        "outputs": _outputs(llm),
    }
    ids = llm.enqueue([TokensPrompt(prompt_token_ids=queued)], params, use_tqdm=False)
    waited = ip.resize_kv_cache(llm, keep_prefix_cache=False, num_blocks=C, mode="wait")
    (q,) = llm.wait_for_completion(use_tqdm=False)
    rec["queued"] = {
        "ids": ids,
        "report": waited.to_dict(),
        "tokens": list(q.outputs[0].token_ids),
        "finish_reason": q.outputs[0].finish_reason,
    }
    engine.engine_core.shutdown()
    return rec


@contextlib.contextmanager
def _fails_once(owner: Any, name: str) -> Iterator[list[list[str]]]:
    """``owner.name`` raises on its first call inside the block (then calls through); the
    yielded list gets the names of the functions on the stack at that call."""
    import traceback

    own = name in vars(owner)
    original = getattr(owner, name)
    stacks: list[list[str]] = []

    def fail_once(*args: Any, **kwargs: Any) -> Any:
        if not stacks:
            stacks.append([frame.name for frame in traceback.extract_stack()])
            raise RuntimeError(f"injected failure in {name}")
        return original(*args, **kwargs)

    setattr(owner, name, fail_once)
    try:
        yield stacks
    finally:
        if own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


def _scheduler_faults(llm: Any) -> dict[str, Any]:
    """A failure inside the engine core's scheduler step — the replayed
    ``Scheduler.__init__`` of the release the contract matched — as it starts (building
    the ``KVCacheManager``) and after it assigned everything (the engine's figures): the
    resize C -> B rolls back to C, the scheduler configured as before it."""
    import vllm.v1.core.kv_cache_manager as kv_cache_manager

    import initpipe_vllm as ip
    from initpipe_vllm.contract.report import installed_release
    from initpipe_vllm.live.core.replay import rebuild_scheduler_kv
    from initpipe_vllm.testing.snapshot import scheduler_snapshot

    def configured() -> dict[str, Any]:  # the pool's contents aside (a rollback empties it)
        snap = scheduler_snapshot(_core(llm))
        return {k: v for k, v in snap.items() if k != "pool"}

    out: dict[str, Any] = {
        "implementation": rebuild_scheduler_kv.for_release(installed_release("resize")).__name__
    }
    for where, owner, name in (
        ("building", kv_cache_manager, "KVCacheManager"),
        ("assigned", _core(llm), "_initialize_effective_attention_block_size"),
    ):
        before = configured()
        with _fails_once(owner, name) as stacks:
            try:
                ip.resize_kv_cache(llm, keep_prefix_cache=False, num_blocks=B)
                res: dict[str, Any] = {"error": None}
            except Exception as err:
                res = {"error": _error(err)}
        res.update(
            stack=stacks[0] if stacks else [],
            blocks=ip.kv_cache_info(llm).num_blocks,
            scheduler_diff=_same(before, configured()),
        )
        out[where] = res
    return out


def _connector(weights_dir: str) -> dict[str, Any]:
    """ExampleConnector (the one connector resize follows): A -> B, then the workload,
    against a fresh stock engine at B with its own connector storage."""
    from vllm import LLM

    import initpipe_vllm as ip
    from initpipe_vllm.hook import PIPELINED_WORKER
    from initpipe_vllm.testing.equivalence import loadable_model, workload_engine_kwargs
    from initpipe_vllm.testing.stock import runner_classes

    out: dict[str, Any] = {}
    with loadable_model(MODEL.parent / "tiny-llama-connector", weights_dir=weights_dir) as (
        folder,
        extra,
    ):
        kwargs, _ = workload_engine_kwargs(
            folder, num_gpu_blocks_override=A, worker_cls=PIPELINED_WORKER, **extra
        )
        llm = LLM(**kwargs)
        _outputs(llm, salt=1)
        out["report"] = ip.resize_kv_cache(llm, keep_prefix_cache=False, num_blocks=B).to_dict()
        out["engine"] = {"outputs": _outputs(llm), **_state(llm)}
        llm.llm_engine.engine_core.shutdown()
        del llm
        kwargs, _ = workload_engine_kwargs(folder, num_gpu_blocks_override=B, **extra)
        fresh = _stock_llm(kwargs)
        out["fresh"] = {
            "outputs": _outputs(fresh),
            **_state(fresh),
            "runner_classes": runner_classes(fresh),
        }
        fresh.llm_engine.engine_core.shutdown()
    return out


def main(out: str, weights_dir: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import random

    from reliability.relkit import MRV2_ALLOCATOR, V1_ALLOCATOR, AllocationSpy

    from initpipe_vllm.testing.equivalence import loadable_model

    queued = [random.Random(7).randrange(3, 500) for _ in range(150)]
    allocators = (V1_ALLOCATOR, MRV2_ALLOCATOR) if _runner_version() == "v2" else (V1_ALLOCATOR,)
    with loadable_model(MODEL, weights_dir=weights_dir) as (folder, extra):
        result: dict[str, Any] = {"model_runner": _runner_version()}
        with AllocationSpy(allocators) as spy:
            result["engine"] = _engine_under_test(folder, extra, queued, spy)
        result["fresh_B"] = _fresh(folder, extra, B, queued)
        result["fresh_C"] = _fresh(folder, extra, C, queued)
    result["connector"] = _connector(weights_dir)
    Path(out).write_text(json.dumps(result))


# -- the tests -----------------------------------------------------------------------------
@pytest.fixture(scope="module", params=RUNNERS)
def result(request: pytest.FixtureRequest, script_result: Any) -> Any:
    """The script's record, once per runner (MRv2 on Triton's interpreter)."""
    got = script_result(__file__, model_runner=request.param)
    assert got["model_runner"] == request.param
    return got


def test_the_oracles_are_stock_vllm(result: Any) -> None:
    """Each oracle ran vLLM's own runner (the script refuses one that did not, so a stock
    oracle is recorded here only as stock), the engine under test initpipe's."""
    oracles = {
        "fresh_B": result["fresh_B"],
        "fresh_C": result["fresh_C"],
        "connector": result["connector"]["fresh"],
    }
    for name, oracle in oracles.items():
        (cls, pipelined), *more = oracle["runner_classes"]
        assert not more and pipelined is False and cls.startswith("vllm."), (name, cls)
    assert result["engine"]["shrink"]["runner_classes"][0][1] is True


def test_each_runner_ran_and_reports_itself(result: Any) -> None:
    runner = result["model_runner"]
    eng = result["engine"]
    assert eng["info_start"]["model_runner"] == runner
    assert eng["shrink"]["runner"]["runner_base_class"].endswith("CPUModelRunner")
    assert eng["shrink"]["info"]["model_runner"] == runner


def test_a_resize_logs_a_summary_not_a_line_per_stage(result: Any) -> None:
    """Per-stage lines are for the start; after it each phase is one line (plus the
    report's two), so a resize of a tiny model is not slowed by its own log."""
    lines = result["engine"]["shrink_log"]
    summaries = [ln for ln in lines if "kv_cache_config phase:" in ln]
    assert len(summaries) == 1 and "stages in" in summaries[0], lines
    assert not [ln for ln in lines if " ms ok" in ln], lines  # no per-stage / teardown line
    assert any(ln.startswith("initpipe: resize (wait): 24 -> 12 blocks") for ln in lines), lines


def test_after_a_resize_the_runner_holds_no_request_and_clean_block_tables(result: Any) -> None:
    """Every request was flushed from the runner before the KV phase ran (MRv2's
    ``req_states``, v1's input batch) and the new block tables hold no entry."""
    for name in ("shrink", "grow", "resumed", "cycled"):
        assert result["engine"][name]["requests_after_resize"] == {
            "num_reqs": 0,
            "nonzero_table_entries": 0,
        }, name


def test_a_zero_token_step_while_released(result: Any) -> None:
    """MRv2's ``execute_model`` applies the block tables' staged writes on every step,
    zero-token ones included (how the engine flushes finished requests): while released its
    ``block_tables`` stay valid and such a step is served. v1 reads ``kv_cache_config`` in
    every step (``_may_reorder_batch``), which a released runner lacks, exactly as stock's
    ``_cleanup_profiling_kv_cache`` leaves it: the step raises — and the engine never sends
    one, since a released engine holds no request (adds are refused, finished requests were
    flushed before the teardown) and vLLM steps only an engine with requests."""
    step = result["engine"]["released"]["empty_step"]
    if result["model_runner"] == "v2":
        assert step == "ok"
    else:
        assert step.startswith("AttributeError") and "kv_cache_config" in step


def _same(a: Any, b: Any) -> list[str]:
    from initpipe_vllm.testing.snapshot import diff_snapshots

    return diff_snapshots(a, b)


@pytest.mark.parametrize(
    ("checkpoint", "fresh"),
    [("shrink", "fresh_B"), ("grow", "fresh_C"), ("resumed", "fresh_C"), ("cycled", "fresh_C")],
)
def test_a_resized_engine_is_a_fresh_engine_of_that_size(
    result: Any, checkpoint: str, fresh: str
) -> None:
    got, want = result["engine"][checkpoint], result[fresh]
    assert got["outputs"][-1]["num_cached_tokens"] > 0  # the workload hit the prefix cache
    assert _same(want["outputs"], got["outputs"]) == []
    assert _same(want["scheduler"], got["scheduler"]) == []
    assert _same(want["runner"], got["runner"]) == []


def test_the_example_connector_follows_a_resize(result: Any) -> None:
    conn = result["connector"]
    assert (conn["report"]["blocks_before"], conn["report"]["blocks_after"]) == (A, B)
    assert conn["engine"]["outputs"][-1]["num_cached_tokens"] > 0
    assert _same(conn["fresh"]["outputs"], conn["engine"]["outputs"]) == []
    assert _same(conn["fresh"]["scheduler"], conn["engine"]["scheduler"]) == []
    assert _same(conn["fresh"]["runner"], conn["engine"]["runner"]) == []


def test_the_reports_and_info_describe_each_resize(result: Any) -> None:
    eng = result["engine"]
    assert eng["info_start"]["num_blocks"] == A and eng["info_start"]["state"] == "serving"
    shrink, grow = eng["shrink"]["report"], eng["grow"]["report"]
    assert (shrink["blocks_before"], shrink["blocks_after"]) == (A, B)
    assert (grow["blocks_before"], grow["blocks_after"]) == (B, C)
    per_block = shrink["bytes_freed"] // A
    assert per_block > 0
    assert shrink["bytes_allocated"] == B * per_block
    assert grow["bytes_freed"] == B * per_block and grow["bytes_allocated"] == C * per_block
    assert eng["grow"]["info"]["bytes_per_rank"] == [C * per_block]
    for rep in (shrink, grow):
        assert set(rep["steps"]) == {
            "plan",
            "pause",
            "carry",  # 0 here: these resizes empty the prefix cache
            "teardown",
            "kv_phase",
            "warmup",
            "scheduler",
            "resume",
        }
        assert 0 < sum(rep["steps"].values()) <= rep["total_s"]
        assert rep["steps"]["plan"] > 0 and rep["steps"]["carry"] == 0
        assert rep["prefix_cache"]["reason"] == "keep_prefix_cache=False"
        rank = rep["ranks"][0]
        assert rank["rss_torn_down"] is not None and rank["rss_after"] is not None
        assert rep["ranks"][0]["kv_phase_s"] > 0
    assert eng["grow"]["info"]["last_report"] == grow


def test_release_frees_everything_and_refuses_requests_until_resume(result: Any) -> None:
    rel = result["engine"]["released"]
    assert rel["report"]["blocks_after"] == 0 and rel["report"]["bytes_allocated"] == 0
    assert rel["report"]["bytes_freed"] == result["engine"]["grow"]["report"]["bytes_allocated"]
    assert rel["info"]["state"] == "released" and rel["info"]["resume_blocks"] == C
    assert rel["info"]["bytes_per_rank"] == []
    assert rel["generate"]["type"] == "KVCacheReleased"  # a KVCacheReleasedError subclass
    assert "resume_kv_cache" in rel["generate"]["message"]
    assert rel["unfinished_after_refusal"] is False  # nothing left waiting for an output
    resumed = result["engine"]["resumed"]
    assert (resumed["report"]["blocks_before"], resumed["report"]["blocks_after"]) == (0, C)


def _only_the_current_generation_alive(leaks: dict[str, Any], allocations: int) -> None:
    """Exactly ``allocations`` KV allocations were seen, and of them only the last (the
    cache in place) still has a live storage: exactly the runner's current storages."""
    assert leaks["allocations"] == allocations
    last = str(allocations - 1)
    assert leaks["alive"] == {last: leaks["current"]}, (
        f"KV allocations still alive besides #{last} (the current one): "
        f"{sorted(set(leaks['alive']) - {last})}"
    )


def test_alternating_resizes_leak_no_kv_storage(result: Any) -> None:
    """Every KV allocation is tracked by weakref (any size, any dtype: the int8 backing
    buffer itself): after the start, shrink, grow, resume and the cycles, only the
    current cache's storages are alive."""
    eng = result["engine"]
    cycles = CYCLES[result["model_runner"]]
    assert [c["blocks_after"] for c in eng["cycles"]] == [B, C] * (cycles // 2)
    assert eng["leaks"]["current"]
    _only_the_current_generation_alive(eng["leaks"], 4 + cycles)


def test_failed_resizes_and_their_rollbacks_leak_no_kv_storage(result: Any) -> None:
    """A fault after the allocating stage ran frees what it allocated; each rollback's
    cache replaces the previous one."""
    eng = result["engine"]
    before = eng["leaks"]["allocations"]
    after = eng["leaks_after_faults"]["allocations"]
    assert after > before + len(eng["faults"])  # every rollback allocated, and one fault too
    _only_the_current_generation_alive(eng["leaks_after_faults"], after)


def test_bad_sizes_and_arguments_are_refused_before_anything_changes(result: Any) -> None:
    ref = result["engine"]["refusals"]
    for name in ("too_small", "too_large", "both_sizes", "no_size", "bad_mode", "resume_serving"):
        assert ref[name] != "accepted", name
        assert ref[name]["type"] == "ResizeRefusedError", (name, ref[name])
        assert ref[name]["rolled_back"] is False
    assert ref["too_small"]["step"] == "planning"
    assert "max_model_len" in ref["too_small"]["message"] or "memory" in ref["too_small"]["message"]
    assert ref["too_large"]["step"] == "memory" and "available" in ref["too_large"]["message"]
    assert ref["info_after"]["num_blocks"] == C and ref["info_after"]["state"] == "serving"


def test_a_fault_at_any_kv_stage_rolls_back_to_the_previous_size(result: Any) -> None:
    faults = result["engine"]["faults"]
    stages = result["engine"]["kv_stages"]
    assert len(stages) >= 15
    assert [(f["stage"], f["after"]) for f in faults] == [
        (s, after) for s in stages for after in (False, True)
    ]
    for f in faults:
        err = f["error"]
        assert err is not None, f
        assert err["type"] == "ResizeError" and err["rolled_back"] is True, (f, err)
        assert err["stage"] == f["stage"] and repr(f["stage"]) in err["message"]
        assert err["step"] == "kv_phase"
        assert f["blocks"] == C
    assert _same(result["fresh_C"]["outputs"], result["engine"]["after_faults"]["outputs"]) == []


@pytest.mark.parametrize("where", ["building", "assigned"])
def test_a_failure_in_the_scheduler_step_rolls_back_to_the_previous_size(
    result: Any, where: str
) -> None:
    """A failure inside the replayed ``Scheduler.__init__`` — the variant of the release
    the contract matched (vLLM 0.33.0's on 0.33) — before it touched the scheduler and
    after it assigned everything: the resize fails at the scheduler step, rolls back, and
    the scheduler is configured as before; the engine then serves the oracle's outputs
    (``test_a_fault_at_any_kv_stage_rolls_back_to_the_previous_size``)."""
    faults = result["engine"]["scheduler_faults"]
    got = faults[where]
    err = got["error"]
    assert err is not None and err["type"] == "ResizeError", got
    assert err["rolled_back"] is True and err["step"] == "scheduler", err
    assert "injected failure" in err["message"], err
    assert faults["implementation"] in got["stack"], (faults["implementation"], got["stack"])
    assert got["blocks"] == C
    assert got["scheduler_diff"] == []


def test_each_rollback_leaves_the_runner_as_before_the_failed_resize(result: Any) -> None:
    """After every single rollback (a fault at each KV stage, before and after it ran) the
    runner snapshot equals the one taken before the failed resize: the culprit is named."""
    left = {
        f"{f['stage']} (fault {'after' if f['after'] else 'before'} it ran)": f["runner_diff"]
        for f in result["engine"]["faults"]
        if f["runner_diff"]
    }
    assert left == {}


def test_a_failed_rollback_leaves_the_engine_released_until_resumed(result: Any) -> None:
    dbl = result["engine"]["double_fault"]
    assert dbl["error"]["type"] == "ResizeError" and dbl["error"]["rolled_back"] is False
    assert dbl["error"]["step"] == "rollback"
    assert dbl["error"]["stage"] == ALLOCATES[result["model_runner"]]
    assert dbl["info"]["state"] == "released" and dbl["info"]["resume_blocks"] == C
    assert dbl["generate"]["type"] == "KVCacheReleased"
    assert _same(result["fresh_C"]["outputs"], dbl["outputs_after_resume"]) == []


def test_requests_wait_or_are_aborted_never_served_from_a_stale_block(result: Any) -> None:
    eng = result["engine"]
    assert eng["wait_holding"]["type"] == "ResizeRefusedError"
    assert eng["wait_holding"]["step"] == "requests"
    assert "mode='abort'" in eng["wait_holding"]["message"]
    abort = eng["abort"]
    assert len(abort["report"]["requests_aborted"]) == 1
    assert abort["unfinished"] is False
    assert _same(result["fresh_B"]["outputs"], abort["outputs"]) == []
    queued = eng["queued"]
    assert len(queued["report"]["requests_waited"]) == 1
    assert queued["tokens"] == result["fresh_C"]["queued_tokens"]
    assert queued["finish_reason"] == "length"


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
