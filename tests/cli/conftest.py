"""Fixtures for the ``initpipe`` CLI tests: toy stage modules, a trace, subprocess and
headless-Chromium helpers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import CHROMIUM_FLAGS, MINI_DURATIONS
from requires import missing
from waiting import HANG_S

# The toy stage modules (package ``cli_toys``) import from here: in-process through pytest's
# ``pythonpath`` setting (pyproject.toml), in subprocesses through ``cli_env``'s PYTHONPATH.
HERE = Path(__file__).resolve().parent


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    """A trace JSON for cli_toys.mini_vllm in Trace.write_json's schema.

    The KV phase ran twice (a profiling run, torn down, then the real one): the second
    ``kv_caches`` duration is the one that counts. A host span and a teardown ride along.
    """
    events, t = [], 0.0

    def add(name: str, phase: str, kind: str, dur: float, gen: int = 0) -> None:
        nonlocal t
        events.append(
            {
                "name": name,
                "phase": phase,
                "kind": kind,
                "start": t,
                "duration": dur,
                "outcome": "ok",
                "generation": gen,
                "error": None,
            }
        )
        t += dur

    add("load_weights", "vllm", "span", 2.0)
    for name in ("attn_layers", "attn_backends", "kv_cache_spec", "cudagraph"):
        add(name, "model", "stage", MINI_DURATIONS[name])
    add("kv_caches", "kv_cache_config", "stage", 9.9, gen=1)
    add("kv_caches", "kv_cache_config", "teardown", 0.001, gen=1)
    for name in ("kv_caches", "metadata_builders", "warm_up"):
        add(name, "kv_cache_config", "stage", MINI_DURATIONS[name], gen=2)
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"version": 1, "wall_origin": 0.0, "events": events}))
    return path


@pytest.fixture
def cli_env() -> dict[str, str]:
    """Environment for ``python -m initpipe.cli`` subprocesses that can import the toys."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.fixture
def run_cli(
    cli_env: dict[str, str], tmp_path: Path
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``initpipe ARGS`` in a fresh interpreter; return the completed process (text)."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "initpipe.cli", *args],
            env=cli_env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=HANG_S,
        )

    return run


@pytest.fixture
def chromium(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Open a URL in real headless Chromium with extra flags; return the process result."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        missing("chromium is not installed (make sysdeps: apt-get install chromium)")
    profile = tmp_path / "chromium-profile"

    def open_(url: str, *flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *flags, url],
            capture_output=True,
            text=True,
            timeout=HANG_S,
            cwd=tmp_path,
        )

    return open_
