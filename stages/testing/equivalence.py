"""Stock vs pipelined vLLM, compared exactly: ``python -m initpipe_vllm.testing.equivalence``.

What belongs here: starting a real vLLM engine twice on a local model folder — once with
the stock worker, once with ``initpipe_vllm.worker.PipelinedWorker`` — running the same
KV-sensitive workload, re-initializing the KV cache the way vLLM's CUDA-graph profiling
pass does (cleanup, minimal profiling KV cache, cleanup, real KV cache), and comparing
tokens, logprobs (or pooled outputs) and :func:`~initpipe_vllm.snapshot.runner_snapshot`
exactly at each step. Replaces nothing in vLLM; it checks the catalog against
``GPUModelRunner.initialize_kv_cache`` (``vllm/v1/worker/gpu_model_runner.py``).

Weights: a model folder with its own checkpoint (``*.safetensors``: :func:`has_own_weights`)
is loaded from it, in its config's dtype; any other folder gets seeded real weights
(:func:`~initpipe_vllm.testing.weights.seeded_model`, in ``--weights-dir`` or a temporary
folder removed afterwards), loaded by vLLM's normal loader. ``--dummy-weights`` keeps
vLLM's ``load_format="dummy"``, whose ±1e-3 weights make attention uniform: outputs then do
not depend on the KV cache, and a wrong KV layout goes unnoticed.

Workload (:func:`run_workload`), sized from the running engine's own KV groups: a prompt
longer than the prefix-cache unit (the lcm of the groups' block sizes), greedy, with
top-2 logprobs for the prompt and each generated token; then a second request repeating
its first 1.25 units, which must hit the prefix cache (``num_cached_tokens > 0``)
where vLLM left prefix caching on. Where vLLM turned it off, the report keeps vLLM's
setting and the lines vLLM logged about it. Prefill runs in steps of ``PREFILL_STEP``
tokens, so later steps read the KV that earlier steps wrote.

A model folder may hold ``initpipe.json`` with ``{"llm_kwargs": {...}, "task": "generate" |
"embed"}`` for model-specific engine arguments; ``{engine_tmp}`` in it becomes a fresh
temporary folder per engine (e.g. a KV connector's storage).
Defaults: no tokenizer, eager, float32, 8 MiB of KV cache, CPU target.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import math
import os
import random
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from initpipe.files import write_file

from ..hook.adapter import which_runner

#: KV cache sizes by default: a toy's 8 MiB; a model with its own weights 64 MiB (about
#: 2,900 tokens of SmolLM2-135M's 30 layers in bfloat16; 8 MiB would not hold one
#: ``MAX_MODEL_LEN`` request).
TOY_KV_BYTES = 8 << 20
REAL_KV_BYTES = 64 << 20

__all__ = [
    "MAX_MODEL_LEN",
    "PREFILL_STEP",
    "REAL_KV_BYTES",
    "TOY_KV_BYTES",
    "compare_model",
    "engine_kwargs",
    "loadable_model",
    "main",
    "parallel_engine_kwargs",
    "run_requests",
    "run_workload",
    "runner_snapshot",
    "workload_engine_kwargs",
    "workload_problems",
    "workload_requests",
]

#: Room for prompts past the largest prefix-cache unit (256 tokens for Gemma4 here).
MAX_MODEL_LEN = 512
#: Chunked-prefill step (``max_num_batched_tokens``) for generating models. Steps that
#: cross a block boundary read back the KV earlier steps wrote; and vLLM 0.32's CPU Mamba2
#: kernel returns only final states (it ignores ``return_intermediate_states``), so an
#: align-mode prefix-caching step spanning two SSD chunks fails (IndexError in
#: ``MambaMixer2.conv_ssm_forward``): 64 is the tiny Mamba2 config's chunk size.
PREFILL_STEP = 64
_MAX_TOKENS = 6
_TOP_LOGPROBS = 2
_SALT_A, _SALT_B = 1, 2


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
        "kv_cache_memory_bytes": TOY_KV_BYTES,
    }
    kwargs.update(opts.get("llm_kwargs", {}))
    kwargs.update(overrides)
    return kwargs, opts


def workload_engine_kwargs(
    model_dir: str | os.PathLike[str], **overrides: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`engine_kwargs` plus what :func:`run_workload` needs.

    That is ``max_model_len=MAX_MODEL_LEN`` and, for generating models,
    ``max_num_batched_tokens=PREFILL_STEP``; ``overrides`` win over both.
    """
    kwargs, opts = engine_kwargs(model_dir)
    kwargs["max_model_len"] = MAX_MODEL_LEN
    if opts.get("task", "generate") == "generate":
        kwargs["max_num_batched_tokens"] = PREFILL_STEP
    kwargs.update(overrides)
    return kwargs, opts


def has_own_weights(model_dir: str | os.PathLike[str]) -> bool:
    """Whether ``model_dir`` holds a checkpoint of its own (``*.safetensors``), which the
    comparison then loads (``weights="real"``) instead of seeded weights."""
    return any(Path(model_dir).glob("*.safetensors"))


@contextlib.contextmanager
def loadable_model(
    model_dir: str | os.PathLike[str],
    *,
    weights: str = "seeded",
    weights_dir: str | os.PathLike[str] | None = None,
) -> Iterator[tuple[Path, dict[str, Any]]]:
    """The folder to start an engine on, and the engine arguments its weights need.

    Args:
        model_dir: A tiny model folder (``config.json``).
        weights: ``"seeded"`` (real seeded weights, see
            :func:`~initpipe_vllm.testing.weights.seeded_model`), ``"dummy"`` (vLLM's
            ``load_format="dummy"`` on ``model_dir`` itself) or ``"real"`` (the folder's
            own checkpoint, in its config's dtype).
        weights_dir: Where seeded weights are cached; ``None``: a temporary folder,
            removed when the context exits.

    Yields:
        ``(folder, overrides)``: pass ``overrides`` to :func:`workload_engine_kwargs`.

    Raises:
        ValueError: ``weights`` is not one of those three.
    """
    if weights == "dummy":
        yield Path(model_dir), {"load_format": "dummy"}
        return
    if weights == "real":  # the folder's own checkpoint, in the dtype its config names
        yield Path(model_dir), {"load_format": "auto", "dtype": "auto"}
        return
    if weights != "seeded":
        msg = f"weights={weights!r}: expected 'seeded', 'dummy' or 'real'"
        raise ValueError(msg)
    from .weights import seeded_model

    with contextlib.ExitStack() as stack:
        cache = weights_dir
        if cache is None:
            cache = stack.enter_context(tempfile.TemporaryDirectory(prefix="initpipe_weights_"))
        yield seeded_model(model_dir, cache), {"load_format": "auto"}


@contextlib.contextmanager
def _vllm_log_lines(needle: str) -> Iterator[list[str]]:
    """Collect vLLM's log messages containing ``needle`` (any level, DEBUG included).

    vLLM's handlers keep their own level, so nothing extra is printed. vLLM configures its
    logging when the first engine starts, after the config (where prefix caching is
    decided) is built, replacing the ``vllm`` logger's handlers; so it is configured here
    first, with the default settings the engine would apply. Where vLLM's logging is
    configured otherwise, or not at all, fewer lines may be seen.
    """
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging_if_needed

    configure_logging_if_needed(LoggingConfig())
    lines: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage()
            if needle in text.lower() and text not in lines:
                lines.append(text)

    logger = logging.getLogger("vllm")
    saved_level = logger.level
    shown = logger.getEffectiveLevel()
    saved = [(h, h.level) for h in logger.handlers]
    keep = _Keep(logging.DEBUG)
    logger.addHandler(keep)
    if not logger.propagate:
        for handler, level in saved:
            handler.setLevel(max(level, shown))
        logger.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        logger.removeHandler(keep)
        logger.setLevel(saved_level)
        for handler, level in saved:
            handler.setLevel(level)


# -- functions run inside the worker (collective_rpc passes the worker first) -------------
def _snapshot(worker: Any) -> dict[str, Any]:
    return runner_snapshot(worker.model_runner)


def runner_snapshot(runner: Any, *, blocks: bool = True) -> dict[str, Any]:
    """The runner's snapshot: v1's :func:`~.snapshot.runner_snapshot` or Model Runner V2's
    :func:`~.snapshot_v2.runner_snapshot_v2`, by the runner's adapter."""
    if which_runner(runner).runner == "v2":
        from .snapshot_v2 import runner_snapshot_v2

        return runner_snapshot_v2(runner, blocks=blocks)
    from .snapshot import runner_snapshot as v1_snapshot

    return v1_snapshot(runner, blocks=blocks)


def _runner_meta(worker: Any) -> dict[str, Any]:
    runner = worker.model_runner
    run = getattr(runner, "initpipe_run", None)
    return {
        "runner_class": type(runner).__name__,
        "runner_version": which_runner(runner).runner,
        "kv_generation": None if run is None else run.kv_generation,
        "stages_completed": None if run is None else run.completed("kv_cache_config"),
        "kv_connector_registered": (
            None if run is None else run.outputs.get("kv_connector_registration")
        ),
    }


def _reinitialize(worker: Any) -> dict[str, Any]:
    """Cleanup, vLLM's minimal profiling KV cache, cleanup, then the real KV cache again."""
    runner = worker.model_runner
    cfg = which_runner(runner).engine_kv_cache_config(runner)
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
    """The end of vLLM's ``profile_cudagraph_memory``.

    v1: clear the dispatcher keys, then ``_cleanup_profiling_kv_cache()`` (which, stock or
    pipelined, leaves the keys). Model Runner V2: its module function
    ``_teardown_profiling_state`` (stock), or the pipelined runner's
    ``initpipe_teardown_profiling_state`` (what its ``profile_cudagraph_memory`` calls in its
    place); MRv2's ``profile_cudagraph_memory`` itself never runs on CPU.
    """
    if which_runner(runner).runner == "v2":
        if hasattr(runner, "initpipe_teardown_profiling_state"):
            runner.initpipe_teardown_profiling_state()
        else:
            from vllm.v1.worker.gpu.cudagraph_utils import _teardown_profiling_state

            _teardown_profiling_state(runner)
        return
    for key_set in runner.cudagraph_dispatcher.cudagraph_keys.values():
        key_set.clear()
    runner.cudagraph_dispatcher.keys_initialized = False
    runner._cleanup_profiling_kv_cache()


def _minimal_profiling_kv_cache(runner: Any) -> None:
    """vLLM's ``_init_minimal_kv_cache_for_profiling``, runnable on CPU.

    Same steps; only the block count differs where vLLM's ``min(max_num_reqs,
    max_cudagraph_capture_size)`` fails because the CPU platform leaves no capture sizes.
    """
    from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

    from ..compat import kv_cache_config_from_groups, kv_cache_groups

    spec = runner.get_kv_cache_spec()
    KVCacheSpecRegistry.check_kv_cache_spec_registry(spec)
    groups = kv_cache_groups(runner.vllm_config, spec)
    capture = runner.compilation_config.max_cudagraph_capture_size
    min_blocks = (
        min(runner.max_num_reqs, capture if capture is not None else runner.max_num_reqs) or 1
    )
    minimal = kv_cache_config_from_groups(runner.vllm_config, groups, num_blocks=min_blocks)
    runner.initialize_kv_cache(minimal, is_profiling=True)
    runner.cache_config.num_gpu_blocks = minimal.num_blocks


def _kv_facts(worker: Any) -> dict[str, Any]:
    """What the workload is sized from: the engine's KV groups and prefix-caching setting."""
    runner = worker.model_runner
    cache = runner.cache_config
    kvc = getattr(runner, "kv_cache_config", None)
    groups = [] if kvc is None else kvc.kv_cache_groups
    return {
        "block_size": cache.block_size,
        "group_block_sizes": [g.kv_cache_spec.block_size for g in groups],
        "enable_prefix_caching": bool(cache.enable_prefix_caching),
        "mamba_cache_mode": getattr(cache, "mamba_cache_mode", None),
        "kv_sharing_fast_prefill": bool(getattr(cache, "kv_sharing_fast_prefill", False)),
        "max_model_len": runner.max_model_len,
        "vocab_size": runner.model_config.get_vocab_size(),
    }


def workload_requests(facts: dict[str, Any], salt: int) -> list[dict[str, Any]]:
    """The workload's two requests for an engine described by ``facts``.

    ``unit`` is the prefix-cache granularity, the lcm of the KV groups' block sizes.
    ``long`` has ``1.5 * unit + 3`` tokens and asks for prompt logprobs (so it never
    reads the prefix cache), unless ``kv_sharing_fast_prefill`` is on (vLLM's runner
    refuses prompt logprobs then); ``repeated_prefix`` repeats its first ``1.25 * unit``
    tokens and then differs, so ``unit`` tokens of it are found in the prefix cache.

    Raises:
        ValueError: the prompts do not fit the engine's ``max_model_len``.
    """
    unit = math.lcm(facts["block_size"], *facts["group_block_sizes"])
    n_long = unit + unit // 2 + 3
    if n_long + _MAX_TOKENS > facts["max_model_len"]:
        msg = (
            f"the workload needs {n_long + _MAX_TOKENS} tokens (prefix-cache unit {unit}) "
            f"but the engine's max_model_len is {facts['max_model_len']}: pass a larger "
            "max_model_len"
        )
        raise ValueError(msg)
    rng = random.Random(salt)
    vocab = facts["vocab_size"]
    long = [rng.randrange(3, vocab) for _ in range(n_long)]
    tail = [rng.randrange(3, vocab) for _ in range(unit // 8 + 2)]
    return [
        {"name": "long", "prompt": long, "prompt_logprobs": not facts["kv_sharing_fast_prefill"]},
        {"name": "repeated_prefix", "prompt": long[: unit + unit // 4] + tail},
    ]


def _logprobs(seq: Any) -> Any:
    """vLLM's per-position ``{token: Logprob}`` dicts as ``[[token, logprob, rank], ...]``."""
    if seq is None:
        return None
    return [
        None
        if pos is None
        else [
            [tok, lp.logprob, lp.rank]
            for tok, lp in sorted(pos.items(), key=lambda kv: (kv[1].rank or 0, kv[0]))
        ]
        for pos in seq
    ]


def run_requests(llm: Any, task: str, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run ``requests`` one call each, in order, so a later one can hit an earlier one's
    prefix-cache blocks; return tokens, logprobs (or embeddings) and ``num_cached_tokens``."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    outs = []
    for req in requests:
        prompt = TokensPrompt(prompt_token_ids=req["prompt"])
        rec: dict[str, Any] = {"name": req["name"], "prompt_tokens": len(req["prompt"])}
        if task == "embed":
            (out,) = llm.embed([prompt], use_tqdm=False)
            rec["embedding"] = list(out.outputs.embedding)
        else:
            params = SamplingParams(
                max_tokens=_MAX_TOKENS,
                temperature=0.0,
                ignore_eos=True,
                detokenize=False,
                logprobs=_TOP_LOGPROBS,
                prompt_logprobs=_TOP_LOGPROBS if req.get("prompt_logprobs") else None,
            )
            (out,) = llm.generate([prompt], params, use_tqdm=False)
            rec["token_ids"] = list(out.outputs[0].token_ids)
            rec["logprobs"] = _logprobs(out.outputs[0].logprobs)
            rec["prompt_logprobs"] = _logprobs(out.prompt_logprobs)
        rec["num_cached_tokens"] = out.num_cached_tokens
        outs.append(rec)
    return outs


def run_workload(llm: Any, task: str, *, salt: int) -> dict[str, Any]:
    """Size the workload from the running engine, run it, return facts and outputs."""
    facts = llm.collective_rpc(_kv_facts)[0]
    return {"facts": facts, "outputs": run_requests(llm, task, workload_requests(facts, salt))}


def _numbers(value: Any) -> Iterator[float]:
    if isinstance(value, float):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _numbers(v)


def workload_problems(result: dict[str, Any]) -> list[str]:
    """What makes a :func:`run_workload` result unable to see the KV cache, as lines."""
    facts, outs = result["facts"], result["outputs"]
    block = max([facts["block_size"], *facts["group_block_sizes"]])
    problems = [
        f"{o['name']}: {o['prompt_tokens']} prompt tokens do not exceed one KV block ({block})"
        for o in outs
        if o["prompt_tokens"] <= block
    ]
    for o in outs:
        values = [o.get(k) for k in ("embedding", "logprobs", "prompt_logprobs")]
        if not all(math.isfinite(x) for x in _numbers(values)):
            problems.append(f"{o['name']}: non-finite logprobs or embedding")
    hit = outs[-1]["num_cached_tokens"]
    if facts["enable_prefix_caching"] and not hit:
        problems.append("prefix caching is on but the repeated prefix hit no cached tokens")
    if not facts["enable_prefix_caching"] and hit:
        problems.append(f"prefix caching is off but {hit} tokens came from the cache")
    return problems


def _ranks(results: list[Any]) -> Any:
    """One worker's result as it is; several workers' as ``{"rank0": ..., "rank1": ...}``
    (``collective_rpc`` answers in rank order), so each rank is compared with its peer."""
    if len(results) == 1:
        return results[0]
    return {f"rank{i}": r for i, r in enumerate(results)}


def parallel_engine_kwargs(
    tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1
) -> dict[str, Any]:
    """Engine arguments for several workers: vLLM's multiprocess executor, and for pipeline
    parallelism ``enforce_eager=False``: vLLM 0.32's ``CPUModelRunner.warming_up_model``
    returns early in eager mode, so the dummy run that creates ``intermediate_tensors``
    never runs and the first step of a later PP rank fails — stock vLLM too."""
    world = tensor_parallel_size * pipeline_parallel_size
    if world == 1:
        return {}
    out: dict[str, Any] = {
        "tensor_parallel_size": tensor_parallel_size,
        "pipeline_parallel_size": pipeline_parallel_size,
        "distributed_executor_backend": "mp",
    }
    if pipeline_parallel_size > 1:
        out["enforce_eager"] = False
    return out


def run_engine(
    model_dir: str | Path, *, pipelined: bool, reinit: bool = True, **overrides: Any
) -> dict[str, Any]:
    """Start one engine, run the workload and return outputs plus snapshots (every rank's,
    as ``{"rank0": ..., ...}``, when there are several workers).

    Before the engine starts, the process globals a previous engine of this process may
    have set are reset to their import-time values
    (:func:`~.process_globals.reset_process_globals`), so neither side inherits the
    other's. The stock engine starts inside :func:`~.stock.stock_environment` (the
    ``INITPIPE_VLLM`` opt-in unset, else ``worker_cls="auto"`` would give it the pipelined
    worker); ``meta["runners"]`` records each rank's ``(runner class, pipelined?)``.
    """
    from vllm import LLM

    from .process_globals import reset_process_globals
    from .stock import runner_classes, stock_environment

    kwargs, opts = workload_engine_kwargs(model_dir, **overrides)
    if pipelined:
        from ..hook import PIPELINED_WORKER

        kwargs["worker_cls"] = PIPELINED_WORKER
    task = opts.get("task", "generate")
    reset_process_globals()
    environment = contextlib.nullcontext() if pipelined else stock_environment()
    with _vllm_log_lines("prefix caching") as log, environment:
        llm = LLM(**kwargs)
    result: dict[str, Any] = {}
    try:
        result["init"] = _ranks(llm.collective_rpc(_snapshot))
        result["outputs_a"] = run_workload(llm, task, salt=_SALT_A)
        result["after_a"] = _ranks(llm.collective_rpc(_snapshot))
        if reinit:
            steps = llm.collective_rpc(_reinitialize)
            result.update({k: _ranks([r[k] for r in steps]) for k in steps[0]})
            llm.reset_prefix_cache()
            result["outputs_b"] = run_workload(llm, task, salt=_SALT_B)
            result["after_b"] = _ranks(llm.collective_rpc(_snapshot))
        metas = llm.collective_rpc(_runner_meta)
        meta = {
            **metas[0],
            "runner_classes": [m["runner_class"] for m in metas],
            "runners": [list(r) for r in runner_classes(llm)],
            "prefix_caching_log": log,
        }
        return {"meta": meta, **result}
    except Exception as err:  # keep what was taken before it failed, for the comparison
        with contextlib.suppress(Exception):  # the runner's state now, before the shutdown
            result["at_failure"] = _ranks(llm.collective_rpc(_snapshot))
        raise EngineRunError(str(err), partial=result) from err
    finally:
        core = getattr(llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm
        gc.collect()


def compare_model(
    model_dir: str | Path,
    *,
    reinit: bool = True,
    weights: str = "seeded",
    weights_dir: str | os.PathLike[str] | None = None,
    model_runner: str | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Run stock then pipelined on ``model_dir``; return ``{"equal", "diffs", ...}``.

    Args:
        model_dir: A model folder (``config.json``; its own ``*.safetensors`` with
            ``weights="real"``).
        reinit: Also re-initialize the KV cache and run a second workload.
        model_runner: ``"v1"`` or ``"v2"``: the runner both engines must have run (a
            difference is reported otherwise); None: whichever vLLM chose.
        weights: ``"seeded"``, ``"dummy"`` or ``"real"`` (see :func:`loadable_model`).
        weights_dir: Cache folder for seeded weights (``None``: a temporary one).
        **overrides: Engine arguments for both engines.

    Returns:
        ``equal`` (no difference between stock and pipelined), ``diffs``, ``problems``
        (why the workload could not see the KV cache; see :func:`workload_problems`),
        ``prefix_caching`` (vLLM's setting, the repeated prefix's cached tokens, what vLLM
        logged about it), ``meta``, and both engines' full results. Where stock's engine
        fails, only ``equal``, ``diffs``, ``problems``, ``refused`` (``{"stock": ...,
        "pipelined": ...}``, each ``Type: message`` or None) and ``failures`` (both
        failures described: where each was raised, the runner state then) are returned:
        equal means the pipelined engine failed with stock's own error, in the same place.
    """
    from .snapshot import stock_differences

    with loadable_model(model_dir, weights=weights, weights_dir=weights_dir) as (folder, extra):
        extra.update(overrides)
        try:
            stock = run_engine(folder, pipelined=False, reinit=reinit, **extra)
        except Exception as stock_err:  # stock refuses this config: does the pipeline too?
            return _refused_by_stock(model_dir, weights, stock_err, folder, reinit, extra)
        piped = run_engine(folder, pipelined=True, reinit=reinit, **extra)
    meta = {"stock": stock.pop("meta"), "pipelined": piped.pop("meta")}
    # Stock's zeroer predates the teardowns at these checkpoints (the deliberate difference)
    torn = {"cleaned", "profiling", "cleaned_after_profiling"}
    diffs = []
    for key in sorted(set(stock) | set(piped)):
        if key not in stock or key not in piped:
            diffs.append(f"/{key}: only in {'stock' if key in stock else 'pipelined'}")
        else:
            diffs += stock_differences(stock[key], piped[key], f"/{key}", torn_down=key in torn)
    diffs += _runner_problems(meta)
    for side in ("stock", "pipelined"):
        ran = meta[side]["runner_version"]
        if model_runner is not None and ran != model_runner:
            diffs.append(f"/meta: the {side} engine ran the {ran} runner, not {model_runner}")
    workloads = [stock[k] for k in ("outputs_a", "outputs_b") if k in stock]
    problems = [f"{p} (stock)" for w in workloads for p in workload_problems(w)]
    log = meta["stock"]["prefix_caching_log"] + meta["pipelined"]["prefix_caching_log"]
    return {
        "model": str(model_dir),
        "weights": weights,
        "equal": not diffs,
        "diffs": diffs,
        "problems": problems,
        "prefix_caching": {
            "enabled": stock["outputs_a"]["facts"]["enable_prefix_caching"],
            "num_cached_tokens": [w["outputs"][-1]["num_cached_tokens"] for w in workloads],
            "vllm_log": list(dict.fromkeys(log)),
        },
        "outputs": stock.get("outputs_a"),
        "model_runner": meta["stock"]["runner_version"],
        "meta": meta,
        "stock": stock,
        "pipelined": piped,
    }


def _runner_problems(meta: dict[str, Any]) -> list[str]:
    """Each rank of either engine that ran the other side's runner, as ``/meta`` lines: a
    stock oracle that is not stock vLLM (or a pipelined engine that is) would make the
    comparison equal by construction."""
    out = []
    for side, want_pipelined in (("stock", False), ("pipelined", True)):
        for rank, (cls, pipelined) in enumerate(meta[side]["runners"]):
            if pipelined != want_pipelined:
                kind = "initpipe's" if pipelined else "vLLM's own"
                out.append(f"/meta: the {side} engine's rank {rank} ran {cls} ({kind} runner)")
    return out


class EngineRunError(RuntimeError):
    """An engine failed after it started; the error is ``__cause__``, and ``partial`` holds
    the snapshots and outputs :func:`run_engine` had taken before (``init`` ...)."""

    def __init__(self, message: str, *, partial: dict[str, Any]) -> None:
        super().__init__(message)
        self.partial = partial


def _failure(err: BaseException) -> dict[str, Any]:
    """:func:`~.failures.describe_failure` of one engine's failure, with ``partial``: the
    snapshots and outputs taken before it and the runner's snapshot at it (``at_failure``),
    where the engine had started (:class:`EngineRunError`); else empty."""
    from .failures import describe_failure

    return {**describe_failure(err), "partial": getattr(err, "partial", {})}


def _refused_by_stock(
    model_dir: str | Path,
    weights: str,
    stock_err: BaseException,
    folder: Path,
    reinit: bool,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """The report for a config stock vLLM fails on: the pipelined engine must fail the same
    way — the same innermost error (type and message), raised in the same place, with the
    same runner state at the failure and the same snapshots and outputs before it, where
    they exist (:func:`~.failures.failure_differences`). Then ``equal`` holds, ``refused``
    names the error and ``failures`` describes both."""
    from .failures import failure_differences

    stock = _failure(stock_err)  # before the pipelined engine changes the process
    piped: dict[str, Any] | None = None
    try:
        run_engine(folder, pipelined=True, reinit=reinit, **extra)
    except Exception as piped_err:
        piped = _failure(piped_err)
    diffs = failure_differences(stock, piped)
    return {
        "model": str(model_dir),
        "weights": weights,
        "equal": not diffs,
        "refused": {
            "stock": stock["error"],
            "pipelined": None if piped is None else piped["error"],
        },
        "failures": {"stock": stock, "pipelined": piped},
        "diffs": diffs,
        "problems": [],
    }


def main(argv: list[str] | None = None) -> int:
    """Compare stock and pipelined vLLM on each ``--model``; exit 1 on any difference."""
    parser = argparse.ArgumentParser(
        prog="python -m initpipe_vllm.testing.equivalence", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        help="a local model folder (config.json); repeatable. Its own *.safetensors "
        "weights are loaded where it has them, else seeded ones",
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
    parser.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        metavar="N",
        help="workers per pipeline stage (vLLM's multiprocess executor; every rank compared)",
    )
    parser.add_argument(
        "--pipeline-parallel-size",
        type=int,
        default=1,
        metavar="N",
        help="pipeline stages (runs without enforce_eager: vLLM's CPU runner needs it for PP)",
    )
    parser.add_argument(
        "--weights-dir",
        metavar="DIR",
        help="cache folder for the seeded weights (default: a temporary folder, removed "
        "afterwards)",
    )
    parser.add_argument(
        "--model-runner",
        choices=("v1", "v2"),
        default="v1",
        help="the vLLM model runner both engines run: v1 (default) or Model Runner V2 (on a "
        "CPU target through Triton's interpreter: initpipe_vllm.testing.triton_cpu)",
    )
    parser.add_argument(
        "--kv-bytes",
        type=int,
        metavar="B",
        help="KV cache size in bytes of both engines (default: 64 MiB for a folder with its "
        "own weights, else 8 MiB or the folder's initpipe.json)",
    )
    parser.add_argument(
        "--dummy-weights",
        action="store_true",
        help="use vLLM's dummy weights (outputs then do not depend on the KV cache)",
    )
    args = parser.parse_args(argv)
    for flag in ("tensor_parallel_size", "pipeline_parallel_size", "kv_bytes"):
        if (getattr(args, flag) or 1) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be 1 or more")
    parallel = parallel_engine_kwargs(args.tensor_parallel_size, args.pipeline_parallel_size)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if args.multiprocess else "0"
    _select_runner(args.model_runner)
    if args.multiprocess or parallel:
        # collective_rpc ships the snapshot functions to the worker processes by pickle.
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    if parallel:
        from ..hook.parallel import default_cpu_thread_binding

        default_cpu_thread_binding(args.tensor_parallel_size * args.pipeline_parallel_size)
    reports = []
    with contextlib.ExitStack() as stack:
        weights_dir = args.weights_dir
        if weights_dir is None and not args.dummy_weights:  # one folder for all --model
            weights_dir = stack.enter_context(
                tempfile.TemporaryDirectory(prefix="initpipe_weights_")
            )
        for model in args.model:
            weights = (
                "dummy" if args.dummy_weights else "real" if has_own_weights(model) else "seeded"
            )
            kv_bytes = args.kv_bytes or (REAL_KV_BYTES if weights == "real" else None)
            sized = {} if kv_bytes is None else {"kv_cache_memory_bytes": kv_bytes}
            try:
                rep = compare_model(
                    model,
                    reinit=not args.no_reinit,
                    weights=weights,
                    weights_dir=weights_dir,
                    model_runner=args.model_runner,
                    **parallel,
                    **sized,
                )
            except Exception as err:  # report and go on with the next model
                # the error itself, not the wrapper that carries what was taken before it
                shown = err.__cause__ if isinstance(err, EngineRunError) else None
                shown = shown or err
                rep = {
                    "model": model,
                    "equal": False,
                    "error": f"{type(shown).__name__}: {shown}",
                    "diffs": [],
                    "problems": [],
                }
            reports.append(rep)
            print(f"{model}: {_status(rep)}", flush=True)
            for line in (rep["diffs"] + rep["problems"])[:20]:
                print(f"  {line}", flush=True)
    if args.json:
        write_file(args.json, json.dumps(reports, default=repr, indent=1))
    ok = all(r["equal"] and not r["problems"] and "refused" not in r for r in reports)
    return 0 if ok else 1


def _select_runner(version: str) -> None:
    """Make this process (and the ones it spawns) build ``version``'s runner.

    v1: ``VLLM_USE_V2_MODEL_RUNNER=0``. v2: ``=1`` (where vLLM has both runners:
    :func:`~initpipe_vllm.compat.runner_choice_env`), and on a CPU target Triton's
    interpreter with the CPU backend entry vLLM checks for (:mod:`.triton_cpu`), set up
    before vLLM is imported.
    """
    from ..compat import runner_choice_env

    os.environ.update(runner_choice_env(version))
    if version == "v2" and os.environ.get("VLLM_TARGET_DEVICE") == "cpu":
        from .triton_cpu import enable_in_process

        enable_in_process()


def _status(rep: dict[str, Any]) -> str:
    if "error" in rep:
        return "ERROR " + rep["error"]
    if "refused" in rep:
        ref = rep["refused"]
        same = "the pipelined engine fails the same way" if rep["equal"] else "DIFFERENTLY"
        return f"REFUSED BY STOCK ({ref['stock']}); {same}"
    if not rep["equal"]:
        return f"DIFFERENT ({len(rep['diffs'])})"
    pc = rep["prefix_caching"]
    cache = (
        f"prefix cache hit {pc['num_cached_tokens']} tokens"
        if pc["enabled"]
        else "prefix caching off in vLLM: " + ("; ".join(pc["vllm_log"]) or "no reason logged")
    )
    return ("EQUAL" if not rep["problems"] else "EQUAL, WORKLOAD PROBLEMS") + f" ({cache})"


if __name__ == "__main__":
    sys.exit(main())
