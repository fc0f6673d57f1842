"""The HTTP routes' own logic, with no engine: what passes through untouched, who is let in,
which path and method answer. A plain Starlette app stands for the rest of vLLM's server;
everything that reaches the engine is tested on real servers (``test_serve.py``).
"""

from __future__ import annotations

import re
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest
from requires import module

module("httpx", "vLLM's OpenAI server brings it")

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from initpipe_vllm.serve import OPEN_ENV, PREFIX, REFIT_ROOT_ENV, WEIGHTS_PREFIX, kv_cache_routes

REFIT = f"{WEIGHTS_PREFIX}/refit"


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
    monkeypatch.delenv(REFIT_ROOT_ENV, raising=False)


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
        ("GET", WEIGHTS_PREFIX),
        ("POST", REFIT),  # before the refit root is asked for
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


# -- the weights routes -------------------------------------------------------------------
def _refit(client: TestClient, body: Any) -> Any:
    return client.post(REFIT, json=body, headers={"Authorization": "Bearer k"})


def test_without_a_refit_root_the_refit_route_is_off() -> None:
    client = TestClient(_app(["k"]))
    r = _refit(client, {"path": "/anything"})
    assert r.status_code == 403, r.text
    assert f"no {REFIT_ROOT_ENV}" in r.json()["error"]["message"]
    # whatever the body: the route is off before the body is read
    assert (
        client.post(REFIT, content=b"{", headers={"Authorization": "Bearer k"}).status_code == 403
    )
    # the weights' state is still answered (here: no engine)
    assert client.get(WEIGHTS_PREFIX, headers={"Authorization": "Bearer k"}).status_code == 503


def test_a_refit_root_that_is_no_folder_keeps_the_route_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(REFIT_ROOT_ENV, str(tmp_path / "missing"))
    r = _refit(TestClient(_app(["k"])), {"path": "x"})
    assert r.status_code == 403 and "is not a folder" in r.json()["error"]["message"]


def test_refit_paths_must_resolve_inside_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from initpipe_vllm.serve.problem import Problem
    from initpipe_vllm.serve.weights import refit_path

    root = tmp_path / "root"
    (root / "v2").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "escape").symlink_to(tmp_path / "outside")
    (root / "inside").symlink_to(root / "v2")
    resolved = root.resolve()
    assert refit_path("v2", resolved) == resolved / "v2"  # relative to the root
    assert refit_path(str(root / "v2"), resolved) == resolved / "v2"
    assert refit_path("inside", resolved) == resolved / "v2"  # a link that stays inside
    assert refit_path("v2/../v2/.", resolved) == resolved / "v2"
    for given in ("../outside", "escape", "v2/../../outside", str(tmp_path / "outside"), "/"):
        with pytest.raises(Problem) as refused:
            refit_path(given, resolved)
        assert refused.value.status == 403 and refused.value.param == "path", given
        assert REFIT_ROOT_ENV in refused.value.message
    for bad in (None, "", 3, ["v2"], "a\x00b"):
        with pytest.raises(Problem) as refused:
            refit_path(bad, resolved)
        assert refused.value.status == 400, bad

    # over HTTP: refused before the engine is asked (this app has none: 503 would say so)
    monkeypatch.setenv(REFIT_ROOT_ENV, str(root))
    client = TestClient(_app(["k"]))
    r = _refit(client, {"path": "../outside"})
    assert r.status_code == 403 and r.json()["error"]["param"] == "path", r.text
    assert _refit(client, {"path": "v2"}).status_code == 503  # inside: on to the engine
    r = _refit(client, {"paht": "v2"})
    assert r.status_code == 400 and "unknown field(s) 'paht'" in r.json()["error"]["message"]
    assert '{"path": "model-v2"}' in _refit(client, [1]).json()["error"]["message"]


def test_the_refit_metrics_are_registered_once() -> None:
    from prometheus_client import REGISTRY, generate_latest

    from initpipe_vllm.serve.weights import refit_metrics

    first = refit_metrics()
    assert first is not None
    TestClient(_app(["k"]))  # building the middleware again registers nothing new
    refit_metrics.cache_clear()  # as a second import of the module would
    again = refit_metrics()
    assert again is not None and again.refits is first.refits
    assert again.last_seconds is first.last_seconds and again.failures is first.failures
    text = generate_latest(REGISTRY).decode()
    kinds = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    for name in ("initpipe_refits", "initpipe_refit_failures"):
        assert kinds.get(name, kinds.get(f"{name}_total")) == "counter", name
        assert re.search(rf"^{name}_total \S+$", text, re.M), name
    assert kinds["initpipe_last_refit_seconds"] == "gauge"
