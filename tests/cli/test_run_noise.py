"""``initpipe run`` hides vLLM's known CPU noise, counts it, and shows everything else."""

from __future__ import annotations

import logging

from initpipe_vllm.tools import quiet


def _record(msg: str, *args: object, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord("vllm.x", level, __file__, 1, msg, args, None)


def test_known_noise_is_hidden_and_counted_and_nothing_else_is() -> None:
    noise = quiet._KnownNoise()
    assert not noise.filter(_record("%s is not found in LD_PRELOAD. For best ...", "libiomp"))
    assert not noise.filter(_record("Enforce eager set, disabling torch.compile, ..."))
    assert noise.hidden == 2
    assert noise.filter(_record("Chat template warmup failed"))
    assert noise.filter(_record("Enforce eager set", level=logging.ERROR))  # errors always show
    assert noise.filter(_record("something %s", "new"))
    assert noise.hidden == 2
