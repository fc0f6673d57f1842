"""Two engines that fail to start or to run: do they fail the same way, in the same place?

What belongs here: describing a failed engine so that the equivalence harness
(:mod:`.equivalence`) can compare stock's failure with the pipelined one's — the innermost
error (type and message), WHERE it was raised, and the runner's state when it failed.
Replaces nothing in vLLM.

"The same message" is not enough: a pipelined catalog may raise stock's words from another
step (a check re-implemented in a stage, or reached on another path). So a failure is
described by (:func:`describe_failure`):

- ``error``: ``Type: message`` of the innermost cause (a pipelined failure wraps it in a
  ``StageError``, whose ``__cause__`` is that error);
- ``raised_in``: the innermost traceback frame, ``module:qualname`` (where it was raised);
- ``vllm_frame``: the innermost frame in vLLM's own code (the vLLM function that failed,
  or that called what failed), None where there is none;
- ``stage`` and ``mirrors``: for a pipelined failure, the failing stage and the vLLM
  methods that stage replaces (its ``meta["mirrors"]``).

:func:`failure_differences` says where two descriptions differ: the same error, raised in
the same frame and failing in the same vLLM function — or, for an error raised by a
stage's own code, that stage replaces the stock method that failed. The caller may add
``partial`` to a description (what was observed before the failure: snapshots, outputs, the
runner's snapshot at the failure), compared key by key with
:func:`~.snapshot.stock_differences` where both sides have one.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import TracebackType
from typing import Any

__all__ = ["describe_failure", "failure_differences", "innermost_error"]


def innermost_error(err: BaseException) -> BaseException:
    """Follow ``__cause__`` to the error that started it."""
    while err.__cause__ is not None:
        err = err.__cause__
    return err


def _frames(tb: TracebackType | None) -> Iterator[Any]:
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def _where(frame: Any) -> str:
    return f"{frame.f_globals.get('__name__', '?')}:{frame.f_code.co_qualname}"


def _stage_mirrors(qualname: str | None) -> list[str]:
    """``meta["mirrors"]`` of the stage function ``module:qualname`` (empty when unknown)."""
    from initpipe import get_spec

    if not qualname or ":" not in qualname:
        return []
    module, _, name = qualname.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return []
    spec = get_spec(obj)
    return list((spec.meta or {}).get("mirrors", ())) if spec is not None else []


def describe_failure(err: BaseException) -> dict[str, Any]:
    """What failed and where (see the module docstring).

    Args:
        err: the exception an engine's start or run raised (its traceback intact).
    """
    inner = innermost_error(err)
    frames = list(_frames(inner.__traceback__))
    vllm = [f for f in frames if f.f_globals.get("__name__", "").startswith("vllm.")]
    stage = getattr(err, "stage", None)
    return {
        "error": f"{type(inner).__name__}: {inner}",
        "raised_in": _where(frames[-1]) if frames else None,
        "vllm_frame": _where(vllm[-1]) if vllm else None,
        "stage": stage,
        "mirrors": _stage_mirrors(getattr(err, "qualname", None)) if stage is not None else [],
    }


def _same_place(stock: dict[str, Any], piped: dict[str, Any]) -> bool:
    if (stock["raised_in"], stock["vllm_frame"]) == (piped["raised_in"], piped["vllm_frame"]):
        return True
    # raised by a stage's own code: that stage must replace the stock method that raised
    return piped["stage"] is not None and stock["vllm_frame"] in piped["mirrors"]


def failure_differences(stock: dict[str, Any], piped: dict[str, Any] | None) -> list[str]:
    """Where two :func:`describe_failure` results differ, as ``/refused/...`` lines; an
    engine that did not fail (``piped`` None) is one line."""
    from .snapshot import stock_differences

    if piped is None:
        return [f"/refused: stock failed ({stock['error']}), pipelined did not fail"]
    out = []
    if stock["error"] != piped["error"]:
        out.append(f"/refused/error: {stock['error']!r} != {piped['error']!r}")
    if not _same_place(stock, piped):
        keys = ("raised_in", "vllm_frame", "stage")
        out.append(
            "/refused/where: stock "
            + ", ".join(f"{k}={stock[k]}" for k in keys[:2])
            + "; pipelined "
            + ", ".join(f"{k}={piped[k]}" for k in keys)
            + (f" (mirrors {piped['mirrors']})" if piped["stage"] else "")
        )
    a, b = stock.get("partial", {}), piped.get("partial", {})
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            out.append(f"/refused/{key}: only in {'stock' if key in a else 'pipelined'}")
        else:
            out += stock_differences(a[key], b[key], f"/refused/{key}")
    return out
