"""Live resize with two workers (tensor parallel): every rank resizes to the same plan, and
a failure on one rank rolls every rank back.

One subprocess (an in-process engine core mutates its process; the two workers are
processes of vLLM's multiprocess executor) on tiny-llama with seeded KV-sensitive weights,
TP=2, the harness's workload:

- the oracle: a fresh STOCK TP=2 engine started at ``B`` blocks — outputs, each rank's
  ``runner_snapshot`` (``collective_rpc``) and the engine core's ``scheduler_snapshot``;
- the engine under test (pipelined worker) starts at ``A``, serves a workload, shrinks to
  ``B``: outputs and both ranks' and the scheduler's snapshots equal the oracle's;
- a fault injected into rank 1 only (its KV allocation) makes a grow fail naming rank 1 and
  the stage; both ranks roll back to ``B`` and equal the oracle again;
- ``kv_cache_memory_bytes`` is per worker: asking for one rank's bytes at ``B`` gives ``B``
  blocks, and the report sums the ranks' bytes;
- release -> resume equals the oracle; a grow back to ``A`` equals a fresh stock TP=2
  engine started at ``A``;
- a weight refit to other seeded weights (B) changes every rank's digest and the outputs;
  a refit back to A gives each rank the digest it had at start, and the outputs, both
  ranks' snapshots and the scheduler's equal the fresh stock engine at ``A`` again.

It runs once per runner: v1, and Model Runner V2 on Triton's interpreter (the stock
engines then run MRv2 too). With MRv2 the engine core runs in its own process (vLLM's
default, the synchronous ``LLM``'s multiprocess client): every resize goes through the
``initpipe_resize`` utility methods there, and the scheduler snapshot, out of reach, is
compared by the in-process proof (``test_resize.py``) instead.

Run as a script (``python test_resize_parallel.py OUT.json WEIGHTS_DIR``) it is that
subprocess.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

A, B = 24, 12
TP = 2
MODEL = Path(__file__).resolve().parents[2] / "stages" / "models" / "tiny-llama"
#: The stage that allocates the KV tensors in each runner's catalog (the fault on rank 1).
FAULT_STAGES = {"v1": "allocated_kv_caches", "v2": "kv_caches_by_layer"}


# -- the subprocess ------------------------------------------------------------------------
def _snap(worker: Any) -> Any:
    from initpipe_vllm.testing.equivalence import runner_snapshot

    return runner_snapshot(worker.model_runner)


def _fault_on_rank_1(worker: Any, stage: str) -> int:
    if worker.rank == 1:
        from initpipe.testing import inject_fault

        inject_fault(worker.model_runner.initpipe_run, stage, times=1)
    return int(worker.rank)


#: Whether the engine core runs in its own process, per runner.
OWN_PROCESS = {"v1": False, "v2": True}


def _state(llm: Any) -> dict[str, Any]:
    from initpipe_vllm.testing.equivalence import run_workload
    from initpipe_vllm.testing.snapshot import scheduler_snapshot

    client = llm.llm_engine.engine_core
    in_process = hasattr(client, "engine_core")
    return {
        "outputs": run_workload(llm, "generate", salt=2)["outputs"],
        "ranks": llm.collective_rpc(_snap),
        "scheduler": scheduler_snapshot(client.engine_core) if in_process else None,
        "engine_core_in_process": in_process,
    }


def _engine(folder: Path, extra: dict[str, Any], blocks: int, pipelined: bool) -> Any:
    """The engine under test (``pipelined``) or an oracle: one started with the opt-in
    (``INITPIPE_VLLM``) unset in its processes, and refused unless every rank is stock."""
    from vllm import LLM

    from initpipe_vllm.hook import PIPELINED_WORKER
    from initpipe_vllm.testing.equivalence import parallel_engine_kwargs, workload_engine_kwargs
    from initpipe_vllm.testing.stock import require_stock, stock_environment

    kwargs, _ = workload_engine_kwargs(
        folder, num_gpu_blocks_override=blocks, **parallel_engine_kwargs(TP), **extra
    )
    if pipelined:
        kwargs["worker_cls"] = PIPELINED_WORKER
    if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1":
        kwargs["gpu_memory_utilization"] = 0.3  # vLLM then checks the free memory
    if pipelined:
        return LLM(**kwargs)
    with stock_environment():
        llm = LLM(**kwargs)
    require_stock(llm)
    return llm


def main(out: str, weights_dir: str) -> None:
    from test_resize import _error, _runner_version  # this folder is on sys.path as a script

    import initpipe_vllm as ip
    from initpipe_vllm.hook.parallel import default_cpu_thread_binding
    from initpipe_vllm.testing.equivalence import loadable_model
    from initpipe_vllm.testing.stock import runner_classes

    rec: dict[str, Any] = {"model_runner": _runner_version()}
    own = OWN_PROCESS[rec["model_runner"]]
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if own else "0"
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(_snap)
    default_cpu_thread_binding(TP)
    fault_stage = FAULT_STAGES[rec["model_runner"]]
    with loadable_model(MODEL, weights_dir=weights_dir) as (folder, extra):
        for blocks in (B, A):
            fresh = _engine(folder, extra, blocks, pipelined=False)
            rec[f"fresh_{blocks}"] = {**_state(fresh), "runner_classes": runner_classes(fresh)}
            fresh.llm_engine.engine_core.shutdown()
            del fresh

        llm = _engine(folder, extra, A, pipelined=True)
        from initpipe_vllm.live.refit.weights import rank_digest
        from initpipe_vllm.testing.equivalence import run_workload
        from initpipe_vllm.testing.weights import seeded_model

        rec["start_digests"] = [a["digest"] for a in llm.collective_rpc(rank_digest)]

        run_workload(llm, "generate", salt=1)  # fill the prefix cache
        rec["shrink"] = {
            "report": ip.resize_kv_cache(llm, keep_prefix_cache=False, num_blocks=B).to_dict(),
            **_state(llm),
        }

        rec["fault_ranks"] = llm.collective_rpc(_fault_on_rank_1, args=(fault_stage,))
        try:
            ip.resize_kv_cache(llm, keep_prefix_cache=False, num_blocks=A)
            rec["fault"] = {"error": "accepted"}
        except Exception as err:
            rec["fault"] = {"error": _error(err)}
        rec["fault"].update(info=ip.kv_cache_info(llm).to_dict(), **_state(llm))

        per_rank = rec["shrink"]["report"]["bytes_allocated"] // TP
        by_bytes = ip.resize_kv_cache(llm, keep_prefix_cache=False, kv_cache_memory_bytes=per_rank)
        rec["by_bytes"] = {"per_rank": per_rank, "report": by_bytes.to_dict()}

        ip.release_kv_cache(llm)
        rec["resumed"] = {"report": ip.resume_kv_cache(llm).to_dict(), **_state(llm)}
        rec["grow"] = {
            "report": ip.resize_kv_cache(llm, keep_prefix_cache=False, num_blocks=A).to_dict(),
            **_state(llm),
        }
        # refit to other weights (B), then back to A: every rank loads its shard, and each
        # rank's digest comes back to the one it had at start
        to_b = ip.refit(llm, seeded_model(MODEL, weights_dir, seed=1))
        rec["refit_b"] = {"receipt": to_b.to_dict(), **_state(llm)}
        back = ip.refit(llm, folder)
        rec["refit_a"] = {"receipt": back.to_dict(), **_state(llm)}
        # the prefix cache kept across a shrink, on both ranks
        from test_resize_warm import warm_round

        prompt = [(7 * i) % 500 + 3 for i in range(150)]
        rec["warm"] = warm_round(llm, prompt, lambda: ip.resize_kv_cache(llm, num_blocks=B))
        llm.llm_engine.engine_core.shutdown()
    Path(out).write_text(json.dumps(rec, default=repr))


# -- the tests -----------------------------------------------------------------------------
@pytest.fixture(scope="module", params=("v1", "v2"))
def rec(request: pytest.FixtureRequest, script_result: Any) -> Any:
    """The script's record, once per runner (MRv2 on Triton's interpreter)."""
    got = script_result(__file__, model_runner=request.param)
    assert got["model_runner"] == request.param
    return got


def _same(a: Any, b: Any) -> list[str]:
    from initpipe_vllm.testing.snapshot import diff_snapshots

    return diff_snapshots(a, b)


def _equals_fresh(rec: Any, state: dict[str, Any], blocks: int = B) -> None:
    fresh = rec[f"fresh_{blocks}"]
    own = OWN_PROCESS[rec["model_runner"]]
    assert state["engine_core_in_process"] is fresh["engine_core_in_process"] is (not own)
    assert _same(fresh["outputs"], state["outputs"]) == []
    assert len(state["ranks"]) == TP
    for rank in range(TP):
        assert _same(fresh["ranks"][rank], state["ranks"][rank]) == [], f"rank {rank}"
    assert _same(fresh["scheduler"], state["scheduler"]) == []


def test_the_oracles_are_stock_vllm_on_every_rank(rec: Any) -> None:
    """Both fresh engines ran vLLM's own runner on each rank (the script refuses one that
    did not)."""
    for blocks in (B, A):
        classes = rec[f"fresh_{blocks}"]["runner_classes"]
        assert len(classes) == TP, blocks
        for cls, pipelined in classes:
            assert pipelined is False and cls.startswith("vllm."), (blocks, cls)


def test_every_rank_resizes_to_a_fresh_engine_of_the_new_size(rec: Any) -> None:
    shrink = rec["shrink"]
    report = shrink["report"]
    assert (report["blocks_before"], report["blocks_after"]) == (A, B)
    assert [r["rank"] for r in report["ranks"]] == list(range(TP))
    assert all(r["bytes_freed"] > r["bytes_allocated"] > 0 for r in report["ranks"])
    assert shrink["outputs"][-1]["num_cached_tokens"] > 0
    _equals_fresh(rec, shrink)


def test_a_failure_on_one_rank_rolls_every_rank_back(rec: Any) -> None:
    assert rec["fault_ranks"] == [0, 1]
    fault = rec["fault"]
    err = fault["error"]
    assert err["type"] == "ResizeError" and err["rolled_back"] is True, err
    stage = FAULT_STAGES[rec["model_runner"]]
    assert (err["rank"], err["stage"]) == (1, stage)
    assert "rank 1" in err["message"] and repr(stage) in err["message"]
    assert fault["info"]["model_runner"] == rec["model_runner"]
    assert (fault["info"]["state"], fault["info"]["num_blocks"]) == ("serving", B)
    assert len(fault["info"]["bytes_per_rank"]) == TP
    _equals_fresh(rec, fault)


def test_kv_cache_memory_bytes_is_per_worker(rec: Any) -> None:
    by_bytes = rec["by_bytes"]
    report = by_bytes["report"]
    assert report["blocks_after"] == B
    assert [r["bytes_allocated"] for r in report["ranks"]] == [by_bytes["per_rank"]] * TP
    assert report["bytes_allocated"] == TP * by_bytes["per_rank"]


def test_release_and_resume_across_ranks(rec: Any) -> None:
    resumed = rec["resumed"]
    assert (resumed["report"]["blocks_before"], resumed["report"]["blocks_after"]) == (0, B)
    _equals_fresh(rec, resumed)


def test_a_refit_reaches_every_rank_and_back_equals_a_fresh_engine(rec: Any) -> None:
    start, to_b, back = rec["start_digests"], rec["refit_b"], rec["refit_a"]
    assert len(start) == TP and len(set(start)) == TP  # each rank holds its own shard
    b_digests = to_b["receipt"]["digests"]
    assert len(b_digests) == TP and all(d != s for d, s in zip(b_digests, start, strict=True))
    assert to_b["outputs"] != rec[f"fresh_{A}"]["outputs"]
    assert back["receipt"]["digests"] == start
    fresh = rec[f"fresh_{A}"]
    assert back["outputs"] == fresh["outputs"]
    # the probe's KV data stays in free blocks (as any served request's): blocks aside
    assert _without_blocks(back["ranks"]) == _without_blocks(fresh["ranks"])
    assert back["scheduler"] == fresh["scheduler"]


def _without_blocks(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "nonzero_blocks"} for r in ranks]


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])


def test_a_grow_across_ranks_equals_a_fresh_engine_of_the_larger_size(rec: Any) -> None:
    grow = rec["grow"]
    assert (grow["report"]["blocks_before"], grow["report"]["blocks_after"]) == (B, A)
    if not OWN_PROCESS[rec["model_runner"]]:
        assert _same(rec[f"fresh_{B}"]["scheduler"], grow["scheduler"]) != []  # sizes differ
    _equals_fresh(rec, grow, A)


def test_a_shrink_keeps_the_prefix_cache_on_every_rank(rec: Any) -> None:
    from test_resize_warm import warm_round_problems

    assert warm_round_problems(rec["warm"], ranks=TP) == []
