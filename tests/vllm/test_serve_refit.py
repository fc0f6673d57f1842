"""Refit over HTTP: ``POST /initpipe/weights/refit`` and ``GET /initpipe/weights`` on a real
``vllm serve``, talked to with the official ``openai`` client (completions) and httpx (the
routes, ``/metrics``).

Two real OpenAI-compatible servers start together, once for the module, on tiny-qwen3 (a
tied head: ``tie_word_embeddings``, which vLLM's own reload leaves on the old weights) with
seeded KV-sensitive weights, both named ``tiny`` (``--served-model-name``):

- ``main``: initpipe's pipelined worker on weights ``A`` (seed 0), ``--api-key``, the
  middleware, and :data:`~initpipe_vllm.serve.REFIT_ROOT_ENV` naming a temporary folder
  that holds ``A``, ``B`` (seed 1) and a broken copy of ``B``; the tests refit it;
- ``stock_b``: stock vLLM started on ``B``: the oracle. Its first run of the workload (an
  empty prefix cache, as after a refit) is what ``main`` must answer after a refit to ``B``.

The workload repeats a prompt prefix, so the prefix cache is part of what is compared: a
refit that kept the old weights' cached blocks could not pass.
"""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from requires import module

httpx = module("httpx", "vLLM's OpenAI server brings it")
openai = module("openai", "vLLM's OpenAI server brings it")

KEY = "initpipe-refit-key"
MODEL = Path(__file__).resolve().parent / "models" / "tiny-qwen3"  # tied
NAME = "tiny"  # both servers' served model name
WEIGHTS = "/initpipe/weights"
REFIT = f"{WEIGHTS}/refit"
SEED_A, SEED_B = 0, 1
BLOCKS = 40
WRONG_DIGEST = "sha256:" + "0" * 64


# -- the servers --------------------------------------------------------------------------
def _broken_copy(good: Path, to: Path) -> str:
    """``good`` copied to ``to`` without one tensor; returns the missing tensor's name."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(good, to)
    tensors = load_file(str(good / "model.safetensors"))
    missing = sorted(tensors)[len(tensors) // 2]
    del tensors[missing]
    save_file(tensors, str(to / "model.safetensors"), metadata={"format": "pt"})
    return missing


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from initpipe_vllm.hook import PIPELINED_WORKER
    from initpipe_vllm.serve import OPEN_ENV, REFIT_ROOT_ENV
    from initpipe_vllm.testing.equivalence import workload_engine_kwargs
    from initpipe_vllm.testing.server import ServerSpec, running_servers
    from initpipe_vllm.testing.stock import OPT_IN_VARS
    from initpipe_vllm.testing.weights import seeded_model

    root = tmp_path_factory.mktemp("refit_root")
    a = seeded_model(MODEL, root, seed=SEED_A)
    b = seeded_model(MODEL, root, seed=SEED_B)
    missing = _broken_copy(b, root / "broken")
    # a good copy of B outside the root, and a link to it inside: both must be refused
    outside = tmp_path_factory.mktemp("outside") / "b"
    shutil.copytree(b, outside)
    (root / "link").symlink_to(outside)

    def engine(folder: Path) -> dict[str, Any]:
        kwargs, _ = workload_engine_kwargs(
            folder,
            load_format="auto",
            num_gpu_blocks_override=BLOCKS,
            gpu_memory_utilization=0.2,
        )
        kwargs["enable_prompt_tokens_details"] = True  # cached tokens in the usage
        kwargs["served_model_name"] = NAME
        return kwargs

    common = ["--middleware", "initpipe_vllm.serve.kv_cache_routes"]
    stock = {"VLLM_API_KEY": None, OPEN_ENV: None, REFIT_ROOT_ENV: None}
    stock.update(dict.fromkeys(OPT_IN_VARS))  # the oracle is stock vLLM
    specs = [
        ServerSpec(
            "main",
            engine(a),
            [*common, "--worker-cls", PIPELINED_WORKER, "--api-key", KEY],
            {**stock, REFIT_ROOT_ENV: str(root)},
        ),
        ServerSpec("stock_b", engine(b), common, stock),
    ]
    with running_servers(specs, tmp_path_factory.mktemp("servers_refit")) as running:
        url = running["main"].url
        auth = {"Authorization": f"Bearer {KEY}"}
        with (
            httpx.Client(base_url=url, timeout=300, headers=auth) as http,
            openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0) as main,
            openai.OpenAI(
                base_url=f"{running['stock_b'].url}/v1", api_key="unused", max_retries=0
            ) as stock_b,
        ):
            yield {
                "servers": running,
                "http": http,
                "main": main,
                "stock_b": stock_b,
                "root": root,
                "a": a,
                "b": b,
                "outside": outside,
                "missing": missing,
            }


@pytest.fixture(scope="module")
def http(servers: Any) -> Any:
    return servers["http"]


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(n)]


BLOCK = 128  # tokens per KV block (vLLM's CPU attention)
FIRST = _prompt(1, 200)  # two blocks: one full (cacheable), one partial
WORKLOAD = [
    FIRST,
    FIRST[:BLOCK] + _prompt(2, 40),  # shares FIRST's full block: a prefix-cache hit
    _prompt(3, 150),
    FIRST,  # a hit again
]


def _complete(client: Any, prompt: list[int]) -> Any:
    return client.completions.create(
        model=NAME,
        prompt=prompt,
        max_tokens=6,
        temperature=0.0,
        logprobs=2,
        extra_body={"return_tokens_as_token_ids": True, "return_token_ids": True},
    )


def _workload(client: Any) -> list[dict[str, Any]]:
    """The workload's completions, one at a time: tokens, logprobs, cached tokens."""
    out = []
    for prompt in WORKLOAD:
        r = _complete(client, prompt)
        choice, details = r.choices[0], r.usage.prompt_tokens_details
        out.append(
            {
                "tokens": choice.model_extra["token_ids"],
                "logprobs": choice.logprobs.token_logprobs,
                "top": choice.logprobs.top_logprobs,
                "cached": (details.cached_tokens if details else 0) or 0,
            }
        )
    return out


@pytest.fixture(scope="module")
def oracle_b(servers: Any) -> list[dict[str, Any]]:
    """Stock vLLM on ``B``: its first workload run (an empty prefix cache)."""
    return _workload(servers["stock_b"])


def _refit(http: Any, **body: Any) -> Any:
    r = http.post(REFIT, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _metrics(http: Any) -> dict[str, float]:
    text = http.get("/metrics").text
    assert "vllm:num_requests_running" in text  # vLLM's own metrics are still there
    found = re.findall(r"^(initpipe_\w+) (\S+)$", text, re.M)
    return {name: float(value) for name, value in found}


# -- the tests ----------------------------------------------------------------------------
def test_a_refit_from_a_to_b_serves_as_a_fresh_stock_server_on_b(
    servers: Any, http: Any, oracle_b: list[dict[str, Any]]
) -> None:
    main = servers["main"]
    assert [o["cached"] for o in oracle_b] == [0, BLOCK, 0, BLOCK]  # the cache counts
    before = _workload(main)
    assert http.get(WEIGHTS).json()["version"] != "B"  # this test starts on A
    # sensitivity: A's answers are not B's
    assert [o["tokens"] for o in before] != [o["tokens"] for o in oracle_b]

    # relative to the root, with the version the engine reports afterwards
    receipt = _refit(http, path=servers["b"].name, version="B")
    assert (receipt["version"], receipt["blocks_after"]) == ("B", BLOCKS)
    assert receipt["weights"]["path"] == str(servers["b"].resolve())
    assert receipt["probe"]["ran"] and receipt["digests"][0].startswith("sha256:")
    assert _workload(main) == oracle_b

    info = http.get(WEIGHTS).json()
    assert (info["state"], info["version"]) == ("serving", "B")
    assert info["digests"] == receipt["digests"]
    assert info["last_receipt"] == receipt


def test_the_weights_routes_need_the_servers_api_key(servers: Any) -> None:
    url = servers["servers"]["main"].url
    with httpx.Client(base_url=url, timeout=60) as anon:
        for method, path in [("GET", WEIGHTS), ("POST", REFIT)]:
            r = anon.request(method, path, json={"path": servers["b"].name})
            assert r.status_code == 401, r.text
            assert r.headers["www-authenticate"] == "Bearer"
        assert anon.get(WEIGHTS, headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_a_path_outside_the_root_is_refused(servers: Any, http: Any) -> None:
    from initpipe_vllm.serve import REFIT_ROOT_ENV

    before = http.get(WEIGHTS).json()
    # a good copy of the weights, reached through a link, '..', or its absolute path
    for path in ("link", f"../{servers['outside'].parent.name}/b", str(servers["outside"])):
        r = http.post(REFIT, json={"path": path})
        assert r.status_code == 403, (path, r.text)
        error = r.json()["error"]
        assert error["param"] == "path" and REFIT_ROOT_ENV in error["message"]
    after = http.get(WEIGHTS).json()
    assert (after["version"], after["refits"]) == (before["version"], before["refits"])


def test_a_broken_weights_folder_is_refused_and_the_engine_serves_on(
    servers: Any, http: Any
) -> None:
    main = servers["main"]
    before = http.get(WEIGHTS).json()
    answer = _complete(main, FIRST).choices[0].model_extra["token_ids"]
    r = http.post(REFIT, json={"path": "broken"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["step"] == "weights" and error["serving"] is True
    assert servers["missing"] in error["message"]
    r = http.post(REFIT, json={"path": "no-such-folder"})
    assert r.status_code == 400 and "is not a folder" in r.json()["error"]["message"]
    after = http.get(WEIGHTS).json()
    assert after["state"] == "serving"
    assert (after["version"], after["digests"]) == (before["version"], before["digests"])
    assert after["failures"] == before["failures"]
    assert _complete(main, FIRST).choices[0].model_extra["token_ids"] == answer


def test_a_failed_refit_fails_closed_over_http_until_a_refit_succeeds(
    servers: Any, http: Any, oracle_b: list[dict[str, Any]]
) -> None:
    """A refit that fails after it started (the loaded weights' digest is not the one
    expected): 503, the engine refuses completions (503 from vLLM's own route) and says
    ``failed``; the next good refit serves again. The metrics count both."""
    main = servers["main"]
    start = _metrics(http)

    r = http.post(REFIT, json={"path": servers["b"].name, "expected_digest": WRONG_DIGEST})
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert (error["step"], error["rank"], error["serving"]) == ("digest", None, False)
    assert "failed closed" in error["message"] and "Traceback" not in r.text
    assert r.json()["weights"]["state"] == "failed"

    with pytest.raises(openai.APIStatusError) as refused:
        _complete(main, FIRST)
    assert refused.value.status_code == 503
    assert "refit" in str(refused.value.message)
    info = http.get(WEIGHTS).json()
    assert info["state"] == "failed" and info["failure"]["step"] == "digest"
    failed = _metrics(http)
    assert failed["initpipe_refit_failures_total"] == start["initpipe_refit_failures_total"] + 1
    assert failed["initpipe_refits_total"] == start["initpipe_refits_total"]

    # a good refit (its digest checked this time) serves again, as a fresh server on B
    digests = _refit(http, path=str(servers["b"]), version="B", probe=False)["digests"]
    receipt = _refit(http, path=servers["b"].name, version="B2", expected_digest=digests)
    assert receipt["digest_checked"] and receipt["digests"] == digests
    assert _workload(main) == oracle_b
    info = http.get(WEIGHTS).json()
    assert (info["state"], info["version"], info["failure"]) == ("serving", "B2", None)

    end = _metrics(http)
    assert end["initpipe_refits_total"] == start["initpipe_refits_total"] + 2
    assert end["initpipe_refit_failures_total"] == failed["initpipe_refit_failures_total"]
    assert end["initpipe_last_refit_seconds"] == receipt["total_s"] > 0
    # every refit this server ran came over HTTP: the counters are the engine's own counts
    assert (end["initpipe_refits_total"], end["initpipe_refit_failures_total"]) == (
        info["refits"],
        info["failures"],
    )
