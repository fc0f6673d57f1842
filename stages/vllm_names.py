"""The vLLM names more than one module declares against, each written once.

What belongs here: ``module:qualname`` strings of vLLM classes and functions (the form
``meta["mirrors"]``/``meta["calls"]`` and ``@vllm_uses`` take, see
:mod:`initpipe_vllm.contract.declare`) that several modules name — the runner classes
first. A name one module alone uses stays next to its use. Strings only: importing this
module imports neither torch nor vllm, and it imports nothing of this package, so every
layer may use it.

When a release moves one of these, the contract reports it (``initpipe doctor``) and the
fix is one line here — or, where both releases must be named, a second constant beside
the first.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DRAFT_SPECULATOR",
    "MODEL_STATE",
    "MRV2_RUNNER",
    "MRV2_RUNNER_MODULE",
    "MRV2_TEARDOWN",
    "PLATFORM",
    "V1_RUNNER",
]

#: vLLM's v1 ``GPUModelRunner`` (``vllm/v1/worker/gpu_model_runner.py``): what the v1
#: catalog (:mod:`initpipe_vllm.v1`) and its runner adapter replace.
V1_RUNNER: Final = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"

#: The module of Model Runner V2's ``GPUModelRunner`` (also its logger's name).
MRV2_RUNNER_MODULE: Final = "vllm.v1.worker.gpu.model_runner"
#: Model Runner V2's ``GPUModelRunner``: what :mod:`initpipe_vllm.mrv2` and its adapter
#: replace.
MRV2_RUNNER: Final = f"{MRV2_RUNNER_MODULE}:GPUModelRunner"
#: MRv2's per-model state interface, which its stages and adapter read.
MODEL_STATE: Final = "vllm.v1.worker.gpu.model_states.interface:ModelState"
#: MRv2's draft-model speculator, which builds its own attention over the KV cache.
DRAFT_SPECULATOR: Final = "vllm.v1.worker.gpu.spec_decode.speculator:DraftModelSpeculator"
#: MRv2's KV cleanup after a profiling pass; its teardowns reproduce pieces of it.
MRV2_TEARDOWN: Final = "vllm.v1.worker.gpu.cudagraph_utils:_teardown_profiling_state"

#: The platform interface (``current_platform``'s class) whose hooks the adapters call.
PLATFORM: Final = "vllm.platforms.interface:Platform"
