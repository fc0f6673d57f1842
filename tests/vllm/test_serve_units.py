"""The HTTP routes' own logic, with no engine: what passes through untouched, who is let in,
which path and method answer. A plain Starlette app stands for the rest of vLLM's server;
everything that reaches the engine is tested on real servers (``test_serve.py``).
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

import pytest
from requires import module

module("httpx", "vLLM's OpenAI server brings it")

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from initpipe_vllm.serve import OPEN_ENV, PREFIX, kv_cache_routes


def _app(api_key: list[str] | None, root_path: str = "") -> Starlette:
    async def echo(request: Request) -> JSONResponse:
        body = await request.body()
        return JSONResponse(
            {"path": request.url.path, "method": request.method, "body": body.decode()}
        )

    app = Starlette(
        routes=[
            Route("/v1/echo", echo, methods=["POST", "OPTIONS"]),
            Route(f"{PREFIX}x", echo, methods=["GET"]),
        ]
    )
    app.state.args = Namespace(api_key=api_key)  # what vLLM's build_app sets
    app.add_middleware(kv_cache_routes)
    return app


@pytest.fixture(autouse=True)
def _no_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.delenv(OPEN_ENV, raising=False)


def test_other_requests_pass_through_untouched() -> None:
    client = TestClient(_app(["k"]))
    r = client.post("/v1/echo", content=b"payload")
    assert r.json() == {"path": "/v1/echo", "method": "POST", "body": "payload"}
    # a path that merely starts with the prefix's letters is not a route of ours
    assert client.get(f"{PREFIX}x").json()["path"] == f"{PREFIX}x"
    # CORS preflight goes to the app (vLLM's CORS middleware answers it there)
    assert client.options("/v1/echo").status_code == 200
    assert client.options(PREFIX).status_code == 404  # the app's, not a 401 of ours


def test_with_a_key_every_route_needs_it() -> None:
    client = TestClient(_app(["k1", "k2"]))
    for method, path in [
        ("GET", PREFIX),
        ("POST", f"{PREFIX}/resize"),
        ("POST", f"{PREFIX}/release"),
        ("POST", f"{PREFIX}/resume"),
        ("GET", f"{PREFIX}/nope"),  # even the 404 is behind the key
    ]:
        for headers in ({}, {"Authorization": "Bearer k3"}, {"Authorization": "Basic k1"}):
            r = client.request(method, path, headers=headers)
            assert r.status_code == 401, (method, path, headers, r.text)
            assert r.json()["error"]["type"] == "UnauthorizedError"
    # either key opens them (then the missing engine says so: no engine in this app)
    for key in ("k1", "k2"):
        r = client.get(PREFIX, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 503 and "no engine" in r.json()["error"]["message"]


def test_without_a_key_closed_unless_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    client = TestClient(_app(None))
    r = client.get(PREFIX)
    assert r.status_code == 403
    assert OPEN_ENV in r.json()["error"]["message"]
    monkeypatch.setenv(OPEN_ENV, "yes")
    r = client.get(PREFIX)
    assert r.status_code == 403 and f"{OPEN_ENV}='yes' is not '1'" in r.json()["error"]["message"]
    monkeypatch.setenv(OPEN_ENV, "1")
    assert client.get(PREFIX).status_code == 503  # open: on to the (missing) engine
    # VLLM_API_KEY alone configures a key, as for vLLM's own routes
    monkeypatch.setenv("VLLM_API_KEY", "envkey")
    assert client.get(PREFIX).status_code == 401
    assert client.get(PREFIX, headers={"Authorization": "Bearer envkey"}).status_code == 503


def test_root_path_is_stripped_as_vllm_does() -> None:
    client = TestClient(_app(["k"]), root_path="/api")
    assert client.get(f"/api{PREFIX}").status_code == 401


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", f"{PREFIX}/resize", 405),
        ("POST", PREFIX, 405),
        ("DELETE", f"{PREFIX}/release", 405),
        ("GET", f"{PREFIX}/", 503),  # a trailing slash is the same route
        ("POST", f"{PREFIX}/grow", 404),
    ],
)
def test_paths_and_methods(method: str, path: str, status: int) -> None:
    client = TestClient(_app(["k"]))
    r = client.request(method, path, headers={"Authorization": "Bearer k"})
    assert r.status_code == status, r.text
    if status == 405:
        assert r.headers["allow"] in ("GET", "POST")
    if status == 404:
        assert f"POST {PREFIX}/resize" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{", "not JSON"),
        (b'"x"', "JSON object"),
        (b'{"num_blocks": 1, "size": 2}', "unknown field(s) 'size'"),
    ],
)
def test_bodies_are_checked_before_the_engine_is_asked(body: bytes, says: str) -> None:
    client = TestClient(_app(["k"]))
    r = client.post(f"{PREFIX}/resize", content=body, headers={"Authorization": "Bearer k"})
    assert r.status_code == 400 and says in r.json()["error"]["message"]
    r = client.post(
        f"{PREFIX}/release", content=b'{"num_blocks": 3}', headers={"Authorization": "Bearer k"}
    )
    assert r.status_code == 400 and "this route takes mode" in r.json()["error"]["message"]


def test_errors_have_vllms_shape() -> None:
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    client = TestClient(_app(["k"]))
    r = client.post(f"{PREFIX}/resize", content=b"{", headers={"Authorization": "Bearer k"})
    parsed: Any = ErrorResponse.model_validate(r.json())
    assert parsed.error.code == 400 and parsed.error.type == "BadRequestError"
