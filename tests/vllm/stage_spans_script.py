"""Run in a subprocess by test_stage_spans.py: a real in-process engine on the pipelined
worker with vLLM's tracing sent to an OTLP/HTTP endpoint; optionally one KV stage replaced
by a failing one. Exits once the engine has answered one request (or failed to start); the
spans are flushed at exit (vLLM's tracer provider shuts down in ``atexit``).

Usage: ``python stage_spans_script.py MODEL_DIR ENDPOINT [FAILING_STAGE]``.
"""

import functools
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "200"  # ms: spans arrive while the process lives

from initpipe import KV, stage
from initpipe_vllm import catalog
from initpipe_vllm.contract.report import installed_release
from initpipe_vllm.hook.adapter import pipelined_class, runner_adapter
from initpipe_vllm.testing.equivalence import engine_kwargs

model, endpoint = sys.argv[1], sys.argv[2]
if len(sys.argv) > 3:
    name = sys.argv[3]
    # the release the contract matched picks the worker's catalog and runner class: the
    # failing stage goes into that release's pipeline, on that release's class
    release = installed_release("catalog_v1")
    pipeline = catalog(release=release)
    original = pipeline.specs[name]

    @functools.wraps(original.func)  # keeps the stage's inputs (its signature)
    def failing(*args, **kwargs):
        raise OSError(f"disk on fire in {name}")

    bad = stage(failing, needs=KV, provides=original.provides, teardown=original.teardown)
    runner_class = pipelined_class(runner_adapter("v1", release))
    runner_class.initpipe_default_pipeline = pipeline.replace(name, bad)


def main() -> None:
    from vllm import LLM, SamplingParams

    kwargs, _ = engine_kwargs(model)
    try:
        # disable_log_stats=False: with tracing on and stats off, vLLM 0.32's first request
        # fails in OutputProcessor.do_tracing (req_state.stats is None)
        llm = LLM(
            worker_cls="initpipe_vllm.worker.PipelinedWorker",
            otlp_traces_endpoint=endpoint,
            disable_log_stats=False,
            **kwargs,
        )
    except Exception as err:  # the failing-stage run: the spans say what happened
        print(f"ENGINE FAILED: {type(err).__name__}: {err}", file=sys.stderr)
        return
    llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=2, seed=0))
    print("ENGINE OK", file=sys.stderr, flush=True)


if __name__ == "__main__":  # the engine core's own process imports this module too
    main()
