"""Worker classes that run the runner's initialization through the initpipe catalog.

What belongs here: the thin worker hook only — it swaps vLLM's runner for the pipelined
one and changes nothing else (issue 4 adds progress logging, trace files, the plugin entry
point and ``initpipe run``). Replaces the runner construction in
``vllm/v1/worker/cpu_worker.py`` (``CPUWorker.init_device``) and
``vllm/v1/worker/gpu_worker.py`` (``Worker._make_model_runner``).

Use as ``LLM(..., worker_cls="initpipe_vllm.worker.PipelinedWorker")`` (or
``--worker-cls``); ``PipelinedWorker`` resolves to the platform's variant. Works in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and in spawned worker processes (the package is
installed, so the qualname resolves there). The classes are built on first attribute
access, so importing this module on a GPU host never imports the CPU worker (whose import
monkeypatches torch's CUDA APIs).
"""

from __future__ import annotations

import functools
from typing import Any

from .errors import UnsupportedRunnerError
from .runner import pipelined_runner_class

__all__ = ["PipelinedCPUWorker", "PipelinedGPUWorker", "PipelinedWorker"]


@functools.cache
def _cpu_worker() -> type:
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.cpu_worker import CPUWorker

    class PipelinedCPUWorker(CPUWorker):
        """``CPUWorker`` whose runner initializes through the initpipe catalog.

        ``CPUWorker.init_device`` hard-codes ``CPUModelRunner``, so the stock runner is
        built there and replaced right after (init-map section 6).
        """

        def init_device(self) -> None:
            super().init_device()
            if self.use_v2_model_runner:
                raise UnsupportedRunnerError("the CPU model runner V2 is not covered by the "
                                             "initpipe catalog (it covers the v1 runner).")
            self.model_runner = pipelined_runner_class(CPUModelRunner)(self.vllm_config,
                                                                       self.device)

    PipelinedCPUWorker.__module__ = __name__
    PipelinedCPUWorker.__qualname__ = "PipelinedCPUWorker"
    return PipelinedCPUWorker


@functools.cache
def _gpu_worker() -> type:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.gpu_worker import Worker

    class PipelinedGPUWorker(Worker):
        """GPU ``Worker`` whose v1 runner initializes through the initpipe catalog.

        Untested here (no GPU). Model Runner V2 is vLLM's default on CUDA; set
        ``VLLM_USE_V2_MODEL_RUNNER=0`` to get the v1 runner this catalog covers.
        """

        def _make_model_runner(self) -> Any:
            if self.use_v2_model_runner:
                raise UnsupportedRunnerError(
                    "Model Runner V2 is enabled; the initpipe catalog covers the v1 "
                    "GPUModelRunner. Set VLLM_USE_V2_MODEL_RUNNER=0.")
            return pipelined_runner_class(GPUModelRunner)(self.vllm_config, self.device)

    PipelinedGPUWorker.__module__ = __name__
    PipelinedGPUWorker.__qualname__ = "PipelinedGPUWorker"
    return PipelinedGPUWorker


def __getattr__(name: str) -> Any:
    if name == "PipelinedCPUWorker":
        return _cpu_worker()
    if name == "PipelinedGPUWorker":
        return _gpu_worker()
    if name == "PipelinedWorker":
        from vllm.platforms import current_platform

        return _cpu_worker() if current_platform.is_cpu() else _gpu_worker()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
