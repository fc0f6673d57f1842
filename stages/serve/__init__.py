"""Live KV resize and weight refit over HTTP: routes added to vLLM's OpenAI-compatible
server.

What belongs here: the server side of the resize and refit APIs and nothing else. vLLM
loads :data:`kv_cache_routes` when started with
``--middleware initpipe_vllm.serve.kv_cache_routes`` (that dotted name is public and
stable); it answers ``GET /initpipe/kv_cache`` and ``POST /initpipe/kv_cache/resize``,
``/release``, ``/resume`` by calling the async resize API (:mod:`initpipe_vllm.live`),
and ``GET /initpipe/weights`` and ``POST /initpipe/weights/refit`` by calling the async
refit API (the folder confined to :data:`REFIT_ROOT_ENV`), on the server's own
``AsyncLLM``, guarded by the server's ``--api-key`` (closed without one unless
:data:`OPEN_ENV` is set), and passes every other request through untouched. Modules:
:mod:`.routes` (the middleware, the KV cache routes, authorization, errors),
:mod:`.weights` (the refit's path rule, calls and Prometheus metrics), :mod:`.problem`.

Importing this package imports neither torch nor vllm (Starlette only when a request
arrives).
"""

from __future__ import annotations

from .routes import OPEN_ENV, PREFIX, KVCacheRoutes, kv_cache_routes
from .weights import REFIT_ROOT_ENV, WEIGHTS_PREFIX

__all__ = [
    "OPEN_ENV",
    "PREFIX",
    "REFIT_ROOT_ENV",
    "WEIGHTS_PREFIX",
    "KVCacheRoutes",
    "kv_cache_routes",
]
