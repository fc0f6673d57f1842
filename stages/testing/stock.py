"""Stock-vLLM oracles that are certainly stock.

What belongs here: what every test oracle ("a fresh stock engine of the same config") needs
so that it cannot silently be a pipelined engine. Replaces nothing in vLLM.

An oracle built with ``worker_cls="auto"`` inherits the caller's environment: with the
README's opt-in ``INITPIPE_VLLM=1`` exported, initpipe's plugin turns ``"auto"`` into the
pipelined worker, and "pipelined vs stock" becomes "pipelined vs pipelined" — equal by
construction. So an oracle is started inside :func:`stock_environment` (the opt-in unset,
for this process and the engine processes it spawns), and :func:`require_stock` checks the
runner every rank really built.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["OPT_IN_VARS", "is_pipelined", "require_stock", "runner_classes", "stock_environment"]

#: Environment variables that make a ``worker_cls="auto"`` engine pipelined.
OPT_IN_VARS = ("INITPIPE_VLLM",)


@contextmanager
def stock_environment() -> Iterator[None]:
    """Unset :data:`OPT_IN_VARS` while the block runs (engines started inside, and the
    processes they spawn, see no opt-in); restore them afterwards."""
    saved = {k: os.environ.pop(k) for k in OPT_IN_VARS if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def is_pipelined(runner: Any) -> bool:
    """Whether ``runner`` (or any base of its class) comes from initpipe, not vLLM."""
    return any(c.__module__.startswith("initpipe") for c in type(runner).__mro__)


def _runner_class(worker: Any) -> tuple[str, bool]:
    runner = worker.model_runner
    cls = type(runner)
    return f"{cls.__module__}.{cls.__qualname__}", is_pipelined(runner)


def runner_classes(llm: Any) -> list[tuple[str, bool]]:
    """Each rank's ``(runner class, pipelined?)`` of a running ``vllm.LLM``."""
    return [tuple(r) for r in llm.collective_rpc(_runner_class)]  # type: ignore[misc]


def require_stock(llm: Any, what: str = "the stock oracle") -> None:
    """Raise ``RuntimeError`` naming the rank and class unless every rank of ``llm`` runs
    vLLM's own runner."""
    bad = [f"rank {i} ran {name}" for i, (name, piped) in enumerate(runner_classes(llm)) if piped]
    if bad:
        msg = (
            f"{what} is not stock vLLM: {', '.join(bad)}; start it inside "
            "initpipe_vllm.testing.stock.stock_environment() (INITPIPE_VLLM unset)"
        )
        raise RuntimeError(msg)
