"""The real ``initpipe`` program in a fresh interpreter: every format and flag, exit codes,
determinism, and no torch/vLLM import."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import MINI_CRITICAL, needs_dot
from requires import missing
from waiting import HANG_S

MINI = "cli_toys.mini_vllm"
Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.mark.parametrize(
    ("fmt", "marker"),
    [
        ("text", "pipeline 'cli_toys.mini_vllm': 7 stages"),
        ("mermaid", "flowchart TD"),
        ("dot", 'digraph "cli_toys.mini_vllm"'),
        ("json", '"order": ['),
    ],
)
def test_text_formats_on_stdout(run_cli: Run, fmt: str, marker: str) -> None:
    res = run_cli("graph", MINI, "--format", fmt)
    assert (res.returncode, res.stderr) == (0, "")
    assert marker in res.stdout


@needs_dot
@pytest.mark.parametrize(
    ("fmt", "head"), [("svg", b"<?xml"), ("png", b"\x89PNG"), ("html", b"<!DOCTYPE html>")]
)
def test_drawn_formats_to_a_file(run_cli: Run, tmp_path: Path, fmt: str, head: bytes) -> None:
    out = tmp_path / f"graph.{fmt}"
    res = run_cli("graph", MINI, "-o", str(out))
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")
    assert out.read_bytes().startswith(head)


@needs_dot
def test_png_to_a_pipe(run_cli: Run, cli_env: dict[str, str]) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "initpipe.cli", "graph", MINI, "-f", "png"],
        env=cli_env,
        capture_output=True,
        timeout=HANG_S,
    )
    assert res.returncode == 0
    assert res.stdout.startswith(b"\x89PNG")


def test_check_exit_codes(run_cli: Run) -> None:
    ok = run_cli("graph", MINI, "--check")
    assert (ok.returncode, ok.stdout.startswith("OK: ")) == (0, True)
    bad = run_cli("graph", "cli_toys.broken", "--check")
    assert bad.returncode == 1
    assert bad.stdout.startswith("invalid pipeline 'cli_toys.broken': 4 problems")


@pytest.mark.parametrize(
    "argv",
    [
        ["graph", "no_such_module_xyz"],
        ["graph", MINI, "--focus", "nope"],
        ["graph", MINI, "--phase", "kv"],
        ["graph", MINI, "--bogus"],
        ["nope"],
    ],
)
def test_usage_errors_exit_2_with_error_on_stderr(run_cli: Run, argv: list[str]) -> None:
    res = run_cli(*argv)
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr.splitlines()[-1].startswith("Error: ")
    assert "Traceback" not in res.stderr


def test_filters_trace_and_blame(run_cli: Run, trace_file: Path) -> None:
    res = run_cli("graph", MINI, "--phase", "model", "--focus", "cudagraph", "-f", "json")
    assert json.loads(res.stdout)["order"] == [
        "attn_layers",
        "attn_backends",
        "kv_cache_spec",
        "cudagraph",
    ]
    res = run_cli("graph", MINI, "--trace", str(trace_file), "-f", "json")
    assert json.loads(res.stdout)["critical_path"] == MINI_CRITICAL
    res = run_cli("graph", MINI, "--trace", str(trace_file), "--blame")
    assert res.returncode == 0
    assert res.stdout.splitlines()[0].split() == ["1.200s", "kv_caches", "(kv_cache_config)"]


def test_diff_exit_codes(run_cli: Run, tmp_path: Path) -> None:
    saved = tmp_path / "base.json"
    assert run_cli("graph", MINI, "-o", str(saved)).returncode == 0
    assert run_cli("graph", MINI, "--diff", str(saved)).returncode == 0
    res = run_cli("graph", "cli_toys.changed_vllm", "--diff", str(saved))
    assert res.returncode == 1
    assert "- stage warm_up (kv_cache_config)" in res.stdout


def test_console_script_is_installed(cli_env: dict[str, str]) -> None:
    exe = shutil.which("initpipe", path=os.path.dirname(sys.executable))
    if exe is None:
        missing("the initpipe console script is not installed (pip install -e .)")
    res = subprocess.run(
        [exe, "graph", "cli_toys.linear", "--check"],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert res.returncode == 0
    assert res.stdout == (
        "OK: pipeline 'cli_toys.linear' is valid: 3 stages "
        "(model: 2, kv_cache_config: 1), 2 edges\n"
    )


def test_output_does_not_depend_on_the_hash_seed(run_cli: Run, cli_env: dict[str, str]) -> None:
    outs = []
    for seed in ("0", "12345"):
        env = {**cli_env, "PYTHONHASHSEED": seed}
        res = subprocess.run(
            [sys.executable, "-m", "initpipe.cli", "graph", MINI, "-f", "dot"],
            env=env,
            capture_output=True,
            text=True,
            timeout=HANG_S,
        )
        outs.append(res.stdout)
    assert outs[0] == outs[1] and outs[0]


def _imported_heavy(cli_env: dict[str, str], argv: list[str]) -> list[str]:
    code = (
        f"import sys; from initpipe.cli import main; rc = main({argv!r}); "
        "print(rc, [m for m in ('torch', 'vllm') if m in sys.modules])"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], env=cli_env, capture_output=True, text=True, timeout=HANG_S
    )
    rc, _, mods = res.stdout.strip().splitlines()[-1].partition(" ")
    assert rc == "0", res.stderr
    return json.loads(mods.replace("'", '"'))


def test_graph_imports_neither_torch_nor_vllm(cli_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "g.json"
    assert _imported_heavy(cli_env, ["graph", MINI, "-f", "json", "-o", str(out)]) == []
    assert json.loads(out.read_text())["version"] == 1


def test_catalog_graph_imports_neither_torch_nor_vllm(cli_env: dict[str, str]) -> None:
    """The default target, the vLLM catalog, must stay light to draw."""
    assert _imported_heavy(cli_env, ["graph", "--check"]) == []
