"""A running vLLM server checked against the trainer's own model, over its OpenAI route.

What belongs here: :func:`server_logprobs` (the server's log-probability of each prompt
token, from ``POST /v1/completions`` with ``prompt_logprobs``), :func:`server_continuations`
(greedy tokens generated from each prompt, which read the server's prefix cache, with their
logprobs), :func:`check_server` (the first against the reference's,
:func:`.reference.reference_logprobs`, within the dtype's tolerance; the second against the
same tokens scored without the cache) and :class:`ServerCheck`, its result.
``initpipe check-weights`` (:mod:`initpipe_vllm.tools.check_weights`) is its command line.

Why: a trainer that syncs weights into a vLLM server by hand (RL frameworks do, on releases
initpipe does not run in) has no proof that the server serves them. This needs nothing
inside the server: any vLLM with the OpenAI route answers ``prompt_logprobs``.

The prefix cache: a sync that does not empty it leaves blocks computed with the old weights,
and every request that shares their prefix reads them. ``prompt_logprobs`` requests never
read the cache, so the reference check cannot see them. The cache check generates from each
prompt first (reading whatever the cache holds for it: the blocks the previous check left,
before the sync), then scores the same tokens with ``prompt_logprobs`` (no cache): the two
agree within the dtype's rounding (:data:`.probe.DTYPE_ATOL`) unless the cache is stale.

Only the standard library talks HTTP; torch is imported when a model reference scores.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

import attrs

from .probe import _against_reference, default_atol, reference_tolerance

__all__ = [
    "CACHE_TOKENS",
    "Continuation",
    "ServerCheck",
    "ServerCheckError",
    "check_server",
    "server_continuations",
    "server_logprobs",
]

#: Greedy tokens the cache check generates from each prompt. Their logprobs depend on every
#: cached block of the prompt; eight are enough for a stale block to show and cost one
#: short request per prompt.
CACHE_TOKENS = 8


class ServerCheckError(RuntimeError):
    """The server could not be asked (unreachable, an HTTP error, an answer without prompt
    logprobs): the message names the URL and what it answered."""


@attrs.frozen(kw_only=True)
class ServerCheck:
    """What :func:`check_server` found.

    Attributes:
        url: the server.
        ok: the server's prompt logprobs agree with the reference's within ``tolerance``.
        max_diff, mean_diff: the largest difference (up to the first past the tolerance)
            and the mean over every scored position.
        tolerance: ``(per position, on average)``.
        positions: how many prompt tokens were compared.
        problem: why it is not ok ("" when it is): the reference check's first, then the
            cache check's.
        seconds: the server's part (the HTTP requests).
        cache_tokens: continuation tokens the cache check compared (0: not run).
        cached_tokens: per prompt, the prompt tokens the server read from its prefix cache
            for the continuation (None: the server does not say; it says with
            ``--enable-prompt-tokens-details``).
        cache_max_diff: the largest difference between a continuation token's logprob
            generated after the cache and the same token's scored without it.
        cache_tolerance: the largest allowed (the dtype's rounding).
        cache_problem: why the cache check failed ("" when it did not).
    """

    url: str
    ok: bool
    max_diff: float
    mean_diff: float
    tolerance: tuple[float, ...]
    positions: int
    problem: str = ""
    seconds: float = 0.0
    cache_tokens: int = 0
    cached_tokens: tuple[int | None, ...] = ()
    cache_max_diff: float = 0.0
    cache_tolerance: float = 0.0
    cache_problem: str = ""

    def summary(self) -> str:
        """One line: how close where they agree, the first disagreement where not; then a
        line on the prefix cache when it was checked."""
        if not self.ok:
            return f"MISMATCH: {self.url}: {self.problem}"
        line = (
            f"OK: {self.url}: {self.positions} prompt logprobs against the reference's, "
            f"max diff {self.max_diff:.3g}, mean {self.mean_diff:.3g} (tolerance "
            f"{self.tolerance[0]:g}, {self.tolerance[1]:g} on average)"
        )
        if not self.cache_tokens:
            return line
        return f"{line}\n{self.cache_line()}"

    def cache_line(self) -> str:
        """What the cache check compared, and how many cached prompt tokens it read."""
        if None in self.cached_tokens:
            read = "cached prompt tokens not reported (--enable-prompt-tokens-details shows them)"
        else:
            read = f"after {sum(t or 0 for t in self.cached_tokens)} cached prompt tokens"
        return (
            f"prefix cache: {self.cache_tokens} generated logprobs {read} equal the same "
            f"tokens scored without the cache, max diff {self.cache_max_diff:.3g} (tolerance "
            f"{self.cache_tolerance:g})"
        )


@attrs.frozen(kw_only=True)
class Continuation:
    """Greedy tokens a server generated from a prompt, as :func:`server_continuations` asks.

    Attributes:
        tokens: the generated token ids.
        logprobs: each one's logprob, as generated (after the prompt's cached blocks).
        cached: prompt tokens read from the prefix cache (None: not reported).
    """

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    cached: int | None


def _post(url: str, body: dict[str, Any], timeout: float) -> Any:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:500]
        raise ServerCheckError(f"{url}: HTTP {err.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as err:
        raise ServerCheckError(f"{url}: cannot reach the server ({err})") from None


def _model_name(base: str, timeout: float) -> str:
    try:
        with urllib.request.urlopen(f"{base}/v1/models", timeout=timeout) as r:
            models = json.loads(r.read())["data"]
    except (urllib.error.URLError, OSError, KeyError, ValueError) as err:
        msg = f"{base}/v1/models: cannot read the served model's name ({err}); pass model="
        raise ServerCheckError(msg) from None
    return str(models[0]["id"])


def server_logprobs(
    url: str, prompts: Sequence[Sequence[int]], *, model: str | None = None, timeout: float = 120
) -> tuple[tuple[float, ...], ...]:
    """Each prompt's token log-probabilities as the server at ``url`` computes them: for every
    token after the first (vLLM's ``prompt_logprobs``; it reads no prefix cache for them).

    Raises:
        ServerCheckError: unreachable, an HTTP error, or an answer without them.
    """
    base = url.rstrip("/")
    name = model or _model_name(base, timeout)
    out: list[tuple[float, ...]] = []
    for i, prompt in enumerate(prompts):
        body = {
            "model": name,
            "prompt": [int(t) for t in prompt],
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
        }
        answer = _post(f"{base}/v1/completions", body, timeout)
        try:
            rows = answer["choices"][0]["prompt_logprobs"]
            values = tuple(
                float(row[str(token)]["logprob"])
                for row, token in zip(rows[1:], prompt[1:], strict=True)
            )
        except (KeyError, IndexError, TypeError, ValueError) as err:
            msg = (
                f"{base}: prompt {i}: the answer has no prompt logprob for each token "
                f"({type(err).__name__}: {err}); is it a vLLM server?"
            )
            raise ServerCheckError(msg) from None
        out.append(values)
    return tuple(out)


def server_continuations(
    url: str,
    prompts: Sequence[Sequence[int]],
    *,
    tokens: int = CACHE_TOKENS,
    model: str | None = None,
    timeout: float = 120,
) -> tuple[Continuation, ...]:
    """``tokens`` greedy tokens the server at ``url`` generates from each prompt, their
    logprobs, and how many prompt tokens it read from its prefix cache (vLLM's
    ``return_tokens_as_token_ids`` and ``ignore_eos``; the count where the server reports
    ``prompt_tokens_details``).

    Raises:
        ServerCheckError: unreachable, an HTTP error, or an answer without them.
    """
    base = url.rstrip("/")
    name = model or _model_name(base, timeout)
    out: list[Continuation] = []
    for i, prompt in enumerate(prompts):
        body = {
            "model": name,
            "prompt": [int(t) for t in prompt],
            "max_tokens": tokens,
            "temperature": 0.0,
            "logprobs": 0,
            "ignore_eos": True,
            "return_tokens_as_token_ids": True,
        }
        answer = _post(f"{base}/v1/completions", body, timeout)
        try:
            got = answer["choices"][0]["logprobs"]
            ids = tuple(int(str(t).removeprefix("token_id:")) for t in got["tokens"])
            values = tuple(float(v) for v in got["token_logprobs"])
            if len(ids) != len(values) or not ids:
                raise ValueError(f"{len(ids)} tokens, {len(values)} logprobs")
        except (KeyError, IndexError, TypeError, ValueError) as err:
            msg = (
                f"{base}: prompt {i}: the answer has no logprob for each generated token "
                f"({type(err).__name__}: {err}); is it a vLLM server?"
            )
            raise ServerCheckError(msg) from None
        details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
        out.append(
            Continuation(
                tokens=ids, logprobs=values, cached=None if cached is None else int(cached)
            )
        )
    return tuple(out)


def _against_uncached(
    continuations: Sequence[Continuation],
    scored: Sequence[Sequence[float]],
    atol: float,
) -> tuple[float, str]:
    """The largest difference between each continuation's logprobs as generated and the same
    tokens' scored without the cache (``scored``: the last of each prompt-plus-continuation's
    prompt logprobs), and why they disagree ("" if they do not)."""
    worst = 0.0
    for i, (c, fresh) in enumerate(zip(continuations, scored, strict=True)):
        for k, (token, gen, ref) in enumerate(zip(c.tokens, c.logprobs, fresh, strict=True)):
            gap = abs(gen - ref) if math.isfinite(gen) and math.isfinite(ref) else math.inf
            if gap > atol:
                cached = "?" if c.cached is None else str(c.cached)
                why = (
                    f"prompt {i}: generated token {k + 1} (token {token}) has logprob "
                    f"{gen:.4f} after the prefix cache ({cached} cached prompt tokens) and "
                    f"{ref:.4f} scored without it: {gap:.3g} apart (tolerance {atol:g}): the "
                    "server's prefix cache holds blocks computed with other weights (empty it "
                    "after every weight sync: vLLM's reset_prefix_cache)"
                )
                return max(worst, gap), why
            worst = max(worst, gap)
    return worst, ""


def check_server(
    url: str,
    reference: Any,
    prompts: Sequence[Sequence[int]],
    *,
    dtype: Any = "bfloat16",
    tolerance: Sequence[float] | None = None,
    model: str | None = None,
    timeout: float = 120,
    cache_tokens: int = CACHE_TOKENS,
) -> ServerCheck:
    """The server's prompt logprobs against ``reference``'s on ``prompts``; and, first, its
    prefix cache: ``cache_tokens`` greedy tokens generated from each prompt (reading the
    blocks a previous check or request left) against the same tokens scored without the
    cache. Run it before a sync too (or after the previous one): the blocks its prompts
    leave in the cache are what the next check reads, and a sync that does not empty the
    cache fails that check.

    Args:
        url: the server (``http://host:port``).
        reference: your model of the weights the server should serve (a torch module,
            scored here with its weights rounded to ``dtype``), or its logprobs of
            ``prompts`` (one sequence per prompt, each token after the first).
        prompts: token ids of text like your training data's (random tokens carry more
            bfloat16 noise than the defects this must see).
        dtype: the server's dtype (its tolerance, and the rounding of a model reference).
        tolerance: ``(per position, on average)``; default: the dtype's
            (:data:`.probe.REFERENCE_TOLERANCE`).
        model: the served model's name (default: the first of ``/v1/models``).
        cache_tokens: tokens generated per prompt for the cache check; 0 skips it.

    Raises:
        ServerCheckError: the server could not be asked.
        BadReference: the reference cannot score the prompts.
    """
    from .reference import reference_logprobs

    if hasattr(reference, "parameters") and callable(reference):
        import torch

        torch_dtype = getattr(torch, str(dtype).removeprefix("torch."), None)
        want = reference_logprobs(reference, prompts, torch_dtype)
    else:
        want = tuple(tuple(float(x) for x in row) for row in reference)
    if cache_tokens < 0:
        raise ValueError(f"cache_tokens={cache_tokens}: give 0 (no cache check) or more")
    started = time.perf_counter()
    name = model or _model_name(url.rstrip("/"), timeout)
    # the continuations first: they read what the cache held before this check
    conts = (
        server_continuations(url, prompts, tokens=cache_tokens, model=name, timeout=timeout)
        if cache_tokens
        else ()
    )
    # one prompt-logprobs request per prompt: the prompt's part for the reference check, the
    # generated tokens' part (read without the cache) for the cache check
    tails = [c.tokens for c in conts] if conts else [() for _ in prompts]
    scored = [[*p, *t] for p, t in zip(prompts, tails, strict=True)]
    got_all = server_logprobs(url, scored, model=name, timeout=timeout)
    seconds = time.perf_counter() - started
    got = tuple(row[: len(p) - 1] for row, p in zip(got_all, prompts, strict=True))
    tol = tuple(tolerance) if tolerance is not None else reference_tolerance(dtype)
    worst, mean, why = _against_reference(prompts, got, want, tol)
    why = why.replace("the engine", "the server")
    atol = default_atol(dtype)
    fresh = [row[len(p) - 1 :] for row, p in zip(got_all, prompts, strict=True)]
    cache_worst, cache_why = _against_uncached(conts, fresh, atol) if conts else (0.0, "")
    return ServerCheck(
        url=url,
        ok=not why and not cache_why,
        max_diff=worst,
        mean_diff=mean,
        tolerance=tol,
        positions=sum(len(p) - 1 for p in prompts),
        problem="; ".join(w for w in (why, cache_why) if w),
        seconds=seconds,
        cache_tokens=sum(len(c.tokens) for c in conts),
        cached_tokens=tuple(c.cached for c in conts),
        cache_max_diff=cache_worst,
        cache_tolerance=atol if conts else 0.0,
        cache_problem=cache_why,
    )
