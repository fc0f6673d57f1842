"""Stable dotted name ``initpipe_vllm.worker.PipelinedWorker`` (vLLM's ``worker_cls``).

vLLM resolves ``worker_cls`` by its qualified name inside every worker process, and users
write it into their configs: it must not move. The code lives in
:mod:`initpipe_vllm.hook.worker`; the classes are built on first access there.
"""

from __future__ import annotations

from typing import Any

from .hook import worker as _impl
from .hook.worker import SUPPORTED_VLLM, check_vllm_version, runner_version

__all__ = [
    "SUPPORTED_VLLM",
    "PipelinedCPUWorker",  # noqa: F822  (built on first access, by __getattr__)
    "PipelinedGPUWorker",  # noqa: F822  (built on first access, by __getattr__)
    "PipelinedWorker",  # noqa: F822  (built on first access, by __getattr__)
    "check_vllm_version",
    "runner_version",
]


def __getattr__(name: str) -> Any:
    # PipelinedWorker / PipelinedCPUWorker / PipelinedGPUWorker are built lazily (importing
    # the CPU worker on a GPU host would patch torch's CUDA APIs).
    return getattr(_impl, name)
