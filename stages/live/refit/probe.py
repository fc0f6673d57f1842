"""The probe of a refit: fixed prompts served twice on the new weights, inside the engine core.

What belongs here: :class:`Probe` (what the caller asks: prompts, tokens to generate,
expected outputs, the logprob tolerance), :func:`default_prompts` (built from the vocabulary
when the caller gives none), :func:`run` (the probe itself) and :class:`ProbeResult`.

How it runs: in the engine core, while the refit holds the engine paused. The user's queued
requests are set aside (the scheduler's waiting queue and deferred set swap with empty ones),
the probe's requests are added as vLLM adds any request (``preprocess_add_request``, then
``add_request``), the engine steps (``step_fn``, as its busy loop does) until they finish,
and the user's queue comes back untouched. The outputs never reach a client (the client
never knew these requests). The prompts run cold (the prefix cache is empty after the
refit), then again, hitting the blocks the cold run filled: tokens must be equal and
logprobs within ``atol`` (by default :data:`DTYPE_ATOL`'s for the model's dtype; a greedy
pick that differs at a near tie, both picks within ``atol``, is no fault), and equal to the
caller's expected outputs when given. The refit
then resets the prefix cache, so the engine holds nothing a fresh engine would not.

Nothing here imports vLLM at import time.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ...contract.declare import vllm_uses

__all__ = [
    "DTYPE_ATOL",
    "REFERENCE_TOLERANCE",
    "Probe",
    "ProbeFailed",
    "ProbeResult",
    "default_atol",
    "default_prompts",
    "reference_tolerance",
    "run",
]

#: Most engine steps a probe may take (a probe that never finishes is a failure).
_MAX_STEPS = 10_000

#: The default logprob tolerance by the model's dtype. Stock vLLM itself gives a prompt
#: served cold and the same prompt served from its prefix cache other logprobs, as far
#: apart as the dtype's rounding of a different computation order allows: on CPU, at most
#: 2e-6 on the float32 toys, 0.066-0.123 on SmolLM2-135M-Instruct in bfloat16 (measured
#: with stock vLLM 0.32.0, issue 48). The tolerance is about twice the largest measured,
#: fp16 scaled from bf16 by their mantissas (8x finer). A stale head, the failure the
#: probe backs up, moves logprobs by whole nats.
DTYPE_ATOL = {"float32": 1e-3, "float64": 1e-3, "float16": 0.05, "bfloat16": 0.25}


#: The check against the caller's reference (:attr:`Probe.reference_logprobs`), by the
#: engine's dtype: the largest difference allowed at one position, and on average over
#: every scored position. Measured on SmolLM2-135M-Instruct with stock vLLM 0.32.0 in
#: bfloat16, after one SGD step (lr 0.02) of fp32 master weights, against transformers
#: with the weights read as the engine holds them (rounded to bf16, fp32 arithmetic): on a
#: 25-token English text, at most 0.21 at one position and 0.09 on average (0.29 and 0.14
#: against the unrounded fp32 weights). The defects, same text: the head left on the old
#: weights 3.6 at one position (0.65 on average), one layer's down_proj doubled 1.6
#: (0.65), the weights not loaded 13.5 (5.4); one down_proj scaled by 1.1: 0.57 (0.17), at
#: the edge. Random-token prompts are not usable: 4.5 at one position on the correct
#: engine. fp16 is bf16's scaled by their mantissas (8x finer); fp32 engines differ from
#: an fp32 reference by rounding alone.
REFERENCE_TOLERANCE = {
    "float32": (1e-3, 1e-4),
    "float64": (1e-3, 1e-4),
    "float16": (0.125, 0.02),
    "bfloat16": (1.0, 0.15),
}


def reference_tolerance(dtype: Any) -> tuple[float, float]:
    """:data:`REFERENCE_TOLERANCE` for the engine's ``dtype`` (a torch dtype or its name):
    ``(per position, on average)``; bfloat16's for any other."""
    name = str(dtype).removeprefix("torch.")
    return REFERENCE_TOLERANCE.get(name, REFERENCE_TOLERANCE["bfloat16"])


def default_atol(dtype: Any) -> float:
    """:data:`DTYPE_ATOL` for ``dtype`` (a torch dtype or its name); bfloat16's for any
    other."""
    return DTYPE_ATOL.get(str(dtype).removeprefix("torch."), DTYPE_ATOL["bfloat16"])


def _tuples(value: Any) -> tuple[tuple[Any, ...], ...] | None:
    return None if value is None else tuple(tuple(v) for v in value)


def _tuple(value: Any) -> tuple[Any, ...] | None:
    return None if value is None else tuple(value)


def _floats(value: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in value)


@attrs.frozen(kw_only=True)
class Probe:
    """What a refit's probe serves and expects.

    Attributes:
        prompts: token-id prompts; None: :func:`default_prompts` (one prompt a block and
            a token long, built from the vocabulary).
        max_tokens: tokens generated per prompt (greedy).
        expected_tokens: the tokens each prompt must give (e.g. a previous receipt's
            ``probe.tokens`` for the same weights, or your trainer's); None: not checked.
        expected_logprobs: the sampled tokens' logprobs each prompt must give (within
            ``atol``); None: not checked.
        atol: the largest difference allowed between two logprobs (cold vs warm, and vs
            ``expected_logprobs``); None: :data:`DTYPE_ATOL` for the model's dtype.
        enabled: False skips the probe (the receipt says so).
        reference_logprobs: per prompt, the log-probability of each of its tokens after
            the first that the caller's own model gives (``refit(..., reference=model)``
            computes them: :mod:`.reference`); the engine's prompt logprobs on the new
            weights must agree, position by position, within ``reference_tolerance``.
            None: not checked.
        reference_tolerance: ``(per position, on average)``: the largest difference
            allowed there at one position, and on average over all; None:
            :func:`reference_tolerance` for the engine's dtype.
    """

    prompts: tuple[tuple[int, ...], ...] | None = attrs.field(default=None, converter=_tuples)
    max_tokens: int = 2
    expected_tokens: tuple[tuple[int, ...], ...] | None = attrs.field(
        default=None, converter=_tuples
    )
    expected_logprobs: tuple[tuple[float, ...], ...] | None = attrs.field(
        default=None, converter=_tuples
    )
    atol: float | None = None
    enabled: bool = True
    reference_logprobs: tuple[tuple[float, ...], ...] | None = attrs.field(
        default=None, converter=_tuples
    )
    reference_tolerance: tuple[float, ...] | None = attrs.field(default=None, converter=_tuple)

    def problems(self) -> list[str]:
        """What makes this probe unusable, as lines (empty: it is usable)."""
        out = []
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            out.append(f"max_tokens={self.max_tokens!r}: expected a positive int")
        elif self.max_tokens <= 0:
            out.append(f"max_tokens={self.max_tokens}: expected a positive int")
        if self.atol is not None and not (
            isinstance(self.atol, (int, float)) and math.isfinite(self.atol) and self.atol >= 0
        ):
            out.append(f"atol={self.atol!r}: expected a finite number >= 0")
        if self.prompts is not None:
            if not self.prompts:
                out.append("prompts=(): give at least one prompt, or None for the default")
            for i, p in enumerate(self.prompts):
                if not p or not all(isinstance(t, int) and not isinstance(t, bool) for t in p):
                    out.append(f"prompts[{i}]: expected a non-empty list of token ids")
        tol = self.reference_tolerance
        if tol is not None and not (
            len(tol) == 2
            and all(isinstance(t, (int, float)) and math.isfinite(t) and t >= 0 for t in tol)
        ):
            out.append(
                f"reference_tolerance={tol!r}: expected (per position, on average), two "
                "finite numbers >= 0"
            )
        if self.reference_logprobs is not None and self.prompts is not None:
            for i, (ref, p) in enumerate(zip(self.reference_logprobs, self.prompts, strict=False)):
                if len(ref) != len(p) - 1:
                    out.append(
                        f"reference_logprobs[{i}] has {len(ref)} values for a prompt of "
                        f"{len(p)} tokens (expected one per token after the first)"
                    )
        for name in ("expected_tokens", "expected_logprobs", "reference_logprobs"):
            given = getattr(self, name)
            if given is None:
                continue
            n = len(self.prompts) if self.prompts is not None else None
            if n is not None and len(given) != n:
                out.append(f"{name} has {len(given)} entries for {n} prompts")
            if n is None:
                out.append(f"{name} needs the prompts it belongs to: pass prompts= too")
        return out

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Probe:
        return cls(**data)


@attrs.frozen(kw_only=True)
class ProbeResult:
    """What the probe served.

    Attributes:
        ran: False when the probe did not run (``problems`` says why: disabled, or a
            pooling model, which generates no tokens); nothing else is set then.
        ok: cold and warm agreed, and matched the expected outputs where given.
        prompts: the prompts served.
        tokens / logprobs: each prompt's generated tokens and their logprobs (cold run).
        cached_tokens: prompt tokens the warm run found in the prefix cache, per prompt.
        max_logprob_diff: the largest cold-vs-warm logprob difference (up to a near tie).
        atol: the tolerance it was held to (the probe's, or its dtype's default).
        checked_expected: whether expected outputs were given and compared.
        problems: why it is not ok, one line each.
        seconds: the probe's wall time.
        reference_checked: whether the prompts' logprobs were compared with the caller's
            reference (:attr:`Probe.reference_logprobs`); reference_max_diff and
            reference_mean_diff: the largest difference found there and the mean over the
            positions scored (both up to the first past the tolerance); reference_tolerance:
            ``(per position, on average)``, the tolerances it was held to.
    """

    ran: bool
    ok: bool
    prompts: tuple[tuple[int, ...], ...] = ()
    tokens: tuple[tuple[int, ...], ...] = ()
    logprobs: tuple[tuple[float, ...], ...] = ()
    cached_tokens: tuple[int, ...] = ()
    max_logprob_diff: float = 0.0
    atol: float = 0.0
    checked_expected: bool = False
    problems: tuple[str, ...] = ()
    seconds: float = 0.0
    reference_checked: bool = False
    reference_max_diff: float = 0.0
    reference_mean_diff: float = 0.0
    reference_tolerance: tuple[float, ...] = attrs.field(default=(0.0, 0.0), converter=_floats)

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProbeResult:
        return cls(
            **{
                **data,
                "prompts": _tuples(data["prompts"]),
                "tokens": _tuples(data["tokens"]),
                "logprobs": _tuples(data["logprobs"]),
                "cached_tokens": tuple(data["cached_tokens"]),
                "problems": tuple(data["problems"]),
            }
        )


class ProbeFailed(RuntimeError):
    """The probe's outputs do not agree (the message lists why)."""

    def __init__(self, result: ProbeResult) -> None:
        super().__init__("; ".join(result.problems))
        self.result = result


def default_prompts(
    vocab_size: int, block_size: int, max_model_len: int, max_tokens: int
) -> tuple[tuple[int, ...], ...]:
    """One deterministic prompt a block and a token long — the shortest whose warm run hits
    a cached block (it recomputes one token) — shorter where ``max_model_len`` asks, drawn
    from the vocabulary (ids from 3 up)."""
    length = max(1, min(block_size + 1, max_model_len - max_tokens - 1))
    span = max(1, vocab_size - 3)
    return (tuple(3 + (7919 * j + 104_729) % span for j in range(length)),)


@vllm_uses(
    "refit",
    calls=(
        "vllm.sampling_params:SamplingParams",
        "vllm.v1.engine:EngineCoreRequest",
        "vllm.v1.engine.core:EngineCore.preprocess_add_request",
        "vllm.v1.engine.core:EngineCore.add_request",
        "vllm.v1.engine.core:EngineCore.abort_requests",
        "vllm.v1.engine.core:EngineCore.step",
        "vllm.v1.engine.core:EngineCore.step_with_batch_queue",
        "vllm.v1.engine.core:EngineCore.post_step",
    ),
)
def _serve(
    core: Any,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    tag: str,
    *,
    prompt_logprobs: bool = False,
) -> list[dict[str, Any]]:
    """Serve ``prompts`` to completion through the engine core; each one's tokens,
    logprobs and cached prompt tokens (and with ``prompt_logprobs``, the logprob of each
    prompt token after the first: vLLM reads no prefix cache for such a request)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine import EngineCoreRequest

    ids = [f"initpipe-probe-{tag}-{i}-{uuid.uuid4().hex[:8]}" for i in range(len(prompts))]
    got: dict[str, dict[str, Any]] = {
        rid: {"tokens": [], "logprobs": [], "prompt_logprobs": [], "cached": 0, "done": False}
        for rid in ids
    }
    for rid, prompt in zip(ids, prompts, strict=True):
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0,
            ignore_eos=True,
            detokenize=False,
            logprobs=0,
            prompt_logprobs=0 if prompt_logprobs else None,
        )
        request = EngineCoreRequest(
            request_id=rid,
            prompt_token_ids=list(prompt),
            mm_features=None,
            sampling_params=params,
            pooling_params=None,
            arrival_time=time.time(),
            lora_request=None,
            cache_salt=None,
            data_parallel_rank=None,
        )
        req, wave = core.preprocess_add_request(request)
        # the class's method: while a refit retries after a failure, the instance's own
        # add_request refuses requests (the engine serves nothing until the refit succeeds)
        type(core).add_request(core, req, wave)
    try:
        for _ in range(_MAX_STEPS):
            if all(g["done"] for g in got.values()):
                break
            lost = [r for r, g in got.items() if not g["done"] and r not in core.scheduler.requests]
            if lost:
                raise RuntimeError(f"the probe's requests {lost} left the scheduler unfinished")
            outputs, executed = core.step_fn()
            post_step = getattr(core, "post_step", None)
            if post_step is not None:
                post_step(executed)
            for eco_batch in (outputs or {}).values():
                for eco in eco_batch.outputs:
                    g = got.get(eco.request_id)
                    if g is None:
                        continue
                    g["tokens"].extend(int(t) for t in eco.new_token_ids)
                    if eco.new_logprobs is not None:
                        g["logprobs"].extend(float(row[0]) for row in eco.new_logprobs.logprobs)
                    chunk = getattr(eco, "new_prompt_logprobs_tensors", None)
                    if chunk is not None:  # column 0: the prompt's own next token
                        g["prompt_logprobs"].extend(float(x) for x in chunk.logprobs[:, 0])
                    if eco.prefill_stats is not None:
                        g["cached"] = int(eco.prefill_stats.num_cached_tokens)
                    if eco.finish_reason is not None:
                        g["done"] = True
        else:
            raise RuntimeError(f"the probe did not finish in {_MAX_STEPS} engine steps")
    finally:
        left = [rid for rid, g in got.items() if not g["done"]]
        if left:
            core.abort_requests(left)
    return [got[rid] for rid in ids]


def _agreeing(cold: Mapping[str, Any], warm: Mapping[str, Any], atol: float) -> tuple[int, str]:
    """How many leading positions of a prompt's cold and warm outputs to compare, and why
    they disagree ("" if they do not). Greedy decoding picks the largest logprob; where two
    tokens are nearly tied, rounding may pick the other one warm. That is no fault when the
    two picks' logprobs are within ``atol`` (the tie was that close); after it the outputs
    continue from different tokens and are not compared."""
    ct, wt = cold["tokens"], warm["tokens"]
    if len(ct) != len(wt):
        return 0, f"{len(ct)} tokens cold, {len(wt)} warm"
    for j, (x, y) in enumerate(zip(ct, wt, strict=True)):
        if x != y:
            gap = abs(cold["logprobs"][j] - warm["logprobs"][j])
            if gap <= atol:
                return j + 1, ""
            return j, (
                f"tokens {ct} cold, {wt} warm (at position {j} the picks' logprobs differ "
                f"by {gap:.3g}, atol {atol:g}: not a near tie)"
            )
    return len(ct), ""


def _max_diff(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> float:
    diffs = [abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
    return max(diffs, default=0.0)


def _against_reference(
    prompts: Sequence[Sequence[int]],
    engine: Sequence[Sequence[float]],
    reference: Sequence[Sequence[float]],
    tolerance: Sequence[float],
) -> tuple[float, float, str]:
    """The largest and the mean difference between the engine's prompt logprobs and the
    reference's, and why they disagree ("" if they do not): the first position past the
    per-position tolerance (its token and both values), a mean past the average one, a
    count that differs, or a value that is not finite."""
    per_position, on_average = tolerance
    worst, total, count = 0.0, 0.0, 0
    for i, (prompt, got, want) in enumerate(zip(prompts, engine, reference, strict=True)):
        if len(got) != len(want):
            return (
                worst,
                0.0,
                (
                    f"prompt {i}: the engine gave {len(got)} prompt logprobs, the reference "
                    f"{len(want)} (one per token after the first)"
                ),
            )
        for j, (e, r) in enumerate(zip(got, want, strict=True)):
            if not (math.isfinite(e) and math.isfinite(r)):
                return (
                    worst,
                    0.0,
                    (
                        f"prompt {i}, position {j + 1} (token {prompt[j + 1]}): logprob "
                        f"{e:.4g} in the engine, {r:.4g} in the reference: not finite"
                    ),
                )
            gap = abs(e - r)
            if gap > per_position:
                return (
                    max(worst, gap),
                    (total + gap) / (count + 1),
                    (
                        f"prompt {i}, position {j + 1} (token {prompt[j + 1]}): logprob "
                        f"{e:.4f} in the engine, {r:.4f} in the reference: {gap:.3g} apart "
                        f"(tolerance {per_position:g} at a position): the engine does not serve "
                        "the reference's weights"
                    ),
                )
            worst, total, count = max(worst, gap), total + gap, count + 1
    mean = total / count if count else 0.0
    if mean > on_average:
        return (
            worst,
            mean,
            (
                f"the prompt logprobs differ from the reference's by {mean:.3g} on average over "
                f"{count} positions (tolerance {on_average:g}; the largest {worst:.3g}): the "
                "engine does not serve the reference's weights"
            ),
        )
    return worst, mean, ""


@vllm_uses(
    "refit",
    mirrors=("vllm.v1.core.sched.scheduler:Scheduler.__init__",),  # waiting, deferred_waiting
    calls=("vllm.v1.core.sched.scheduler:Scheduler.set_pause_state",),
)
def run(
    core: Any,
    probe: Probe,
    prompts: tuple[tuple[int, ...], ...],
    *,
    unpaused: Any,
    paused: Any,
    dtype: Any = "float32",
) -> ProbeResult:
    """Serve ``prompts`` cold, then warm, on ``core`` (paused: ``paused`` is set back, and
    the user's queued requests with it); compare, within ``probe.atol`` or the default for
    the model's ``dtype``. Never raises for outputs that disagree: the result says so
    (:class:`ProbeFailed` is the caller's to raise)."""
    start = time.perf_counter()
    sched = core.scheduler
    waiting, deferred = sched.waiting, sched.deferred_waiting
    sched.waiting, sched.deferred_waiting = type(waiting)(), set()
    sched.set_pause_state(unpaused)
    try:
        check_reference = probe.reference_logprobs is not None
        cold = _serve(core, prompts, probe.max_tokens, "cold", prompt_logprobs=check_reference)
        warm = _serve(core, prompts, probe.max_tokens, "warm")
    finally:
        sched.set_pause_state(paused)
        sched.waiting, sched.deferred_waiting = waiting, deferred
    atol = probe.atol if probe.atol is not None else default_atol(dtype)
    problems: list[str] = []
    tokens = tuple(tuple(c["tokens"]) for c in cold)
    logprobs = tuple(tuple(c["logprobs"]) for c in cold)
    diff = 0.0
    for i, (c, w) in enumerate(zip(cold, warm, strict=True)):
        bad = [x for x in c["logprobs"] + w["logprobs"] if not math.isfinite(x)]
        if bad:
            problems.append(f"prompt {i}: non-finite logprobs {bad[:3]}")
            continue
        n, why = _agreeing(c, w, atol)
        if why:
            problems.append(f"prompt {i}: {why}")
        diff = max(diff, _max_diff([c["logprobs"][:n]], [w["logprobs"][:n]]))
    if diff > atol:
        problems.append(f"cold and warm logprobs differ by {diff:.3g} (atol {atol:g})")
    checked = probe.expected_tokens is not None or probe.expected_logprobs is not None
    if probe.expected_tokens is not None:
        for i, (got, want) in enumerate(zip(tokens, probe.expected_tokens, strict=True)):
            if got != want:
                problems.append(f"prompt {i}: tokens {list(got)}, expected {list(want)}")
    if probe.expected_logprobs is not None and not problems:
        off = _max_diff(logprobs, probe.expected_logprobs)
        if off > atol:
            problems.append(f"logprobs differ from the expected ones by {off:.3g} (atol {atol:g})")
    ref_diff, ref_mean = 0.0, 0.0
    ref_tol: tuple[float, ...] = (0.0, 0.0)
    if probe.reference_logprobs is not None:
        ref_tol = probe.reference_tolerance or reference_tolerance(dtype)
        ref_diff, ref_mean, why = _against_reference(
            prompts, [c["prompt_logprobs"] for c in cold], probe.reference_logprobs, ref_tol
        )
        if why:
            problems.append(why)
    return ProbeResult(
        ran=True,
        ok=not problems,
        reference_checked=probe.reference_logprobs is not None,
        reference_max_diff=ref_diff,
        reference_mean_diff=ref_mean,
        reference_tolerance=ref_tol,
        prompts=prompts,
        tokens=tokens,
        logprobs=logprobs,
        cached_tokens=tuple(w["cached"] for w in warm),
        max_logprob_diff=0.0 if not math.isfinite(diff) else diff,
        atol=atol,
        checked_expected=checked,
        problems=tuple(problems),
        seconds=time.perf_counter() - start,
    )
