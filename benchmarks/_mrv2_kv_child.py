"""Child process of ``benchmarks.mrv2``: MRv2's KV re-init, stock vs pipelined, timed.

Usage: ``python -m benchmarks._mrv2_kv_child PAIRS``. Model Runner V2 needs Triton's
interpreter set up before vLLM is imported on a CPU target, so this runs in its own
process. It builds a stock and a pipelined MRv2 runner (tiny Llama, dummy weights, eager,
engine-less as ``benchmarks.kv`` does for v1), plans their KV configs with the engine's
planner, and times, alternating sides, (a) the first ``initialize_kv_cache`` on each and
(b) the re-init vLLM's profiling runs: the teardown (stock: ``_teardown_profiling_state``;
pipelined: ``initpipe_teardown_profiling_state``, what its ``profile_cudagraph_memory``
calls instead) then ``initialize_kv_cache`` with another block count. The startup heap is
frozen (as ``EngineCore.__init__`` leaves it), so both teardowns' ``gc.collect()`` scan
only what was allocated since. The pipelined runner is past its start-up
(``initpipe_startup_done()``, as the worker calls after its warm-up); the re-init is timed
with ``INITPIPE_LOG_STAGES=0`` (no log line) and with the default logging (one summary
line per phase). Each sample is ``NUMBER`` consecutive re-inits of one side.
Prints one ``INITPIPE_MRV2_KV_JSON {...}`` line.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

MARK = "INITPIPE_MRV2_KV_JSON"
#: Consecutive re-inits per sample (as ``benchmarks.kv``).
NUMBER = 5


def main(argv: list[str] | None = None) -> int:
    """Time the MRv2 KV phase and re-init on both sides; print the samples."""
    pairs = int((argv if argv is not None else sys.argv[1:])[0])
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    # The framework's own cost, as benchmarks.kv measures v1's: no per-stage log lines.
    os.environ["INITPIPE_LOG_STAGES"] = "0"
    if os.environ["VLLM_TARGET_DEVICE"] == "cpu":
        from initpipe_vllm.testing.triton_cpu import enable_in_process

        enable_in_process()
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    import vllm.v1.worker.cpu_worker  # noqa: F401  (the CPU shims the runner needs)
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.cpu.model_runner import CPUModelRunner
    from vllm.v1.worker.gpu.cudagraph_utils import _teardown_profiling_state

    from initpipe_vllm.hook.runner_v2 import pipelined_runner_v2_class
    from initpipe_vllm.testing import build_runner, plan_kv_cache_config, tiny_vllm_config

    sides = {}
    for name, cls in (("stock", CPUModelRunner), ("initpipe", pipelined_runner_v2_class())):
        cfg = tiny_vllm_config("tiny-llama")
        runner = build_runner(cfg, cls)
        plans = [plan_kv_cache_config(runner, num_blocks=n) for n in (48, 64)]
        sides[name] = (cfg, runner, plans)

    def init(name: str, plan: object) -> float:
        cfg, runner, _ = sides[name]
        with set_current_vllm_config(cfg):
            t0 = time.perf_counter()
            runner.initialize_kv_cache(plan)
            return time.perf_counter() - t0

    def teardown(name: str) -> float:
        cfg, runner, _ = sides[name]
        with set_current_vllm_config(cfg):
            t0 = time.perf_counter()
            if name == "stock":
                _teardown_profiling_state(runner)
            else:
                runner.initpipe_teardown_profiling_state()
            return time.perf_counter() - t0

    first = {name: init(name, sides[name][2][0]) for name in sides}
    sides["initpipe"][1].initpipe_startup_done()  # as the worker does after its warm-up
    gc.collect()
    gc.freeze()

    def samples() -> dict[str, list[float]]:
        out: dict[str, list[float]] = {"stock": [], "initpipe": []}
        for i in range(pairs):
            order = ("stock", "initpipe") if i % 2 == 0 else ("initpipe", "stock")
            for name in order:
                total = 0.0
                for k in range(NUMBER):
                    plan = sides[name][2][(i * NUMBER + k + 1) % 2]
                    total += teardown(name) + init(name, plan)
                out[name].append(total / NUMBER)
        return out

    reinit = samples()
    os.environ.pop("INITPIPE_LOG_STAGES")  # the default logging
    logged = samples()
    print(f"{MARK} " + json.dumps({"first": first, "reinit": reinit, "logged": logged}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
