"""Third-party stages: API replace/add, and entry points enabled only on request."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from coretoys import linear

from initpipe import Extension, ExtensionError, Pipeline, apply_extensions, stage

EXTPKG = Path(__file__).parent / "extpkg"


def test_api_extension_replaces_and_adds_and_marks_the_package():
    @stage(needs="model", provides="b")
    def triple(a):
        return a * 3

    @stage(needs="kv_cache_config")
    def log_d(d):
        return d

    base = Pipeline.from_module(linear)
    p = apply_extensions(
        base, [Extension(name="x", replace={"b": triple}, add=[log_d], package="acme-kv")]
    )
    assert p.order == ["a", "b", "c", "d", "log_d"]
    assert p.specs["b"].package == "acme-kv" and p.specs["a"].package is None
    run = p.start(config=1)
    run.load(model=1)
    run.initialize_kv_cache(0)
    assert run.outputs["b"] == 6 and run.outputs["log_d"] == 7


def test_api_extension_breaking_the_graph_names_the_package():
    @stage(needs="model")
    def bad(kv_cache_config):
        return 1

    with pytest.raises(ExtensionError, match="extension 'x' from package 'acme'") as e:
        apply_extensions(
            Pipeline.from_module(linear), [Extension(name="x", add=[bad], package="acme")]
        )
    assert e.value.package == "acme"
    assert type(e.value.problems[0]).__name__ == "PhaseViolationError"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The toy extension package installed with --no-deps into a throwaway folder."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(EXTPKG),
        ],
        check=True,
        capture_output=True,
    )
    return target


def run_with(installed, env_value, code):
    env = {k: v for k, v in os.environ.items() if k != "INITPIPE_EXTENSIONS"}
    env["PYTHONPATH"] = os.pathsep.join([str(installed), str(Path(__file__).parent)])
    if env_value is not None:
        env["INITPIPE_EXTENSIONS"] = env_value
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True
    )


SHOW = """
    import json
    from initpipe import Pipeline
    from coretoys import linear
    p = Pipeline.from_module(linear).with_extensions()
    run = p.start(config=1); run.load(model=1); run.initialize_kv_cache(0)
    print(json.dumps({"order": p.order, "b": run.outputs["b"],
                      "pkg": {n: s.package for n, s in p.specs.items()}}))
"""


def test_installed_extension_changes_nothing_unless_enabled(installed):
    res = run_with(installed, None, SHOW)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out == {
        "order": ["a", "b", "c", "d"],
        "b": 4,
        "pkg": {"a": None, "b": None, "c": None, "d": None},
    }


def test_enabled_extensions_replace_and_add(installed):
    res = run_with(installed, "toy_double,toy_audit", SHOW)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["order"] == ["a", "b", "c", "d", "audit"]
    assert out["b"] == 8
    assert out["pkg"]["b"] == "initpipe-toy-ext" and out["pkg"]["audit"] == "initpipe-toy-ext"


def test_broken_extension_is_rejected_naming_the_package(installed):
    res = run_with(installed, "toy_broken", SHOW)
    assert res.returncode != 0
    assert "ExtensionError: extension 'toy_broken' from package 'initpipe-toy-ext'" in res.stderr
    assert "missing input 'no_such_key'" in res.stderr


def test_unknown_extension_lists_the_installed_ones(installed):
    res = run_with(installed, "toy_dubble", SHOW)
    assert "extension 'toy_dubble' is not installed" in res.stderr
    assert "toy_audit, toy_broken, toy_double" in res.stderr
