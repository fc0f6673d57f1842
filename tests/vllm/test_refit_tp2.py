"""Refit of a tied model at TP=2, the engine core and both workers in their own processes:
each rank's vocab-parallel head shard is re-derived, and the engine equals a fresh stock
TP=2 engine on the new weights where vLLM's own reload does not.

tiny-qwen3 (tied), seeded weights A then B, ``tensor_parallel_size=2`` (vLLM's
multiprocessing executor; ``VLLM_CPU_OMP_THREADS_BIND="0|1"``), in one subprocess: a fresh
stock engine on B; the CONTROL (a stock engine on A, ``reload_weights`` to B,
``reset_prefix_cache``); the pipelined engine on A refitted to B (the weights as a folder:
the workers are in other processes).

Run as a script (``python test_refit_tp2.py OUT.json WEIGHTS_DIR``) it is that subprocess.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

MODEL = Path(__file__).resolve().parent / "models" / "tiny-qwen3"


def _engine(folder: Path, **more: Any) -> Any:
    from vllm import LLM

    from initpipe_vllm.testing.equivalence import workload_engine_kwargs

    kwargs, _ = workload_engine_kwargs(
        folder,
        num_gpu_blocks_override=40,
        load_format="auto",
        tensor_parallel_size=2,
        gpu_memory_utilization=0.3,  # the engine core checks free memory in its own process
        **more,
    )
    return LLM(**kwargs)


def _outputs(llm: Any) -> Any:
    from initpipe_vllm.testing.equivalence import run_workload

    return run_workload(llm, "generate", salt=2)["outputs"]


def _fresh(b: Path) -> Any:
    from initpipe_vllm.testing.stock import require_stock, stock_environment

    with stock_environment():
        llm = _engine(b)
    require_stock(llm)
    out = _outputs(llm)
    llm.llm_engine.engine_core.shutdown()
    return out


def _control(a: Path, b: Path) -> Any:
    from initpipe_vllm.testing.stock import require_stock, stock_environment

    with stock_environment():
        llm = _engine(a)
    require_stock(llm)
    _outputs(llm)
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(b)})
    llm.reset_prefix_cache()
    out = _outputs(llm)
    llm.llm_engine.engine_core.shutdown()
    return out


def _refit(a: Path, b: Path) -> dict[str, Any]:
    import initpipe_vllm as ip
    from initpipe_vllm.hook import PIPELINED_WORKER

    llm = _engine(a, worker_cls=PIPELINED_WORKER)
    _outputs(llm)
    receipt = ip.refit(llm, b)
    out = {"receipt": receipt.to_dict(), "outputs": _outputs(llm)}
    llm.llm_engine.engine_core.shutdown()
    return out


def main(out: str, weights_dir: str) -> None:
    from initpipe_vllm.testing.weights import seeded_model

    a = seeded_model(MODEL, weights_dir)
    b = seeded_model(MODEL, weights_dir, seed=1)
    result = {"fresh_b": _fresh(b), "control": _control(a, b), "refit": _refit(a, b)}
    Path(out).write_text(json.dumps(result))


@pytest.fixture(scope="module")
def result(script_result: Any) -> Any:
    return script_result(
        __file__,
        env={
            "VLLM_CPU_OMP_THREADS_BIND": "0|1",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
            # run_workload sends functions to the workers through collective_rpc
            "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
        },
    )


def test_vllms_own_reload_serves_a_stale_tied_head_at_tp2(result: Any) -> None:
    assert result["control"] != result["fresh_b"]


def test_a_tp2_refit_of_a_tied_model_is_a_fresh_tp2_engine(result: Any) -> None:
    got = result["refit"]
    assert got["outputs"] == result["fresh_b"]  # tokens, logprobs, prefix-cache hits
    receipt = got["receipt"]
    assert len(receipt["digests"]) == 2
    assert "(rank 0 of 2)" in receipt["checks"]["coverage"]
    assert set(receipt["checks"]["repaired"]) == {"lm_head"}
    assert receipt["weights"]["transport"] == "folder"


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
