"""What the refit proofs' subprocesses share: the engine core, the workload's outputs, each
rank's weights digest, and a stock oracle engine (certainly stock, its load recorded so
its digest covers what vLLM's CPU kernels pack). Imports nothing heavy until called."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = [
    "ENGLISH",
    "core",
    "default_prompts",
    "differing",
    "digests",
    "outputs",
    "stock_engine",
    "tensor_hashes",
]


#: An English text the checks against a trainer's model score (131 tokens with SmolLM2's
#: tokenizer: past one 128-token CPU block). Text, as a trainer's data is: random tokens
#: carry more bfloat16 noise than the defects (initpipe_vllm.live.refit.reference).
ENGLISH = (
    "The quick brown fox jumps over the lazy dog. Paris is the capital of France, and Rome "
    "is the capital of Italy. Water boils at one hundred degrees Celsius at sea level, and "
    "it freezes at zero. The Earth goes around the Sun once a year, and the Moon goes "
    "around the Earth about once a month. Most plants need light, water and air to grow. "
    "A week has seven days, and a year has twelve months. Cats and dogs are the most common "
    "pets in many countries. The Pacific is the largest ocean on Earth, and the Nile is one "
    "of the longest rivers. Bread is made from flour, water, salt and yeast."
)


def core(llm: Any) -> Any:
    """The in-process ``EngineCore`` of a ``vllm.LLM``."""
    return llm.llm_engine.engine_core.engine_core


def outputs(llm: Any) -> Any:
    """The equivalence harness's workload on ``llm`` (tokens, logprobs, cached tokens)."""
    from initpipe_vllm.testing.equivalence import run_workload

    return run_workload(llm, "generate", salt=2)["outputs"]


def digests(llm: Any) -> list[str]:
    """Each rank's weights digest, in rank order."""
    from initpipe_vllm.live.refit.weights import rank_digest

    return [a["digest"] for a in llm.collective_rpc(rank_digest)]


def _rank_hashes(wrapper: Any) -> dict[str, str]:
    from initpipe_vllm.live.core.rank import worker_of
    from initpipe_vllm.live.refit.weights import weights_hashes

    worker, _ = worker_of(wrapper)
    return weights_hashes(worker.model_runner.get_model())[0]


def tensor_hashes(llm: Any) -> list[dict[str, str]]:
    """Each rank's tensor name -> hash, what its digest is made of (to name a difference)."""
    return list(llm.collective_rpc(_rank_hashes))


def differing(got: list[dict[str, str]], want: list[dict[str, str]]) -> str:
    """The tensors whose hashes differ between two :func:`tensor_hashes` records, one line each
    (an assertion's message: which tensor a digest mismatch comes from)."""
    lines = [] if len(got) == len(want) else [f"{len(got)} ranks against {len(want)}"]
    for rank, (g, w) in enumerate(zip(got, want, strict=False)):
        for name in sorted(set(g) | set(w)):
            if g.get(name) != w.get(name):
                lines.append(f"rank {rank} {name}: {g.get(name)} != {w.get(name)}")
    return "\n".join(lines) or "no tensor differs"


def default_prompts(llm: Any) -> list[list[int]]:
    """The prompts a refit's default probe serves on ``llm``'s model."""
    from initpipe_vllm.live.refit.probe import Probe, default_prompts as built

    cfg = core(llm).vllm_config
    return [
        list(p)
        for p in built(
            cfg.model_config.get_vocab_size(),
            cfg.cache_config.block_size,
            cfg.model_config.max_model_len,
            Probe().max_tokens,
        )
    ]


@contextlib.contextmanager
def stock_engine(kwargs: dict[str, Any]) -> Iterator[Any]:
    """A stock ``vllm.LLM(**kwargs)``, checked stock, shut down afterwards. Its load runs
    inside ``recording_packed_weights``, which changes nothing vLLM does."""
    from vllm import LLM

    from initpipe_vllm.hook.packed import recording_packed_weights
    from initpipe_vllm.testing.stock import require_stock, stock_environment

    with stock_environment(), recording_packed_weights():
        llm = LLM(**kwargs)
    require_stock(llm)
    try:
        yield llm
    finally:
        core(llm).shutdown()
