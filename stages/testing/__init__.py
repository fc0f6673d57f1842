"""The test kit: what the catalog's tests, and third-party stage authors, test with.

What belongs here: tools for checking a pipelined runner against stock vLLM — nothing the
product path calls.

- :mod:`.builders` — engine-less runners (stock or pipelined) on a tiny local model, and the
  ``KVCacheConfig`` the engine would plan for them;
- :mod:`.snapshot` — ``runner_snapshot``: a runner's initialization state as plain data,
  and ``diff_snapshots``; :mod:`.snapshot_v2` — the same for Model Runner V2;
- :mod:`.triton_cpu` — Model Runner V2 on a CPU through Triton's interpreter (a test
  device: the ``sitecustomize.py`` in ``triton_cpu_site/``); :mod:`.site_chain` — such a
  ``sitecustomize`` runs the one it would hide;
- :mod:`.equivalence` — stock vs pipelined engines on one config: same tokens, logprobs and
  snapshots on a KV-sensitive workload (``python -m initpipe_vllm.testing.equivalence
  --model DIR``);
- :mod:`.stock` — ``stock_environment`` and ``require_stock``: an oracle engine that is
  certainly stock (the ``INITPIPE_VLLM`` opt-in unset, every rank's runner checked);
- :mod:`.process_globals` — the module globals a runner's initialization sets in its
  process, reset before each engine of a comparison (neither side inherits the other's);
- :mod:`.failures` — two failed engines compared: the same error, raised in the same
  place, the same state up to the failure;
- :mod:`.weights` — ``seeded_model``: a tiny model folder with seeded real safetensors
  weights, so outputs depend on the KV cache;
- :mod:`.pytest_plugin` — the ``pytest11`` plugin with fixtures for stage-level tests.

Fault injection into a run lives in :mod:`initpipe.testing` (the core's test facility).
"""

from __future__ import annotations

from . import builders
from .builders import *  # noqa: F403 -- engine-less runners and configs (builders.__all__)
from .weights import seeded_model

__all__ = ["seeded_model"]
__all__ += builders.__all__
