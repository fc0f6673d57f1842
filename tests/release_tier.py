"""The release tier: the proofs that every vLLM release initpipe supports passes against its
own stock vLLM. ``tests/conftest.py`` marks them ``proof``; ``make test`` runs the whole suite
on vLLM 0.32.0, then these (``-m proof``) on the vLLM 0.33.0 test device
(``make test-release``; the device is for tests, never the product path)."""

from __future__ import annotations

__all__ = ["RELEASE_PROOFS", "names"]

#: The release tier: the proofs that every vLLM release initpipe supports passes against its
#: own stock vLLM, marked ``proof``. ``make test`` runs the whole suite on vLLM 0.32.0, then
#: these (``-m proof``) on the vLLM 0.33.0 test device (``make test-release``). Each entry is
#: a test node id or its prefix (a module, a test, one parameter).
RELEASE_PROOFS = (
    # the contract: the release's locks regenerate; doctor all ok, installed and on the wheel
    "tests/contract/test_lock.py",
    # the release's catalogs and runner adapters, their lifecycle
    "tests/vllm/test_catalog.py",
    "tests/hook/test_release_axis.py",
    "tests/hook/test_runner_states.py",
    # stock == pipelined engines: v1 plain and sliding window; MRv2 sliding window (0.33's
    # block-table reach) and a Mamba hybrid (the whole proof, every model, by hand per port)
    *(
        f"tests/vllm/test_engine_equivalence.py::{test}[{model}]"
        for test in (
            "test_stock_and_pipelined_engines_are_identical",
            "test_the_workload_spans_blocks_and_hits_the_prefix_cache",
        )
        for model in ("tiny-llama", "tiny-gemma2")
    ),
    *(
        f"tests/vllm/test_mrv2.py::test_stock_and_pipelined_mrv2_engines_are_identical[{model}]"
        for model in ("tiny-gemma2", "tiny-nemotron-h")
    ),
    # the runner state vs stock's, and the v1 variant's draft mark
    "tests/vllm/test_runner.py::test_a_draft_models_layers_are_marked_in_their_specs_as_stock_marks_them",
    "tests/vllm/test_runner.py::test_init_cleanup_profiling_and_reinit_match_stock[tiny-gemma2]",
    # a fault at each stage whose variant is new rolls back (v1 kv_cache_spec; every MRv2 stage)
    "tests/reliability/test_fault_injection.py::test_model_stage_fault_surfaces_from_the_runner_and_retry_works[kv_cache_spec",
    "tests/vllm/test_mrv2_engineless.py",
    # the start-up report: the release's span sites, the config timer, spans of a real start
    "tests/startup/test_span_sites.py",
    "tests/startup/test_marks_and_cli.py::test_the_config_timer_times_vllms_engine_config",
    "tests/startup/test_startup_engines.py::test_in_process_the_tree_nests_initpipes_stages_in_vllms_spans",
    "tests/vllm/test_stage_spans.py::test_a_failing_stage_is_an_error_span_and_the_rollback_is_there",
)


def names(nodeid: str, proof: str) -> bool:
    """Whether ``proof`` (a node id, a module, or a node id cut inside its parameters)
    names the test ``nodeid``."""
    return nodeid == proof or nodeid.startswith((proof + "::", proof + "[", proof + "-"))
