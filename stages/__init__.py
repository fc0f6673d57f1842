"""initpipe's vLLM catalogs: folder ``stages/``, import name ``initpipe_vllm`` — this module
is only the facade.

Why two names: vLLM resolves ``worker_cls="initpipe_vllm.worker.PipelinedWorker"`` by its
qualified name inside every spawned worker process, where a user's own module called
``stages`` on the path could shadow a bare ``import stages``. The folder keeps the
design's name; ``pyproject.toml`` (``[tool.setuptools.package-dir]``) installs it as
``initpipe_vllm``. Every path below is relative to ``stages/``.

vLLM's runner initialization (``get_kv_cache_spec``, ``initialize_kv_cache`` and what they
call) rebuilt as initpipe stages that call vLLM's own building blocks. One folder per
concern, imports pointing down (``tests/test_layout.py`` checks it):

- the catalogs, siblings: ``v1/`` (vLLM's v1 ``GPUModelRunner``) and ``mrv2/`` (Model
  Runner V2, vLLM's default runner where Triton exists), each its stages and the records
  they pass; ``catalogs.py``, what they share (each built once per (runner, release),
  extended once per extension set); ``releases/``, one module per vLLM release holding what
  differs in it (stage overlays); ``vllm_names.py``, the vLLM names several modules
  declare against; ``compat.py``, each vLLM call that moves between releases, bound once;
  ``errors.py``, the error tree (rooted in ``initpipe.InitpipeError``);
- ``contract/`` — what the catalogs mirror of vLLM, and the check against the installed one;
- ``hook/`` — the vLLM integration: pipelined runners (v1 and MRv2) and worker, plugin,
  progress;
- ``live/`` — changes to a running engine, one transaction at a time: its KV cache's
  resize, release and resume (with the prefix cache kept) and the weight refit (the
  public ``resize_kv_cache``, ``release_kv_cache``, ``resume_kv_cache``,
  ``kv_cache_info``, ``refit``, ``weights_info`` and their twins, re-exported here lazily);
- ``serve/`` — the same over HTTP: ``initpipe_vllm.serve.kv_cache_routes``, middleware for
  ``vllm serve --middleware``;
- ``testing/`` — the test kit: pytest plugin, ``runner_snapshot``, the stock-vs-pipelined
  equivalence harness, runner builders;
- ``tools/`` — ``initpipe run``, ``plan``, ``doctor``, ``startup``;
- ``models/`` — the embedded tiny model configs.

What this facade keeps working: the v1 catalog's names (:func:`catalog`,
:func:`base_catalog`, ``STAGES``, ``INITPIPE_INPUTS``, every stage, so
``Pipeline.from_module("initpipe_vllm")`` builds it), the error names, the lazy live API,
``initpipe_vllm:pipeline`` (what ``initpipe graph`` draws), and the v1 stage modules'
pre-folder names (``initpipe_vllm.kv_tensors`` is ``initpipe_vllm.v1.kv_tensors``; an
extension written against them keeps importing). ``worker.py``, ``runner.py`` and
``pytest_plugin.py`` are thin re-exports that keep the dotted names vLLM, pickling and
users' tests resolve (``initpipe_vllm.worker.PipelinedWorker``,
``initpipe_vllm.runner.Pipelined*``, ``initpipe_vllm.pytest_plugin``).

Importing this package imports neither torch nor vllm, so the graph can be drawn at once.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from . import _import_time, errors  # _import_time first: when this package's import began
from .catalogs import base_catalog, catalog
from .errors import *  # noqa: F403 -- the error tree (errors.__all__)
from .v1 import *  # noqa: F403 -- every v1 stage, for Pipeline.from_module("initpipe_vllm")
from .v1 import (
    INITPIPE_INPUTS,
    STAGES,
    __all__ as _v1_names,
    kv_phase,
    kv_tensors,
    model_phase,
    types,
)

#: The v1 stage modules under their names before the catalogs had folders (issue 34): an
#: extension that imports ``initpipe_vllm.kv_tensors`` gets ``initpipe_vllm.v1.kv_tensors``.
MOVED_MODULES = {
    "kv_phase": kv_phase,
    "kv_tensors": kv_tensors,
    "model_phase": model_phase,
    "types": types,
}
for _name, _module in MOVED_MODULES.items():
    sys.modules.setdefault(f"{__name__}.{_name}", _module)
del _name, _module

#: The live-resize API, re-exported lazily from ``live/`` (a higher layer).
RESIZE_API = (
    "KVCacheInfo",
    "Probe",
    "RefitReceipt",
    "ResizeReport",
    "WeightsInfo",
    "kv_cache_info",
    "kv_cache_info_async",
    "refit",
    "refit_async",
    "release_kv_cache",
    "release_kv_cache_async",
    "resize_kv_cache",
    "resize_kv_cache_async",
    "resume_kv_cache",
    "resume_kv_cache_async",
    "weights_info",
    "weights_info_async",
)


def __getattr__(name: str) -> Any:
    # `initpipe graph initpipe_vllm:pipeline` draws what workers would run (extensions too).
    if name == "pipeline":
        return catalog()
    if name in RESIZE_API:
        from .live import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "INITPIPE_INPUTS",
    "STAGES",
    "base_catalog",
    "catalog",
    *RESIZE_API,
    *(n for n in _v1_names if n not in ("CATALOG", "INITPIPE_INPUTS", "STAGES")),
]
__all__ += errors.__all__
_import_time.ENDED_S = time.time()
