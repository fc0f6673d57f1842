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
transformed on the way), on any checkpoint. It cannot see a stale prefix cache: vLLM reads
none for a request that asks for prompt logprobs. The probe's warm run, checked against its
cold run, is what sees that.

torch is imported when called, never at import time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from .probe import Probe

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


@contextlib.contextmanager
def _weights_as_held_in(model: Any, dtype: Any) -> Iterator[None]:
    """While a forward pass runs, each module's own floating-point parameters read as the
    engine holds them: rounded to ``dtype`` (then back to their own dtype, so the pass
    computes at the trainer's precision). One module's weights at a time are swapped
    (forward hooks), so it costs one module's copy of memory, not the model's; every
    parameter is restored afterwards. Nothing is done where the dtypes already match."""
    import torch

    saved: dict[int, list[tuple[Any, Any]]] = {}

    def before(module: Any, _args: Any) -> None:
        swapped = []
        for p in module.parameters(recurse=False):
            if p.is_floating_point() and p.dtype != dtype:
                swapped.append((p, p.data))
                p.data = p.data.to(dtype).to(p.dtype)
        saved[id(module)] = swapped

    def after(module: Any, _args: Any, _out: Any) -> None:
        for p, data in saved.pop(id(module), ()):
            p.data = data

    handles = []
    if dtype is not None and any(
        p.is_floating_point() and p.dtype != dtype for p in model.parameters()
    ):
        for module in model.modules():
            if next(module.parameters(recurse=False), None) is not None:
                handles.append(module.register_forward_pre_hook(before))
                handles.append(module.register_forward_hook(after))
    try:
        with torch.no_grad():
            yield
    finally:
        for h in handles:
            h.remove()
        for swapped in saved.values():  # a pass that raised between a module's hooks
            for p, data in swapped:
                p.data = data


def reference_logprobs(
    model: Any, prompts: Sequence[Sequence[int]], dtype: Any = None
) -> tuple[tuple[float, ...], ...]:
    """Each prompt's token log-probabilities under ``model``: for every token after the
    first, ``log_softmax(logits)[token]`` at the position before it, in float32.

    Args:
        model: a torch module taking ``input_ids`` (shape ``[1, n]``) and returning logits
            (``[1, n, vocab]``), as a transformers causal LM does; run in eval mode under
            ``torch.no_grad`` (its training mode is restored afterwards).
        prompts: token-id prompts.
        dtype: the engine's dtype (a torch dtype): the model's weights are read as the
            engine holds them, rounded to it, while the pass computes at the model's own
            precision. A trainer's fp32 weights rounded to bf16 move its logprobs by as
            much as bf16's arithmetic does; only the arithmetic is the engine's to answer
            for. None: the weights as they are.

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
        for i, prompt in enumerate(prompts):
            with _weights_as_held_in(model, dtype):
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
    """``probe`` with the reference's logprobs of its prompts (:attr:`Probe.prompts`, which
    must be given) for the engine's ``config`` (a vLLM ``VllmConfig``: the model's weights
    are read in its dtype).

    ``reference``: a torch module (:func:`reference_logprobs` scores the prompts) or the
    logprobs themselves (one sequence per prompt).

    Raises:
        BadReference: a disabled probe, no prompts, or a reference that cannot score them.
    """
    if not probe.enabled:
        msg = "reference= needs the probe: do not pass probe=False with it"
        raise BadReference(msg)
    prompts = probe.prompts
    if prompts is None:
        msg = (
            "reference= needs the prompts it scores: pass probe={'prompts': [...]} with "
            "token ids of text like your training data's (a tokenized sentence or two, 64 "
            "tokens or more). The probe's default prompts are random tokens, whose "
            "logprobs (-10 to -20) carry more bfloat16 noise than the defects it must see: "
            "4.5 nats at one position on a correct engine (SmolLM2-135M)"
        )
        raise BadReference(msg)
    if hasattr(reference, "parameters") and callable(reference):
        dtype = getattr(getattr(config, "model_config", None), "dtype", None)
        logprobs = reference_logprobs(reference, prompts, dtype)
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
