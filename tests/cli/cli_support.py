"""Constants and helpers shared by the CLI tests (importable: tests/cli is on sys.path)."""

from __future__ import annotations

import shutil

import pytest
from requires import in_ci, missing

#: Durations for cli_toys.mini_vllm chosen so the critical path is unambiguous.
MINI_DURATIONS = {
    "attn_layers": 0.1,
    "attn_backends": 0.05,
    "kv_cache_spec": 0.5,
    "cudagraph": 0.01,
    "kv_caches": 1.2,
    "metadata_builders": 0.02,
    "warm_up": 0.3,
}
MINI_CRITICAL = ["attn_layers", "kv_cache_spec", "kv_caches", "metadata_builders", "warm_up"]
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
    "--window-size=1400,1000",
]


def console_messages(stderr: str) -> list[str]:
    """The page's console messages (and uncaught errors) from Chromium's stderr log."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


_NO_DOT = "Graphviz dot is not installed (make sysdeps: apt-get install graphviz)"


def _dot_missing() -> bool:
    """True where ``dot`` is absent and a skip is allowed (in CI: a collection failure)."""
    if shutil.which("dot") is not None:
        return False
    if in_ci():
        missing(_NO_DOT)
    return True


needs_dot = pytest.mark.skipif(_dot_missing(), reason=_NO_DOT)
