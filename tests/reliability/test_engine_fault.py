"""Once through a real engine: a failing KV stage reports its name to the user.

The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) in ONE subprocess (an
engine mutates its process). The pipelined runner class's ``initpipe_default_pipeline`` is
set there to ``catalog().replace(stage, failing_stage)``; no product file is edited.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from initpipe_vllm import catalog
from initpipe_vllm.testing import model_dir

STAGE = "runner_kv_caches"  # late in the KV phase: allocation already happened
SCRIPT = Path(__file__).with_name("engine_fault_script.py")


@pytest.fixture(scope="module")
def engine_failure():
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env.pop("INITPIPE_VLLM", None)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(model_dir("tiny-llama")), STAGE],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :]), proc.stdout + proc.stderr


def test_engine_start_fails_with_the_stage_name_in_the_message(engine_failure) -> None:
    result, _ = engine_failure
    assert result["raised"] is not None, "the engine started although a stage raised"
    assert f"stage {STAGE!r}" in result["message"]
    assert "disk on fire" in result["message"]


def test_the_user_sees_what_completed_and_what_was_rolled_back(engine_failure) -> None:
    result, output = engine_failure
    err = result["stage_error"]
    assert err is not None and err["stage"] == STAGE
    kv = catalog().phase_order("kv_cache_config")
    assert err["completed"] == kv[: kv.index(STAGE)]
    assert err["rolled_back"] == err["completed"][::-1]
    assert "allocated_kv_caches" in result["message"]  # the completed list reaches the user
    assert STAGE in output  # and the process output names it
