"""Stable dotted names ``initpipe_vllm.runner.Pipelined<Runner>`` and the runner helpers.

The lazily built runner classes (``PipelinedCPUModelRunner``, ``PipelinedGPUModelRunner``)
carry this module as their ``__module__``, so pickling and vLLM's qualname lookup resolve
them here. The code lives in :mod:`initpipe_vllm.hook.runner`.
"""

from __future__ import annotations

from typing import Any

from .hook import runner as _impl
from .hook.runner import (
    PipelinedRunnerMixin,
    apply_kv_outputs,
    apply_model_outputs,
    clear_kv_state,
    engine_kv_cache_config,
    kv_inputs,
    pipelined_runner_class,
    platform_runner_class,
    start_inputs,
)

__all__ = [
    "PipelinedRunnerMixin",
    "apply_kv_outputs",
    "apply_model_outputs",
    "clear_kv_state",
    "engine_kv_cache_config",
    "kv_inputs",
    "pipelined_runner_class",
    "platform_runner_class",
    "start_inputs",
]


def __getattr__(name: str) -> Any:
    return getattr(_impl, name)
