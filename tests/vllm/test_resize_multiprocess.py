"""Live resize with the engine core in its own process: ``LLM`` (multiprocess) and ``AsyncLLM``.

vLLM's default: the engine core runs in a spawned process, reached only through the
``vllm.general_plugins`` entry point ``initpipe_resize`` (which adds the resize utility
methods) and utility calls by name. One subprocess starts, on tiny-llama with seeded
KV-sensitive weights and the harness's workload:

- a multiprocess ``LLM`` with the pipelined worker at ``A`` blocks: a request in flight
  while ``mode="wait"`` resizes to ``B`` finishes first (vLLM's ``pause_scheduler``), then
  the workload must equal a FRESH stock engine started at ``B`` (tokens,
  logprobs, cached tokens, ``runner_snapshot`` read through ``collective_rpc``); the
  frontend's ``cache_config`` (learned once at the handshake) follows; release -> refused
  ``generate`` -> resume gives the same again; a fault injected into the spawned worker
  (through ``collective_rpc``) makes a resize fail naming the stage and roll back;
- an ``AsyncLLM``: a streaming request survives a ``wait`` resize, one is aborted by an
  ``abort`` resize (its stream ends with ``finish_reason="abort"``), the Prometheus info
  gauge ``vllm:cache_config_info`` carries the new size, release/resume round-trips and the
  workload equals the fresh engine's;
- refits of that ``AsyncLLM`` (weights A, then seeded B, then A): a request in flight
  finishes first, one arriving during the drain waits and runs on the new weights, a second
  refit and a resize meanwhile are refused, ``abort`` mode aborts, in-memory tensors reach
  the engine core's workers as a temporary folder, a refit that fails (a wrong expected
  digest) fails closed — the request queued meanwhile ends with an error, new ones are
  refused by the frontend and by the engine core — and a retry back to A at ``B`` blocks
  equals the fresh stock engine;
- the oracle is a fresh multiprocess STOCK engine at ``B`` (an in-process one differs in
  the last float digits); its engine core runs with ``VLLM_PLUGINS=initpipe`` (no
  ``initpipe_resize``), and a resize of it is refused with a message naming the entry point.

Run as a script (``python test_resize_multiprocess.py OUT.json WEIGHTS_DIR``) it is that
subprocess.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from waiting import until_async

A, B, C = 24, 12, 40
MODEL = Path(__file__).resolve().parents[2] / "stages" / "models" / "tiny-llama"
LONG = 300  # tokens the in-flight requests generate
PROMPT = 150  # tokens of their prompts
#: The stage that allocates the KV tensors, by runner: where the injected fault goes.
ALLOCATES = {"v1": "allocated_kv_caches", "v2": "kv_caches_by_layer"}


def _snap(worker: Any) -> Any:
    from initpipe_vllm.testing.equivalence import runner_snapshot  # either runner's

    return runner_snapshot(worker.model_runner)


def _error(err: BaseException) -> dict[str, Any]:
    from initpipe_vllm import KVCacheReleasedError

    return {
        "type": type(err).__name__,
        "is_released_error": isinstance(err, KVCacheReleasedError),
        "message": str(err),
        "step": getattr(err, "step", None),
        "stage": getattr(err, "stage", None),
        "rolled_back": getattr(err, "rolled_back", None),
    }


def _kwargs(folder: Path, extra: dict[str, Any], blocks: int, pipelined: bool) -> dict[str, Any]:
    from initpipe_vllm.hook import PIPELINED_WORKER
    from initpipe_vllm.testing.equivalence import workload_engine_kwargs

    kwargs, _ = workload_engine_kwargs(folder, num_gpu_blocks_override=blocks, **extra)
    if pipelined:
        kwargs["worker_cls"] = PIPELINED_WORKER
    return kwargs


def _outputs(llm: Any) -> Any:
    from initpipe_vllm.testing.equivalence import run_workload

    return run_workload(llm, "generate", salt=2)["outputs"]


def _prompt(seed: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(PROMPT)]


def _sync(folder: Path, extra: dict[str, Any], hold: Path) -> dict[str, Any]:
    from vllm import LLM, SamplingParams

    import initpipe_vllm as ip
    from initpipe_vllm.live.core.hold import UNTIL_PAUSE

    rec: dict[str, Any] = {}
    params = SamplingParams(max_tokens=LONG, temperature=0.0, ignore_eos=True, detokenize=False)
    llm = LLM(**_kwargs(folder, extra, A, pipelined=True))
    engine = llm.llm_engine
    rec["frontend_blocks_start"] = engine.vllm_config.cache_config.num_gpu_blocks
    from vllm.inputs import TokensPrompt as TP

    llm.generate([TP(prompt_token_ids=_prompt(3))], params, use_tqdm=False)  # warm the cache
    # in flight when the resize comes, on any machine: the engine core admits the request
    # (its first token), then runs no step until the resize pauses the scheduler
    hold.write_text(UNTIL_PAUSE)
    llm.enqueue([TP(prompt_token_ids=_prompt(1))], params, use_tqdm=False)
    first = engine.step()  # blocks until the engine core sent its first token: in flight
    try:
        shrink = ip.resize_kv_cache(llm, keep_prefix_cache=False, num_blocks=B, mode="wait")
    finally:
        hold.unlink()
    rest = llm.wait_for_completion(use_tqdm=False)
    (waited,) = [o for o in [*first, *rest] if o.finished]
    rec["shrink"] = {
        "report": shrink.to_dict(),
        "info": ip.kv_cache_info(llm).to_dict(),
        "frontend_blocks": engine.vllm_config.cache_config.num_gpu_blocks,
        "frontend_tokens": engine.vllm_config.cache_config.kv_cache_size_tokens,
        "waited_tokens": list(waited.outputs[0].token_ids),
        "waited_finish": waited.outputs[0].finish_reason,
        "outputs": _outputs(llm),
        "runner": llm.collective_rpc(_snap)[0],
    }
    rel = ip.release_kv_cache(llm)
    try:
        llm.generate([TP(prompt_token_ids=_prompt(1))], params, use_tqdm=False)
        refused: Any = "served"
    except Exception as err:
        refused = _error(err)
    # past the frontend's guard (another frontend would be): the engine core itself
    # finishes the request at once with an error, it does not wait for a resume
    engine._initpipe_state = "serving"
    try:
        (past,) = llm.generate([TP(prompt_token_ids=_prompt(1))], params, use_tqdm=False)
        core_refusal: Any = {
            "finish": past.outputs[0].finish_reason,
            "tokens": len(past.outputs[0].token_ids),
        }
    except Exception as err:
        core_refusal = _error(err)
    engine._initpipe_state = "released"
    rec["released"] = {
        "report": rel.to_dict(),
        "info": ip.kv_cache_info(llm).to_dict(),
        "generate": refused,
        "core_refusal": core_refusal,
        "frontend_blocks": engine.vllm_config.cache_config.num_gpu_blocks,
    }
    resumed = ip.resume_kv_cache(llm)
    rec["resumed"] = {
        "report": resumed.to_dict(),
        "outputs": _outputs(llm),
        "runner": llm.collective_rpc(_snap)[0],
    }
    # a fault in the spawned worker: the stage's next run fails once, the rollback works
    from initpipe_vllm.compat import runner_from_env

    stage = ALLOCATES[runner_from_env()]  # the stage that allocates the KV tensors
    llm.collective_rpc(_inject, args=(stage,))
    try:
        ip.resize_kv_cache(llm, keep_prefix_cache=False, num_blocks=C)
        rec["fault"] = {"error": None}
    except Exception as err:
        rec["fault"] = {"error": _error(err)}
    rec["fault"]["stage"], rec["fault"]["runner"] = stage, runner_from_env()
    rec["fault"]["info"] = ip.kv_cache_info(llm).to_dict()
    llm.reset_prefix_cache()
    rec["fault"]["outputs"] = _outputs(llm)
    grow = ip.resize_kv_cache(llm, keep_prefix_cache=False, num_blocks=C)
    rec["grow"] = {"report": grow.to_dict(), "info": ip.kv_cache_info(llm).to_dict()}
    from test_resize_warm import warm_round

    rec["warm"] = warm_round(llm, _prompt(5), lambda: ip.resize_kv_cache(llm, num_blocks=A))
    engine.engine_core.shutdown()
    return rec


def _fresh(folder: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """The oracle: a fresh stock engine at B, multiprocess too (an in-process engine differs
    in the last float digits: its thread setup differs). Its engine core loads the worker
    opt-in plugin only (``VLLM_PLUGINS`` is read when that process starts), so a resize of
    it shows the refusal a user gets without ``initpipe_resize``. It is certainly stock: its
    processes start with the opt-in (``INITPIPE_VLLM``) unset, and its runner is checked."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    import initpipe_vllm as ip
    from initpipe_vllm.testing.stock import require_stock, runner_classes, stock_environment

    os.environ["VLLM_PLUGINS"] = "initpipe"
    with stock_environment():
        fresh = LLM(**_kwargs(folder, extra, B, pipelined=False))
    del os.environ["VLLM_PLUGINS"]
    require_stock(fresh)
    rec = {
        "outputs": _outputs(fresh),
        "runner": fresh.collective_rpc(_snap)[0],
        "runner_classes": runner_classes(fresh),
    }
    params = SamplingParams(max_tokens=LONG, temperature=0.0, ignore_eos=True, detokenize=False)
    (alone,) = fresh.generate([TokensPrompt(prompt_token_ids=_prompt(1))], params, use_tqdm=False)
    rec["long_tokens"] = list(alone.outputs[0].token_ids)
    try:
        ip.resize_kv_cache(fresh, keep_prefix_cache=False, num_blocks=A)
        rec["no_plugin"] = "accepted"
    except Exception as err:
        rec["no_plugin"] = _error(err)
    fresh.llm_engine.engine_core.shutdown()
    return rec


def _inject(worker: Any, stage: str) -> None:
    from initpipe.testing import inject_fault

    inject_fault(worker.model_runner.initpipe_run, stage, times=1)


async def _agenerate(engine: Any, prompt: list[int], params: Any, rid: str) -> Any:
    from vllm.inputs import TokensPrompt

    final = None
    async for out in engine.generate(TokensPrompt(prompt_token_ids=prompt), params, rid):
        final = out
    return final


async def _aworkload(engine: Any, facts: dict[str, Any]) -> Any:
    from vllm import SamplingParams

    from initpipe_vllm.testing.equivalence import _logprobs, workload_requests

    outs = []
    for i, req in enumerate(workload_requests(facts, 2)):
        params = SamplingParams(
            max_tokens=6,
            temperature=0.0,
            ignore_eos=True,
            detokenize=False,
            logprobs=2,
            prompt_logprobs=2 if req.get("prompt_logprobs") else None,
        )
        out = await _agenerate(engine, req["prompt"], params, f"w{i}")
        outs.append(
            {
                "name": req["name"],
                "prompt_tokens": len(req["prompt"]),
                "token_ids": list(out.outputs[0].token_ids),
                "logprobs": _logprobs(out.outputs[0].logprobs),
                "prompt_logprobs": _logprobs(out.prompt_logprobs),
                "num_cached_tokens": out.num_cached_tokens,
            }
        )
    return outs


def _facts(worker: Any) -> Any:
    from initpipe_vllm.testing.equivalence import _kv_facts

    return _kv_facts(worker)


async def _async(
    folder: Path, extra: dict[str, Any], hold: Path, weights_b: Path
) -> dict[str, Any]:
    import asyncio

    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    import initpipe_vllm as ip
    from initpipe_vllm.live.core.hold import UNTIL_PAUSE

    kwargs = _kwargs(folder, extra, A, pipelined=True)
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
    rec: dict[str, Any] = {}
    try:
        params = SamplingParams(max_tokens=LONG, temperature=0.0, ignore_eos=True, detokenize=False)
        facts = (await engine.collective_rpc(_facts))[0]

        async def info() -> dict[str, Any]:
            return dict((await ip.kv_cache_info_async(engine)).to_dict())

        async def started(rid: str, seed: int, text: str) -> asyncio.Task[Any]:
            """The request, admitted by the engine core (it holds its prompt's blocks), whose
            steps are then held while the hold file exists (see initpipe_vllm.live.core.hold)."""
            hold.write_text(text)
            task = asyncio.create_task(_agenerate(engine, _prompt(seed), params, rid))

            async def admitted() -> bool:
                now = await info()
                used = now["num_blocks"] - 1 - now["free_blocks"]  # the null block is never free
                return bool(used >= math.ceil(PROMPT / now["block_size"]))

            await until_async("the request holding KV blocks", admitted)
            return task

        async def resizing() -> bool:
            return bool((await info())["state"] == "resizing")

        task = await started("inflight-wait", 1, "held")
        first = asyncio.create_task(
            ip.resize_kv_cache_async(engine, keep_prefix_cache=False, num_blocks=B, mode="wait")
        )
        await until_async("resizing (the first resize waiting)", resizing)
        during = await info()
        try:
            await ip.resize_kv_cache_async(engine, keep_prefix_cache=False, num_blocks=C)
            second: Any = "accepted"
        except Exception as err:
            second = _error(err)
        held = [first.done(), task.done()]
        hold.unlink()
        shrink = await first
        done = await task
        rec["wait"] = {
            "during": {"info": during, "second": second, "done": held},
            "report": shrink.to_dict(),
            "tokens": list(done.outputs[0].token_ids),
            "finish": done.outputs[0].finish_reason,
        }
        # held until the abort resize pauses the scheduler: the request is still running then
        task = await started("inflight-abort", 2, UNTIL_PAUSE)
        try:
            aborted = await ip.resize_kv_cache_async(
                engine, keep_prefix_cache=False, num_blocks=B, mode="abort"
            )
        finally:
            hold.unlink()
        done = await task
        rec["abort"] = {
            "report": aborted.to_dict(),
            "finish": done.outputs[0].finish_reason if done is not None else None,
            "tokens": len(done.outputs[0].token_ids) if done is not None else None,
        }
        from prometheus_client import REGISTRY

        labels = [
            dict(s.labels)
            for metric in REGISTRY.collect()
            if metric.name == "vllm:cache_config_info"
            for s in metric.samples
        ]
        rec["gauge"] = labels
        rel = await ip.release_kv_cache_async(engine)
        try:
            await _agenerate(engine, _prompt(1), params, "while-released")
            refused: Any = "served"
        except Exception as err:
            refused = _error(err)
        rec["released"] = {
            "report": rel.to_dict(),
            "info": (await ip.kv_cache_info_async(engine)).to_dict(),
            "generate": refused,
        }
        await ip.resume_kv_cache_async(engine)
        rec["outputs"] = await _aworkload(engine, facts)
        rec["info"] = (await ip.kv_cache_info_async(engine)).to_dict()
        rec["refit"] = await _async_refit(engine, folder, weights_b, hold, facts, started)
    finally:
        engine.shutdown()
    return rec


def _probe_prompt(facts: dict[str, Any]) -> list[int]:
    from initpipe_vllm.live.refit.probe import Probe, default_prompts

    (first,) = default_prompts(
        facts["vocab_size"], facts["block_size"], facts["max_model_len"], Probe().max_tokens
    )
    return list(first)


async def _async_refit(
    engine: Any, a: Path, b: Path, hold: Path, facts: dict[str, Any], started: Any
) -> dict[str, Any]:
    """Refits of an ``AsyncLLM`` whose engine core runs in its own process: a request in
    flight finishes first, one that arrives during the drain waits and is served with the new
    weights, a second refit and a resize meanwhile are refused; ``abort`` mode; in-memory
    tensors; a refit that fails closed (a request queued meanwhile ends with an error, new
    ones are refused) and its retry, which must equal the fresh stock engine again."""
    import asyncio

    from safetensors.torch import load_file
    from vllm import SamplingParams

    import initpipe_vllm as ip
    from initpipe_vllm.live.core.hold import UNTIL_PAUSE
    from initpipe_vllm.live.refit.probe import Probe

    rec: dict[str, Any] = {}
    short = SamplingParams(
        max_tokens=Probe().max_tokens,
        temperature=0.0,
        ignore_eos=True,
        detokenize=False,
        logprobs=0,
    )
    prompt = _probe_prompt(facts)
    under_a = await _agenerate(engine, prompt, short, "probe-prompt-under-a")
    rec["under_a"] = list(under_a.outputs[0].token_ids)

    async def state() -> str:
        return str((await ip.weights_info_async(engine)).state)

    async def busy() -> bool:
        return await state() == "busy"

    async def queued_request(rid: str) -> asyncio.Task[Any]:
        """A request sent while a refit drains; returned once the engine core has it (a
        utility call after it on the same socket is answered after it was read)."""
        task = asyncio.create_task(_agenerate(engine, prompt, short, rid))

        async def registered() -> bool:
            return any(r.startswith(rid) for r in engine.output_processor.request_states)

        await until_async(f"{rid} registered", registered)
        return task

    async def attempt(call: Any) -> Any:
        try:
            return (await call).to_dict()
        except Exception as err:
            return _error(err)

    # wait mode: in flight finishes, arriving waits, a second refit and a resize refused
    inflight = await started("refit-inflight", 1, "held")
    first = asyncio.create_task(ip.refit_async(engine, b, mode="wait", version="B"))
    await until_async("refitting (the refit waiting for the request in flight)", busy)
    arriving = await queued_request("arrived-during-drain")
    second = await attempt(ip.refit_async(engine, a))
    resize = await attempt(ip.resize_kv_cache_async(engine, keep_prefix_cache=False, num_blocks=C))
    held = [first.done(), inflight.done(), arriving.done()]
    hold.unlink()
    receipt = await first
    done, arrived = await inflight, await arriving
    rec["wait"] = {
        "held": held,
        "second": second,
        "resize": resize,
        "receipt": receipt.to_dict(),
        "inflight_tokens": list(done.outputs[0].token_ids),
        "arrived_tokens": list(arrived.outputs[0].token_ids),
        "arrived_finish": arrived.outputs[0].finish_reason,
        "info": (await ip.weights_info_async(engine)).to_dict(),
    }
    # abort mode: the request in flight is aborted
    inflight = await started("refit-abort", 2, UNTIL_PAUSE)
    try:
        aborted = await ip.refit_async(engine, a, mode="abort")
    finally:
        hold.unlink()
    done = await inflight
    rec["abort"] = {
        "receipt": aborted.to_dict(),
        "finish": done.outputs[0].finish_reason if done is not None else None,
    }
    # (name, tensor) pairs: written to a temporary folder the engine core's workers load
    tensors = load_file(str(b / "model.safetensors"))
    rec["tensors"] = (await ip.refit_async(engine, tensors, version="B-tensors")).to_dict()
    # fail closed: a wrong expected digest; a request queued meanwhile ends with an error
    inflight = await started("refit-fail-inflight", 1, "held")
    failing = asyncio.create_task(ip.refit_async(engine, a, expected_digest="sha256:" + "0" * 64))
    await until_async("refitting (the failing refit waiting)", busy)
    queued = await queued_request("queued-during-failing-refit")
    await attempt(ip.weights_info_async(engine))  # after the add, on the same socket
    hold.unlink()
    failed = await attempt(failing)
    await inflight
    try:
        out = await asyncio.wait_for(queued, timeout=120)
        queued_end: Any = {
            "finish": out.outputs[0].finish_reason,
            "tokens": len(out.outputs[0].token_ids),
        }
    except Exception as err:
        queued_end = _error(err)
    rec["failed"] = {
        "error": failed,
        "info": (await ip.weights_info_async(engine)).to_dict(),
        "queued": queued_end,
    }
    try:
        await _agenerate(engine, prompt, short, "after-failure")
        rec["failed"]["generate"] = "served"
    except Exception as err:
        rec["failed"]["generate"] = {
            **_error(err),
            "refit_failed_error": type(err).__name__ == "RefitFailed",
        }
    engine._initpipe_state = "serving"  # past the frontend's guard: the core refuses too
    try:
        out = await asyncio.wait_for(
            _agenerate(engine, prompt, short, "past-the-guard"), timeout=120
        )
        rec["failed"]["core_refusal"] = {
            "finish": out.outputs[0].finish_reason,
            "tokens": len(out.outputs[0].token_ids),
        }
    except Exception as err:
        rec["failed"]["core_refusal"] = _error(err)
    engine._initpipe_state = "failed"
    retry = await ip.refit_async(engine, a, num_blocks=B)
    rec["retry"] = {
        "receipt": retry.to_dict(),
        "outputs": await _aworkload(engine, facts),
        "info": (await ip.weights_info_async(engine)).to_dict(),
    }
    return rec


def main(out: str, weights_dir: str) -> None:
    import asyncio

    from initpipe_vllm.live.core.hold import ENV_HOLD
    from initpipe_vllm.testing.equivalence import loadable_model

    hold = Path(out).with_name("hold-steps")  # the pipelined engine cores' steps held if it exists
    with loadable_model(MODEL, weights_dir=weights_dir) as (folder, extra):
        extra["gpu_memory_utilization"] = 0.3
        fresh = _fresh(folder, extra)
        os.environ[ENV_HOLD] = str(hold)  # read by each engine core process at its start
        result = _sync(folder, extra, hold)
        from initpipe_vllm.testing.weights import seeded_model

        weights_b = seeded_model(MODEL, weights_dir, seed=1)
        result["async"] = asyncio.run(_async(folder, extra, hold, weights_b))
        result["fresh_B"] = fresh
    Path(out).write_text(json.dumps(result))


# -- the tests -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sync(script_result: Any) -> Any:
    # the test reads runner snapshots through collective_rpc with a function: vLLM sends a
    # function to its engine core process only with pickle allowed (test-only setting)
    return script_result(
        __file__,
        {"VLLM_ENABLE_V1_MULTIPROCESSING": None, "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"},
    )


@pytest.fixture(scope="module")
def asynced(sync: Any) -> Any:
    return sync["async"]


def _same(a: Any, b: Any) -> list[str]:
    from initpipe_vllm.testing.snapshot import diff_snapshots

    return diff_snapshots(a, b)


def test_the_oracle_is_stock_vllm(sync: Any) -> None:
    """The fresh engine ran vLLM's own runner (the script refuses one that did not)."""
    (cls, pipelined), *more = sync["fresh_B"]["runner_classes"]
    assert not more and pipelined is False and cls.startswith("vllm."), cls


def test_multiprocess_resize_waits_for_requests_then_equals_a_fresh_engine(sync: Any) -> None:
    fresh, shrink = sync["fresh_B"], sync["shrink"]
    assert sync["frontend_blocks_start"] == A
    assert (shrink["report"]["blocks_before"], shrink["report"]["blocks_after"]) == (A, B)
    # the request in flight finished on the old cache with an unresized engine's tokens
    assert shrink["waited_finish"] == "length"
    assert shrink["waited_tokens"] == fresh["long_tokens"]
    assert shrink["report"]["requests_waited"] == []  # it was running, not queued
    assert shrink["report"]["steps"]["pause"] > 0
    assert shrink["outputs"][-1]["num_cached_tokens"] > 0
    assert _same(fresh["outputs"], shrink["outputs"]) == []
    assert _same(fresh["runner"], shrink["runner"]) == []
    # the frontend's copy of the config (learned once at the handshake) follows
    assert shrink["frontend_blocks"] == B and shrink["info"]["num_blocks"] == B
    assert shrink["frontend_tokens"] == B * shrink["info"]["block_size"]


def test_multiprocess_release_refuses_requests_and_resume_equals_a_fresh_engine(
    sync: Any,
) -> None:
    rel, resumed = sync["released"], sync["resumed"]
    assert rel["info"]["state"] == "released" and rel["frontend_blocks"] == 0
    assert rel["generate"]["type"] == "KVCacheReleased"
    assert rel["generate"]["is_released_error"] is True
    assert rel["core_refusal"] == {"finish": "error", "tokens": 0}
    assert (resumed["report"]["blocks_before"], resumed["report"]["blocks_after"]) == (0, B)
    assert _same(sync["fresh_B"]["outputs"], resumed["outputs"]) == []
    assert _same(sync["fresh_B"]["runner"], resumed["runner"]) == []


def test_a_fault_in_a_spawned_worker_rolls_the_resize_back(sync: Any) -> None:
    fault = sync["fault"]
    assert fault["error"]["type"] == "ResizeError" and fault["error"]["rolled_back"] is True
    assert fault["error"]["stage"] == fault["stage"] == ALLOCATES[fault["runner"]]
    assert f"'{fault['stage']}'" in fault["error"]["message"]
    assert fault["info"]["num_blocks"] == B and fault["info"]["state"] == "serving"
    assert _same(sync["fresh_B"]["outputs"], fault["outputs"]) == []
    assert sync["grow"]["info"]["num_blocks"] == C


def test_async_llm_waits_aborts_and_reports_the_new_size(asynced: Any, sync: Any) -> None:
    wait, abort = asynced["wait"], asynced["abort"]
    assert wait["finish"] == "length" and len(wait["tokens"]) == LONG
    # while the first waits, the engine says so and refuses a second resize (nothing queues)
    assert wait["during"]["done"] == [False, False]  # held: neither answered yet
    assert wait["during"]["info"]["state"] == "resizing"
    assert wait["during"]["info"]["num_blocks"] == A
    second = wait["during"]["second"]
    assert second["type"] == "ResizeRefusedError" and second["step"] == "state", second
    assert "another resize" in second["message"]
    assert wait["tokens"] == sync["fresh_B"]["long_tokens"]
    assert abort["finish"] == "abort" and abort["tokens"] < LONG
    assert len(abort["report"]["requests_aborted"]) == 1
    assert asynced["gauge"] and all(g["num_gpu_blocks"] == str(B) for g in asynced["gauge"])
    rel = asynced["released"]
    assert rel["info"]["state"] == "released"
    # a GracefulHTTPError too: AsyncLLM.generate passes it through unwrapped (503 over HTTP)
    assert rel["generate"]["type"] == "KVCacheReleased"
    assert rel["generate"]["is_released_error"] is True
    assert "resume_kv_cache" in rel["generate"]["message"]
    assert asynced["info"]["num_blocks"] == B
    assert _same(sync["fresh_B"]["outputs"], asynced["outputs"]) == []


def test_without_the_resize_plugin_in_the_engine_core_the_resize_says_so() -> None:
    # vLLM's own words when the engine core lacks the method (seen with VLLM_PLUGINS=initpipe:
    # EngineCoreProc._invoke_utility_method, then the client raises Exception(message))
    from initpipe_vllm.live.frontend import _plugin_missing

    vllm_says = Exception(
        "Call to initpipe_resize_kv_cache method failed: 'EngineCoreProc' object has no "
        "attribute 'initpipe_resize_kv_cache'"
    )
    method = "initpipe_resize_kv_cache"
    err = _plugin_missing(vllm_says, method)
    assert err is not None and type(err).__name__ == "ResizeRefusedError"
    assert "initpipe_resize" in str(err) and "VLLM_PLUGINS" in str(err)
    assert method in str(err)
    # another method missing is not this method missing
    assert _plugin_missing(vllm_says, "initpipe_refit_weights") is None
    assert _plugin_missing(Exception("Call to reset_prefix_cache method failed"), method) is None
    other = Exception("Call to initpipe_resize_kv_cache method failed: KeyError: 'x'")
    assert _plugin_missing(other, method) is None  # a real failure of the method is not renamed


def test_an_engine_core_started_without_the_resize_plugin_refuses_by_name(sync: Any) -> None:
    out = sync["fresh_B"]["no_plugin"]
    assert out["type"] == "ResizeRefusedError"
    assert "initpipe_resize" in out["message"] and "VLLM_PLUGINS" in out["message"]


# -- refit, engine core in its own process -------------------------------------------------
def test_async_refit_drains_serves_the_waiting_request_and_refuses_a_second(asynced: Any) -> None:
    wait = asynced["refit"]["wait"]
    assert wait["held"] == [False, False, False]  # held: none answered during the drain
    for refused in (wait["second"], wait["resize"]):
        assert refused["type"] in ("RefitRefusedError", "ResizeRefusedError"), refused
        assert refused["step"] == "state" and "another refit is running" in refused["message"]
    receipt = wait["receipt"]
    assert receipt["version"] == "B" and wait["info"]["version"] == "B"
    # the request in flight finished under the old weights (a fresh stock engine's tokens)
    assert len(wait["inflight_tokens"]) == LONG
    # the one that arrived during the drain waited, then ran on the new weights: the same
    # tokens as the probe (the same prompt, served by the refitted engine) and not A's
    assert wait["arrived_finish"] == "length"
    assert any(r.startswith("arrived-during-drain") for r in receipt["requests_waited"])
    assert wait["arrived_tokens"] == list(receipt["probe"]["tokens"][0])
    assert wait["arrived_tokens"] != asynced["refit"]["under_a"]
    assert receipt["probe"]["ok"] and all(h > 0 for h in receipt["probe"]["cached_tokens"])


def test_async_refit_abort_mode_aborts_the_request_in_flight(asynced: Any) -> None:
    abort = asynced["refit"]["abort"]
    assert abort["finish"] == "abort"
    assert len(abort["receipt"]["requests_aborted"]) == 1


def test_async_refit_from_tensors_crosses_to_the_engine_core_as_a_folder(asynced: Any) -> None:
    refit = asynced["refit"]
    tensors = refit["tensors"]
    assert tensors["weights"]["kind"] == "tensors" and tensors["weights"]["transport"] == "folder"
    assert tensors["digests"] == refit["wait"]["receipt"]["digests"]  # the same weights, B


def test_a_failed_refit_refuses_requests_until_a_refit_succeeds(asynced: Any, sync: Any) -> None:
    failed = asynced["refit"]["failed"]
    err = failed["error"]
    assert err["type"] == "RefitError" and err["step"] == "digest"
    assert failed["info"]["state"] == "failed" and failed["info"]["failure"]["step"] == "digest"
    # the request queued during the failing refit's drain ended with an error: no hang
    assert failed["queued"] == {"finish": "error", "tokens": 0}
    gen = failed["generate"]
    assert gen["refit_failed_error"] and "'digest'" in gen["message"]
    assert failed["core_refusal"] == {"finish": "error", "tokens": 0}
    retry = asynced["refit"]["retry"]
    assert retry["info"]["state"] == "serving"
    assert retry["receipt"]["blocks_before"] == 0 and retry["receipt"]["blocks_after"] == B
    assert _same(sync["fresh_B"]["outputs"], retry["outputs"]) == []


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])


def test_multiprocess_resize_keeps_the_prefix_cache(sync: Any) -> None:
    from test_resize_warm import warm_round_problems

    assert warm_round_problems(sync["warm"]) == []
