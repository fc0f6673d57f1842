"""Live KV resize over HTTP: routes added to vLLM's OpenAI-compatible server.

What belongs here: the server side of the resize API and nothing else. vLLM loads
:data:`kv_cache_routes` when started with
``--middleware initpipe_vllm.serve.kv_cache_routes`` (that dotted name is public and
stable); it answers ``GET /initpipe/kv_cache`` and ``POST /initpipe/kv_cache/resize``,
``/release``, ``/resume`` by calling the async resize API (:mod:`initpipe_vllm.resize`) on
the server's own ``AsyncLLM``, guarded by the server's ``--api-key`` (closed without one
unless :data:`OPEN_ENV` is set), and passes every other request through untouched.

Importing this package imports neither torch nor vllm (Starlette only when a request
arrives).
"""

from __future__ import annotations

from .routes import OPEN_ENV, PREFIX, KVCacheRoutes, kv_cache_routes

__all__ = ["OPEN_ENV", "PREFIX", "KVCacheRoutes", "kv_cache_routes"]
