"""Stable dotted names ``initpipe_vllm.runner.Pipelined<Runner>`` and the runner helpers.

The lazily built runner classes (``PipelinedCPUModelRunner``, ``PipelinedGPUModelRunner``,
and Model Runner V2's ``PipelinedCPUModelRunnerV2``, ``PipelinedGPUModelRunnerV2``,
``PipelinedXPUModelRunnerV2``) carry this module as their ``__module__``, so pickling and
vLLM's qualname lookup resolve them here. The shared mixin, the factory and the resolver live
in :mod:`initpipe_vllm.hook.adapter`; the two adapters in :mod:`initpipe_vllm.hook.runner`
and :mod:`initpipe_vllm.hook.runner_v2`. The helpers below are re-exported explicitly
(``import X as X``), which is what type checkers read as this module's public names.
"""

from __future__ import annotations

from typing import Any

from .hook import runner as _impl
from .hook.runner import (
    PipelinedRunnerMixin as PipelinedRunnerMixin,
    apply_kv_outputs as apply_kv_outputs,
    apply_model_outputs as apply_model_outputs,
    clear_kv_state as clear_kv_state,
    engine_kv_cache_config as engine_kv_cache_config,
    kv_inputs as kv_inputs,
    pipelined_runner_class as pipelined_runner_class,
    platform_runner_class as platform_runner_class,
    start_inputs as start_inputs,
)


def __getattr__(name: str) -> Any:
    # The lazily built classes, of every runner's adapter (hook.adapter resolves them).
    from .hook.adapter import resolve_class

    cls = resolve_class(name)
    return cls if cls is not None else getattr(_impl, name)
