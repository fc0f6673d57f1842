"""Reliability tests: real vLLM on CPU; skipped where vLLM is not installed."""

import os

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
pytest.importorskip("vllm")
