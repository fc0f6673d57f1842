"""Build the tiny offline WordLevel tokenizer of ``stages/models/tiny-bert`` (512 tokens).

Run once: ``python tests/vllm/build_tiny_tokenizer.py``; the output is committed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, processors


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


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[2] / "stages" / "models" / "tiny-bert"
    build(Path(sys.argv[1]) if len(sys.argv) > 1 else root)
