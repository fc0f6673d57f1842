"""Child process of ``benchmarks.engine``: start one in-process vLLM engine and time it.

Usage: ``python -m benchmarks._engine_child [--pipelined] [--model DIR [--real]]``. Prints one line
``INITPIPE_ENGINE_JSON {...}`` on stdout with ``llm_s`` (seconds from just before
``LLM(...)`` to just after it returns), ``import_s`` (``import vllm``) and the runner class.
The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) because an
in-process engine mutates its process (thread binding): each sample is a fresh process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

MARK = "INITPIPE_ENGINE_JSON"


def _runner_facts(worker: object) -> tuple[str, str]:
    """The runner's class name and the module of vLLM's class under it (v1 or MRv2)."""
    cls = type(worker.model_runner)  # type: ignore[attr-defined]
    base = next(c for c in cls.__mro__ if c.__module__.startswith("vllm."))
    return cls.__name__, base.__module__


def main(argv: list[str] | None = None) -> int:
    """Start one engine (stock or pipelined worker), print the timing line, shut down."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks._engine_child")
    ap.add_argument("--pipelined", action="store_true", help="initpipe's PipelinedWorker")
    ap.add_argument("--model", default=None, help="model folder (default: tiny-llama)")
    ap.add_argument(
        "--real",
        action="store_true",
        help="the folder's own weights in its config's dtype, 64 MiB of KV (default: dummy "
        "float32 weights, 8 MiB)",
    )
    ap.add_argument(
        "--model-runner",
        choices=("v1", "v2"),
        default=None,
        help="force vLLM's runner (v2 on a CPU target: Triton's interpreter)",
    )
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if args.model_runner == "v2" and os.environ["VLLM_TARGET_DEVICE"] == "cpu":
        from initpipe_vllm.testing.triton_cpu import enable_in_process

        enable_in_process()  # before vLLM is imported (both sides alike)
    elif args.model_runner is not None:
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if args.model_runner == "v2" else "0"
    t0 = time.perf_counter()
    from vllm import LLM

    from initpipe_vllm.hook import PIPELINED_WORKER
    from initpipe_vllm.testing import model_dir
    from initpipe_vllm.testing.equivalence import engine_kwargs

    import_s = time.perf_counter() - t0
    kwargs, _ = engine_kwargs(
        args.model or model_dir("tiny-llama"),
        kv_cache_memory_bytes=(64 if args.real else 8) << 20,
        enforce_eager=True,
        dtype="auto" if args.real else "float32",
        load_format="auto" if args.real else "dummy",
    )
    if args.pipelined:
        kwargs["worker_cls"] = PIPELINED_WORKER
    t1 = time.perf_counter()
    llm = LLM(**kwargs)
    llm_s = time.perf_counter() - t1
    runner, module = llm.collective_rpc(_runner_facts)[0]
    print(
        f"{MARK} "
        + json.dumps(
            {
                "llm_s": llm_s,
                "import_s": import_s,
                "runner": runner,
                "runner_base_module": module,
                "pipelined": args.pipelined,
            }
        ),
        flush=True,
    )
    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
