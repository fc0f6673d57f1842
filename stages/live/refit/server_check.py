"""A running vLLM server checked against the trainer's own model, over its OpenAI route.

What belongs here: :func:`server_logprobs` (the server's log-probability of each prompt
token, from ``POST /v1/completions`` with ``prompt_logprobs``), :func:`check_server` (those
against the reference's, :func:`.reference.reference_logprobs`, within the dtype's
tolerance) and :class:`ServerCheck`, its result. ``initpipe check-weights``
(:mod:`initpipe_vllm.tools.check_weights`) is its command line.

Why: a trainer that syncs weights into a vLLM server by hand (RL frameworks do, on releases
initpipe does not run in) has no proof that the server serves them. This needs nothing
inside the server: any vLLM with the OpenAI route answers ``prompt_logprobs``.

Only the standard library talks HTTP; torch is imported when a model reference scores.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

import attrs

from .probe import _against_reference, reference_tolerance

__all__ = ["ServerCheck", "ServerCheckError", "check_server", "server_logprobs"]


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
        problem: why it is not ok ("" when it is).
        seconds: the server's part (the HTTP requests).
    """

    url: str
    ok: bool
    max_diff: float
    mean_diff: float
    tolerance: tuple[float, ...]
    positions: int
    problem: str = ""
    seconds: float = 0.0

    def summary(self) -> str:
        """One line: how close where they agree, the first disagreement where not."""
        if not self.ok:
            return f"MISMATCH: {self.url}: {self.problem}"
        return (
            f"OK: {self.url}: {self.positions} prompt logprobs against the reference's, "
            f"max diff {self.max_diff:.3g}, mean {self.mean_diff:.3g} (tolerance "
            f"{self.tolerance[0]:g}, {self.tolerance[1]:g} on average)"
        )


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


def check_server(
    url: str,
    reference: Any,
    prompts: Sequence[Sequence[int]],
    *,
    dtype: Any = "bfloat16",
    tolerance: Sequence[float] | None = None,
    model: str | None = None,
    timeout: float = 120,
) -> ServerCheck:
    """The server's prompt logprobs against ``reference``'s on ``prompts``.

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
    started = time.perf_counter()
    got = server_logprobs(url, prompts, model=model, timeout=timeout)
    seconds = time.perf_counter() - started
    tol = tuple(tolerance) if tolerance is not None else reference_tolerance(dtype)
    worst, mean, why = _against_reference(prompts, got, want, tol)
    return ServerCheck(
        url=url,
        ok=not why,
        max_diff=worst,
        mean_diff=mean,
        tolerance=tol,
        positions=sum(len(p) - 1 for p in prompts),
        problem=why.replace("the engine", "the server"),
        seconds=seconds,
    )
