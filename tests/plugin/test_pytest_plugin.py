"""The pytest11 plugin, used the way a stage author would: a test file of their own."""

import pytest

pytest.importorskip("vllm")

AUTHOR_TESTS = '''
import pytest
from initpipe import stage
from initpipe_vllm.pytest_plugin import assert_same_state, assert_stages_ran


@stage(needs="kv_cache_config", after="runner_kv_caches")
def kv_bytes_report(kv_caches):
    """A third-party stage: bytes per layer, after binding."""
    return {name: t.numel() * t.element_size() for name, t in kv_caches.items()}


@pytest.mark.parametrize("initpipe_model", ["tiny-llama", "tiny-gemma2"])
def test_kv_cache_spec_stage_alone(initpipe_model, initpipe_runner, initpipe_model_outputs,
                                   run_stage):
    from initpipe_vllm.model_phase import kv_cache_spec

    out = run_stage(kv_cache_spec, vllm_config=initpipe_runner.vllm_config,
                    attention_layers=initpipe_model_outputs["attention_layers"],
                    shared_kv_cache_layers=initpipe_model_outputs["shared_kv_cache_layers"])
    assert out == initpipe_runner.runner.get_kv_cache_spec()


def test_my_stage_with_its_upstream(run_with_stage, initpipe_runner, runner_snapshot):
    runner = run_with_stage(kv_bytes_report)
    report = runner.initpipe_run.outputs["kv_bytes_report"]
    assert set(report) == set(initpipe_runner.kv_cache_config.kv_cache_groups[0].layer_names)
    assert all(b > 0 for b in report.values())
    assert_stages_ran(runner.initpipe_run, ["allocated_kv_caches", "runner_kv_caches",
                                            "kv_bytes_report"], phase="kv_cache_config")
    stock = initpipe_runner.runner
    with initpipe_runner.current():
        stock.initialize_kv_cache(initpipe_runner.kv_cache_config)
    assert_same_state(runner_snapshot(stock), runner_snapshot(runner))


def test_run_stage_names_missing_inputs(run_stage):
    from initpipe_vllm.model_phase import kv_cache_spec
    run_stage(kv_cache_spec, vllm_config=None)
'''


def test_plugin_fixtures_serve_a_stage_authors_tests(pytester):
    pytester.makepyfile(test_author=AUTHOR_TESTS)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=1)
    out = result.stdout.str()
    assert (
        "stage 'kv_cache_spec' takes ['vllm_config', 'attention_layers', "
        "'shared_kv_cache_layers']; missing ['attention_layers', 'shared_kv_cache_layers']" in out
    )


def test_snapshot_assertion_reports_each_difference(pytester):
    pytester.makepyfile(
        test_diff="""
from initpipe_vllm.pytest_plugin import assert_same_state
def test_diff():
    assert_same_state({"a": 1, "b": [1, 2]}, {"a": 2, "b": [1, 2]})
"""
    )
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*runner states differ (1 differences)*"])
