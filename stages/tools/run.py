"""``initpipe run``: start a real vLLM engine through the pipeline and show what happened.

What belongs here: the main job only. It starts vLLM in-process on a local model folder
(default: the tiny Llama shipped in ``initpipe_vllm/models/tiny-llama``: config.json only,
dummy weights, 8 MiB of KV cache) with ``initpipe_vllm.worker.PipelinedWorker``, prints
each stage as it runs, runs the equivalence harness's workload
(:func:`~initpipe_vllm.testing.equivalence.run_workload`: two token-id prompts longer
than a KV block, the second repeating the first's prefix), completes vLLM's example text
prompts where the model folder has a tokenizer (the embedded one does), and prints a
summary: the slowest stages, the critical path and the KV bytes per layer. vLLM's log stays
at warnings, and its advice about running on a CPU is hidden and counted
(:mod:`initpipe_vllm.tools.quiet`), unless ``--verbose``. ``--compare-stock`` loads seeded
real weights instead (:func:`~initpipe_vllm.testing.weights.seeded_model`), so the outputs
depend on the KV cache, also runs stock vLLM on the same config, and exits 1 unless the
tokens, logprobs and runner snapshot (:func:`~initpipe_vllm.snapshot.runner_snapshot`)
match and the workload saw the KV cache, printing what differs. ``--resize 32,128,64``
(seeded weights too) resizes the running engine's KV cache to each block count in turn
after the first generation (:func:`initpipe_vllm.resize_kv_cache` with
``keep_prefix_cache=False``: the oracle is a fresh engine), prints each report and
generates again, then starts a fresh stock engine of each size and exits 1 unless the
tokens, logprobs and prefix-cache hits are the same. Every stock engine starts with the
``INITPIPE_VLLM`` opt-in unset (:func:`~initpipe_vllm.testing.stock.stock_environment`) and
is checked to run vLLM's own runner on every rank; one that does not ends the run with
``Error:`` and exit 1.
``--model-runner v1|v2`` picks vLLM's runner (default: vLLM's choice); ``v2`` on a machine
without a GPU runs Model Runner V2 through Triton's interpreter
(:mod:`initpipe_vllm.testing.triton_cpu`) and says so.
``--tensor-parallel-size N`` / ``--pipeline-parallel-size M`` run several workers
(vLLM's multiprocess executor; on CPU the thread binding is set when unset): their
stages run in other processes, so each rank's stages are printed from its trace once the
engine is up, and ``--compare-stock`` compares every rank.
Replaces nothing in vLLM.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..testing.equivalence import REAL_KV_BYTES, TOY_KV_BYTES
from ._cli import add_model_runner
from .quiet import NOISE, quiet

__all__ = ["DEFAULT_MODEL", "NotStockError", "build_parser", "main"]

#: The embedded toy (config.json only): ``--model tiny-llama``, and the tests' model.
DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-llama"
#: The models ``--model`` knows by name; the first is the default.
MODEL_NAMES = ("smollm2", "tiny-llama")
#: The chat turn ``initpipe run`` asks a model with a chat template.
CHAT_QUESTION = "What is the capital of France?"


def _say(text: str = "") -> None:
    print(text, flush=True)


def _print_event(event: Any) -> None:
    what = event.name if event.kind == "stage" else f"{event.kind} {event.name}"
    mark = "" if event.outcome == "ok" else f"  {event.outcome.upper()}: {event.error}"
    _say(f"  [{event.phase:15}] {what:44} {event.duration * 1e3:9.3f} ms{mark}")


# -- run inside the worker (collective_rpc passes the worker first) -----------------------
def _summary(worker: Any) -> dict[str, Any]:
    runner = worker.model_runner
    run = runner.initpipe_run
    # the per-layer views with aliases: v1's ``kv_caches``, MRv2's ``kv_caches_by_layer``
    name = next((k for k in ("kv_caches", "kv_caches_by_layer") if k in run.outputs), None)
    kv = run.outputs[name] if name is not None else {}
    storages: dict[int, str] = {}
    layers = []
    for name, t in kv.items():
        key = t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()
        alias = storages.setdefault(key, name)
        layers.append(
            {
                "layer": name,
                "shape": list(t.shape),
                "dtype": str(t.dtype),
                "bytes": t.numel() * t.element_size(),
                "shares_with": alias if alias != name else None,
            }
        )
    events = [e.to_dict() for e in run.trace.events]
    return {
        "events": events,
        "critical_path": run.critical_path(),
        "layers": layers,
        "runner_class": type(runner).__name__,
        "catalog": run.pipeline.name,
        "num_blocks": runner.kv_cache_config.num_blocks,
    }


def _print_ranks_stages(summaries: list[dict[str, Any]]) -> None:
    """Several workers: their stages ran in other processes; show each rank's from its
    trace (the order they ran in)."""
    for rank, summary in enumerate(summaries):
        _say(f"\nrank {rank}: stages as they ran ({summary['runner_class']})")
        for e in summary["events"]:
            if e["kind"] in ("stage", "teardown"):
                what = e["name"] if e["kind"] == "stage" else f"teardown {e['name']}"
                mark = "" if e["outcome"] == "ok" else f"  {e['outcome'].upper()}: {e['error']}"
                _say(f"  [{e['phase']:15}] {what:44} {e['duration'] * 1e3:9.3f} ms{mark}")


#: How many of the slowest stages the summary names (the live lines show every stage).
SLOWEST = 5


def _print_summary(summary: dict[str, Any]) -> None:
    stages = [e for e in summary["events"] if e["kind"] == "stage"]
    spans = [e for e in summary["events"] if e["kind"] == "span"]
    latest: dict[str, dict[str, Any]] = {e["name"]: e for e in stages}
    slowest = sorted(latest.values(), key=lambda e: -e["duration"])
    _say(f"\nslowest stages (of {len(slowest)}; the latest run of each, ms):")
    for e in slowest[:SLOWEST]:
        _say(f"  {e['phase']:16} {e['name']:44} {e['duration'] * 1e3:9.3f}")
    if len(slowest) > SLOWEST:
        rest = sum(e["duration"] for e in slowest[SLOWEST:])
        _say(f"  {len(slowest) - SLOWEST} more stages: {rest * 1e3:.3f} ms in all")
    if spans:
        _say("\nvLLM steps outside the DAG (ms):")
        for e in spans:
            _say(f"  {e['name']:61} {e['duration'] * 1e3:9.3f}")
    path = summary["critical_path"]
    total = sum(d for _, d in path)
    _say(f"\ncritical path ({total * 1e3:.3f} ms): " + " -> ".join(n for n, _ in path))
    _say(f"\nKV cache: {summary['num_blocks']} blocks per layer")
    layers = summary["layers"]
    counted = sum(0 if layer["shares_with"] else layer["bytes"] for layer in layers)
    for layer, alike in _runs_of_alike(layers):
        share = f"  (shares {layer['shares_with']})" if layer["shares_with"] else ""
        if alike:
            _say(f"  ... {alike} more layers of that shape, dtype and size")
            continue
        _say(
            f"  {layer['layer']:44} {tuple(layer['shape'])!s:22} {layer['dtype']:14} "
            f"{layer['bytes']:>12,} B{share}"
        )
    _say(f"  total (distinct)  {counted:,} B in {len(layers)} layers")


def _runs_of_alike(layers: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
    """The layers to print: a run of more than three own-storage layers of one shape, dtype
    and size shows its first and last, with ``(layer, n)`` standing for the ``n`` between."""

    def kind(layer: dict[str, Any]) -> Any:
        if layer["shares_with"]:
            return None
        return (tuple(layer["shape"]), layer["dtype"], layer["bytes"])

    out: list[tuple[dict[str, Any], int]] = []
    i = 0
    while i < len(layers):
        j = i + 1
        while (
            j < len(layers) and kind(layers[i]) is not None and kind(layers[j]) == kind(layers[i])
        ):
            j += 1
        run = layers[i:j]
        if len(run) > 3:
            out += [(run[0], 0), (run[1], len(run) - 2), (run[-1], 0)]
        else:
            out += [(layer, 0) for layer in run]
        i = j
    return out


class NotStockError(RuntimeError):
    """The engine started as the stock oracle runs initpipe's runner: comparing with it
    would compare the pipeline with itself."""


def _start(
    model: Path, pipelined: bool, kv_bytes: int, extra: dict[str, Any], **overrides: Any
) -> Any:
    """Start the pipelined engine, or a stock one: that one inside ``stock_environment()``
    (``INITPIPE_VLLM`` unset) and checked on every rank (:class:`NotStockError`)."""
    from vllm import LLM

    from ..hook import PIPELINED_WORKER
    from ..testing.equivalence import workload_engine_kwargs
    from ..testing.process_globals import reset_process_globals
    from ..testing.stock import require_stock, stock_environment

    kwargs, opts = workload_engine_kwargs(
        model, kv_cache_memory_bytes=kv_bytes, **extra, **overrides
    )
    reset_process_globals()  # neither engine inherits what the other set in this process
    if pipelined:
        kwargs["worker_cls"] = PIPELINED_WORKER
        return LLM(**kwargs), opts.get("task", "generate")
    with stock_environment():
        llm = LLM(**kwargs)
    try:
        require_stock(llm, "the stock engine to compare with")
    except RuntimeError as err:
        _stop(llm)
        raise NotStockError(str(err)) from None
    return llm, opts.get("task", "generate")


def _stop(llm: Any) -> None:
    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()


def _observe(llm: Any, task: str) -> dict[str, Any]:
    """Outputs, and every rank's runner snapshot at init and after the workload."""
    from ..testing.equivalence import _ranks, _snapshot, run_workload

    init = _ranks(llm.collective_rpc(_snapshot))
    outputs = run_workload(llm, task, salt=1)
    return {
        "init": init,
        "outputs": outputs,
        "after": _ranks(llm.collective_rpc(_snapshot)),
        "numerics": llm.collective_rpc(_numerics),
    }


def _numerics(_worker: Any) -> dict[str, Any]:
    """What can change a CPU engine's floating-point results without changing its state:
    printed beside a difference from stock, so a difference has its first clue."""
    import os

    import torch

    return {
        "torch_threads": torch.get_num_threads(),
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "mkldnn": torch.backends.mkldnn.is_available(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def _print_outputs(task: str, workload: dict[str, Any]) -> None:
    outs = workload["outputs"]
    _say(f"\n{task} outputs for {len(outs)} fixed prompts:")
    for i, out in enumerate(outs):
        if task == "generate":
            shown = f"{out['token_ids']}"
        else:
            shown = f"[{len(out['embedding'])} floats] {out['embedding'][:4]} ..."
        cached = out["num_cached_tokens"]
        _say(f"  prompt {i}: {shown}  ({out['prompt_tokens']} tokens, {cached} from the cache)")


#: The prompts of vLLM's own first example (``examples/offline_inference/basic``).
TEXT_PROMPTS = (
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
)


def _generate_text(llm: Any, weights: str) -> list[tuple[str, str]]:
    """Greedy completions of :data:`TEXT_PROMPTS`: 8 tokens each on a toy's noise, up to 16
    (or the end of the sentence) on real weights, then the chat turn :data:`CHAT_QUESTION`
    where the model has a chat template."""
    from vllm import SamplingParams

    real = weights == "real"
    params = SamplingParams(max_tokens=16 if real else 8, temperature=0.0, ignore_eos=not real)
    outs = llm.generate(list(TEXT_PROMPTS), params, use_tqdm=False)
    texts = [(o.prompt, o.outputs[0].text) for o in outs]
    if real and _chat_template(llm):
        chat = SamplingParams(max_tokens=48, temperature=0.0)
        turn = [{"role": "user", "content": CHAT_QUESTION}]
        answer = llm.chat(turn, chat, use_tqdm=False)[0].outputs[0].text
        texts.append((f"chat: {CHAT_QUESTION}", answer))
    return texts


def _chat_template(llm: Any) -> bool:
    tokenizer = llm.get_tokenizer()
    return bool(getattr(tokenizer, "chat_template", None))


def _print_text(texts: list[tuple[str, str]], weights: str) -> None:
    why = {
        "dummy": "dummy weights: the words are noise, the path to them is real",
        "seeded": "seeded random weights: the words are noise, the path to them is real",
        "real": "the model's own weights, greedy",
    }[weights]
    _say(f"\ntext prompts ({why}):")
    for prompt, text in texts:
        _say(f"  {prompt!r} -> {text!r}")


def _block_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or any(n <= 0 for n in counts):
        msg = f"{text!r}: expected positive block counts separated by commas, e.g. 32,128,64"
        raise argparse.ArgumentTypeError(msg)
    return counts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="initpipe run", description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        default=MODEL_NAMES[0],
        metavar="NAME|DIR",
        help="smollm2 (default: SmolLM2-135M-Instruct's real weights, converted once into "
        "--cache-dir), tiny-llama (the embedded toy: dummy weights, or seeded ones with "
        "--compare-stock or --resize), or a local model folder with config.json (its own "
        "*.safetensors weights where it has them, else like the toy)",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="where the smollm2 conversion is kept (default: $INITPIPE_CACHE_DIR, else "
        "$XDG_CACHE_HOME/initpipe, else ~/.cache/initpipe)",
    )
    p.add_argument(
        "--trace",
        type=Path,
        metavar="FILE",
        help="write the trace (JSON) to FILE and a Chrome trace beside it",
    )
    p.add_argument(
        "--compare-stock",
        action="store_true",
        help="use seeded real weights, also run stock vLLM; exit 1 unless tokens, "
        "logprobs and runner state match",
    )
    p.add_argument(
        "--weights-dir",
        type=Path,
        metavar="DIR",
        help="with --compare-stock: cache folder for the seeded weights (default: a "
        "temporary folder, removed afterwards)",
    )
    p.add_argument(
        "--kv-bytes",
        type=int,
        metavar="B",
        help="KV cache size in bytes (default: 64 MiB for a model with real weights, "
        "8 MiB for a toy)",
    )
    p.add_argument(
        "--resize",
        type=_block_counts,
        metavar="N,N,...",
        help="after the first generation, resize the KV cache to each block count in turn, "
        "generate again each time, and check the tokens against a fresh engine of that "
        "size (seeded weights)",
    )
    p.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        metavar="N",
        help="workers per pipeline stage (vLLM's multiprocess executor)",
    )
    p.add_argument(
        "--pipeline-parallel-size",
        type=int,
        default=1,
        metavar="M",
        help="pipeline stages (runs without enforce_eager: vLLM's CPU runner needs it)",
    )
    add_model_runner(p)
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show vLLM's INFO lines and the warnings about running on a CPU that are "
        "hidden by default (the last line counts those)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the main job; return 0 on success, 1 on a stage failure or a stock mismatch."""
    args = build_parser().parse_args(argv)
    try:
        args.model, real = _resolve_model(args.model, args.cache_dir)
    except ModelChoiceError as err:
        print(f"Error: --model {err}", file=sys.stderr)
        return 2 if err.usage else 1
    if args.kv_bytes is None:
        args.kv_bytes = REAL_KV_BYTES if real else TOY_KV_BYTES
    if args.kv_bytes <= 0:
        print("Error: --kv-bytes must be a positive number of bytes", file=sys.stderr)
        return 2
    for flag in ("tensor_parallel_size", "pipeline_parallel_size"):
        if getattr(args, flag) < 1:
            print(f"Error: --{flag.replace('_', '-')} must be 1 or more", file=sys.stderr)
            return 2
    _select_model_runner(args.model_runner)
    world = args.tensor_parallel_size * args.pipeline_parallel_size
    if world > 1:
        from ..hook.parallel import default_cpu_thread_binding

        # vLLM's CPU build stops on a one-NUMA-node machine without a binding per rank
        bound = default_cpu_thread_binding(world)
        if bound is not None:
            print(f"VLLM_CPU_OMP_THREADS_BIND={bound} (one core list per rank)")
    # In-process engine: the StageError itself reaches us, and startup is ~10 s faster.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if not args.verbose:  # our own lines show each stage; vLLM's INFO lines only on request
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if args.trace is not None:
        os.environ["INITPIPE_TRACE"] = str(args.trace)
    from ..testing.equivalence import loadable_model, parallel_engine_kwargs
    from ..testing.weights import WeightsError

    weights = "real" if real else "seeded" if args.compare_stock or args.resize else "dummy"
    parallel = parallel_engine_kwargs(args.tensor_parallel_size, args.pipeline_parallel_size)
    try:
        with contextlib.ExitStack() as stack:
            if not args.verbose:
                quiet(
                    Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="initpipe-run-")))
                )
            found = stack.enter_context(
                loadable_model(args.model, weights=weights, weights_dir=args.weights_dir)
            )
            model, extra = found
            if _has_tokenizer(args.model):  # text prompts, and vLLM's chat-template warm-up
                extra = {**extra, "skip_tokenizer_init": False}
            args.weights = weights
            status = _run(args, model, {**extra, **parallel})
            if NOISE.hidden:
                _say(
                    f"\n({NOISE.hidden} vLLM warnings about this CPU set-up hidden; "
                    "--verbose shows them)"
                )
            return status
    except WeightsError as err:  # an architecture transformers cannot build
        print(f"Error: --compare-stock: {err}", file=sys.stderr)
        return 1


class ModelChoiceError(RuntimeError):
    """``--model`` names nothing runnable; ``usage``: a bad value (exit 2), else the real
    model could not be had (exit 1)."""

    def __init__(self, message: str, *, usage: bool) -> None:
        super().__init__(message)
        self.usage = usage


def _resolve_model(value: str, cache_dir: Path | None) -> tuple[Path, bool]:
    """``--model``'s folder, and whether it holds real weights (``*.safetensors``)."""
    if value == "smollm2":
        from ..real_model import RealModelError, smollm2

        try:
            return smollm2(cache_dir, say=_progress), True
        except RealModelError as err:
            raise ModelChoiceError(f"smollm2: {err}", usage=False) from None
    folder = DEFAULT_MODEL if value == "tiny-llama" else Path(value)
    if not (folder / "config.json").is_file():
        names = ", ".join(MODEL_NAMES)
        msg = f"{value}: no config.json in that folder (or name one of: {names})"
        raise ModelChoiceError(msg, usage=True)
    from ..testing.equivalence import has_own_weights

    return folder, has_own_weights(folder)


def _progress(line: str) -> None:
    """Progress of work before the run (the real model's one-time conversion): stderr,
    beside the progress bars of the libraries doing it."""
    print(line, file=sys.stderr, flush=True)


def _has_tokenizer(model: Path) -> bool:
    return (model / "tokenizer.json").is_file()


def _select_model_runner(choice: str) -> None:
    """Make vLLM build ``choice``'s runner in this process and the ones it spawns.

    ``v2`` on a machine without a GPU (``VLLM_TARGET_DEVICE=cpu``) switches Triton's
    interpreter on (:mod:`initpipe_vllm.testing.triton_cpu`) and says so.
    """
    if choice == "auto":
        return
    from ..compat import runner_choice_env

    os.environ.update(runner_choice_env("v1" if choice == "v1" else "v2"))
    if choice == "v1":
        return
    if os.environ.get("VLLM_TARGET_DEVICE") == "cpu":
        from ..testing.triton_cpu import enable_in_process

        enable_in_process()
        print(
            "Model Runner V2 on a CPU: Triton's interpreter runs its kernels "
            "(initpipe_vllm.testing.triton_cpu, a test device; generation is slow)",
            flush=True,
        )


def _run(args: argparse.Namespace, model: Path, extra: dict[str, Any]) -> int:
    from initpipe import StageError

    from ..hook import progress

    _say(f"initpipe run: {args.model} through initpipe_vllm.worker.PipelinedWorker")
    _say("each stage as it runs ([phase] stage, time):")
    if model != args.model:
        _say(f"seeded weights: {model}")
    progress.add_listener(_print_event)
    try:
        llm, task = _start(model, pipelined=True, kv_bytes=args.kv_bytes, extra=extra)
    except StageError as err:
        _say(f"\nFAILED: {err}")
        return 1
    finally:
        progress.remove_listener(_print_event)
    resized: list[tuple[int, Any]] = []
    try:
        summaries = llm.collective_rpc(_summary)
        summary = summaries[0]
        if len(summaries) > 1:
            _print_ranks_stages(summaries)
        piped = _observe(llm, task)
        has_text = task == "generate" and _has_tokenizer(args.model)
        texts = _generate_text(llm, args.weights) if has_text else []
        if args.resize:
            resized = _resize_steps(llm, task, args.resize)
    finally:
        _say("\nstopping the engine: the KV phase's teardowns, in reverse order")
        _stop(llm)
        del llm
        gc.collect()
    if texts:
        _print_text(texts, args.weights)
    _print_outputs(task, piped["outputs"])
    _say(f"\nrunner: {summary['runner_class']} (catalog {summary['catalog']})")
    if len(summaries) > 1:
        _say(f"\n(summary of rank 0 of {len(summaries)})")
    _print_summary(summary)
    world = len(summaries)
    for rank in range(world) if args.trace is not None else ():
        paths = progress.trace_paths(rank, world)
        if paths is not None:
            chrome = f" (and {paths[1]})" if paths[1] is not None else ""
            _say(f"\ntrace: {paths[0]}{chrome}")
    try:
        return _against_stock(args, model, extra, task, piped, resized)
    except NotStockError as err:
        print(f"Error: {err}", file=sys.stderr)
        return 1


def _against_stock(
    args: argparse.Namespace,
    model: Path,
    extra: dict[str, Any],
    task: str,
    piped: dict[str, Any],
    resized: list[tuple[int, Any]],
) -> int:
    """``--resize``'s and ``--compare-stock``'s checks against stock engines: 0 or 1."""
    from ..testing.equivalence import workload_problems
    from ..testing.snapshot import stock_differences

    status = 0
    if resized:
        status = _check_resized(model, args.kv_bytes, extra, task, resized)
    if not args.compare_stock:
        return status
    _say("\n--compare-stock: starting stock vLLM on the same config ...")
    stock_llm, _ = _start(model, pipelined=False, kv_bytes=args.kv_bytes, extra=extra)
    try:
        stock = _observe(stock_llm, task)
    finally:
        _stop(stock_llm)
    diffs = stock_differences(stock, piped)
    problems = workload_problems(stock["outputs"])
    facts = stock["outputs"]["facts"]
    hit = stock["outputs"]["outputs"][-1]["num_cached_tokens"]
    _say(
        f"prefix caching: {hit} tokens of the repeated prefix from the cache"
        if facts["enable_prefix_caching"]
        else "prefix caching: turned off by vLLM for this model"
    )
    if diffs:
        _say(f"DIFFERENT from stock vLLM ({len(diffs)} differences):")
        for line in diffs[:40]:
            _say(f"  {line}")
        _say(f"  numerics: stock {stock['numerics']}, initpipe {piped['numerics']}")
    for line in problems:
        _say(f"WORKLOAD PROBLEM (the outputs cannot show the KV cache): {line}")
    if diffs or problems:
        return 1
    _say(
        "SAME as stock vLLM: tokens, logprobs, runner snapshot at init and after the "
        f"workload ({len(json.dumps(stock['init']))} bytes of state compared)"
    )
    return status


def _resize_steps(llm: Any, task: str, counts: list[int]) -> list[tuple[int, Any]]:
    """Resize to each count in turn; print each report; generate again each time."""
    from ..live.api import kv_cache_info, resize_kv_cache
    from ..testing.equivalence import run_workload

    out = []
    for n in counts:
        _say(f"\n--resize: {kv_cache_info(llm).num_blocks} -> {n} blocks")
        # the oracle is a fresh engine of that size: its prefix cache starts empty
        report = resize_kv_cache(llm, num_blocks=n, keep_prefix_cache=False)
        _say(str(report))
        workload = run_workload(llm, task, salt=2)
        _print_outputs(task, workload)
        out.append((n, workload["outputs"]))
    return out


def _check_resized(
    model: Path, kv_bytes: int, extra: dict[str, Any], task: str, resized: list[tuple[int, Any]]
) -> int:
    """Start a fresh stock engine of each size; 1 unless the outputs are the same."""
    from ..testing.equivalence import run_workload
    from ..testing.snapshot import diff_snapshots

    status = 0
    for n, outputs in resized:
        stock, _ = _start(model, False, kv_bytes, extra, num_gpu_blocks_override=n)
        try:
            fresh = run_workload(stock, task, salt=2)["outputs"]
        finally:
            _stop(stock)
            del stock
            gc.collect()
        diffs = diff_snapshots(fresh, outputs)
        if diffs:
            status = 1
            _say(f"--resize {n}: DIFFERENT from a fresh stock engine of {n} blocks:")
            for line in diffs[:20]:
                _say(f"  {line}")
        else:
            _say(f"--resize {n}: SAME tokens and logprobs as a fresh stock engine of {n} blocks")
    return status


if __name__ == "__main__":
    sys.exit(main())
