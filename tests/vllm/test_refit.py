"""Weight refit, in-process: after a refit the engine is a FRESH engine started with the new
weights — same tokens, logprobs, prefix-cache hits, digest and runner state — and every
failed step leaves an engine that refuses to serve until a retry succeeds.

One subprocess per runner (an in-process engine mutates its process) on tiny-llama with two
sets of seeded, KV-sensitive weights (``seeded_model`` seeds 0 and 1: A and B) and the
equivalence harness's workload (longer than a block, a prefix-cache hit, exact logprobs):

- oracles: fresh STOCK engines (``INITPIPE_VLLM`` unset, their runner checked to be vLLM's)
  started on A with 24 blocks, on B with 24 and with 40: the workload's outputs, the runner
  and scheduler snapshots, each rank's weights digest, and the refit probe's default
  prompts served with the probe's parameters;
- the engine under test starts on A (24 blocks, pipelined worker), fills its prefix cache,
  then: refit to B (same size); the STALE-CACHE CONTROL — vLLM's own
  ``reload_weights`` back to A with no cache reset, then the workload, which must differ from
  fresh A (the prefix cache survived: the check that catches it can fail) — and a refit to A
  that repairs it; a refit to B at 40 blocks; a release, then a refit while released; six
  bad weights folders and bad arguments, refused before anything changed; a probe whose
  expected tokens are wrong and a wrong expected digest (real failures: fail closed, then a
  retry); a fault injected once at every step (teardown, load — half the tensors loaded,
  then an error — digest, kv_phase, warmup, scheduler, caches, probe): the refit names the
  step, the engine refuses requests, a resize is refused, and the next refit succeeds; 20
  refits alternating A/B with the workload between;
- leaks: every KV allocation is weakref'd (``relkit.AllocationSpy``); at the end only the
  current cache's are alive, and every parameter kept its storage (reloads are in place).

Run as a script (``python test_refit.py OUT.json WEIGHTS_DIR``) it is that subprocess.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from refit_kit import default_prompts, differing, tensor_hashes

SMALL, LARGE = 24, 40
MODEL = Path(__file__).resolve().parents[2] / "stages" / "models" / "tiny-llama"
RUNNERS = ("v1", "v2")
#: refits in the alternating loop, per runner (MRv2's kernels run interpreted here, about
#: 12x slower: its loop and faults are a subset; the steps are the runners' shared code)
LOOP = {"v1": 20, "v2": 4}
#: every step a fault is injected at, in order
FAULT_STEPS = (
    "teardown",
    "load",
    "verify",
    "digest",
    "kv_phase",
    "warmup",
    "scheduler",
    "caches",
    "probe",
)
#: the steps MRv2's run injects a fault at (those whose rank side differs per runner, and
#: the probe, which serves through the runner)
FAULT_STEPS_V2 = ("load", "kv_phase", "probe")


def _runner_version() -> str:
    from initpipe_vllm.compat import runner_from_env

    return runner_from_env()


# -- the subprocess ------------------------------------------------------------------------
def _core(llm: Any) -> Any:
    return llm.llm_engine.engine_core.engine_core


def _worker(llm: Any) -> Any:
    return _core(llm).model_executor.driver_worker.worker


def _outputs(llm: Any) -> Any:
    from initpipe_vllm.testing.equivalence import run_workload

    return run_workload(llm, "generate", salt=2)["outputs"]


def _state(llm: Any) -> dict[str, Any]:
    from initpipe_vllm.testing.equivalence import runner_snapshot
    from initpipe_vllm.testing.snapshot import scheduler_snapshot

    # blocks=False: the probe's KV data stays in free blocks, as any served request's does
    return {
        "runner": runner_snapshot(_worker(llm).model_runner, blocks=False),
        "scheduler": scheduler_snapshot(_core(llm)),
    }


def _digests(llm: Any) -> list[str]:
    from initpipe_vllm.live.refit.weights import rank_digest

    return [a["digest"] for a in llm.collective_rpc(rank_digest)]


def _probe_outputs(llm: Any, prompts: list[list[int]]) -> dict[str, Any]:
    """The probe's prompts served through the public API with the probe's parameters."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from initpipe_vllm.live.refit.probe import Probe

    params = SamplingParams(
        max_tokens=Probe().max_tokens,
        temperature=0.0,
        ignore_eos=True,
        detokenize=False,
        logprobs=0,
    )
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return {
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "logprobs": [
            [
                pos[tok].logprob
                for pos, tok in zip(o.outputs[0].logprobs, o.outputs[0].token_ids, strict=True)
            ]
            for o in outs
        ],
    }


def _error(err: BaseException) -> dict[str, Any]:
    return {
        "type": type(err).__name__,
        "classes": [c.__name__ for c in type(err).__mro__],
        "message": str(err),
        "step": getattr(err, "step", None),
        "rank": getattr(err, "rank", None),
        "serving": getattr(err, "serving", None),
    }


def _fresh(folder: Path, extra: dict[str, Any], blocks: int) -> dict[str, Any]:
    from vllm import LLM

    from initpipe_vllm.hook.packed import recording_packed_weights
    from initpipe_vllm.testing.equivalence import workload_engine_kwargs
    from initpipe_vllm.testing.stock import require_stock, runner_classes, stock_environment

    kwargs, _ = workload_engine_kwargs(folder, num_gpu_blocks_override=blocks, **extra)
    # the record of the weights vLLM's CPU kernels pack away (for the digest): it changes
    # nothing the engine does, which stays stock (checked)
    with stock_environment(), recording_packed_weights():
        llm = LLM(**kwargs)
    require_stock(llm)
    try:
        out = {
            "runner_classes": runner_classes(llm),
            "digests": _digests(llm),
            "hashes": tensor_hashes(llm),
            "outputs": _outputs(llm),
            **_state(llm),
        }
        out["probe"] = _probe_outputs(llm, default_prompts(llm))
        return out
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm


def _bad_folders(a: Path, root: Path) -> dict[str, Path]:
    """Weights folders a refit must refuse before anything changes."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(a / "model.safetensors"))
    names = sorted(tensors)
    cases: dict[str, dict[str, Any]] = {
        "missing_tensor": {k: v for k, v in tensors.items() if k != names[3]},
        "unexpected_tensor": {**tensors, "model.extra.weight": torch.zeros(2, 2)},
        "wrong_shape": {**tensors, names[3]: tensors[names[3]][:-1].clone()},
        "wrong_dtype": {**tensors, names[3]: tensors[names[3]].to(torch.int32)},
    }
    out = {}
    for name, content in cases.items():
        folder = root / name
        folder.mkdir()
        save_file(content, str(folder / "model.safetensors"))
        out[name] = folder
    (root / "empty").mkdir()
    out["empty"] = root / "empty"
    (root / "not_safetensors").mkdir()
    (root / "not_safetensors" / "model.safetensors").write_bytes(b"not a safetensors file")
    out["not_safetensors"] = root / "not_safetensors"
    return out


def _flipped(b: Path, root: Path) -> Path:
    """B with one linear layer's weight negated."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(b / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight"
    tensors[name] = -tensors[name]
    folder = root / "flipped"
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@contextlib.contextmanager
def _patched(owner: Any, name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    """``owner.name`` replaced by ``make(original)`` inside the block."""
    original = getattr(owner, name)
    had = name in vars(owner)
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        if had:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


def _raising(message: str) -> Callable[[Any], Any]:
    def make(_original: Any) -> Any:
        def fail(*_args: Any, **_kwargs: Any) -> Any:
            raise RuntimeError(message)

        return fail

    return make


def _half_load(original: Any) -> Any:
    """``Worker.reload_weights`` that loads half the checkpoint's tensors, then fails."""

    def load(weights_path: str | None = None, **_kwargs: Any) -> None:
        from safetensors.torch import load_file

        assert weights_path is not None
        tensors = sorted(load_file(str(Path(weights_path) / "model.safetensors")).items())
        original(weights_iterator=iter(tensors[: len(tensors) // 2]))
        raise RuntimeError("injected fault: the load stopped half-way")

    return load


@contextlib.contextmanager
def _fault(llm: Any, step: str) -> Iterator[None]:
    """One failure inside ``step`` of the next refit (inside the rank or engine-core code
    that step runs, so the step's own error handling is what is tested)."""
    import initpipe_vllm.live.core.steps as steps_module
    import initpipe_vllm.live.refit.probe as probe_module
    import initpipe_vllm.live.refit.weights as weights_module
    from initpipe.testing import clear_faults, inject_fault

    worker = _worker(llm)
    runner = worker.model_runner
    msg = f"injected fault in {step}"
    if step == "teardown":
        with _patched(
            runner, "initpipe_release_kv_cache", _once(runner.initpipe_release_kv_cache, msg)
        ):
            yield
    elif step == "load":
        with _patched(worker, "reload_weights", _half_load):
            yield
    elif step == "verify":
        import initpipe_vllm.live.refit.coverage as coverage_module

        with _patched(coverage_module, "check", _raising(msg)):
            yield
    elif step == "digest":
        with _patched(weights_module, "weights_digest", _raising(msg)):
            yield
    elif step == "kv_phase":
        stage = runner.initpipe_pipeline.phase_order("kv_cache_config")[-1]
        inject_fault(runner.initpipe_run, stage, times=1)
        try:
            yield
        finally:
            clear_faults(runner.initpipe_run)
    elif step == "warmup":
        with _patched(worker, "compile_or_warm_up_model", _raising(msg)):
            yield
    elif step == "scheduler":
        with _patched(steps_module, "rebuild_scheduler_kv", _raising(msg)):
            yield
    elif step == "caches":  # a rank whose encoder cache did not empty: the check fails
        with _patched(weights_module, "_encoder_entries", lambda _original: lambda _r: 1):
            yield
    elif step == "probe":
        with _patched(probe_module, "_serve", _raising(msg)):
            yield
    else:  # pragma: no cover
        raise ValueError(step)


def _once(original: Any, message: str) -> Callable[[Any], Any]:
    calls = {"n": 0}

    def make(_original: Any) -> Any:
        def maybe(*args: Any, **kwargs: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError(message)
            return original(*args, **kwargs)

        return maybe

    return make


def _attempt(call: Callable[[], Any]) -> dict[str, Any]:
    try:
        value = call()
    except Exception as err:
        return {"error": _error(err)}
    return {"error": None, "value": value.to_dict() if hasattr(value, "to_dict") else value}


def _direct_reload_attempt(llm: Any, weights: Path) -> dict[str, Any] | None:
    """A refit under vLLM 0.34's ``VLLM_RELOAD_MODE=direct`` (None where vLLM has no direct
    reload). vLLM caches its variables once the engine started: its own
    ``disable_envs_cache`` lets this read the new value, as a start with it set would."""
    import importlib.util

    if importlib.util.find_spec("vllm.model_executor.model_loader.reload.direct") is None:
        return None
    import vllm.envs as envs

    import initpipe_vllm as ip

    cached = envs._is_envs_cache_enabled()
    os.environ["VLLM_RELOAD_MODE"] = "direct"
    envs.disable_envs_cache()
    try:
        return _attempt(lambda: ip.refit(llm, weights))
    finally:
        del os.environ["VLLM_RELOAD_MODE"]
        if cached:
            envs.enable_envs_cache()  # a new cache: read again, without the variable


def _failed_engine(llm: Any) -> dict[str, Any]:
    """What a failed-closed engine says and does."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    import initpipe_vllm as ip

    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, detokenize=False)
    return {
        "info": ip.weights_info(llm).to_dict(),
        "kv": ip.kv_cache_info(llm).to_dict(),
        "generate": _attempt(
            lambda: (
                llm.generate([TokensPrompt(prompt_token_ids=[5, 6, 7])], params, use_tqdm=False)
                and "served"
            )
        ),
        "unfinished": llm.llm_engine.has_unfinished_requests(),
        "resize": _attempt(lambda: ip.resize_kv_cache(llm, num_blocks=SMALL)),
        "resume": _attempt(lambda: ip.resume_kv_cache(llm)),
    }


def _param_storages(llm: Any) -> list[int]:
    return [p.data_ptr() for p in _worker(llm).model_runner.get_model().parameters()]


def _engine_under_test(a: Path, b: Path, extra: dict[str, Any], spy: Any, tmp: Path) -> Any:
    from vllm import LLM

    import initpipe_vllm as ip
    from initpipe_vllm.hook import PIPELINED_WORKER
    from initpipe_vllm.live.refit.engine import _hashes
    from initpipe_vllm.live.refit.probe import Probe
    from initpipe_vllm.testing.equivalence import workload_engine_kwargs
    from initpipe_vllm.testing.stock import runner_classes

    kwargs, _ = workload_engine_kwargs(
        a, num_gpu_blocks_override=SMALL, worker_cls=PIPELINED_WORKER, **extra
    )
    llm = LLM(**kwargs)
    rec: dict[str, Any] = {"runner_classes": runner_classes(llm)}
    params_at_start = _param_storages(llm)
    rec["start"] = {
        "outputs": _outputs(llm),
        "digests": _digests(llm),
        "hashes": tensor_hashes(llm),
    }

    def checkpoint(name: str, receipt: Any, **more: Any) -> None:
        rec[name] = {
            "receipt": receipt.to_dict(),
            "info": ip.weights_info(llm).to_dict(),
            "digests": _digests(llm),
            "hashes": tensor_hashes(llm),
            "outputs": _outputs(llm),
            **_state(llm),
            **more,
        }

    # A -> B at the same size; the hashes before may not survive it
    stale = _hashes(_core(llm))
    receipt = ip.refit(llm, b, version="B-1")
    rec["stale_hashes_before"] = len(stale)
    rec["stale_hashes_after"] = len(stale & _hashes(_core(llm)))
    checkpoint("to_b", receipt)

    # the control: vLLM's reload without a cache reset serves from B's blocks
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(a)})
    rec["stale_control"] = {"outputs": _outputs(llm)}
    checkpoint("repaired_to_a", ip.refit(llm, a))

    checkpoint("to_b_large", ip.refit(llm, b, num_blocks=LARGE))

    # refit while released: the KV cache comes back with the new weights
    rec["released"] = ip.release_kv_cache(llm).to_dict()
    checkpoint("released_to_a", ip.refit(llm, a, num_blocks=SMALL))

    # refused before anything changed: the engine keeps serving A
    refusals: dict[str, Any] = {}
    for name, folder in _bad_folders(a, tmp).items():
        refusals[name] = _attempt(lambda folder=folder: ip.refit(llm, folder))
    for name, call in {
        "no_folder": lambda: ip.refit(llm, tmp / "nowhere"),
        "not_weights": lambda: ip.refit(llm, 42),
        "both_sizes": lambda: ip.refit(llm, b, num_blocks=8, kv_cache_memory_bytes=1 << 20),
        "bad_mode": lambda: ip.refit(llm, b, mode="later"),
        "bad_digest": lambda: ip.refit(llm, b, expected_digest="md5:0"),
        "bad_probe": lambda: ip.refit(llm, b, probe={"max_tokens": 0}),
        "too_small": lambda: ip.refit(llm, b, num_blocks=3),
        "bad_tensor_item": lambda: ip.refit(llm, [("x", 1)]),
    }.items():
        refusals[name] = _attempt(call)
    direct = _direct_reload_attempt(llm, b)
    if direct is not None:
        refusals["direct_reload"] = direct
    refusals["after"] = {"info": ip.weights_info(llm).to_dict(), "outputs": _outputs(llm)}
    rec["refusals"] = refusals

    # real failures after the start: fail closed, then a retry
    prompts = default_prompts(llm)
    wrong = Probe(prompts=prompts, expected_tokens=[[0, 0]] * len(prompts))
    rec["probe_mismatch"] = _attempt(lambda: ip.refit(llm, b, probe=wrong))
    rec["probe_mismatch_engine"] = _failed_engine(llm)
    right = rec["to_b"]["receipt"]["probe"]
    checkpoint(
        "probe_retry",
        ip.refit(
            llm,
            b,
            probe=Probe(
                prompts=prompts,
                expected_tokens=right["tokens"],
                expected_logprobs=right["logprobs"],
            ),
        ),
    )
    rec["digest_mismatch"] = _attempt(
        lambda: ip.refit(llm, a, expected_digest="sha256:" + "0" * 64)
    )
    rec["digest_mismatch_engine"] = _failed_engine(llm)
    checkpoint("digest_retry", ip.refit(llm, a, expected_digest=rec["start"]["digests"]))

    # a fault at every step; each retry refits to the other weights
    faults = []
    target = b
    for step in FAULT_STEPS if _runner_version() == "v1" else FAULT_STEPS_V2:
        with _fault(llm, step):
            res = _attempt(lambda target=target: ip.refit(llm, target))
        res["step"] = step
        res["engine"] = _failed_engine(llm)
        retry = ip.refit(llm, target)
        res["retry"] = {
            "receipt": retry.to_dict(),
            "outputs": _outputs(llm),
            "digests": _digests(llm),
            "hashes": tensor_hashes(llm),
            "weights": "b" if target == b else "a",
        }
        faults.append(res)
        target = a if target == b else b
    rec["faults"] = faults

    # one linear weight changed (its sign): the digest must see it, on CPU too (vLLM packs
    # linear weights into kernel handles there)
    rec["flipped_digests"] = list(ip.refit(llm, _flipped(b, tmp)).digests)

    # the loop: alternating refits, the workload between
    loop = []
    for i in range(LOOP[_runner_version()]):
        weights = b if i % 2 == 0 else a
        r = ip.refit(llm, weights)
        loop.append(
            {
                "weights": "b" if weights == b else "a",
                "digests": list(r.digests),
                "probe_ok": r.probe.ok,
                "outputs": _outputs(llm),
                "kv_allocations_alive": len(spy.alive()),
            }
        )
    rec["loop"] = loop
    rec["kv_allocations_alive_at_end"] = len(spy.alive())
    rec["params_kept_their_storage"] = _param_storages(llm) == params_at_start
    rec["final"] = _state(llm)
    llm.llm_engine.engine_core.shutdown()
    return rec


def main(out: str, weights_dir: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import tempfile

    from reliability.relkit import MRV2_ALLOCATOR, V1_ALLOCATOR, AllocationSpy

    from initpipe_vllm.testing.weights import seeded_model

    a = seeded_model(MODEL, weights_dir)
    b = seeded_model(MODEL, weights_dir, seed=1)
    extra = {"load_format": "auto"}
    allocators = (V1_ALLOCATOR, MRV2_ALLOCATOR) if _runner_version() == "v2" else (V1_ALLOCATOR,)
    result: dict[str, Any] = {"model_runner": _runner_version()}
    with tempfile.TemporaryDirectory(prefix="initpipe_refit_test_") as tmp:
        with AllocationSpy(allocators) as spy:
            result["engine"] = _engine_under_test(a, b, extra, spy, Path(tmp))
    result["fresh_a"] = _fresh(a, extra, SMALL)
    result["fresh_b"] = _fresh(b, extra, SMALL)
    result["fresh_b_large"] = _fresh(b, extra, LARGE)
    Path(out).write_text(json.dumps(result))


# -- the tests -----------------------------------------------------------------------------
@pytest.fixture(scope="module", params=RUNNERS)
def result(request: pytest.FixtureRequest, script_result: Any) -> Any:
    """The script's record, once per runner (MRv2 on Triton's interpreter)."""
    got = script_result(__file__, model_runner=request.param)
    assert got["model_runner"] == request.param
    return got


def _fresh_for(result: Any, weights: str, blocks: int = SMALL) -> Any:
    if weights == "b":
        return result["fresh_b" if blocks == SMALL else "fresh_b_large"]
    assert blocks == SMALL
    return result["fresh_a"]


def test_the_pipelined_engine_starts_as_a_fresh_stock_engine(result: Any) -> None:
    """Before any refit: stock's tokens and digest on A (a later mismatch is the refit's)."""
    start, fresh = result["engine"]["start"], _fresh_for(result, "a")
    assert start["outputs"] == fresh["outputs"]
    assert start["digests"] == fresh["digests"], differing(start["hashes"], fresh["hashes"])


def test_the_oracles_are_stock_vllm_and_the_engine_is_pipelined(result: Any) -> None:
    for key in ("fresh_a", "fresh_b", "fresh_b_large"):
        assert all(not pipelined for _cls, pipelined in result[key]["runner_classes"]), key
    assert all(pipelined for _cls, pipelined in result["engine"]["runner_classes"])
    # A and B are different weights: the proof below could not pass by accident
    assert result["fresh_a"]["outputs"] != result["fresh_b"]["outputs"]
    assert result["fresh_a"]["digests"] != result["fresh_b"]["digests"]


@pytest.mark.parametrize(
    ("checkpoint", "weights", "blocks"),
    [
        ("to_b", "b", SMALL),
        ("repaired_to_a", "a", SMALL),
        ("to_b_large", "b", LARGE),
        ("released_to_a", "a", SMALL),
        ("probe_retry", "b", SMALL),
        ("digest_retry", "a", SMALL),
    ],
)
def test_a_refitted_engine_is_a_fresh_engine_started_with_the_new_weights(
    result: Any, checkpoint: str, weights: str, blocks: int
) -> None:
    got, fresh = result["engine"][checkpoint], _fresh_for(result, weights, blocks)
    assert got["outputs"] == fresh["outputs"]  # tokens, logprobs, cached tokens
    assert got["digests"] == fresh["digests"], differing(got["hashes"], fresh["hashes"])
    assert got["digests"] == list(got["receipt"]["digests"])
    assert got["runner"] == fresh["runner"]
    assert got["scheduler"] == fresh["scheduler"]
    assert got["receipt"]["blocks_after"] == blocks


def test_the_probe_serves_what_a_fresh_engine_serves(result: Any) -> None:
    probe = result["engine"]["to_b"]["receipt"]["probe"]
    fresh = result["fresh_b"]["probe"]
    assert probe["ran"] and probe["ok"]
    assert [list(t) for t in probe["tokens"]] == fresh["tokens"]
    for got, want in zip(probe["logprobs"], fresh["logprobs"], strict=True):
        assert got == pytest.approx(want, abs=1e-4)
    # the warm run hit the blocks the cold run filled
    assert all(hit > 0 for hit in probe["cached_tokens"])


def test_no_prefix_cache_block_survives_a_refit(result: Any) -> None:
    eng = result["engine"]
    assert eng["stale_hashes_before"] > 0  # the cache held blocks before the refit
    assert eng["stale_hashes_after"] == 0
    assert "emptied and checked" in eng["to_b"]["receipt"]["caches"]["prefix_cache"]


def test_the_digest_sees_a_change_to_one_linear_weight(result: Any) -> None:
    flipped = result["engine"]["flipped_digests"]
    assert flipped and flipped != result["fresh_b"]["digests"]


def test_the_stale_cache_control_fails_where_a_refit_passes(result: Any) -> None:
    """vLLM's reload with no cache reset serves from blocks computed with B: the workload
    sees it (so the equality above would catch a refit that kept the cache)."""
    eng = result["engine"]
    assert eng["stale_control"]["outputs"] != result["fresh_a"]["outputs"]
    assert eng["repaired_to_a"]["outputs"] == result["fresh_a"]["outputs"]


def test_the_receipt_lists_every_step_with_its_time_and_bytes(result: Any) -> None:
    receipt = result["engine"]["to_b"]["receipt"]
    names = [s["name"] for s in receipt["steps"]]
    assert names == [
        "plan",
        "pause",
        "teardown",
        "load",
        "verify",
        "digest",
        "kv_phase",
        "warmup",
        "scheduler",
        "caches",
        "probe",
    ]
    assert all(s["ok"] and s["ms"] >= 0 for s in receipt["steps"])
    moved = {s["name"]: s["bytes"] for s in receipt["steps"]}
    assert moved["load"] == receipt["weights"]["bytes"] > 0
    assert moved["teardown"] == moved["kv_phase"] == sum(receipt["kv_bytes_per_rank"]) > 0
    assert moved["digest"] > 0
    assert receipt["version"] == "B-1" and receipt["previous_version"] == "default"
    assert receipt["model_runner"] == result["model_runner"]
    assert receipt["weights"]["checked_against"]  # the starting checkpoint
    released = result["engine"]["released_to_a"]["receipt"]
    assert [s["name"] for s in released["steps"]][2] == "load"  # nothing to tear down
    assert released["blocks_before"] == 0


def test_the_version_is_vllms_weight_version(result: Any) -> None:
    eng = result["engine"]
    assert eng["to_b"]["info"]["version"] == "B-1"
    assert eng["to_b"]["info"]["state"] == "serving"
    assert eng["repaired_to_a"]["info"]["version"].startswith("refit-")


@pytest.mark.parametrize(
    "case",
    [
        "missing_tensor",
        "unexpected_tensor",
        "wrong_shape",
        "wrong_dtype",
        "empty",
        "not_safetensors",
        "no_folder",
    ],
)
def test_bad_weights_are_refused_before_anything_changes(result: Any, case: str) -> None:
    err = result["engine"]["refusals"][case]["error"]
    assert err is not None and err["type"] == "RefitRefusedError"
    assert err["step"] == "weights" and err["serving"] is True
    assert "Nothing changed" in err["message"]
    named = {
        "missing_tensor": "missing tensor",
        "unexpected_tensor": "unexpected tensor 'model.extra.weight'",
        "wrong_shape": "has shape",
        "wrong_dtype": "has dtype int32, expected float32",
    }
    if case in named:
        assert named[case] in err["message"]


@pytest.mark.parametrize(
    "case",
    [
        "not_weights",
        "both_sizes",
        "bad_mode",
        "bad_digest",
        "bad_probe",
        "too_small",
        "bad_tensor_item",
    ],
)
def test_bad_arguments_are_refused_before_anything_changes(result: Any, case: str) -> None:
    err = result["engine"]["refusals"][case]["error"]
    assert err is not None and err["type"] == "RefitRefusedError", err
    assert err["step"] in ("arguments", "planning", "weights")


def test_vllms_direct_reload_is_refused_before_anything_changes(result: Any) -> None:
    """0.34's ``VLLM_RELOAD_MODE=direct`` bypasses the layerwise reload a refit checks its
    load against: refused by name, still serving (the next test: serving as before)."""
    refusals = result["engine"]["refusals"]
    if "direct_reload" not in refusals:
        pytest.skip("this vLLM has no direct reload (0.34.0 added VLLM_RELOAD_MODE)")
    err = refusals["direct_reload"]["error"]
    assert err is not None and err["type"] == "RefitRefusedError", err
    assert "VLLM_RELOAD_MODE=direct" in err["message"] and err["serving"] is True


def test_after_the_refusals_the_engine_serves_its_weights_as_before(result: Any) -> None:
    after = result["engine"]["refusals"]["after"]
    assert after["info"]["state"] == "serving"
    assert after["outputs"] == result["fresh_a"]["outputs"]


def _assert_failed_closed(engine: Any, step: str) -> None:
    assert engine["info"]["state"] == "failed"
    assert engine["info"]["failure"]["step"] == step
    assert engine["info"]["digests"] == []
    assert engine["kv"]["state"] == "failed" and engine["kv"]["num_blocks"] == 0
    gen = engine["generate"]["error"]
    assert gen is not None and "RefitFailedError" in gen["classes"]
    assert repr(step) in gen["message"]
    assert not engine["unfinished"]  # refused, not left waiting
    for call in ("resize", "resume"):
        assert engine[call]["error"]["type"] == "ResizeRefusedError"
        assert "refit" in engine[call]["error"]["message"]


def test_a_probe_that_disagrees_fails_the_refit_closed(result: Any) -> None:
    eng = result["engine"]
    err = eng["probe_mismatch"]["error"]
    assert err["type"] == "RefitError" and err["step"] == "probe" and err["serving"] is False
    assert "expected [0, 0]" in err["message"]
    _assert_failed_closed(eng["probe_mismatch_engine"], "probe")
    assert eng["probe_retry"]["receipt"]["probe"]["checked_expected"]


def test_a_digest_that_differs_fails_the_refit_closed(result: Any) -> None:
    eng = result["engine"]
    err = eng["digest_mismatch"]["error"]
    assert err["type"] == "RefitError" and err["step"] == "digest"
    assert "differs from the expected" in err["message"]
    _assert_failed_closed(eng["digest_mismatch_engine"], "digest")
    assert eng["digest_retry"]["receipt"]["digest_checked"]


def test_a_fault_at_any_step_fails_closed_and_a_retry_succeeds(result: Any) -> None:
    faults = result["engine"]["faults"]
    steps = FAULT_STEPS if result["model_runner"] == "v1" else FAULT_STEPS_V2
    assert [f["step"] for f in faults] == list(steps)
    for res in faults:
        step, err = res["step"], res["error"]
        assert err is not None and err["type"] == "RefitError", res
        assert err["step"] == step and err["serving"] is False, step
        assert "injected fault" in err["message"] or step in ("kv_phase", "caches"), step
        _assert_failed_closed(res["engine"], step)
        retry = res["retry"]
        fresh = _fresh_for(result, retry["weights"])
        assert retry["outputs"] == fresh["outputs"], step
        assert retry["digests"] == fresh["digests"], (
            step,
            differing(retry["hashes"], fresh["hashes"]),
        )


def test_twenty_alternating_refits_equal_fresh_engines_and_leak_nothing(result: Any) -> None:
    loop = result["engine"]["loop"]
    assert len(loop) == LOOP[result["model_runner"]]
    for i, step in enumerate(loop):
        fresh = _fresh_for(result, step["weights"])
        assert step["outputs"] == fresh["outputs"], i
        assert step["digests"] == fresh["digests"], i
        assert step["probe_ok"], i
        assert step["kv_allocations_alive"] == 1, i
    eng = result["engine"]
    assert eng["kv_allocations_alive_at_end"] == 1
    assert eng["params_kept_their_storage"]


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
