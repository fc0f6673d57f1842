"""The order in which ``make test``'s two workers take the test modules (pytest-xdist,
``--dist loadfile --no-loadscope-reorder``: a module stays in one worker, and the workers
take modules in collection order): :data:`SLOW_FIRST` puts the long modules first, so neither
worker is left with a long module at the end while the other idles. The end of a run lists
the slowest modules (:func:`module_seconds`), by which to keep the list in step."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

__all__ = ["LISTED_MODULE_S", "SLOW_FIRST", "module_seconds"]

#: Modules that start engines or servers, slowest first (seconds of one worker, measured
#: quiet on 2 cores with ``make test``'s two workers before the OpenMP threads waited
#: passively, stop 61; ``make test`` lists the slowest modules of each tier at its end, by
#: which to keep this list in step). It only orders, so that the longest modules do not start
#: last: every test runs, and the unlisted modules follow in collection order. This order
#: took 36.0 min in stop 63; one by the most seconds in any tier (the two 0.34.0-tier
#: modules of about 300 s first, side by side) took 39.4, so it was not kept.
SLOW_FIRST = (
    "tests/vllm/test_trl_grpo.py",  # 375 s (TRL GRPO, 2 steps, 3 syncs; 3 stock starts)
    "tests/vllm/test_refit_real.py",  # 205-308 s (SmolLM2-135M bf16, training steps)
    "tests/test_docs_outputs.py",  # 231-260 s (the docs' examples that show their output)
    "tests/vllm/test_refit_models.py",  # 256 s (tied Qwen3 v1/MRv2, LFM2, MLA, Gemma 2, ...)
    "tests/vllm/test_rl_loop.py",  # 167-223 s (examples/rl_loop.py on SmolLM2: 2 steps)
    "tests/vllm/test_engine_equivalence.py",  # 132-164 s
    "tests/vllm/test_parallel.py",  # 141-161 s
    "tests/hook/test_hook.py",  # 150 s
    "tests/vllm/test_refit.py",  # 142 s (v1 and MRv2)
    "tests/vllm/test_serve.py",  # 136 s (v1 and MRv2 servers)
    "tests/vllm/test_resize_warm.py",  # 116 s (v1 and MRv2, in-process)
    "tests/vllm/test_mrv2.py",  # 115 s (Model Runner V2 on Triton's interpreter)
    "tests/benchmarks/test_vllm_smoke.py",  # 110 s
    "tests/startup/test_startup_engines.py",  # 104 s (five starts: in-process x2, TP=2, serve, v2)
    "tests/vllm/test_check_weights.py",  # 86-107 s alone (a stock server on SmolLM2)
    "tests/vllm/test_resize.py",  # 85 s (v1 and MRv2)
    "tests/vllm/test_resize_warm_models.py",  # 76 s (eight models, v1 in-process)
    "tests/vllm/test_refit_tp2.py",  # 76 s (three TP=2 engines, each in its own processes)
    "tests/vllm/test_resize_multiprocess.py",  # 74 s
    "tests/vllm/test_resize_parallel.py",  # 65 s (v1 and MRv2)
    "tests/vllm/test_real_model.py",  # 62 s (initpipe run --compare-stock; a warm resize)
    "tests/vllm/test_serve_refit.py",  # 61 s (two servers)
    "tests/vllm/test_kv_sensitivity.py",  # 44 s (six cache kinds, one MRv2 process)
    "tests/plugin/test_pytest_plugin.py",  # 34 s
    "tests/hook/test_plugin.py",  # 28 s
    "tests/vllm/test_refit_unreloadable.py",  # 23 s (GPT-OSS fails closed)
    "tests/vllm/test_equivalence_negative.py",  # 21 s (four tiny-llama engines, one process)
    "tests/vllm/test_stage_spans.py",  # 19 s (two traced engines)
    "tests/benchmarks/test_refit_smoke.py",  # 17 s
    "tests/vllm_plan/test_vllm_plan.py",  # 17 s
    "tests/vllm/test_runner.py",  # 13 s
    "tests/vllm/test_mrv2_engineless.py",  # 11 s
    "tests/reliability/test_fault_injection.py",  # 5 s (tiny-llama and tiny-nemotron-h rigs)
    "tests/vllm/test_kv_phase.py",  # 5 s
    "tests/vllm/test_model_phase.py",  # 2 s
    "tests/vllm/test_forced_backends.py",  # 2 s
)


def module_seconds(reports: Iterable[object]) -> dict[str, float]:
    """Seconds per test module (set-up, call and tear-down of its tests: a module's shared
    engines start in its first test's set-up), slowest first."""
    total: dict[str, float] = defaultdict(float)
    for report in reports:
        nodeid, seconds = getattr(report, "nodeid", ""), getattr(report, "duration", None)
        if nodeid and isinstance(seconds, float):
            total[nodeid.split("::", 1)[0]] += seconds
    return dict(sorted(total.items(), key=lambda kv: -kv[1]))


#: Modules that take at least this many seconds are listed at the end of a run.
LISTED_MODULE_S = 15.0
