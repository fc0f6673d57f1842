"""The release tier: the proofs that every vLLM release initpipe supports passes against its
own stock vLLM. ``tests/conftest.py`` marks them ``proof``; ``make test`` runs the whole suite
on vLLM 0.32.0, then these (``-m proof``) on the vLLM 0.33.0 test device
(``make test-release``), then on the vLLM 0.34.0 device, a release with Model Runner V2
only, which skips the v1 proofs and runs MRv2's counterparts (:func:`proofs`). The devices
are for tests, never the product path."""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "EVERY_MRV2",
    "MRV2_ONLY_PROOFS",
    "MRV2_TIER_ONLY",
    "MRV2_TIER_ONLY_MODULES",
    "RELEASE_PROOFS",
    "V1_ONLY",
    "mrv2_tier_only",
    "names",
    "parametrized_with",
    "proofs",
    "skips_mrv2_tier_only",
]

#: The release tier: the proofs that every vLLM release initpipe supports passes against its
#: own stock vLLM, marked ``proof``. ``make test`` runs the whole suite on vLLM 0.32.0, then
#: these (``-m proof``) on the vLLM 0.33.0 test device (``make test-release``). Each entry is
#: a test node id or its prefix (a module, a test, one parameter).
RELEASE_PROOFS = (
    # the contract: the release's locks regenerate; doctor all ok, installed and on the wheel
    "tests/contract/test_lock.py",
    "tests/contract/test_drift.py",  # a drifted copy of the release is named and refused
    # the release's catalogs and runner adapters, their lifecycle
    "tests/vllm/test_catalog.py",
    "tests/hook/test_release_axis.py",
    "tests/hook/test_runner_states.py",
    # stock == pipelined engines: v1 on every embedded model; MRv2 on sliding window (0.33's
    # block-table reach) and a Mamba hybrid (every model on MRv2: by hand once per port, the
    # interpreted kernels cost about 35 s a model)
    "tests/vllm/test_engine_equivalence.py::test_stock_and_pipelined_engines_are_identical",
    "tests/vllm/test_engine_equivalence.py::test_the_workload_spans_blocks_and_hits_the_prefix_cache",
    "tests/vllm/test_engine_equivalence.py::test_the_architectures_cover_what_they_claim",
    *(
        f"tests/vllm/test_mrv2.py::{test}[{model}]"
        for test in (
            "test_stock_and_pipelined_mrv2_engines_are_identical",
            "test_the_teardown_leaves_what_stocks_teardown_leaves",
        )
        for model in ("tiny-gemma2", "tiny-nemotron-h")
    ),
    # the runner state vs stock's, and the v1 variant's draft mark
    "tests/vllm/test_runner.py::test_a_draft_models_layers_are_marked_in_their_specs_as_stock_marks_them",
    "tests/vllm/test_runner.py::test_init_cleanup_profiling_and_reinit_match_stock[tiny-gemma2]",
    # a fault at each stage whose variant is new rolls back (v1 kv_cache_spec; every MRv2 stage)
    "tests/reliability/test_fault_injection.py::test_model_stage_fault_surfaces_from_the_runner_and_retry_works[kv_cache_spec",
    "tests/vllm/test_mrv2_engineless.py",
    # live resize, release and resume == a fresh stock engine of that size (v1 in-process;
    # TP=2 with the engine core and workers in their own processes); a failure inside the
    # replayed scheduler step rolls back; initpipe plan == the release's own planning
    *(
        f"tests/vllm/test_resize.py::{test}[v1"
        for test in (
            "test_the_oracles_are_stock_vllm",
            "test_a_resized_engine_is_a_fresh_engine_of_that_size",
            "test_release_frees_everything_and_refuses_requests_until_resume",
            "test_a_fault_at_any_kv_stage_rolls_back_to_the_previous_size",
            "test_a_failure_in_the_scheduler_step_rolls_back_to_the_previous_size",
        )
    ),
    "tests/vllm/test_resize_parallel.py::test_the_oracles_are_stock_vllm_on_every_rank[v1]",
    "tests/vllm/test_resize_parallel.py::test_every_rank_resizes_to_a_fresh_engine_of_the_new_size[v1]",
    # weight refit == a fresh stock engine started with the new weights, both runners
    # in-process (MRv2 on Triton's interpreter); a fault at a step fails closed and a retry
    # succeeds; TP=2: every rank's digest
    *(
        f"tests/vllm/test_refit.py::{test}[{runner}"
        for runner in ("v1", "v2")
        for test in (
            "test_the_oracles_are_stock_vllm_and_the_engine_is_pipelined",
            "test_a_refitted_engine_is_a_fresh_engine_started_with_the_new_weights",
            "test_no_prefix_cache_block_survives_a_refit",
            "test_the_digest_sees_a_change_to_one_linear_weight",
            "test_a_fault_at_any_step_fails_closed_and_a_retry_succeeds",
            "test_vllms_direct_reload_is_refused_before_anything_changes",
        )
    ),
    "tests/vllm/test_resize_parallel.py::test_a_refit_reaches_every_rank_and_back_equals_a_fresh_engine[v1]",
    # a tied head (Qwen3, both runners): the release's own reload still leaves it stale (the
    # control), the refit equals a fresh engine, the planted load bugs fail it closed; a
    # model whose load_weights writes parameters itself (GPT-OSS) is refused unchanged
    *(
        f"tests/vllm/test_refit_models.py::{test}[tiny-qwen3"
        for test in (
            "test_the_two_checkpoints_differ",
            "test_vllms_own_reload_still_serves_a_stale_tied_head",
            "test_a_refitted_tied_model_is_a_fresh_engine_on_the_new_weights",
            "test_a_trainers_weights_load_as_a_fresh_load_would",
            "test_a_head_that_differs_from_its_tied_embedding_is_refused",
            "test_the_receipt_says_what_was_checked_and_repaired",
            "test_each_planted_bug_fails_the_refit_closed_naming_it",
        )
    ),
    "tests/vllm/test_refit_unreloadable.py",
    # a server synced by other means, checked from outside (initpipe check-weights): the
    # release's own stock server on the real model agrees with its own weights, names other
    # weights, and names a prefix cache left stale by vLLM's reload
    "tests/vllm/test_check_weights.py",
    # a resize that keeps the prefix cache == a stock engine of the new size that served the
    # same requests (grow and shrink), both runners in-process; the carry on vLLM's BlockPool
    *(
        f"tests/vllm/test_resize_warm.py::{test}[{runner}"
        for runner in ("v1", "v2")
        for test in (
            "test_a_grow_keeps_the_pool_of_an_engine_of_the_new_size_with_the_same_history",
            "test_after_a_grow_every_prompt_hits_and_answers_as_the_stock_engine",
            "test_a_shrink_keeps_the_most_recent_blocks_that_fit_with_their_bytes",
            "test_after_a_shrink_the_kept_hit_the_evicted_recompute_as_the_stock_engine",
        )
    ),
    "tests/vllm/test_carry_units.py",
    "tests/vllm_plan/test_vllm_plan.py",
    "tests/vllm/test_resize_units.py",  # the scheduler rebuilt == a fresh one; the builder
    "tests/contract/test_compat.py",  # the planning calls bound once, per release
    # the start-up report: the release's span sites, the config timer, spans of a real start
    "tests/startup/test_span_sites.py",
    "tests/startup/test_marks_and_cli.py::test_the_config_timer_times_vllms_engine_config",
    "tests/startup/test_startup_engines.py::test_in_process_the_tree_nests_initpipes_stages_in_vllms_spans",
    "tests/startup/test_startup_engines.py::test_model_runner_v2_through_the_test_device",
    "tests/startup/test_probes.py",  # every probe's target is in the release
    "tests/vllm/test_stage_spans.py::test_a_failing_stage_is_an_error_span_and_the_rollback_is_there",
)


#: Proofs of :data:`RELEASE_PROOFS` that are Model Runner V1's whatever their parameters
#: (the v1 harness, the v1 runner in-process, v1's plan against a v1 engine): a release
#: without that runner (0.34.0) skips them, as it skips every test parametrized ``"v1"``.
V1_ONLY = (
    "tests/vllm/test_engine_equivalence.py",
    "tests/vllm/test_runner.py",
    "tests/reliability/test_fault_injection.py",
    "tests/vllm_plan/test_vllm_plan.py",
    "tests/startup/test_startup_engines.py::test_in_process_the_tree_nests_initpipes_stages_in_vllms_spans",
    # the v1 runner's class: its states, its overridden methods, its stage spans
    "tests/hook/test_runner_states.py::test_an_entry_point_out_of_order_names_the_call_to_make_first[PipelinedCPUModelRunner",
    "tests/hook/test_runner_states.py::test_the_states_follow_the_run_and_the_runners_kv",
    "tests/contract/test_lock.py::test_the_subclasses_initpipe_builds_are_resolved_too",
    "tests/vllm/test_resize_units.py::test_both_pipelined_runners_are_driven_through_one_interface",
    "tests/vllm/test_stage_spans.py",
)

#: The release tier of a release with Model Runner V2 only (0.34.0) adds MRv2's
#: counterparts of the v1 proofs it skips: stock == pipelined MRv2 on every embedded model
#: (and TP=2 with the engine core in its own process); MRv2's plan == what stock MRv2
#: allocates (``test_mrv2.py``, the default plan there); live resize, release and resume,
#: and the rollbacks, on MRv2 in-process and at TP=2; the HTTP routes on an MRv2 server.
MRV2_ONLY_PROOFS = (
    "tests/vllm/test_mrv2.py",
    *(
        f"tests/vllm/test_resize.py::{test}[v2"
        for test in (
            "test_the_oracles_are_stock_vllm",
            "test_a_resized_engine_is_a_fresh_engine_of_that_size",
            "test_release_frees_everything_and_refuses_requests_until_resume",
            "test_a_fault_at_any_kv_stage_rolls_back_to_the_previous_size",
            "test_a_failure_in_the_scheduler_step_rolls_back_to_the_previous_size",
        )
    ),
    # the engine core in its own process: LLM and AsyncLLM resize, release, a spawned
    # worker's fault, the async refit (one engine start: the module)
    "tests/vllm/test_resize_multiprocess.py",
    "tests/vllm/test_resize_parallel.py::test_the_oracles_are_stock_vllm_on_every_rank[v2]",
    "tests/vllm/test_resize_parallel.py::test_every_rank_resizes_to_a_fresh_engine_of_the_new_size[v2]",
    "tests/vllm/test_resize_parallel.py::test_a_refit_reaches_every_rank_and_back_equals_a_fresh_engine[v2]",
    "tests/vllm/test_serve.py::test_the_oracle_servers_are_stock_vllm[v2]",
    "tests/vllm/test_serve.py::test_completions_after_a_shrink_and_a_grow_equal_fresh_servers[v2",
)


#: Model Runner V2's slowest tests (minutes each through Triton's interpreter) run where
#: MRv2 is the only runner: on 0.34.0's tier, the release users install, they are proofs
#: (:func:`proofs`); a release with both runners (0.32.0's whole suite, 0.33.0's tier)
#: skips them: MRv2 with the engine core and TP=2 workers in their own processes, its HTTP
#: servers, the harness on the embedded models beyond those the plan and the 0.33.0 tier
#: read, and the real model. ``INITPIPE_EVERY_MRV2=1`` runs them there too.
MRV2_TIER_ONLY = (
    "tests/vllm/test_mrv2.py::test_mrv2_with_the_engine_core_and_two_workers_in_their_own_processes",
    *(
        f"tests/vllm/test_mrv2.py::{test}[{model}]"
        for test in (
            "test_stock_and_pipelined_mrv2_engines_are_identical",
            "test_the_teardown_leaves_what_stocks_teardown_leaves",
        )
        for model in (
            "tiny-bert",
            "tiny-gemma4-fastprefill",
            "tiny-llama-connector",
            "tiny-deepseek-mla",
            "tiny-lfm2",
            "tiny-gpt-oss",
        )
    ),
    "tests/vllm/test_real_model.py::test_model_runner_v2_on_the_real_weights_equals_stock_mrv2",
)
#: Modules whose every ``"v2"``-parametrized test is :data:`MRV2_TIER_ONLY` (several
#: processes or servers per engine).
MRV2_TIER_ONLY_MODULES = ("tests/vllm/test_serve.py", "tests/vllm/test_resize_parallel.py")
#: The environment variable that runs :data:`MRV2_TIER_ONLY` on every release.
EVERY_MRV2 = "INITPIPE_EVERY_MRV2"


def mrv2_tier_only(nodeid: str, params: dict[str, Any]) -> bool:
    """Whether the test ``nodeid`` (with its parameters) is :data:`MRV2_TIER_ONLY`."""
    if any(names(nodeid, p) for p in MRV2_TIER_ONLY):
        return True
    module = nodeid.split("::", 1)[0]
    return module in MRV2_TIER_ONLY_MODULES and parametrized_with(params, "v2")


def parametrized_with(params: dict[str, Any], runner: str) -> bool:
    """Whether a test's parameters name ``runner`` (``"v1"``/``"v2"``), alone or in a
    tuple."""
    return any(v == runner or (isinstance(v, tuple) and runner in v) for v in params.values())


def skips_mrv2_tier_only() -> bool:
    """Whether a release with both runners skips :data:`MRV2_TIER_ONLY` (unless
    ``INITPIPE_EVERY_MRV2=1``)."""
    return os.environ.get(EVERY_MRV2) != "1"


def proofs(has_v1: bool) -> tuple[str, ...]:
    """The release tier of a release with (``has_v1``) or without Model Runner V1, beside
    :data:`MRV2_TIER_ONLY` (a proof where there is no v1: :func:`mrv2_tier_only`)."""
    return RELEASE_PROOFS if has_v1 else (*RELEASE_PROOFS, *MRV2_ONLY_PROOFS)


def names(nodeid: str, proof: str) -> bool:
    """Whether ``proof`` (a node id, a module, a test, or a node id cut inside its
    parameters, e.g. ``test_x[v1``) names the test ``nodeid``."""
    if not nodeid.startswith(proof):
        return False
    rest = nodeid[len(proof) :]
    if not rest:
        return True
    if "[" in proof and not proof.endswith("]"):  # cut inside the parameters
        return rest[0] in "-]"
    return rest.startswith(("::", "["))
