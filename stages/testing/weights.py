"""Seeded, deterministic real weights for a tiny model folder, written as safetensors.

What belongs here: turning a config-only model folder (``config.json``, optional
``initpipe.json`` and tokenizer files) into a folder vLLM's normal loader reads
(``load_format="auto"``), so engine-level tests see outputs that depend on the KV cache.
vLLM's ``load_format="dummy"`` fills every weight uniformly in ±1e-3: attention scores are
then ≈0, attention is uniform, and a corrupted KV block changes nothing measurable.

The weights come from transformers: the class named in ``config.json``'s ``architectures``
is built with ``_from_config`` under a fixed seed (so norms, biases and SSM parameters get
that architecture's own initialization), then every parameter with two or more dimensions
(projections, embeddings, expert stacks, convolutions) is redrawn from
``N(0, (gain / sqrt(fan_in))**2)`` with ``fan_in`` its last dimension. With ``gain=2`` a
query or key entry has a standard deviation of about 2 and attention scores one of about 4,
far from uniform, with no per-architecture table. ``save_pretrained`` writes the checkpoint
in the layout the architecture's Hub checkpoints use, which is what vLLM's loaders expect.
Replaces nothing in vLLM: it stands in for a downloaded checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_GAIN", "DEFAULT_SEED", "WeightsError", "seeded_model"]

#: Standard deviation of a redrawn weight times ``sqrt(fan_in)``.
DEFAULT_GAIN = 2.0
#: The seed both transformers' initialization and the redraw start from.
DEFAULT_SEED = 0
#: Bumped whenever the recipe changes, so a cache folder never serves stale weights.
_RECIPE = "initpipe-seeded-weights/1"
#: Files of a model folder that are never copied (weights of an earlier run, caches).
_SKIP_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


class WeightsError(RuntimeError):
    """The seeded weights for a model folder could not be built; the message says why."""


def _source_files(model_dir: Path) -> list[Path]:
    return sorted(
        p
        for p in model_dir.iterdir()
        if p.is_file() and not p.name.startswith(".") and not p.name.endswith(_SKIP_SUFFIXES)
    )


def _cache_key(model_dir: Path, seed: int, gain: float) -> str:
    from importlib.metadata import version

    # the installed version, without importing transformers (seconds) for a cache hit
    h = hashlib.sha256()
    h.update(f"{_RECIPE}|seed={seed}|gain={gain!r}|tf={version('transformers')}".encode())
    for path in _source_files(model_dir):
        h.update(b"\0" + path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def seeded_model(
    model_dir: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str],
    *,
    seed: int = DEFAULT_SEED,
    gain: float = DEFAULT_GAIN,
) -> Path:
    """Return a loadable copy of ``model_dir`` with seeded real weights, under ``cache_dir``.

    The folder ``cache_dir/<model name>-<key>`` holds the model folder's own files
    (``config.json`` unchanged, ``initpipe.json``, tokenizer files) plus
    ``model.safetensors``. ``key`` digests those files, ``seed``, ``gain``, the recipe and
    the transformers version, so the same inputs reuse the folder. It is built in a
    temporary folder beside it and renamed into place, so a crash leaves no half-built
    folder; when two processes race, the first rename wins and both use it.

    Args:
        model_dir: A folder with ``config.json`` naming its ``architectures``.
        cache_dir: Where the built folders live (created if missing).
        seed: Seeds transformers' initialization and the redraw.
        gain: Redrawn weights have standard deviation ``gain / sqrt(fan_in)``.

    Returns:
        The built folder; pass it as ``model=`` with ``load_format="auto"``.

    Raises:
        FileNotFoundError: ``model_dir`` has no ``config.json``.
        WeightsError: transformers cannot build the architecture, or the weights are not
            finite; the message names the model type and architecture.
    """
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        msg = f"{model_dir}: no config.json in that folder"
        raise FileNotFoundError(msg)
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    final = cache / f"{model_dir.name}-{_cache_key(model_dir, seed, gain)}"
    if final.is_dir():
        return final
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=cache))
    try:
        for path in _source_files(model_dir):
            shutil.copyfile(path, tmp / path.name)
        _write_weights(model_dir, tmp, seed=seed, gain=gain)
        try:
            tmp.rename(final)
        except OSError:
            if not final.is_dir():  # not a lost race: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _architecture(model_dir: Path) -> tuple[str, str]:
    config = json.loads((model_dir / "config.json").read_text())
    archs = config.get("architectures") or []
    model_type = str(config.get("model_type", "?"))
    if not archs:
        msg = (
            f"{model_dir}: config.json names no 'architectures' (model_type {model_type!r}); "
            "seeded weights need the transformers class to build"
        )
        raise WeightsError(msg)
    return str(archs[0]), model_type


def _build(model_dir: Path, seed: int) -> Any:
    """The architecture's transformers model, initialized under ``seed``, in float32."""
    import torch
    import transformers

    arch, model_type = _architecture(model_dir)
    what = f"model_type {model_type!r}, architecture {arch!r} ({model_dir})"
    cls = getattr(transformers, arch, None)
    if cls is None or not hasattr(cls, "_from_config"):
        msg = (
            f"transformers {transformers.__version__} has no model class {arch!r} for "
            f"{what}: seeded weights cannot be built for it"
        )
        raise WeightsError(msg)
    try:
        config = transformers.AutoConfig.from_pretrained(str(model_dir))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return cls._from_config(config, dtype=torch.float32)
    except Exception as err:
        msg = f"transformers cannot build {what}: {type(err).__name__}: {err}"
        raise WeightsError(msg) from err


def _redraw(model: Any, seed: int, gain: float) -> None:
    """Redraw every parameter of two or more dimensions (tied ones once)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    seen: set[int] = set()
    with torch.no_grad():
        for _, param in sorted(model.named_parameters(remove_duplicate=False)):
            if param.dim() < 2 or id(param) in seen:
                continue
            seen.add(id(param))
            std = gain / math.sqrt(param.shape[-1])
            param.copy_(torch.randn(param.shape, generator=gen, dtype=param.dtype) * std)


def _write_weights(model_dir: Path, dest: Path, *, seed: int, gain: float) -> None:
    import torch

    model = _build(model_dir, seed)
    _redraw(model, seed, gain)
    bad = [
        name
        for name, t in model.state_dict().items()
        if t.is_floating_point() and not bool(torch.isfinite(t).all())
    ]
    if bad:
        arch, model_type = _architecture(model_dir)
        msg = (
            f"model_type {model_type!r}, architecture {arch!r}: non-finite initial weights "
            f"in {', '.join(bad[:5])}"
        )
        raise WeightsError(msg)
    out = dest / ".save"
    model.save_pretrained(str(out), safe_serialization=True)
    # Only the checkpoint: config.json stays the folder's own (transformers re-serializes
    # it with defaults filled in), and no generation_config.json changes vLLM's defaults.
    for path in out.iterdir():
        if path.name.endswith(".safetensors") or path.name.endswith(".safetensors.index.json"):
            path.rename(dest / path.name)
    shutil.rmtree(out)
