"""Shared fixtures of the contract tests: small synthetic vLLM trees, as folders and wheels.

A tree is a dict ``{relpath: source}``; ``vllm/__init__.py`` is added when absent. Nothing
here (or in the tests) imports vLLM or torch: the installed vLLM is only ever read.
"""

from __future__ import annotations

import textwrap
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from initpipe_vllm.contract.fingerprint import Index
from initpipe_vllm.contract.source import open_source

Tree = dict[str, str]

METADATA = "Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n\nA description.\n"


def write_tree(root: Path, files: Tree) -> Path:
    """Write ``files`` (dedented) under ``root``, with a ``vllm/__init__.py``; returns root."""
    for relpath, text in {"vllm/__init__.py": "", **files}.items():
        path = root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def write_wheel(path: Path, files: Tree, metadata: str = METADATA) -> Path:
    """A wheel at ``path`` holding ``files`` and a ``vllm-9.9.9.dist-info``."""
    with zipfile.ZipFile(path, "w") as wheel:
        for relpath, text in {"vllm/__init__.py": "", **files}.items():
            wheel.writestr(relpath, textwrap.dedent(text))
        wheel.writestr("vllm-9.9.9.dist-info/METADATA", metadata)
        wheel.writestr("vllm-9.9.9.dist-info/WHEEL", "Wheel-Version: 1.0\n")
        wheel.writestr("vllm-9.9.9.dist-info/RECORD", "vllm/__init__.py,,\n")
    return path


@pytest.fixture
def make_tree(tmp_path: Path) -> Callable[..., Path]:
    """``make_tree(files, name="t")``: a fresh folder holding ``files``."""
    count = iter(range(1000))

    def make(files: Tree, name: str = "") -> Path:
        return write_tree(tmp_path / (name or f"tree{next(count)}"), files)

    return make


@pytest.fixture
def make_index(make_tree: Callable[..., Path]) -> Callable[[Tree], Index]:
    """``make_index(files)``: an :class:`Index` over a fresh folder holding ``files``."""
    return lambda files: Index(open_source(make_tree(files)))


@pytest.fixture
def make_wheel(tmp_path: Path) -> Callable[..., Path]:
    """``make_wheel(files, metadata=METADATA)``: a fresh ``.whl`` holding ``files``."""
    count = iter(range(1000))
    return lambda files, metadata=METADATA: write_wheel(
        tmp_path / f"vllm-9.9.9-{next(count)}-py3-none-any.whl", files, metadata
    )
