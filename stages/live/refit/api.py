"""The public refit API: ``refit``, ``refit_async``, ``weights_info``, ``weights_info_async``
(re-exported at ``initpipe_vllm``'s top level).

What belongs here: the frontend's part of a refit — checking the arguments, turning the
weights the caller gives into what the engine core can load (a folder path as it is;
in-memory tensors passed as they are where the workers share this process, else written
once to a temporary safetensors folder they load and removed afterwards), aborting
requests in ``abort`` mode (in-process), calling the engine core (:mod:`.engine`) through
the one frontend (:mod:`initpipe_vllm.live.frontend`), which answers the
:class:`~.receipt.RefitReceipt` or raises the typed error. While the last refit has failed,
new requests are refused there (``RefitFailedError``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.entry import shares_process
from ..frontend import (
    call,
    call_async,
    check_mode,
    check_size,
    engine_of,
    inproc_core,
    query,
    query_async,
)
from .engine import REFIT_UTILITY, WEIGHTS_UTILITY, refused as _refused
from .probe import Probe
from .receipt import RefitReceipt, WeightsInfo

__all__ = ["refit", "refit_async", "weights_info", "weights_info_async"]


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
    num_blocks: Any,
    kv_cache_memory_bytes: Any,
    mode: Any,
    expected_digest: Any,
    probe: Any,
    version: Any,
) -> tuple[dict[str, Any], list[tuple[str, Any]] | None]:
    check_mode(mode, _refused)
    if version is not None and (not isinstance(version, str) or not version):
        raise _refused("arguments", f"version={version!r}: expected a non-empty str")
    check_size(num_blocks, kv_cache_memory_bytes, required=False, refusal=_refused)
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


def _with_reference(spec: dict[str, Any], reference: Any, engine: Any) -> None:
    """The spec's probe with the ``reference``'s logprobs of its prompts, scored here
    (:mod:`.reference`); a reference that cannot be used is refused before anything
    changes."""
    if reference is None:
        return
    from .reference import BadReference, probe_with_reference

    config = getattr(engine, "vllm_config", None)
    try:
        found = probe_with_reference(Probe.from_dict(spec["probe"]), reference, config)
    except BadReference as err:
        raise _refused("arguments", f"reference: {err}") from None
    bad = found.problems()
    if bad:
        raise _refused("arguments", "reference: " + "; ".join(bad))
    spec["probe"] = found.to_dict()


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
    reference: Any = None,
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
        probe: a :class:`~initpipe_vllm.live.refit.probe.Probe` (prompts, expected outputs),
            a dict of its fields, True (default prompts) or False (no probe).
        version: the weights version the engine reports afterwards (vLLM's
            ``weight_version``; default ``refit-N``).
        reference: your own model of the new weights (a torch module of the engine's
            architecture taking ``input_ids``, e.g. the transformers model you trained),
            or its logprobs of ``probe``'s prompts: it scores the probe's prompts here,
            and the engine's prompt logprobs on the new weights must agree position by
            position (within the probe's ``reference_tolerance``, by default the
            dtype's), or the refit fails closed naming the first that does not.

    Raises:
        RefitRefusedError: bad arguments, weights that do not match the checkpoint (a
            missing or unexpected tensor, another shape or dtype), an engine or state a
            refit cannot follow, not enough memory: nothing changed.
        RefitError: a step failed (``.step``, ``.rank``); the engine failed closed: it
            refuses requests until a refit succeeds.
    """
    options = (num_blocks, kv_cache_memory_bytes, mode, expected_digest, probe, version)
    spec, tensors = _spec(weights, *options)
    engine = engine_of(llm, _refused)
    _with_reference(spec, reference, engine)
    core = inproc_core(engine)
    folder = None
    try:
        if tensors is not None:
            if core is not None and shares_process(core):
                spec["tensors"], spec["transport"] = tuple(tensors), "in-process"
            else:
                folder = _to_folder(tensors)
                spec["path"] = str(folder)
        return call(engine, REFIT_UTILITY, spec, mode, record=RefitReceipt, abort=mode == "abort")
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


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
    reference: Any = None,
) -> RefitReceipt:
    """:func:`refit` for an ``AsyncLLM`` (its engine core runs in its own process: tensors
    travel as a temporary safetensors folder). ``mode="wait"``: requests in flight finish,
    new ones queue and run on the new weights; ``"abort"``: their streams end with
    ``finish_reason="abort"``."""
    options = (num_blocks, kv_cache_memory_bytes, mode, expected_digest, probe, version)
    spec, tensors = _spec(weights, *options)
    engine = engine_of(llm, _refused)
    _with_reference(spec, reference, engine)
    folder = _to_folder(tensors) if tensors is not None else None
    if folder is not None:
        spec["path"] = str(folder)
    try:
        return await call_async(engine, REFIT_UTILITY, spec, mode, record=RefitReceipt)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def weights_info(llm: Any) -> WeightsInfo:
    """The engine's weights now: state, version, digests, refits and failures."""
    return WeightsInfo.from_dict(query(engine_of(llm, _refused), WEIGHTS_UTILITY))


async def weights_info_async(llm: Any) -> WeightsInfo:
    """:func:`weights_info` for an ``AsyncLLM``."""
    return WeightsInfo.from_dict(await query_async(engine_of(llm, _refused), WEIGHTS_UTILITY))
