"""The weights of a refit: where they come from, what they must look like, and the rank side.

What belongs here: the :class:`Source` a refit loads (a folder of safetensors files, or
``(name, tensor)`` pairs in checkpoint format), the check of a source against the
engine's own checkpoint before anything changes (:func:`schema_of`, :func:`mismatches`:
names, shapes, dtypes read from the safetensors headers, never the tensors), the hand-off
of in-memory tensors to workers in other processes (:func:`to_folder`), and the rank
functions a refit sends through ``collective_rpc``: :func:`rank_load` (vLLM's own
``Worker.reload_weights``: in place, layerwise, with the post-load processing — initpipe
writes no loader), :func:`rank_digest` (a digest of every parameter and buffer after that
processing) and :func:`rank_caches` (the weight-derived caches a rank holds, counted).
Like every rank function they answer a record and never raise (:mod:`..core.rank`).

Importing this module imports neither torch nor vLLM.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from ...contract.declare import vllm_uses
from ..core.rank import failure_of, rss, trim_memory, worker_of
from ..core.records import RankRecord

__all__ = [
    "RankCaches",
    "RankDigest",
    "RankLoad",
    "RankPrecheck",
    "RankVerify",
    "Schema",
    "Source",
    "casts",
    "folder_schema",
    "mismatches",
    "rank_caches",
    "rank_digest",
    "rank_load",
    "rank_precheck",
    "rank_verify",
    "same_tensor",
    "tensors_schema",
    "tied_copies",
    "to_folder",
]

#: name -> (shape, dtype name as torch spells it)
Schema = dict[str, tuple[tuple[int, ...], str]]

#: safetensors' dtype codes, as torch names them
_ST_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


@attrs.frozen(kw_only=True)
class Source:
    """What a rank loads: a folder (``path``) or the tensors themselves (``tensors``:
    only where the workers share the caller's process)."""

    path: str | None = None
    tensors: tuple[tuple[str, Any], ...] | None = None

    @property
    def kind(self) -> str:
        return "folder" if self.path is not None else "tensors"


# -- schemas ------------------------------------------------------------------------------
def _safetensors_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def folder_schema(folder: str | os.PathLike[str]) -> tuple[Schema, int]:
    """The tensors a folder of safetensors files holds (read from the headers only) and
    their bytes on disk.

    Raises:
        FileNotFoundError: no such folder, or no ``*.safetensors`` file in it.
        ValueError: a file whose header cannot be read, or a tensor in two files.
    """
    from safetensors import safe_open

    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder")
    files = _safetensors_files(root)
    if not files:
        raise FileNotFoundError(f"{root} holds no *.safetensors file")
    schema: Schema = {}
    size = 0
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:  # type: ignore[no-untyped-call]
                for name in f.keys():
                    if name in schema:
                        raise ValueError(f"tensor {name!r} is in two files (one is {path.name})")
                    part = f.get_slice(name)
                    schema[name] = (
                        tuple(part.get_shape()),
                        _ST_DTYPES.get(part.get_dtype(), part.get_dtype()),
                    )
        except ValueError:
            raise
        except Exception as err:  # safetensors raises its own SafetensorError
            raise ValueError(f"{path.name}: not a readable safetensors file ({err})") from err
        size += path.stat().st_size
    return schema, size


def tensors_schema(tensors: Iterable[tuple[str, Any]]) -> tuple[Schema, int]:
    """The same for ``(name, tensor)`` pairs.

    Raises:
        ValueError: an item that is not a ``(str, tensor)`` pair, or a name given twice.
    """
    schema: Schema = {}
    size = 0
    for i, item in enumerate(tensors):
        ok = isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
        if not ok or not hasattr(item[1], "shape"):
            raise ValueError(f"item {i} is not a (name, tensor) pair: {type(item).__name__}")
        name, tensor = item
        if name in schema:
            raise ValueError(f"tensor {name!r} is given twice")
        schema[name] = (tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
        size += int(tensor.numel()) * int(tensor.element_size())
    return schema, size


#: dtypes a weight loader casts between, as a fresh load does (an fp32 checkpoint into a
#: bf16 engine, say); any other dtype change (fp8 or integer, quantized weights) is refused
CASTABLE = frozenset({"float64", "float32", "float16", "bfloat16"})


def mismatches(
    reference: Mapping[str, tuple[tuple[int, ...], str]],
    new: Schema,
    *,
    redundant: Iterable[str] = (),
) -> list[str]:
    """How ``new`` differs from the ``reference`` checkpoint: one line per tensor missing,
    unexpected (but those in ``redundant``: a tied head's copy, checked apart), of another
    shape, or of a dtype a fresh load would not cast from (empty: it matches)."""
    lines = [f"missing tensor {n!r}" for n in sorted(set(reference) - set(new))]
    extra = set(new) - set(reference) - set(redundant)
    lines += [f"unexpected tensor {n!r}" for n in sorted(extra)]
    for name in sorted(set(reference) & set(new)):
        (shape, dtype), (new_shape, new_dtype) = reference[name], new[name]
        if tuple(shape) != new_shape:
            lines.append(f"tensor {name!r} has shape {list(new_shape)}, expected {list(shape)}")
        if dtype != new_dtype and not {dtype, new_dtype} <= CASTABLE:
            lines.append(f"tensor {name!r} has dtype {new_dtype}, expected {dtype}")
    return lines


def casts(reference: Mapping[str, tuple[tuple[int, ...], str]], new: Schema) -> dict[str, int]:
    """``"float32->bfloat16"`` -> how many tensors the loaders cast so (a fresh load casts
    them the same way)."""
    out: dict[str, int] = {}
    for name in set(reference) & set(new):
        have, want = new[name][1], reference[name][1]
        if have != want:
            out[f"{have}->{want}"] = out.get(f"{have}->{want}", 0) + 1
    return out


def tied_copies(
    reference: Mapping[str, Any], new: Schema, ties: Iterable[Iterable[str]]
) -> dict[str, str]:
    """The tensors of ``new`` the reference lacks that are copies of a tied parameter the
    new weights also hold (``lm_head.weight`` beside ``model.embed_tokens.weight`` in a
    tied model's ``state_dict()``): copy -> the tensor it is tied to."""
    out = {}
    for group in ties:
        names = list(group)
        for name in names:
            if name in new and name not in reference:
                partner = next((n for n in names if n != name and n in new), None)
                if partner is not None:
                    out[name] = partner
    return out


def same_tensor(source: Source, a: str, b: str) -> bool:
    """Whether the tensors ``a`` and ``b`` of ``source`` hold the same values."""
    import torch

    if source.tensors is not None:
        found = dict(source.tensors)
        x, y = found[a], found[b]
    else:
        from safetensors import safe_open

        got: dict[str, Any] = {}
        assert source.path is not None
        for path in _safetensors_files(Path(source.path)):
            with safe_open(str(path), framework="pt") as f:  # type: ignore[no-untyped-call]
                for name in set(f.keys()) & {a, b}:
                    got[name] = f.get_tensor(name)
        x, y = got[a], got[b]
    return bool(x.shape == y.shape and torch.equal(x.detach().cpu(), y.detach().cpu()))


def to_folder(tensors: Iterable[tuple[str, Any]], parent: str | None = None) -> Path:
    """Write ``(name, tensor)`` pairs as one safetensors file in a new temporary folder
    (under ``/dev/shm`` where it exists: the pages are read back at memory speed), for
    workers in other processes to load. The caller removes the folder."""
    from safetensors.torch import save_file

    if parent is None and os.access("/dev/shm", os.W_OK):
        parent = "/dev/shm"
    folder = Path(tempfile.mkdtemp(prefix="initpipe_refit_", dir=parent))
    try:
        seen: set[int] = set()
        out: dict[str, Any] = {}
        for name, tensor in tensors:
            t = tensor.detach().to("cpu")
            ptr = t.untyped_storage().data_ptr()
            out[name] = t.clone() if ptr in seen else t.contiguous()  # tied: own storage
            seen.add(ptr)
        save_file(out, str(folder / "model.safetensors"))
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


# -- the rank side --------------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class RankLoad(RankRecord):
    """A rank loaded the new weights (``rank_load``)."""

    seconds: float
    bytes_loaded: int
    rss_after: int | None
    #: module -> the parameter it is tied to, for each module whose post-load processing
    #: initpipe re-ran after vLLM's reload skipped it
    repaired: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class RankDigest(RankRecord):
    """A digest of a rank's weights after post-processing (``rank_digest``)."""

    digest: str
    tensors: int
    bytes_hashed: int
    seconds: float


@attrs.frozen(kw_only=True)
class RankCaches(RankRecord):
    """What a rank still holds that was computed from weights (``rank_caches``)."""

    encoder_entries: int
    seconds: float


def _model(worker: Any) -> Any:
    return worker.model_runner.get_model()


def _param_bytes(model: Any) -> int:
    return sum(int(p.numel()) * int(p.element_size()) for p in model.parameters())


@vllm_uses(
    "refit", calls=("vllm.v1.worker.gpu_model_runner:GPUModelRunner.reload_weights",), runner="v1"
)
@vllm_uses(
    "refit",
    calls=(
        "vllm.v1.worker.gpu_worker:Worker.reload_weights",
        "vllm.v1.worker.gpu.model_runner:GPUModelRunner.reload_weights",
        "vllm.model_executor.model_loader.reload.inplace:reload_weights",
    ),
)
def rank_load(wrapper: Any, source: Source) -> dict[str, Any]:
    """Load ``source`` into this rank's model through vLLM's ``Worker.reload_weights``
    (each rank reads its own shard through vLLM's loader; the runner then resets its LoRA,
    encoder and multimodal caches, as vLLM's reload does)."""
    worker, rank = worker_of(wrapper)
    start = time.perf_counter()
    try:
        from ...hook.packed import recording_packed_weights
        from .coverage import fresh_load, repair, tracking_reload

        model = _model(worker)
        worker._initpipe_reload_log = None
        with recording_packed_weights(), tracking_reload(model) as log:
            if source.path is not None:
                worker.reload_weights(weights_path=source.path)
            else:
                worker.reload_weights(weights_iterator=iter(source.tensors or ()))
            record = fresh_load(model)
            if record is not None:  # what vLLM's reload left undone, done as a load does
                repair(model, record, log)
        worker._initpipe_reload_log = log
        trim_memory()
        return RankLoad(
            rank=rank,
            seconds=time.perf_counter() - start,
            bytes_loaded=_param_bytes(model),
            rss_after=rss(),
            repaired=dict(log.repaired),
        ).to_dict()
    except Exception as err:
        failure = failure_of(rank, err, "load")
        return attrs.evolve(failure, seconds=time.perf_counter() - start).to_dict()


@attrs.frozen(kw_only=True)
class RankVerify(RankRecord):
    """A rank's load compared with what a fresh load writes, derives and ties
    (``rank_verify``; :mod:`.coverage`)."""

    parameters: int
    written: int
    tied: int
    modules: int
    ties: int
    tensors_compared: int
    bytes_compared: int
    kernels: int
    repaired: dict[str, str]
    seconds: float


@attrs.frozen(kw_only=True)
class RankPrecheck(RankRecord):
    """What on this rank a refit cannot load right (``rank_precheck``; empty: nothing),
    and the groups of parameters that share storage (a tied head's checkpoint copy is then
    recognised)."""

    problems: tuple[str, ...]
    ties: tuple[tuple[str, ...], ...] = ()


def rank_precheck(wrapper: Any) -> dict[str, Any]:
    """Before anything changes: the engine recorded its fresh load, and every module vLLM's
    reload would leave unprocessed is one initpipe can repair (:func:`.coverage.unrepairable`)."""
    from .coverage import fresh_load, unrepairable

    worker, rank = worker_of(wrapper)
    try:
        model = _model(worker)
        record = fresh_load(model)
        problems: tuple[str, ...]
        if record is None:
            problems = (
                "the engine's start recorded no fresh load to check a refit against (it "
                "was not loaded by initpipe's pipelined worker)",
            )
        else:
            problems = tuple(unrepairable(model, record))
        ties = () if record is None else record.ties
        return RankPrecheck(rank=rank, problems=problems, ties=ties).to_dict()
    except Exception as err:
        return failure_of(rank, err, "precheck").to_dict()


class LoadNotFresh(RuntimeError):
    """The load differs from a fresh load (the message names every tensor or module)."""


def rank_verify(wrapper: Any) -> dict[str, Any]:
    """Check this rank's last load (:func:`rank_load`) against the record of the fresh
    load the engine started with: every parameter written, every derived module
    re-processed, the same ties. A failure names each culprit."""
    from .coverage import check, fresh_load

    worker, rank = worker_of(wrapper)
    start = time.perf_counter()
    try:
        model = _model(worker)
        record, log = fresh_load(model), getattr(worker, "_initpipe_reload_log", None)
        if record is None:
            raise LoadNotFresh("the engine's start recorded no fresh load to compare with")
        if log is None:
            raise LoadNotFresh("no record of the load (it did not run on this rank)")
        found = check(model, record, log)
        if found.problems:
            shown = found.problems[:6]
            more = len(found.problems) - len(shown)
            raise LoadNotFresh(
                "the load differs from a fresh load: "
                + "; ".join(shown)
                + (f"; and {more} more" if more > 0 else "")
            )
        counts = attrs.asdict(found, filter=lambda field, _: field.name != "problems")
        return RankVerify(
            rank=rank,
            **counts,
            repaired=dict(log.repaired),
            seconds=time.perf_counter() - start,
        ).to_dict()
    except Exception as err:
        return failure_of(rank, err, "verify").to_dict()


def weights_hashes(model: Any) -> tuple[dict[str, str], int]:
    """Each parameter and buffer of ``model`` by name -> the sha256 of its dtype, shape and
    bytes, and the bytes hashed. A weight vLLM's CPU kernels packed away (an empty
    parameter) counts with the hash recorded as it was packed (:mod:`~initpipe_vllm.hook.packed`,
    ``packed:<hex>``); one packed with no record raises (the digest would not cover it). A
    layer whose kernel packed a copy and kept its weight (an embedding, a head) counts twice:
    the weight, and the copy's record as ``<name><packed>`` (a head left on an old copy has
    another digest). Tensors are hashed on a thread pool (``hashlib`` releases the GIL); a
    tensor off the CPU is copied to it first."""
    from concurrent.futures import ThreadPoolExecutor

    from ...hook.packed import packed_weight_hash, tensor_hash

    named: dict[str, Any] = {}
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        for kind in (module.named_parameters, module.named_buffers):
            for name, t in kind(recurse=False):
                named[prefix + name] = (module, name, t)
    pending: dict[str, Any] = {}
    hashes: dict[str, str] = {}
    hashed = 0
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        for full, (module, name, t) in named.items():
            if t.numel() == 0 and name == "weight":
                packed = packed_weight_hash(module)
                if packed is None:
                    raise RuntimeError(
                        f"{full} was packed into a kernel with no recorded hash: the digest "
                        "cannot cover it (load the model with the pipelined worker)"
                    )
                hashes[full] = f"packed:{packed}"
                continue
            pending[full] = pool.submit(tensor_hash, t)
            hashed += int(t.numel()) * int(t.element_size())
            if name == "weight" and (packed := packed_weight_hash(module)) is not None:
                # a kernel that packed a copy and kept the weight: what it computes with
                hashes[f"{full}<packed>"] = f"packed:{packed}"
        for full, future in pending.items():
            hashes[full] = future.result()
    return hashes, hashed


def weights_digest(model: Any) -> tuple[str, int, int]:
    """``sha256:<hex>`` over :func:`weights_hashes` in name order (each tensor's name and
    hash), the number of tensors and the bytes hashed."""
    hashes, hashed = weights_hashes(model)
    h = hashlib.sha256()
    for full in sorted(hashes):
        h.update(f"{full}\0{hashes[full]}\0".encode())
    return f"sha256:{h.hexdigest()}", len(hashes), hashed


def rank_digest(wrapper: Any) -> dict[str, Any]:
    """This rank's :func:`weights_digest`."""
    worker, rank = worker_of(wrapper)
    start = time.perf_counter()
    try:
        digest, count, hashed = weights_digest(_model(worker))
        return RankDigest(
            rank=rank,
            digest=digest,
            tensors=count,
            bytes_hashed=hashed,
            seconds=time.perf_counter() - start,
        ).to_dict()
    except Exception as err:
        return failure_of(rank, err, "digest").to_dict()


def _encoder_entries(runner: Any) -> int:
    """Entries of the runner's encoder cache (v1: a dict; MRv2: its encoder cache's)."""
    cache = getattr(runner, "encoder_cache", None)
    if cache is None:
        return 0
    if isinstance(cache, dict):
        return len(cache)
    outputs = getattr(cache, "encoder_outputs", None)
    return len(outputs) if isinstance(outputs, dict) else 0


def rank_caches(wrapper: Any) -> dict[str, Any]:
    """Empty this rank's encoder cache (vLLM's ``reset_encoder_cache``) and count what is
    left: a refit checks the count, it does not assume it."""
    worker, rank = worker_of(wrapper)
    start = time.perf_counter()
    try:
        runner = worker.model_runner
        runner.reset_encoder_cache()
        return RankCaches(
            rank=rank, encoder_entries=_encoder_entries(runner), seconds=time.perf_counter() - start
        ).to_dict()
    except Exception as err:
        return failure_of(rank, err, "caches").to_dict()
