"""``kv_cache_routes``: the ASGI middleware ``vllm serve --middleware`` loads.

vLLM adds a middleware class with ``app.add_middleware(cls)`` (no arguments): everything
else this needs is read per request from the FastAPI app vLLM built, which Starlette puts in
``scope["app"]``: ``app.state.engine_client`` (the ``AsyncLLM`` the async resize and refit
APIs take) and ``app.state.args`` (the server's ``--api-key``).

Routes (JSON in, JSON out):

=========  ===============================  ==================================================
GET        ``/initpipe/kv_cache``            :class:`~initpipe_vllm.live.api.KVCacheInfo`
POST       ``/initpipe/kv_cache/resize``     ``{"num_blocks": N}`` or
                                             ``{"kv_cache_memory_bytes": B}``, optional
                                             ``"mode": "wait" | "abort"``,
                                             ``"keep_prefix_cache": true | false``
                                             (default true)
                                             -> :class:`~initpipe_vllm.live.api.ResizeReport`
POST       ``/initpipe/kv_cache/release``    optional ``{"mode": ...}`` -> the report
POST       ``/initpipe/kv_cache/resume``     optional size (default: the size before the
                                             release) -> the report
GET        ``/initpipe/weights``             :class:`~initpipe_vllm.live.refit.receipt.
                                             WeightsInfo` (state, version, digests, refits,
                                             failures, failure, last receipt)
POST       ``/initpipe/weights/refit``       ``{"path": "folder"}`` (a folder of safetensors
                                             files inside :data:`~.weights.REFIT_ROOT_ENV`,
                                             absolute or relative to it), optional
                                             ``"version"``, ``"num_blocks"`` or
                                             ``"kv_cache_memory_bytes"``, ``"mode"``,
                                             ``"expected_digest"``, ``"probe"`` (a dict of
                                             :class:`~initpipe_vllm.live.refit.probe.Probe`'s
                                             fields, or false) -> :class:`~initpipe_vllm.
                                             resize.receipt.RefitReceipt`
=========  ===============================  ==================================================

Errors have vLLM's (OpenAI's) error shape, ``{"error": {"message", "type", "param",
"code"}}``, plus the failed call's ``step``, ``rank`` and (resize) ``stage``,
``rolled_back`` or (refit) ``serving`` and, once the engine was reached, its state now
(``"kv_cache"`` or ``"weights"``). Statuses: 400 bad body, a size that cannot work, weights
that do not match the model's checkpoint (a missing or unexpected tensor, another shape or
dtype; not a folder); 401 no or wrong key; 403 no key configured and :data:`OPEN_ENV` not
set, or (refit) no :data:`~.weights.REFIT_ROOT_ENV` configured or a path resolving outside
it; 404/405 wrong path/method under the prefixes; 409 the state refuses it (another resize
or refit running, resume while serving, resize while released, requests that cannot be
drained); 500 a failed resize that was rolled back (the old size serves); 501 an engine
resize or refit cannot follow (not the pipelined worker, data parallel, a connector, the
plugin missing); 503 a failed resize whose rollback failed too (the cache is released:
resume retries), or a refit that failed once started: the engine failed closed and refuses
requests (vLLM's own routes answer 503) until a refit succeeds.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from http import HTTPStatus
from typing import Any

import attrs

from ..contract.declare import vllm_uses
from ..errors import RefitError, RefitRefusedError, ResizeError, ResizeRefusedError
from ..live.api import (
    kv_cache_info_async,
    release_kv_cache_async,
    resize_kv_cache_async,
    resume_kv_cache_async,
)
from .problem import Problem
from .weights import (
    REFIT_FIELDS,
    WEIGHTS_PREFIX,
    refit,
    refit_body,
    refit_metrics,
    refit_root,
    weights_info,
)

__all__ = ["OPEN_ENV", "PREFIX", "KVCacheRoutes", "kv_cache_routes"]

logger = logging.getLogger("vllm.initpipe")

#: The KV cache routes' paths start with this (the weights routes' with
#: :data:`~.weights.WEIGHTS_PREFIX`).
PREFIX = "/initpipe/kv_cache"
#: With no API key configured the routes answer 403 unless this is ``1`` in the server's
#: environment (then anyone who can reach the port may resize the KV cache, and refit the
#: weights from the folder :data:`~.weights.REFIT_ROOT_ENV` names).
OPEN_ENV = "INITPIPE_KV_CACHE_ROUTES_OPEN"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_SIZE = ("num_blocks", "kv_cache_memory_bytes")
#: HTTP status of a refusal (nothing changed), by the step that refused it (resize and
#: refit).
REFUSED_STATUS = {
    "arguments": HTTPStatus.BAD_REQUEST,
    "weights": HTTPStatus.BAD_REQUEST,
    "planning": HTTPStatus.BAD_REQUEST,
    "memory": HTTPStatus.BAD_REQUEST,
    "state": HTTPStatus.CONFLICT,
    "requests": HTTPStatus.CONFLICT,
    "engine": HTTPStatus.NOT_IMPLEMENTED,
}


async def _info(engine: Any, body: dict[str, Any]) -> dict[str, Any]:
    return (await kv_cache_info_async(engine)).to_dict()


async def _resize(engine: Any, body: dict[str, Any]) -> dict[str, Any]:
    return (await resize_kv_cache_async(engine, **body)).to_dict()


async def _release(engine: Any, body: dict[str, Any]) -> dict[str, Any]:
    return (await release_kv_cache_async(engine, **body)).to_dict()


async def _resume(engine: Any, body: dict[str, Any]) -> dict[str, Any]:
    return (await resume_kv_cache_async(engine, **body)).to_dict()


Call = Callable[[Any, dict[str, Any]], Awaitable[dict[str, Any]]]


@attrs.frozen
class _Group:
    """The routes under one prefix: the info that describes their state, the state it
    reads while one of this server's changes is in flight."""

    key: str  # names the info in an error's body
    info: Call
    busy: str


KV_CACHE = _Group("kv_cache", _info, "resizing")
WEIGHTS = _Group("weights", weights_info, "busy")


@attrs.frozen
class _Route:
    method: str
    fields: tuple[str, ...]  # the JSON body's allowed fields
    call: Call
    group: _Group
    action: str = ""  # resize, release, resume, refit: one at a time
    example: str = '{"num_blocks": 64}'
    gate: Callable[[], object] | None = None  # checked before the body is read
    # checks (and completes) the body before the engine is asked
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None


ROUTES: dict[str, _Route] = {
    PREFIX: _Route("GET", (), _info, KV_CACHE),
    f"{PREFIX}/resize": _Route(
        "POST", (*_SIZE, "mode", "keep_prefix_cache"), _resize, KV_CACHE, "resize"
    ),
    f"{PREFIX}/release": _Route("POST", ("mode",), _release, KV_CACHE, "release"),
    f"{PREFIX}/resume": _Route("POST", _SIZE, _resume, KV_CACHE, "resume"),
    WEIGHTS_PREFIX: _Route("GET", (), weights_info, WEIGHTS),
    f"{WEIGHTS_PREFIX}/refit": _Route(
        "POST",
        REFIT_FIELDS,
        refit,
        WEIGHTS,
        "refit",
        '{"path": "model-v2"}',
        gate=refit_root,
        prepare=refit_body,
    ),
}


# -- authorization ------------------------------------------------------------------------
@vllm_uses(
    "serve",
    calls=("vllm.envs:VLLM_API_KEY",),
)
def api_keys(state: Any) -> list[str]:
    """The server's API keys, chosen as vLLM's own ``init_entrypoints_middleware`` does:
    ``--api-key`` (one or more), else ``VLLM_API_KEY``; empty values ignored."""
    from vllm import envs

    given = getattr(getattr(state, "args", None), "api_key", None)
    if isinstance(given, str):
        given = [given]
    return [key for key in (given or [envs.VLLM_API_KEY]) if key]


@vllm_uses(
    "serve",
    calls=("vllm.entrypoints.serve.middleware.authenticate:AuthenticationMiddleware",),
)
@functools.lru_cache(maxsize=4)
def _verifier(keys: tuple[str, ...]) -> Any:
    # vLLM's own check (sha256 digests, constant-time compare, "Bearer" scheme), so the
    # routes accept exactly what the OpenAI routes accept
    from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

    return AuthenticationMiddleware(app=None, tokens=list(keys))  # type: ignore[arg-type]


def _authorize(scope: Scope, state: Any) -> None:
    keys = api_keys(state)
    if keys:
        from starlette.datastructures import Headers

        if not _verifier(tuple(keys)).verify_token(Headers(scope=scope)):
            raise Problem(
                HTTPStatus.UNAUTHORIZED,
                "Unauthorized: send the server's API key (--api-key / VLLM_API_KEY) as "
                "'Authorization: Bearer <key>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return
    opened = os.environ.get(OPEN_ENV)
    if opened == "1":
        return
    why = f" ({OPEN_ENV}={opened!r} is not '1')" if opened is not None else ""
    raise Problem(
        HTTPStatus.FORBIDDEN,
        f"the initpipe routes (KV cache, weights) are closed: this server has no API key{why}. "
        "Start it with --api-key KEY (or VLLM_API_KEY=KEY) and send 'Authorization: Bearer "
        "KEY', or set "
        f"{OPEN_ENV}=1 in the server's environment to open them to anyone who can reach it",
    )


# -- requests -----------------------------------------------------------------------------
def _route(path: str, method: str) -> _Route:
    route = ROUTES.get(path.rstrip("/"))
    if route is None:
        known = ", ".join(f"{r.method} {p}" for p, r in ROUTES.items())
        raise Problem(HTTPStatus.NOT_FOUND, f"no route {path}; the routes are: {known}")
    if method != route.method:
        raise Problem(
            HTTPStatus.METHOD_NOT_ALLOWED,
            f"{method} {path}: use {route.method}",
            headers={"Allow": route.method},
        )
    return route


async def _body(request: Any, route: _Route) -> dict[str, Any]:
    if route.method == "GET":
        return {}
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as err:
        raise Problem(HTTPStatus.BAD_REQUEST, f"the request body is not JSON: {err}") from None
    example = route.example if route.fields else "{}"
    if not isinstance(body, dict):
        raise Problem(
            HTTPStatus.BAD_REQUEST,
            f"the request body must be a JSON object such as {example}, not {type(body).__name__}",
        )
    unknown = sorted(set(body) - set(route.fields))
    if unknown:
        takes = ", ".join(route.fields) or "no fields"
        raise Problem(
            HTTPStatus.BAD_REQUEST,
            f"unknown field(s) {', '.join(map(repr, unknown))}: this route takes {takes}",
            param=unknown[0],
        )
    return body


def _error_type(status: HTTPStatus) -> str:
    name = status.phrase.title().replace(" ", "").replace("-", "")
    return name if name.endswith("Error") else f"{name}Error"


def _error_body(
    status: HTTPStatus, message: str, *, param: str | None = None, **extra: Any
) -> dict[str, Any]:
    error = {"message": message, "type": _error_type(status), "param": param, "code": int(status)}
    return {"error": {**error, **extra}}


class KVCacheRoutes:
    """ASGI middleware: answers the KV cache routes under :data:`PREFIX` and the weights
    routes under :data:`~.weights.WEIGHTS_PREFIX`, passes every other request (and CORS
    preflight ``OPTIONS``) to the app untouched.

    One resize, release, resume or refit at a time per server: while one is in flight
    (e.g. waiting for requests to finish) another gets 409 at once and ``GET`` says
    ``resizing`` (KV cache) or ``busy`` (weights). The engine core also refuses a second one
    while the first waits for requests (one from another API server process, or from the
    Python API). Building the middleware registers the refit's Prometheus metrics
    (:func:`~.weights.refit_metrics`), so ``/metrics`` shows them from the start.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._running: str | None = None
        refit_metrics()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") == "OPTIONS":
            return await self.app(scope, receive, send)
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if not any(path == p or path.startswith(f"{p}/") for p in (PREFIX, WEIGHTS_PREFIX)):
            return await self.app(scope, receive, send)
        from starlette.responses import JSONResponse

        start = time.perf_counter()
        status, body, headers = await self._answer(scope, receive, path)
        logger.info(
            "initpipe: %s %s -> %d (%.3f s)",
            scope["method"],
            path,
            status,
            time.perf_counter() - start,
        )
        await JSONResponse(body, status_code=status, headers=headers)(scope, receive, send)
        return None

    async def _state(self, group: _Group, engine: Any) -> dict[str, Any]:
        """The group's info; its state reads ``group.busy`` while this server has a change
        in flight."""
        info = await group.info(engine, {})
        if self._running is not None:
            info["state"] = group.busy
        return info

    async def _info_now(self, group: _Group, engine: Any) -> dict[str, Any] | None:
        """:meth:`_state` after a failure (None if the engine cannot say)."""
        try:
            return await self._state(group, engine)
        except Exception:
            return None

    async def _call(self, route: _Route, engine: Any, body: dict[str, Any]) -> Any:
        if not route.action:
            return await self._state(route.group, engine)
        if self._running is not None:
            raise Problem(
                HTTPStatus.CONFLICT,
                f"another resize or refit is running ({self._running}, state "
                f"'{route.group.busy}'); this one was not started: retry once it has answered",
            )
        self._running = route.action
        try:
            return await route.call(engine, body)
        finally:
            self._running = None

    async def _answer(
        self, scope: Scope, receive: Receive, path: str
    ) -> tuple[int, Any, dict[str, str]]:
        """(status, JSON body, headers) for one request under :data:`PREFIX`."""
        from starlette.requests import Request

        state = getattr(scope.get("app"), "state", None)
        engine = None
        group = WEIGHTS if path.startswith(WEIGHTS_PREFIX) else KV_CACHE
        try:
            _authorize(scope, state)
            route = _route(path, scope["method"])
            if route.gate is not None:
                route.gate()
            body = await _body(Request(scope, receive), route)
            if route.prepare is not None:
                body = route.prepare(body)
            engine = getattr(state, "engine_client", None)
            if engine is None:
                raise Problem(HTTPStatus.SERVICE_UNAVAILABLE, "the server has no engine yet")
            return HTTPStatus.OK, await self._call(route, engine, body), {}
        except Problem as p:
            body = _error_body(p.status, p.message, param=p.param)
            if engine is not None:
                body[group.key] = await self._info_now(group, engine)
            return p.status, body, p.headers or {}
        except RefitError as err:
            if isinstance(err, RefitRefusedError):
                status = REFUSED_STATUS.get(err.step, HTTPStatus.BAD_REQUEST)
            elif err.serving:
                status = HTTPStatus.INTERNAL_SERVER_ERROR
            else:  # failed closed: nothing is served until a refit succeeds
                status = HTTPStatus.SERVICE_UNAVAILABLE
            details = {k: getattr(err, k) for k in ("step", "rank", "serving")}
            body = _error_body(status, str(err), **details)
            if engine is not None and status != HTTPStatus.BAD_REQUEST:
                body[group.key] = await self._info_now(group, engine)
            return status, body, {}
        except ResizeError as err:
            if isinstance(err, ResizeRefusedError):
                status = REFUSED_STATUS.get(err.step or "", HTTPStatus.BAD_REQUEST)
            elif err.rolled_back:
                status = HTTPStatus.INTERNAL_SERVER_ERROR
            else:
                status = HTTPStatus.SERVICE_UNAVAILABLE
            details = {k: getattr(err, k) for k in ("step", "stage", "rank", "rolled_back")}
            body = _error_body(status, str(err), **details)
            if engine is not None and status != HTTPStatus.BAD_REQUEST:
                body[group.key] = await self._info_now(group, engine)
            return status, body, {}
        except Exception as err:  # the engine died, a bug: say what, no traceback over HTTP
            logger.exception("initpipe: %s %s failed", scope["method"], path)
            status = HTTPStatus.INTERNAL_SERVER_ERROR
            return status, _error_body(status, f"{type(err).__name__}: {err}"), {}


#: The public, stable name: ``--middleware initpipe_vllm.serve.kv_cache_routes``.
kv_cache_routes = KVCacheRoutes
