"""Resize over HTTP: ``--middleware initpipe_vllm.serve.kv_cache_routes`` on real servers,
talked to with a real HTTP client.

Four real OpenAI-compatible servers start together (once for the module), each on
tiny-llama with seeded KV-sensitive weights and the middleware given:

- ``main``: initpipe's pipelined worker, ``--api-key``, started at ``C`` blocks; the tests
  resize it; its engine core holds its steps while a test's hold file exists
  (``INITPIPE_HOLD_STEPS``), so requests stay in flight when a test needs them to;
- ``fresh_b``: stock vLLM started at ``B`` blocks, no key, no opt-in: the oracle for ``B``
  and the closed (403) routes;
- ``fresh_c``: stock vLLM started at ``C`` blocks, no key, ``OPEN_ENV=1``: the oracle for
  ``C``, open routes, and a resize refused because the engine is not the pipelined worker;
- ``faulty``: the pipelined worker at ``C``, open, whose worker fails its first resize at
  the KV allocation (``INITPIPE_INJECT_FAULT=allocated_kv_caches@2``): the rollback over HTTP.

The four start once per runner: v1, then Model Runner V2 on Triton's interpreter (every
server, stock ones included, runs MRv2; the fault then hits MRv2's allocating stage), and
every test runs on both.

The oracle is each fresh server's FIRST run of the workload (an empty prefix cache, as after
a resize). The workload's prefix-cache hits depend on the cache size (a repeat of the first
prompt after others fill 12 blocks misses at ``B`` and hits at ``C``), so the two oracles
differ and a resized server that kept the old size could not pass.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import re
from pathlib import Path
from typing import Any

import pytest
from requires import module
from waiting import HANG_S, until_async

B, C = 12, 40
KEY = "initpipe-test-key"
MODEL = Path(__file__).resolve().parents[2] / "stages" / "models" / "tiny-llama"
ROUTES = "/initpipe/kv_cache"
#: The stage that allocates the KV tensors, in each runner's catalog (the faulty server).
FAULT_STAGES = {"v1": "allocated_kv_caches", "v2": "kv_caches_by_layer"}
#: Tokens of the requests that keep a resize waiting (max_model_len is 512). The hold
#: keeps them in flight whatever their length; MRv2's interpreted kernels make each token
#: about 12x dearer here, so its requests are shorter.
LONG = {"v1": 450, "v2": 40}
PROMPT = 50  # their prompts' tokens

httpx = module("httpx", "vLLM's OpenAI server brings it")


# -- the servers --------------------------------------------------------------------------
def _runner_env(runner: str) -> dict[str, str | None]:
    """What a server's environment needs to run ``runner`` (MRv2: the test kit's
    interpreter set-up, which its spawned engine core inherits)."""
    if runner == "v1":
        return {}
    from initpipe_vllm.testing import triton_cpu

    return {k: v for k, v in triton_cpu.environ().items() if os.environ.get(k) != v}


@pytest.fixture(scope="module", params=("v1", "v2"))
def servers(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    seeded_weights_dir: Path,
) -> Any:
    from initpipe.testing import ENV_FAULT
    from initpipe_vllm.hook import PIPELINED_WORKER
    from initpipe_vllm.live.core.hold import ENV_HOLD
    from initpipe_vllm.serve import OPEN_ENV
    from initpipe_vllm.testing.equivalence import loadable_model, workload_engine_kwargs
    from initpipe_vllm.testing.server import ServerSpec, running_servers
    from initpipe_vllm.testing.stock import OPT_IN_VARS

    runner = request.param
    run_env = _runner_env(runner)
    with loadable_model(MODEL, weights_dir=seeded_weights_dir) as (folder, extra):

        def engine(blocks: int) -> dict[str, Any]:
            kwargs, _ = workload_engine_kwargs(
                folder,
                num_gpu_blocks_override=blocks,
                gpu_memory_utilization=0.2,
                **extra,
            )
            kwargs["enable_prompt_tokens_details"] = True  # cached tokens in the usage
            return kwargs

        common = ["--middleware", "initpipe_vllm.serve.kv_cache_routes"]
        # No server inherits the opt-in: the fresh ones are the stock oracles.
        stock = dict.fromkeys(OPT_IN_VARS)
        closed = {"VLLM_API_KEY": None, OPEN_ENV: None, **stock, **run_env}
        opened = {"VLLM_API_KEY": None, OPEN_ENV: "1", **stock, **run_env}
        hold = tmp_path_factory.mktemp("hold") / "steps"  # main's steps held while it exists
        fault = FAULT_STAGES[runner]
        specs = [
            ServerSpec(
                "main",
                engine(C),
                [*common, "--worker-cls", PIPELINED_WORKER, "--api-key", KEY],
                {**closed, ENV_HOLD: str(hold)},
            ),
            ServerSpec("fresh_b", engine(B), common, closed),
            ServerSpec("fresh_c", engine(C), common, opened),
            # its first resize fails in the worker, at the allocation (run 1 is the start)
            ServerSpec(
                "faulty",
                engine(C),
                [*common, "--worker-cls", PIPELINED_WORKER],
                {**opened, ENV_FAULT: f"{fault}@2"},
            ),
        ]
        logs = tmp_path_factory.mktemp(f"servers_{runner}")
        with running_servers(specs, logs) as running:
            clients = {
                name: httpx.Client(
                    base_url=s.url,
                    timeout=300,
                    headers={"Authorization": f"Bearer {KEY}"} if name == "main" else {},
                )
                for name, s in running.items()
            }
            try:
                yield {
                    "servers": running,
                    "clients": clients,
                    "model": str(folder),
                    "hold": hold,
                    "runner": runner,
                }
            finally:
                for client in clients.values():
                    client.close()


def test_the_oracle_servers_are_stock_vllm(servers: Any) -> None:
    """The fresh servers log no initpipe phase line; the pipelined ones do (the needle
    works), whatever INITPIPE_VLLM the suite was started with."""
    phase = re.compile(r"initpipe .*kv_cache_config phase: ")
    logs = {n: s.log.read_text(errors="replace") for n, s in servers["servers"].items()}
    assert {n for n, text in logs.items() if phase.search(text)} == {"main", "faulty"}


@pytest.fixture(scope="module")
def main(servers: Any) -> Any:
    return servers["clients"]["main"]


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(n)]


FIRST = _prompt(1, 200)  # two blocks: one full (cacheable), one partial
WORKLOAD = [
    FIRST,
    FIRST[:128] + _prompt(2, 40),  # shares FIRST's full block: a prefix-cache hit
    *(_prompt(10 + i, 300) for i in range(6)),  # 3 blocks each: 18 > a 12-block cache
    FIRST,  # evicted at B=12 blocks, still cached at C=40
]


def _complete(client: Any, model: str, prompt: list[int], **extra: Any) -> Any:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": 6,
        "temperature": 0.0,
        "logprobs": 2,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        **extra,
    }
    return client.post("/v1/completions", json=body)


def _one(client: Any, model: str, prompt: list[int]) -> dict[str, Any]:
    """One completion: tokens, logprobs, cached tokens."""
    r = _complete(client, model, prompt)
    assert r.status_code == 200, r.text
    choice, usage = r.json()["choices"][0], r.json()["usage"]
    return {
        "tokens": choice["token_ids"],
        "logprobs": choice["logprobs"]["token_logprobs"],
        "top": choice["logprobs"]["top_logprobs"],
        "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
    }


def _workload(client: Any, model: str) -> list[dict[str, Any]]:
    """The workload's completions, one at a time."""
    return [_one(client, model, prompt) for prompt in WORKLOAD]


@pytest.fixture(scope="module")
def oracle(servers: Any) -> dict[int, Any]:
    """Each fresh server's first workload run (empty prefix cache)."""
    model, clients = servers["model"], servers["clients"]
    return {B: _workload(clients["fresh_b"], model), C: _workload(clients["fresh_c"], model)}


def _cache_info_labels(client: Any) -> dict[str, str]:
    text = client.get("/metrics").text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("vllm:cache_config_info{")]
    return dict(re.findall(r'(\w+)="([^"]*)"', line))


def _resize(client: Any, **body: Any) -> Any:
    """A resize that empties the prefix cache (the oracles' state) unless told otherwise."""
    body.setdefault("keep_prefix_cache", False)
    r = client.post(f"{ROUTES}/resize", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _at(client: Any, blocks: int) -> None:
    """Bring ``main`` to ``blocks`` (tests share it; each says where it starts)."""
    info = client.get(ROUTES).json()
    if info["state"] == "released":
        assert client.post(f"{ROUTES}/resume", json={"num_blocks": blocks}).status_code == 200
    elif info["num_blocks"] != blocks:
        _resize(client, num_blocks=blocks)


# -- the tests ----------------------------------------------------------------------------
def test_completions_after_a_shrink_and_a_grow_equal_fresh_servers(
    servers: Any, main: Any, oracle: dict[int, Any]
) -> None:
    model = servers["model"]
    # sensitivity: the two sizes give different results on this workload
    assert oracle[B] != oracle[C]
    assert oracle[C][-1]["cached"] == 128 and oracle[B][-1]["cached"] == 0
    assert oracle[C][1]["cached"] == 128

    start = main.get(ROUTES).json()
    assert (start["num_blocks"], start["model_runner"]) == (C, servers["runner"])
    assert _workload(main, model) == oracle[C]  # before: a fresh pipelined server

    shrink = _resize(main, num_blocks=B)
    assert (shrink["action"], shrink["blocks_before"], shrink["blocks_after"]) == ("resize", C, B)
    assert shrink["bytes_freed"] > shrink["bytes_allocated"] > 0
    assert _workload(main, model) == oracle[B]

    grow = _resize(main, num_blocks=C, mode="abort")
    assert (grow["blocks_before"], grow["blocks_after"], grow["mode"]) == (B, C, "abort")
    assert _workload(main, model) == oracle[C]
    info = main.get(ROUTES).json()
    assert info["state"] == "serving" and info["num_blocks"] == C
    assert info["last_report"] == grow


def test_a_resize_over_http_keeps_the_prefix_cache_by_default(servers: Any, main: Any) -> None:
    model = servers["model"]
    _at(main, C)
    _one(main, model, FIRST)
    hit = _one(main, model, FIRST)
    assert hit["cached"] == 128
    r = main.post(f"{ROUTES}/resize", json={"num_blocks": B})  # the default keeps it
    assert r.status_code == 200, r.text
    carry = r.json()["prefix_cache"]
    assert carry["kept"] and carry["blocks_kept"] >= 1 and carry["bytes_copied"] > 0
    assert _one(main, model, FIRST) == hit
    cold = _resize(main, num_blocks=C)
    assert cold["prefix_cache"]["reason"] == "keep_prefix_cache=False"
    assert _one(main, model, FIRST)["cached"] == 0


def test_metrics_show_the_new_capacity(servers: Any, main: Any) -> None:
    clients = servers["clients"]
    _at(main, B)
    assert _cache_info_labels(main) == _cache_info_labels(clients["fresh_b"])
    _resize(main, num_blocks=C)
    labels = _cache_info_labels(main)
    assert labels == _cache_info_labels(clients["fresh_c"])
    assert labels["num_gpu_blocks"] == str(C)
    assert labels["kv_cache_size_tokens"] == str(C * int(labels["block_size"]))


def test_release_refuses_completions_with_503_and_resume_equals_a_fresh_server(
    servers: Any, main: Any, oracle: dict[int, Any]
) -> None:
    model = servers["model"]
    _at(main, C)
    released = main.post(f"{ROUTES}/release")
    assert released.status_code == 200, released.text
    assert (released.json()["action"], released.json()["blocks_after"]) == ("release", 0)
    info = main.get(ROUTES).json()
    assert (info["state"], info["num_blocks"], info["resume_blocks"]) == ("released", 0, C)
    assert _cache_info_labels(main)["num_gpu_blocks"] == "0"

    refused = _complete(main, model, FIRST)
    assert refused.status_code == 503
    message = refused.json()["error"]["message"]
    assert "released" in message and f"POST {ROUTES}/resume" in message
    # a resize of a released cache conflicts with its state; the state did not change
    conflict = main.post(f"{ROUTES}/resize", json={"num_blocks": B})
    assert conflict.status_code == 409, conflict.text
    assert conflict.json()["kv_cache"]["state"] == "released"

    resumed = main.post(f"{ROUTES}/resume")
    assert resumed.status_code == 200, resumed.text
    assert (resumed.json()["blocks_before"], resumed.json()["blocks_after"]) == (0, C)
    assert _workload(main, model) == oracle[C]
    again = main.post(f"{ROUTES}/resume")
    assert again.status_code == 409 and "not released" in again.json()["error"]["message"]


def test_the_routes_need_the_servers_api_key(servers: Any) -> None:
    url = servers["servers"]["main"].url
    model = servers["model"]
    with httpx.Client(base_url=url, timeout=HANG_S) as anon:
        for method, path in [("GET", ROUTES), ("POST", f"{ROUTES}/resize")]:
            r = anon.request(method, path, json={"num_blocks": B})
            assert r.status_code == 401, r.text
            assert r.json()["error"]["code"] == 401
            assert r.headers["www-authenticate"] == "Bearer"
        wrong = anon.get(ROUTES, headers={"Authorization": "Bearer not-the-key"})
        assert wrong.status_code == 401
        # vLLM's own routes take the same key the same way
        assert _complete(anon, model, FIRST).status_code == 401
    with httpx.Client(
        base_url=url, timeout=HANG_S, headers={"Authorization": f"Bearer {KEY}"}
    ) as c:
        assert c.get(ROUTES).status_code == 200
        assert _complete(c, model, FIRST).status_code == 200


def test_without_a_key_the_routes_are_closed_unless_opened(servers: Any) -> None:
    from initpipe_vllm.serve import OPEN_ENV

    closed, opened = servers["clients"]["fresh_b"], servers["clients"]["fresh_c"]
    for method, path in [("GET", ROUTES), ("POST", f"{ROUTES}/release")]:
        r = closed.request(method, path)
        assert r.status_code == 403, r.text
        assert OPEN_ENV in r.json()["error"]["message"]
        assert "--api-key" in r.json()["error"]["message"]
    # the refused release changed nothing: the server still completes
    assert _complete(closed, servers["model"], FIRST).status_code == 200

    info = opened.get(ROUTES)
    assert info.status_code == 200, info.text
    assert (info.json()["state"], info.json()["num_blocks"]) == ("serving", C)
    # a stock worker cannot be resized: 501, naming the worker to start with
    r = opened.post(f"{ROUTES}/resize", json={"num_blocks": B})
    assert r.status_code == 501, r.text
    assert "PipelinedWorker" in r.json()["error"]["message"]
    assert r.json()["error"]["step"] == "engine"
    assert opened.get(ROUTES).json()["num_blocks"] == C


def test_a_failed_resize_says_so_and_the_old_size_serves_on(
    servers: Any, oracle: dict[int, Any]
) -> None:
    faulty = servers["clients"]["faulty"]
    r = faulty.post(f"{ROUTES}/resize", json={"num_blocks": B})
    assert r.status_code == 500, r.text
    error = r.json()["error"]
    stage = FAULT_STAGES[servers["runner"]]
    assert (error["rolled_back"], error["stage"], error["step"]) == (True, stage, "kv_phase")
    assert "keeps serving" in error["message"] and "Traceback" not in r.text
    assert (r.json()["kv_cache"]["state"], r.json()["kv_cache"]["num_blocks"]) == ("serving", C)
    assert _cache_info_labels(faulty)["num_gpu_blocks"] == str(C)
    # serving at the old size, as a fresh server of it (the prefix cache was reset)
    assert _workload(faulty, servers["model"]) == oracle[C]
    # the fault is spent: the next resize goes through
    assert faulty.post(f"{ROUTES}/resize", json={"num_blocks": B}).status_code == 200


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"not json", "not JSON"),
        (b"[12]", "JSON object"),
        (b'{"num_block": 12}', "unknown field(s) 'num_block'"),
        (b'{"num_blocks": 12, "kv_cache_memory_bytes": 1048576}', "exactly one"),
        (b'{"num_blocks": -3}', "positive int"),
        (b'{"num_blocks": "12"}', "positive int"),
        (b"{}", "pass the new size"),
        (b'{"num_blocks": 12, "mode": "later"}', "mode='later'"),
        (b'{"num_blocks": 4}', "smallest KV cache that serves max_model_len=512 is num_blocks=5"),
        (b'{"kv_cache_memory_bytes": 1000}', "is too small"),
        (b'{"num_blocks": 1000000000000}', "are available"),
    ],
)
def test_bad_bodies_get_400_naming_the_problem(main: Any, body: bytes, says: str) -> None:
    before = main.get(ROUTES).json()
    r = main.post(f"{ROUTES}/resize", content=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert says in error["message"], error["message"]
    assert error["code"] == 400 and error["type"] == "BadRequestError"
    assert "Traceback" not in r.text
    after = main.get(ROUTES).json()
    assert (after["state"], after["num_blocks"]) == (before["state"], before["num_blocks"])


def test_wrong_paths_and_methods_under_the_prefix(main: Any) -> None:
    r = main.get(f"{ROUTES}/resize")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    r = main.post(f"{ROUTES}/grow", json={})
    assert r.status_code == 404 and f"POST {ROUTES}/resize" in r.json()["error"]["message"]
    assert main.post(ROUTES).status_code == 405


def test_two_concurrent_resizes_exactly_one_succeeds(servers: Any, main: Any) -> None:
    """Requests in flight keep a resize waiting (``mode="wait"``); a second resize sent
    meanwhile gets 409 at once while the state reads ``resizing``; then the first runs, after
    the requests, which complete on the old cache.

    Made true, not hoped for: ``main``'s engine core holds its steps while the hold file
    exists (``INITPIPE_HOLD_STEPS``, :mod:`initpipe_vllm.live.core.hold`), from before the
    requests start until the 409 came: every request is admitted (holds blocks), none can
    finish, whatever the machine's speed."""
    _at(main, C)
    model, hold = servers["model"], servers["hold"]
    requests = 4  # max_num_seqs: all in flight at once

    async def scenario() -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {KEY}"}
        base = servers["servers"]["main"].url
        async with httpx.AsyncClient(base_url=base, timeout=300, headers=headers) as c:

            async def info() -> Any:
                return (await c.get(ROUTES)).json()

            async def admitted() -> bool:
                # every prompt's blocks are taken (the null block is never free)
                now = await info()
                need = requests * math.ceil(PROMPT / now["block_size"])
                return bool(now["num_blocks"] - 1 - now["free_blocks"] >= need)

            async def resizing() -> bool:
                return bool((await info())["state"] == "resizing")

            def generate(i: int) -> Any:
                body = {
                    "model": model,
                    "prompt": _prompt(20 + i, PROMPT),
                    "max_tokens": LONG[servers["runner"]],
                    "temperature": 0.0,
                    "ignore_eos": True,
                }
                return asyncio.create_task(c.post("/v1/completions", json=body))

            hold.write_text("held by test_two_concurrent_resizes_exactly_one_succeeds")
            try:
                running = [generate(i) for i in range(requests)]
                await until_async("every request holding KV blocks", admitted)
                first = asyncio.create_task(c.post(f"{ROUTES}/resize", json={"num_blocks": B}))
                await until_async("resizing (the first resize waiting)", resizing)
                during = await info()
                second = await c.post(f"{ROUTES}/resize", json={"num_blocks": 20})
                pending = [t.done() for t in (first, *running)]
            finally:
                hold.unlink(missing_ok=True)
            return {
                "during": during,
                "second": second,
                "pending": pending,
                "first": await first,
                "done": [(await t).json() for t in running],
                "after": await info(),
            }

    out = asyncio.run(scenario())
    assert out["pending"] == [False] * (1 + requests)  # nothing answered while held
    assert out["during"]["state"] == "resizing", out
    assert out["during"]["num_blocks"] == C
    ok, refused = out["first"], out["second"]
    assert refused.status_code == 409, refused.text
    assert "another resize" in refused.json()["error"]["message"]
    assert refused.json()["kv_cache"]["state"] == "resizing"
    assert ok.status_code == 200, ok.text
    assert ok.json()["steps"]["pause"] > 0  # it waited for the requests
    assert (ok.json()["blocks_before"], ok.json()["blocks_after"]) == (C, B)
    assert out["after"]["num_blocks"] == B and out["after"]["state"] == "serving"
    # the requests in flight finished on the old cache
    long = LONG[servers["runner"]]
    assert [d["usage"]["completion_tokens"] for d in out["done"]] == [long] * requests


def test_the_key_is_read_as_vllm_reads_it() -> None:
    from argparse import Namespace
    from types import SimpleNamespace

    from initpipe_vllm.serve.routes import api_keys

    def keys(api_key: Any, env: str | None) -> list[str]:
        saved = os.environ.get("VLLM_API_KEY")
        try:
            if env is None:
                os.environ.pop("VLLM_API_KEY", None)
            else:
                os.environ["VLLM_API_KEY"] = env
            return api_keys(SimpleNamespace(args=Namespace(api_key=api_key)))
        finally:
            if saved is None:
                os.environ.pop("VLLM_API_KEY", None)
            else:
                os.environ["VLLM_API_KEY"] = saved

    assert keys(["a", "b"], "env") == ["a", "b"]  # --api-key wins over VLLM_API_KEY
    assert keys(None, "env") == ["env"]
    assert keys(None, None) == [] and keys(None, "") == []
