"""The vLLM integration: where the catalog meets a running vLLM worker.

What belongs here: everything that touches vLLM's runner and worker objects at run time,
and nothing that is a stage.

- :mod:`.runner` — ``PipelinedRunnerMixin`` and the one adapter that writes stage outputs
  onto vLLM's v1 ``GPUModelRunner`` / ``CPUModelRunner``;
- :mod:`.runner_v2` — ``PipelinedRunnerV2Mixin`` and its adapter, for Model Runner V2
  (the :mod:`initpipe_vllm.mrv2` catalog);
- :mod:`.worker` — ``PipelinedWorker`` (CPU, CUDA/ROCm and XPU variants), the class vLLM is
  given as ``worker_cls``, and ``why_not_pipelined``, the one decision of whether it can run
  a config;
- :mod:`.plugin` — the opt-in ``vllm.general_plugins`` entry point (``INITPIPE_VLLM=1``),
  which keeps vLLM's stock worker, with one warning, where the pipelined one cannot run;
- :mod:`.progress` — per-stage log lines, trace files and failure reports;
- :mod:`.parallel` — what several workers on one machine need first (vLLM's CPU thread
  binding per rank).

Imports point down: this package uses the catalog (``initpipe_vllm`` and its stage
modules) and ``initpipe``; the tools and the test kit use this package, never the reverse.
vLLM is imported lazily, inside the functions that need it.
"""

from __future__ import annotations

__all__ = ["PIPELINED_WORKER"]

#: The dotted name vLLM is given as ``worker_cls`` (resolved in every worker process, so
#: it stays stable: ``initpipe_vllm/worker.py`` re-exports the class from :mod:`.worker`).
PIPELINED_WORKER = "initpipe_vllm.worker.PipelinedWorker"
