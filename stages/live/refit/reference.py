"""The refit's check against the trainer: the caller's own model scores the probe's prompts.

What belongs here: :func:`reference_logprobs` (a torch module of the engine's architecture,
e.g. the transformers model a trainer just stepped, scores each prompt: the log-probability
of every token after the first, in float32) and :func:`probe_with_reference` (the probe a
refit runs with those values). It runs in the caller's process, before the refit: only the
numbers travel to the engine core, whose probe compares them with the engine's own prompt
logprobs on the new weights (:func:`.probe.run`).

Why: the receipt proves the engine holds the weights it was given and that it computes
what a fresh engine on them computes. The trainer's forward pass is an oracle independent of
vLLM: it catches what both share (a head left on old weights by a load path, a tensor
transformed on the way, a stale cache), on any checkpoint.

torch is imported when called, never at import time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from .probe import Probe, default_prompts

__all__ = ["BadReference", "probe_with_reference", "reference_logprobs"]


class BadReference(ValueError):
    """The reference cannot score the prompts (the message says why and what to pass)."""


def _logits(output: Any) -> Any:
    """The logits of a module's output: transformers' ``.logits``, a tuple's first item,
    or the tensor itself."""
    logits = getattr(output, "logits", None)
    if logits is None:
        logits = output[0] if isinstance(output, (tuple, list)) else output
    return logits


def reference_logprobs(
    model: Any, prompts: Sequence[Sequence[int]]
) -> tuple[tuple[float, ...], ...]:
    """Each prompt's token log-probabilities under ``model``: for every token after the
    first, ``log_softmax(logits)[token]`` at the position before it, in float32.

    Args:
        model: a torch module taking ``input_ids`` (shape ``[1, n]``) and returning logits
            (``[1, n, vocab]``), as a transformers causal LM does; run in eval mode under
            ``torch.no_grad`` (its training mode is restored afterwards).
        prompts: token-id prompts.

    Raises:
        BadReference: the module's output is not logits of the prompt's length, or its
            vocabulary does not hold a prompt's token.
    """
    import torch

    params = next(iter(model.parameters()), None)
    device = params.device if params is not None else torch.device("cpu")
    was_training = bool(getattr(model, "training", False))
    model.eval()
    out: list[tuple[float, ...]] = []
    try:
        with torch.no_grad():
            for i, prompt in enumerate(prompts):
                ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
                try:
                    logits = _logits(model(input_ids=ids))
                except (IndexError, RuntimeError, TypeError) as err:
                    msg = (
                        f"prompt {i}: the reference could not score it ({type(err).__name__}: "
                        f"{err}): is it a causal LM of the engine's architecture and vocabulary?"
                    )
                    raise BadReference(msg) from err
                if not isinstance(logits, torch.Tensor) or tuple(logits.shape[:2]) != (
                    1,
                    len(prompt),
                ):
                    shape = getattr(logits, "shape", type(logits).__name__)
                    msg = (
                        f"prompt {i}: the reference returned {shape} for {len(prompt)} tokens; "
                        "expected logits of shape [1, tokens, vocab] (a causal LM's output)"
                    )
                    raise BadReference(msg)
                if max(prompt) >= logits.shape[-1]:
                    msg = (
                        f"prompt {i}: token {max(prompt)} is past the reference's vocabulary "
                        f"of {logits.shape[-1]}: is it the engine's architecture?"
                    )
                    raise BadReference(msg)
                lp = torch.log_softmax(logits[0, :-1].float(), dim=-1)
                picked = lp.gather(1, ids[0, 1:, None]).squeeze(1)
                out.append(tuple(float(x) for x in picked.cpu()))
    finally:
        if was_training:
            model.train()
    return tuple(out)


def probe_with_reference(probe: Probe, reference: Any, config: Any) -> Probe:
    """``probe`` with the reference's logprobs of its prompts (:attr:`Probe.prompts`, or
    :func:`~.probe.default_prompts` for the engine's ``config``, a vLLM ``VllmConfig``).

    ``reference``: a torch module (:func:`reference_logprobs` scores the prompts) or the
    logprobs themselves (one sequence per prompt of ``probe.prompts``, which must be given).

    Raises:
        BadReference: a disabled probe, logprobs without their prompts, or a reference
            that cannot score them.
    """
    if not probe.enabled:
        msg = "reference= needs the probe: do not pass probe=False with it"
        raise BadReference(msg)
    prompts = probe.prompts
    if prompts is None:
        model = config.model_config
        prompts = default_prompts(
            model.get_vocab_size(),
            int(config.cache_config.block_size),
            int(model.max_model_len),
            probe.max_tokens,
        )
    if hasattr(reference, "parameters") and callable(reference):
        logprobs = reference_logprobs(reference, prompts)
    elif probe.prompts is None:
        msg = (
            "reference= given as logprobs needs the prompts they score: pass "
            "probe={'prompts': ...} too, or pass the model itself"
        )
        raise BadReference(msg)
    else:
        try:
            logprobs = tuple(tuple(float(x) for x in row) for row in reference)
        except (TypeError, ValueError):
            msg = (
                f"reference={type(reference).__name__}: expected a torch module (your "
                "trainer's model) or one sequence of logprobs per prompt"
            )
            raise BadReference(msg) from None
    return attrs.evolve(probe, prompts=prompts, reference_logprobs=logprobs)
