"""Stock vs pipelined equivalence harness: ``python -m initpipe_vllm.equivalence --model DIR``.

What belongs here: starting a real vLLM engine twice on a local model folder — once with
the stock worker, once with ``initpipe_vllm.worker.PipelinedWorker`` — running the same
short workload, re-initializing the KV cache the way vLLM's CUDA-graph profiling pass does
(cleanup, minimal profiling KV cache, cleanup, real KV cache), and comparing tokens (or
pooled outputs) and :func:`~initpipe_vllm.snapshot.runner_snapshot` exactly at each step.
Replaces nothing in vLLM; it checks the catalog against ``GPUModelRunner.initialize_kv_cache``
(``vllm/v1/worker/gpu_model_runner.py``).

A model folder may hold ``initpipe.json`` with ``{"llm_kwargs": {...}, "task": "generate" |
"embed"}`` for model-specific engine arguments; ``{engine_tmp}`` in it becomes a fresh
temporary folder per engine (e.g. a KV connector's storage).
Defaults: dummy weights, no tokenizer, eager, float32, 8 MiB of KV cache, CPU target.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from initpipe.files import write_file

__all__ = ["compare_model", "engine_kwargs", "main"]

PROMPTS_A = [[1, 5, 9, 30, 7], [3, 4, 11, 2, 90, 17, 5, 6, 8]]
PROMPTS_B = [[8, 8, 1, 44], [100, 101, 102]]


def engine_kwargs(
    model_dir: str | os.PathLike[str], **overrides: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """LLM keyword arguments for a tiny local model, and its ``initpipe.json`` options."""
    model_dir = Path(model_dir)
    opts_file = model_dir / "initpipe.json"
    text = opts_file.read_text() if opts_file.exists() else "{}"
    if "{engine_tmp}" in text:  # a fresh folder per engine (e.g. a connector's storage)
        text = text.replace("{engine_tmp}", tempfile.mkdtemp(prefix="initpipe_engine_"))
    opts = json.loads(text)
    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "enforce_eager": True,
        "dtype": "float32",
        "max_model_len": 256,
        "max_num_seqs": 4,
        "seed": 0,
        "kv_cache_memory_bytes": 8 << 20,
    }
    kwargs.update(opts.get("llm_kwargs", {}))
    kwargs.update(overrides)
    return kwargs, opts


# -- functions run inside the worker (collective_rpc passes the worker first) -------------
def _snapshot(worker: Any) -> dict[str, Any]:
    from .snapshot import runner_snapshot

    return runner_snapshot(worker.model_runner)


def _runner_meta(worker: Any) -> dict[str, Any]:
    runner = worker.model_runner
    run = getattr(runner, "initpipe_run", None)
    return {
        "runner_class": type(runner).__name__,
        "kv_generation": None if run is None else run.kv_generation,
        "stages_completed": None if run is None else run.completed("kv_cache_config"),
        "kv_connector_registered": (
            None if run is None else run.outputs.get("kv_connector_registration")
        ),
    }


def _reinitialize(worker: Any) -> dict[str, Any]:
    """Cleanup, vLLM's minimal profiling KV cache, cleanup, then the real KV cache again."""
    from ..hook.runner import engine_kv_cache_config
    from .snapshot import runner_snapshot

    runner = worker.model_runner
    cfg = engine_kv_cache_config(runner)
    num_blocks = runner.cache_config.num_gpu_blocks
    _profiling_cleanup(runner)
    out = {"cleaned": runner_snapshot(runner, blocks=False)}
    try:
        _minimal_profiling_kv_cache(runner)
        out["profiling"] = runner_snapshot(runner)
    finally:
        _profiling_cleanup(runner)
    out["cleaned_after_profiling"] = runner_snapshot(runner, blocks=False)
    runner.cache_config.num_gpu_blocks = num_blocks
    runner.initialize_kv_cache(cfg)
    if cfg.needs_kv_cache_zeroing:  # what Worker.initialize_from_config does next
        runner._init_kv_zero_meta()
    out["reinitialized"] = runner_snapshot(runner)
    return out


def _profiling_cleanup(runner: Any) -> None:
    """The end of vLLM's ``profile_cudagraph_memory``: clear the dispatcher keys, then
    ``_cleanup_profiling_kv_cache()`` (which, stock or pipelined, leaves the keys)."""
    for key_set in runner.cudagraph_dispatcher.cudagraph_keys.values():
        key_set.clear()
    runner.cudagraph_dispatcher.keys_initialized = False
    runner._cleanup_profiling_kv_cache()


def _minimal_profiling_kv_cache(runner: Any) -> None:
    """vLLM's ``_init_minimal_kv_cache_for_profiling``, runnable on CPU.

    Same steps; only the block count differs where vLLM's ``min(max_num_reqs,
    max_cudagraph_capture_size)`` fails because the CPU platform leaves no capture sizes.
    """
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups, get_kv_cache_groups
    from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

    spec = runner.get_kv_cache_spec()
    KVCacheSpecRegistry.check_kv_cache_spec_registry(spec)
    groups = get_kv_cache_groups(runner.vllm_config, spec)
    capture = runner.compilation_config.max_cudagraph_capture_size
    min_blocks = (
        min(runner.max_num_reqs, capture if capture is not None else runner.max_num_reqs) or 1
    )
    saved = runner.cache_config.num_gpu_blocks_override
    runner.cache_config.num_gpu_blocks_override = min_blocks
    try:
        minimal = get_kv_cache_config_from_groups(runner.vllm_config, groups, available_memory=0)
    finally:
        runner.cache_config.num_gpu_blocks_override = saved
    runner.initialize_kv_cache(minimal, is_profiling=True)
    runner.cache_config.num_gpu_blocks = minimal.num_blocks


def _workload(llm: Any, task: str, prompts: list[list[int]]) -> list[Any]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    tps = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    if task == "embed":
        return [list(o.outputs.embedding) for o in llm.embed(tps, use_tqdm=False)]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, detokenize=False)
    return [list(o.outputs[0].token_ids) for o in llm.generate(tps, params, use_tqdm=False)]


def run_engine(
    model_dir: str | Path, *, pipelined: bool, reinit: bool = True, **overrides: Any
) -> dict[str, Any]:
    """Start one engine, run the workload and return outputs plus snapshots."""
    from vllm import LLM

    kwargs, opts = engine_kwargs(model_dir, **overrides)
    if pipelined:
        from ..hook import PIPELINED_WORKER

        kwargs["worker_cls"] = PIPELINED_WORKER
    task = opts.get("task", "generate")
    llm = LLM(**kwargs)
    try:
        result: dict[str, Any] = {"init": llm.collective_rpc(_snapshot)[0]}
        result["outputs_a"] = _workload(llm, task, PROMPTS_A)
        result["after_a"] = llm.collective_rpc(_snapshot)[0]
        if reinit:
            result.update(llm.collective_rpc(_reinitialize)[0])
            llm.reset_prefix_cache()
            result["outputs_b"] = _workload(llm, task, PROMPTS_B)
            result["after_b"] = llm.collective_rpc(_snapshot)[0]
        return {"meta": llm.collective_rpc(_runner_meta)[0], **result}
    finally:
        core = getattr(llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm
        gc.collect()


def compare_model(
    model_dir: str | Path, *, reinit: bool = True, **overrides: Any
) -> dict[str, Any]:
    """Run stock then pipelined on ``model_dir``; return ``{"equal", "diffs", ...}``."""
    from .snapshot import stock_differences

    stock = run_engine(model_dir, pipelined=False, reinit=reinit, **overrides)
    piped = run_engine(model_dir, pipelined=True, reinit=reinit, **overrides)
    meta = {"stock": stock.pop("meta"), "pipelined": piped.pop("meta")}
    # Stock's zeroer predates the teardowns at these checkpoints (the deliberate difference)
    torn = {"cleaned", "profiling", "cleaned_after_profiling"}
    diffs = []
    for key in sorted(set(stock) | set(piped)):
        if key not in stock or key not in piped:
            diffs.append(f"/{key}: only in {'stock' if key in stock else 'pipelined'}")
        else:
            diffs += stock_differences(stock[key], piped[key], f"/{key}", torn_down=key in torn)
    if not meta["pipelined"]["runner_class"].startswith("Pipelined"):
        diffs.append(f"/meta: the pipelined engine ran {meta['pipelined']['runner_class']}")
    return {
        "model": str(model_dir),
        "equal": not diffs,
        "diffs": diffs,
        "outputs": stock.get("outputs_a"),
        "meta": meta,
        "stock": stock,
        "pipelined": piped,
    }


def main(argv: list[str] | None = None) -> int:
    """Compare stock and pipelined vLLM on each ``--model``; exit 1 on any difference."""
    parser = argparse.ArgumentParser(
        prog="python -m initpipe_vllm.equivalence", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        help="a local model folder (config.json); repeatable",
    )
    parser.add_argument("--json", metavar="PATH", help="write the full report as JSON")
    parser.add_argument(
        "--no-reinit", action="store_true", help="skip the KV re-initialization pass"
    )
    parser.add_argument(
        "--multiprocess",
        action="store_true",
        help="run the engine core and worker in separate processes",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if args.multiprocess else "0"
    if args.multiprocess:
        # collective_rpc ships the snapshot functions to the worker process by pickle.
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    reports = []
    for model in args.model:
        try:
            rep = compare_model(model, reinit=not args.no_reinit)
        except Exception as err:  # report and go on with the next model
            rep = {
                "model": model,
                "equal": False,
                "error": f"{type(err).__name__}: {err}",
                "diffs": [],
            }
        reports.append(rep)
        status = (
            "EQUAL"
            if rep["equal"]
            else ("ERROR " + rep["error"] if "error" in rep else f"DIFFERENT ({len(rep['diffs'])})")
        )
        print(f"{model}: {status}", flush=True)
        for line in rep["diffs"][:20]:
            print(f"  {line}", flush=True)
    if args.json:
        write_file(args.json, json.dumps(reports, default=repr, indent=1))
    return 0 if all(r["equal"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
