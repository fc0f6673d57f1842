"""The public refit API: ``refit``, ``refit_async``, ``weights_info``, ``weights_info_async``
(re-exported at ``initpipe_vllm``'s top level).

What belongs here: the frontend's part of a refit — checking the arguments, turning the
weights the caller gives into what the engine core can load (a folder path as it is;
in-memory tensors passed as they are where the workers share this process, else written
once to a temporary safetensors folder they load and removed afterwards), aborting
requests in ``abort`` mode (in-process), calling the engine core (:mod:`.engine`), and
turning its plain answer back into a :class:`~.receipt.RefitReceipt` or a typed error. While
the last refit has failed, new requests are refused here (``RefitFailedError``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import RefitRefusedError
from .api import (
    _client,
    _engine,
    _guard,
    _inproc_core,
    _plugin_missing,
    _refresh_metrics_info,
    apply_state,
    query,
    query_async,
)
from .engine import REFIT_METHOD, WEIGHTS_METHOD, install, refit_error_from_dict
from .probe import Probe
from .receipt import RefitReceipt, WeightsInfo

__all__ = ["refit", "refit_async", "weights_info", "weights_info_async"]

MODES = ("wait", "abort")


def _refused(step: str, reason: str) -> RefitRefusedError:
    return RefitRefusedError(
        f"refit refused ({step}): {reason}. Nothing changed; the engine serves on with its "
        "previous weights.",
        step=step,
        reason=reason,
    )


def _probe(probe: Any) -> Probe:
    if probe is None or probe is True:
        found = Probe()
    elif probe is False:
        found = Probe(enabled=False)
    elif isinstance(probe, Probe):
        found = probe
    elif isinstance(probe, Mapping):
        try:
            found = Probe(**probe)
        except TypeError as err:
            raise _refused("arguments", f"probe={dict(probe)!r}: {err}") from None
    else:
        raise _refused(
            "arguments", f"probe={probe!r}: expected a Probe, a dict of its fields, True or False"
        )
    bad = found.problems()
    if bad:
        raise _refused("arguments", "probe: " + "; ".join(bad))
    return found


def _digest(expected: Any) -> list[str] | None:
    if expected is None:
        return None
    values = [expected] if isinstance(expected, str) else expected
    if (
        not isinstance(values, Sequence)
        or not values
        or not all(isinstance(v, str) and v.startswith("sha256:") for v in values)
    ):
        raise _refused(
            "arguments",
            f"expected_digest={expected!r}: expected 'sha256:...' (one rank) or a list of "
            "them, one per rank (a receipt's .digests)",
        )
    return list(values)


def _size(num_blocks: Any, kv_cache_memory_bytes: Any) -> None:
    if num_blocks is not None and kv_cache_memory_bytes is not None:
        raise _refused("arguments", "pass at most one of num_blocks= and kv_cache_memory_bytes=")
    for name, value in (
        ("num_blocks", num_blocks),
        ("kv_cache_memory_bytes", kv_cache_memory_bytes),
    ):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value <= 0
        ):
            raise _refused("arguments", f"{name}={value!r}: expected a positive int")


def _weights(weights: Any) -> tuple[str | None, list[tuple[str, Any]] | None]:
    """A folder path, or the ``(name, tensor)`` pairs (a mapping's items, or any iterable
    of pairs: read once, here)."""
    if isinstance(weights, (str, os.PathLike)):
        path = Path(weights).expanduser().resolve()
        if not path.is_dir():
            raise _refused("weights", f"{weights!s} is not a folder (expected safetensors files)")
        return str(path), None
    if isinstance(weights, Mapping):
        return None, list(weights.items())
    if isinstance(weights, Iterable) and not isinstance(weights, (bytes, bytearray)):
        return None, list(weights)
    raise _refused(
        "arguments",
        f"weights={type(weights).__name__}: expected a folder of safetensors files or "
        "(name, tensor) pairs in the checkpoint's format",
    )


def _spec(
    weights: Any,
    *,
    num_blocks: Any,
    kv_cache_memory_bytes: Any,
    mode: Any,
    expected_digest: Any,
    probe: Any,
    version: Any,
) -> tuple[dict[str, Any], list[tuple[str, Any]] | None]:
    if mode not in MODES:
        raise _refused(
            "arguments", f"mode={mode!r}: expected 'wait' (let requests finish) or 'abort'"
        )
    if version is not None and (not isinstance(version, str) or not version):
        raise _refused("arguments", f"version={version!r}: expected a non-empty str")
    _size(num_blocks, kv_cache_memory_bytes)
    path, tensors = _weights(weights)
    spec = {
        "path": path,
        "num_blocks": num_blocks,
        "kv_cache_memory_bytes": kv_cache_memory_bytes,
        "expected_digest": _digest(expected_digest),
        "probe": _probe(probe).to_dict(),
        "version": version,
        "transport": "folder",
        "kind": "folder" if tensors is None else "tensors",
    }
    return spec, tensors


def _finish(engine: Any, answer: dict[str, Any]) -> RefitReceipt:
    apply_state(engine, answer)
    _refresh_metrics_info(engine)
    if not answer["ok"]:
        raise refit_error_from_dict(answer["error"])
    return RefitReceipt.from_dict(answer["receipt"])


def _shares_process(core: Any) -> bool:
    return type(core.model_executor).__name__ == "UniProcExecutor"


def refit(
    llm: Any,
    weights: Any,
    *,
    num_blocks: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    mode: str = "wait",
    expected_digest: str | Sequence[str] | None = None,
    probe: Probe | Mapping[str, Any] | bool | None = None,
    version: str | None = None,
) -> RefitReceipt:
    """Load new weights into a running engine and rebuild everything that depends on them,
    as one transaction; return its receipt.

    The engine stops admitting requests (``mode="wait"`` lets those in flight finish, new
    ones queue; ``"abort"`` aborts them), releases its KV cache, loads the weights through
    vLLM's ``reload_weights`` on every rank, digests them, runs its KV phase at the new
    size (default: the current one), empties and checks every cache computed from the old
    weights, serves a probe twice (cold, then from the prefix cache it filled), and serves
    again — the queued requests first. Afterwards it is what a fresh engine started with
    these weights at this size would be.

    Args:
        llm: a vLLM ``LLM`` or ``LLMEngine`` using initpipe's pipelined worker.
        weights: a folder of safetensors files in the model's checkpoint format (each rank
            loads its shard), or ``(name, tensor)`` pairs / a ``{name: tensor}`` mapping in
            that format (passed as they are where the workers share this process; else
            written once to a temporary safetensors folder, under ``/dev/shm`` when it
            exists, and removed afterwards).
        num_blocks: the KV blocks afterwards (default: the size before, or the size
            before a release).
        kv_cache_memory_bytes: the KV size per rank afterwards, instead of ``num_blocks``.
        mode: ``"wait"`` or ``"abort"`` (requests in flight).
        expected_digest: the digest the loaded weights must have (``"sha256:..."``, or one
            per rank: a previous receipt's ``digests``); else the refit fails.
        probe: a :class:`~initpipe_vllm.resize.probe.Probe` (prompts, expected outputs),
            a dict of its fields, True (default prompts) or False (no probe).
        version: the weights version the engine reports afterwards (vLLM's
            ``weight_version``; default ``refit-N``).

    Raises:
        RefitRefusedError: bad arguments, weights that do not match the checkpoint (a
            missing or unexpected tensor, another shape or dtype), an engine or state a
            refit cannot follow, not enough memory: nothing changed.
        RefitError: a step failed (``.step``, ``.rank``); the engine failed closed: it
            refuses requests until a refit succeeds.
    """
    spec, tensors = _spec(
        weights,
        num_blocks=num_blocks,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        mode=mode,
        expected_digest=expected_digest,
        probe=probe,
        version=version,
    )
    engine = _engine_or_refuse(llm)
    core = _inproc_core(engine)
    folder = None
    try:
        if tensors is not None:
            if core is not None and _shares_process(core):
                spec["tensors"], spec["transport"] = tuple(tensors), "in-process"
            else:
                folder = _to_folder(tensors)
                spec["path"] = str(folder)
        if core is None:
            client = _client(engine, is_async=False)
            _guard(engine)
            try:
                answer = client.call_utility(REFIT_METHOD, spec, mode, [])
            except Exception as err:
                raise (_plugin_missing(err) or err) from err
            return _finish(engine, answer)
        install()
        _guard(engine)
        aborted: list[str] = []
        if mode == "abort":
            aborted = sorted(engine.output_processor.request_states)
            if aborted:
                engine.abort_request(aborted, internal=True)
        return _finish(engine, getattr(core, REFIT_METHOD)(spec, mode, aborted))
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _engine_or_refuse(llm: Any) -> Any:
    try:
        return _engine(llm)
    except Exception as err:
        raise _refused("arguments", str(err)) from None


def _to_folder(tensors: list[tuple[str, Any]]) -> Path:
    from .weights import tensors_schema, to_folder

    try:
        tensors_schema(tensors)
    except ValueError as err:
        raise _refused("weights", str(err)) from None
    return to_folder(tensors)


async def refit_async(
    llm: Any,
    weights: Any,
    *,
    num_blocks: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    mode: str = "wait",
    expected_digest: str | Sequence[str] | None = None,
    probe: Probe | Mapping[str, Any] | bool | None = None,
    version: str | None = None,
) -> RefitReceipt:
    """:func:`refit` for an ``AsyncLLM`` (its engine core runs in its own process: tensors
    travel as a temporary safetensors folder). ``mode="wait"``: requests in flight finish,
    new ones queue and run on the new weights; ``"abort"``: their streams end with
    ``finish_reason="abort"``."""
    spec, tensors = _spec(
        weights,
        num_blocks=num_blocks,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        mode=mode,
        expected_digest=expected_digest,
        probe=probe,
        version=version,
    )
    engine = _engine_or_refuse(llm)
    client = _client(engine, is_async=True)
    _guard(engine)
    folder = _to_folder(tensors) if tensors is not None else None
    if folder is not None:
        spec["path"] = str(folder)
    try:
        answer = await client.call_utility_async(REFIT_METHOD, spec, mode, [])
    except Exception as err:
        raise (_plugin_missing(err) or err) from err
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    return _finish(engine, answer)


def weights_info(llm: Any) -> WeightsInfo:
    """The engine's weights now: state, version, digests, refits and failures."""
    return WeightsInfo.from_dict(query(_engine_or_refuse(llm), WEIGHTS_METHOD))


async def weights_info_async(llm: Any) -> WeightsInfo:
    """:func:`weights_info` for an ``AsyncLLM``."""
    return WeightsInfo.from_dict(await query_async(_engine_or_refuse(llm), WEIGHTS_METHOD))
