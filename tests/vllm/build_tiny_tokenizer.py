"""Build the tiny offline tokenizers of the embedded models (512 tokens each, no hub).

- ``stages/models/tiny-bert``: a WordLevel tokenizer (pooling models need one, even with
  token-id prompts);
- ``stages/models/tiny-llama``: a byte-level BPE trained on :data:`CORPUS`, with a chat
  template, so ``initpipe run`` shows text prompts and completions and vLLM's chat-template
  warm-up has a tokenizer to render with. Its specials match the model's config
  (``<s>`` = 1 = ``bos_token_id``, ``</s>`` = 2 = ``eos_token_id``).

Run once: ``python tests/vllm/build_tiny_tokenizer.py``; the output is committed, and
``tests/vllm/test_tiny_tokenizers.py`` checks that it is what this script builds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers


def build(folder: Path, vocab_size: int = 512) -> None:
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {tok: i for i, tok in enumerate(special)}
    for i in range(len(special), vocab_size):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": 512,
                "pad_token": "[PAD]",
                "unk_token": "[UNK]",
                "cls_token": "[CLS]",
                "sep_token": "[SEP]",
                "mask_token": "[MASK]",
            },
            indent=1,
        )
        + "\n"
    )


#: What the tiny Llama's BPE merges are learnt from: vLLM's example prompts and plain prose.
CORPUS = """Hello, my name is Ada. The president of the United States is elected every four years.
The capital of France is Paris. The future of AI is open, and the people who build it
share what they learn. A language model reads a prompt and writes the next words, one token
at a time. Its key and value cache keeps what it has read, so the next token costs less.
The engine starts, loads the weights, measures the memory, allocates the cache and serves.
Each stage of the start names what it needs and what it makes; the graph puts them in order.
When the cache grows or shrinks, the blocks that were kept move to their new places, and the
requests that were waiting carry on. A test compares every token with the stock engine, so
a change that breaks the order shows at once. Small models run on a laptop; large ones need
several cards, and the same stages run on each of them, in the same order, with the same names.
Weights come from a checkpoint on disk; a refit swaps them while the server keeps its port.
"""
#: The chat template vLLM's renderer warms up with (one line per message).
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def build_bpe(folder: Path, vocab_size: int = 512) -> None:
    """A byte-level BPE of ``vocab_size`` tokens with ``<unk>``, ``<s>``, ``</s>`` first."""
    special = ["<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    # every id the model can generate decodes: the corpus is long enough for all merges
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 512,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")


if __name__ == "__main__":
    models_dir = Path(__file__).resolve().parents[2] / "stages" / "models"
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    build(out / "tiny-bert" if out else models_dir / "tiny-bert")
    build_bpe(out / "tiny-llama" if out else models_dir / "tiny-llama")
