"""A refit's reload compared with the engine's fresh load, and repaired where vLLM's
layerwise reload leaves a layer behind.

What belongs here: :func:`tracking_reload` (while vLLM's ``reload_weights`` runs: which
layers vLLM's layerwise reload processed and which of their tensors it wrote, read from
vLLM's own bookkeeping, and every loader copy into a parameter), :func:`repair` (vLLM's own
post-load processing re-run on a layer the reload left unprocessed because all its weights
are tied to another layer's), :func:`check` (coverage, derived modules and packed kernels,
ties, and the checkpoint's bytes; each failure a line naming the tensor or module) and
:func:`unrepairable` (before anything changes: a tied head initpipe could not repair). The
reference, the record of the fresh load, is ``hook/fresh_load.py``'s.

Why: vLLM's layerwise reload processes a layer once all of *its own* weights arrive. A
layer whose weight is another layer's (a tied ``lm_head``: ``lm_head.weight is
embed_tokens.weight``) receives nothing from the checkpoint, so vLLM puts its old kernel
tensors back ("Failed to load weights") and never re-runs its post-load processing. The
storage is shared, so the weight itself is new; but whatever the processing derived from it
is not. On the CPU platform that is the packed GEMM kernel (``dispatch_cpu_unquantized_gemm``
copies the weight into a oneDNN or sgl-kernel handle): the head keeps computing logits with
the old weights. A fresh load runs that processing on every module with a quantization
method (``process_weights_after_loading`` in vLLM's model loader); :func:`repair` runs the
same call on the modules the reload skipped, and :func:`check` proves afterwards that every
module a fresh load processes was processed again.

Importing this module imports neither torch nor vLLM.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import attrs

from ...contract.declare import vllm_uses
from ...contract.variants import by_release
from ...hook.fresh_load import (
    FreshLoad,
    WriteLog,
    fresh_load,
    hook_modules,
    param_name,
    parameters,
    record_fresh_load,
    storage,
    ties_of,
)

__all__ = [
    "DIRECT_RELOAD",
    "REPAIRABLE",
    "Coverage",
    "FreshLoad",
    "ReloadLog",
    "check",
    "fresh_load",
    "record_fresh_load",
    "repair",
    "tracking_reload",
    "unrepairable",
]

#: Post-load processing initpipe re-runs on a tied layer the reload skipped: methods whose
#: processing reads the weight and leaves it as it is (the unquantized embedding's: on CPU
#: it packs a copy into a GEMM kernel, elsewhere it does nothing).
REPAIRABLE = ("UnquantizedEmbeddingMethod",)


@vllm_uses(
    "refit",
    calls=("vllm.model_executor.model_loader.reload.direct:direct_reload_enabled",),
    release="0.34.0",
)
@vllm_uses(
    "refit",
    mirrors=("vllm.model_executor.model_loader.weight_tying:_get_untied_lm_head",),
    calls=("vllm.model_executor.layers.vocab_parallel_embedding:VocabParallelEmbedding",),
)
def unrepairable(model: Any, record: FreshLoad) -> list[str]:
    """What a layerwise reload would leave stale and initpipe cannot repair, as lines
    (empty: a refit can proceed). Checked before anything changes: the parameters the
    fresh load's ``load_weights`` wrote outside their weight loaders
    (:attr:`FreshLoad.outside`), and the tied heads initpipe cannot re-process safely. A
    tied head is found as vLLM's own weight tying finds one, by type: a vocabulary
    embedding or head (``VocabParallelEmbedding``) whose weight is another's; the checkpoint
    loads one of them, and the other is left unprocessed. Any other module left unprocessed
    is caught after the load (:func:`check`), and the refit fails closed."""
    import importlib.util

    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    lines = []
    if importlib.util.find_spec("vllm.model_executor.model_loader.reload.direct") is not None:
        from vllm.model_executor.model_loader.reload.direct import (  # type: ignore[import-not-found, unused-ignore]
            direct_reload_enabled,
        )

        if direct_reload_enabled():  # 0.34.0's
            lines.append(DIRECT_RELOAD)
    by_storage: dict[int, dict[int, tuple[str, Any]]] = {}
    for mname, _pname, module, p in parameters(model):
        ptr = storage(p)
        if ptr is not None and isinstance(module, VocabParallelEmbedding):
            by_storage.setdefault(ptr, {}).setdefault(id(module), (mname, module))
    for group in by_storage.values():
        if len(group) < 2:
            continue
        names = sorted(n for n, _m in group.values())
        for name, module in sorted(group.values(), key=lambda x: x[0]):
            method = type(getattr(module, "quant_method", None)).__name__
            if name in record.derived and method not in REPAIRABLE:
                others = ", ".join(n for n in names if n != name)
                lines.append(
                    f"{name} ({method}) is tied to {others}: vLLM's layerwise reload "
                    "leaves one of them unprocessed, and initpipe re-runs only "
                    f"{', '.join(REPAIRABLE)}'s processing (restart the engine on the "
                    "new weights instead)"
                )
    if record.outside:
        names = sorted(record.outside)
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        lines.append(
            f"{len(names)} parameter{' is' if len(names) == 1 else 's are'} written by "
            f"{type(model).__name__}.load_weights "
            f"outside their weight loaders ({shown}): vLLM's layerwise reload sees a load "
            "only through the weight loaders, so a refit would leave them stale (restart "
            "the engine on the new weights instead)"
        )
    return lines


def checksum(t: Any) -> str:
    """A tensor's dtype, shape and CRC-32 of its bytes: the bytes check compares the engine
    with what its own loaders copied (an equality test, not a digest anyone publishes:
    CRC-32 reads 3x faster than sha256 here)."""
    import zlib

    import torch

    data = t.detach().contiguous().to("cpu").reshape(-1).view(torch.uint8)
    return f"{t.dtype}|{list(t.shape)}|{zlib.crc32(memoryview(data.numpy())):08x}"


# -- the reload -----------------------------------------------------------------------------
@attrs.define
class ReloadLog:
    """What vLLM's layerwise reload did, layer by layer (filled by :func:`tracking_reload`).

    Attributes:
        processed: module name -> how it was processed (``layerwise``, ``attention`` or,
            after :func:`repair`, ``repaired``).
        written: module name -> the names of its tensors a weight loader wrote.
        partial: module name -> ``(elements loaded, elements expected)`` where the layer was
            processed before all its elements arrived.
        repaired: the modules :func:`repair` re-processed, each with the module it is tied
            to.
    """

    processed: dict[str, str] = attrs.field(factory=dict)
    written: dict[str, set[str]] = attrs.field(factory=dict)
    partial: dict[str, tuple[int, int]] = attrs.field(factory=dict)
    repaired: dict[str, str] = attrs.field(factory=dict)
    #: each loader copy into a parameter a fresh load keeps as loaded: (module,
    #: parameter, offset from the parameter's own, shape, stride, dtype, the source's
    #: :func:`checksum` as the parameter's dtype)
    copies: list[tuple[str, str, int, tuple[int, ...], tuple[int, ...], Any, str]] = attrs.field(
        factory=list
    )


@by_release("refit")
@vllm_uses(
    "refit",
    mirrors=(
        "vllm.model_executor.model_loader.reload.layerwise:_layerwise_process",
        "vllm.model_executor.model_loader.reload.layerwise:_finalize_attention_layer",
        "vllm.model_executor.model_loader.reload.layerwise:_get_original_loader",
        "vllm.model_executor.model_loader.reload.types:LayerReloadingInfo",
    ),
)
@contextlib.contextmanager
def tracking_reload(model: Any) -> Iterator[ReloadLog]:
    """Inside: every layer vLLM's layerwise reload processes is logged with the tensors
    its weight loaders wrote (vLLM's own ``info.loaded_weights``) and whether all the
    layer's elements arrived (``load_numel`` against ``load_numel_total``). vLLM's
    functions run unchanged."""
    with _tracking(model) as log:
        yield log


@tracking_reload.variant("0.34.0")
@vllm_uses(
    "refit",
    mirrors=(
        "vllm.model_executor.model_loader.reload.layerwise:_layerwise_process",
        "vllm.model_executor.model_loader.reload.layerwise:_finalize_attention_layer",
        "vllm.model_executor.model_loader.reload.layerwise:_get_original_loader",
        "vllm.model_executor.model_loader.reload.layerwise:finalize_layerwise_reload",
        # the module global finalize_layerwise_reload calls, patched for the reload
        "vllm.model_executor.model_loader.reload.layerwise:finalize_model_weights",
        "vllm.model_executor.model_loader.weight_utils:finalize_model_weights",
        "vllm.model_executor.model_loader.reload.types:LayerReloadingInfo",
    ),
    calls=(
        "vllm.model_executor.model_loader.reload.direct:direct_reload_enabled",
        "vllm.model_executor.layers.attention:is_deferred_attention_layer",
    ),
    release="0.34.0",
    replaces=("initpipe_vllm.live.refit.coverage:tracking_reload",),
)
@contextlib.contextmanager
def _tracking_reload_0_34_0(model: Any) -> Iterator[ReloadLog]:
    """0.34's reload runs every module's own post-load hook (attention layers' included)
    from ``finalize_model_weights`` once the layerwise pass is done: each module that call
    reaches (:func:`~initpipe_vllm.hook.fresh_load.hook_modules`) is logged when it
    returns, an attention layer as ``attention``, any other as ``hook``. A direct reload
    (``VLLM_RELOAD_MODE=direct``) bypasses the layerwise bookkeeping this reads: refused
    before any weight changes (:func:`unrepairable` says so first)."""
    import vllm.model_executor.model_loader.reload.layerwise as layerwise
    from vllm.model_executor.layers.attention import is_deferred_attention_layer
    from vllm.model_executor.model_loader.reload.direct import (  # type: ignore[import-not-found, unused-ignore]
        direct_reload_enabled,
    )

    if direct_reload_enabled():
        raise RuntimeError(DIRECT_RELOAD)
    finalize = layerwise.finalize_model_weights

    def logged(target: Any, *args: Any, **kwargs: Any) -> Any:
        result = finalize(target, *args, **kwargs)
        if target is model:
            for name, module in hook_modules(model).items():
                attention = is_deferred_attention_layer(module)
                log.processed[name] = "attention" if attention else "hook"
        return result

    with _tracking(model) as log:
        layerwise.finalize_model_weights = logged
        try:
            yield log
        finally:
            layerwise.finalize_model_weights = finalize


#: Why a refit refuses vLLM's direct reload (0.34.0's ``VLLM_RELOAD_MODE=direct``).
DIRECT_RELOAD = (
    "VLLM_RELOAD_MODE=direct: vLLM's direct reload bypasses the layerwise bookkeeping a "
    "refit checks its load against; unset it (vLLM's default is layerwise) for a refit"
)


@contextlib.contextmanager
def _tracking(model: Any) -> Iterator[ReloadLog]:
    """The body of :func:`tracking_reload`."""
    import vllm.model_executor.model_loader.reload.layerwise as layerwise

    names = {id(m): n for n, m in model.named_modules()}
    log = ReloadLog()
    process, finalize = layerwise._layerwise_process, layerwise._finalize_attention_layer
    original_loader = layerwise._get_original_loader
    current: list[Any] = []  # the layer being processed

    record = fresh_load(model)
    kept = record.kept if record is not None else None

    def on_copy(dst: Any, src: Any) -> None:
        layer = current[-1] if current else None
        ptr = storage(dst)
        if layer is None or kept is None or ptr is None or dst.numel() != src.numel():
            return
        for pname, t in layer._parameters.items():
            if t is not None and storage(t) == ptr:
                if param_name(names[id(layer)], pname) not in kept:
                    return  # a parameter the bytes check does not compare: no hash
                data = src.detach().to(dst.dtype).reshape(dst.shape)
                log.copies.append(
                    (
                        names[id(layer)],
                        pname,
                        int(dst.storage_offset() - t.storage_offset()),
                        tuple(dst.shape),
                        tuple(dst.stride()),
                        dst.dtype,
                        checksum(data),
                    )
                )
                return

    def watched_loader(tensor: Any) -> Any:
        loader = original_loader(tensor)
        if not current:
            return loader

        @functools.wraps(loader)
        def load(*args: Any, **kwargs: Any) -> Any:
            with WriteLog(on_copy):
                return loader(*args, **kwargs)

        return load

    def note(layer: Any, info: Any, how: str) -> None:
        name = names.get(id(layer))
        if name is None:
            return
        log.processed[name] = how
        log.written.setdefault(name, set()).update(n for n, _args in info.loaded_weights)
        total = info.load_numel_total
        if how == "layerwise" and total is not None and 0 < info.load_numel < total:
            log.partial[name] = (int(info.load_numel), int(total))

    def logged_process(layer: Any, info: Any) -> Any:
        note(layer, info, "layerwise")
        current.append(layer)
        try:
            return process(layer, info)
        finally:
            current.pop()

    def logged_finalize(layer: Any, info: Any, model_config: Any) -> Any:
        note(layer, info, "attention")
        return finalize(layer, info, model_config)

    layerwise._layerwise_process = logged_process
    layerwise._finalize_attention_layer = logged_finalize
    layerwise._get_original_loader = watched_loader
    try:
        yield log
    finally:
        layerwise._layerwise_process = process
        layerwise._finalize_attention_layer = finalize
        layerwise._get_original_loader = original_loader


def _written_storages(model: Any, log: ReloadLog) -> dict[int, str]:
    """storage -> a parameter name the reload wrote into it."""
    out: dict[int, str] = {}
    for mname, pname, _m, p in parameters(model):
        if pname in log.written.get(mname, ()):
            ptr = storage(p)
            if ptr is not None:
                out.setdefault(ptr, param_name(mname, pname))
    return out


@vllm_uses(
    "refit",
    calls=(
        "vllm.model_executor.layers.vocab_parallel_embedding:"
        "UnquantizedEmbeddingMethod.process_weights_after_loading",
    ),
)
def repair(model: Any, record: FreshLoad, log: ReloadLog) -> dict[str, str]:
    """Re-run vLLM's post-load processing on each module a fresh load processes that the
    reload left unprocessed while every one of its parameters shares storage with one the
    reload wrote (a tied head). Only :data:`REPAIRABLE` methods; the others are left to
    :func:`check`, which fails. Returns module -> the parameter it is tied to."""
    written = _written_storages(model, log)
    done = {}
    for name in sorted(record.derived - set(log.processed)):
        module = model.get_submodule(name)
        method = getattr(module, "quant_method", None)
        if method is None or type(method).__name__ not in REPAIRABLE:
            continue
        ptrs = [storage(p) for p in module._parameters.values() if p is not None]
        if not ptrs or not all(p is not None and p in written for p in ptrs):
            continue
        method.process_weights_after_loading(module)
        log.processed[name] = "repaired"
        done[name] = written[ptrs[0]]  # type: ignore[index]
    log.repaired.update(done)
    return done


@attrs.frozen(kw_only=True)
class Coverage:
    """What :func:`check` compared, for the receipt."""

    problems: tuple[str, ...]
    parameters: int
    written: int
    tied: int
    modules: int
    ties: int
    bytes_compared: int = 0
    tensors_compared: int = 0
    kernels: int = 0


def check(model: Any, record: FreshLoad, log: ReloadLog) -> Coverage:
    """Compare the reload with the fresh load: every parameter written (by its own loader,
    or through the storage it shares with one that was: a tie), no layer processed with
    part of its elements, every module a fresh load processes processed again, the same
    groups of parameters sharing storage, and where a fresh load keeps a parameter as
    loaded, the checkpoint's bytes in it. One line per failure, naming it."""
    problems: list[str] = []
    written = _written_storages(model, log)
    params = parameters(model)
    n_written = n_tied = n_derived = 0
    for mname, pname, _m, p in params:
        full = param_name(mname, pname)
        if pname in log.written.get(mname, ()):
            n_written += 1
            continue
        ptr = storage(p)
        if ptr is not None and ptr in written:
            n_tied += 1
            continue
        if record.loaded is not None and full not in record.loaded:
            n_derived += 1  # created by the post-load processing: the derived check's
            continue
        problems.append(
            f"{full} was not written by this load (a fresh load writes every parameter): "
            "the checkpoint lacks it or its loader skipped it"
        )
    for name, (got, want) in sorted(log.partial.items()):
        problems.append(
            f"{name} was processed with {got} of its {want} elements loaded: the rest hold "
            "no checkpoint data"
        )
    for name in sorted(record.derived - set(log.processed)):
        problems.append(
            f"{name}: its post-load processing ({record.methods.get(name)}) was not re-run, "
            "so what it derives from the weights (a packed kernel, a repacked tensor) "
            "still holds the old ones"
        )
    now = ties_of(model)
    if now != record.ties:
        gone = sorted(set(record.ties) - set(now))
        new = sorted(set(now) - set(record.ties))
        problems += [f"tie undone: {' and '.join(g)} no longer share storage" for g in gone]
        problems += [
            f"new tie: {' and '.join(g)} share storage, which a fresh load does not do" for g in new
        ]
    compared, n_bytes = _compare_bytes(model, record, log, problems)
    kernels = _compare_kernels(model, problems)
    return Coverage(
        kernels=kernels,
        problems=tuple(problems),
        parameters=len(params),
        written=n_written,
        tied=n_tied,
        modules=len(record.derived),
        ties=len(record.ties),
        bytes_compared=n_bytes,
        tensors_compared=compared,
    )


#: the largest relative difference between a packed kernel's output and its weight's
#: (``torch.nn.functional.linear``) on the same input, by the weight's dtype: a kernel packed
#: from other weights is off by about 1 (its output has nothing to do with the weight's)
KERNEL_RTOL = {"float32": 1e-3, "float64": 1e-3, "float16": 3e-2, "bfloat16": 3e-2}


@vllm_uses(
    "refit",
    mirrors=("vllm.model_executor.layers.utils:cpu_unquantized_gemm",),  # layer.cpu_linear
)
def _compare_kernels(model: Any, problems: list[str]) -> int:
    """Each layer whose CPU GEMM kernel packed a copy of a weight it kept (an embedding or
    a head: ``cpu_linear``): the kernel and the weight must compute the same on a fixed
    input. Appends a line per layer that differs; returns the layers compared."""
    import torch

    n = 0
    generator = torch.Generator().manual_seed(0)
    for name, module in model.named_modules():
        kernel = getattr(module, "cpu_linear", None)
        w = module._parameters.get("weight")
        if kernel is None or w is None or w.ndim != 2 or w.numel() == 0 or w.is_meta:
            continue
        x = torch.randn(4, w.shape[1], generator=generator).to(device=w.device, dtype=w.dtype)
        with torch.no_grad():
            got = kernel(x, w, None).float()
            want = torch.nn.functional.linear(x, w).float()
        err = float((got - want).abs().max() / want.abs().max().clamp_min(1e-12))
        n += 1
        tol = KERNEL_RTOL.get(str(w.dtype).removeprefix("torch."), 3e-2)
        if not err <= tol:
            problems.append(
                f"{name}: its packed kernel computes other values than its weight (relative "
                f"difference {err:.2g}, at most {tol:g}): it was packed from other weights"
            )
    return n


def _compare_bytes(
    model: Any, record: FreshLoad, log: ReloadLog, problems: list[str]
) -> tuple[int, int]:
    """Each loader copy into a parameter a fresh load keeps as loaded: the engine's bytes
    there now must be the source's. Appends a line per parameter that differs; returns
    the parameters and bytes compared."""
    if record.kept is None:
        return 0, 0
    seen: set[str] = set()
    bad: set[str] = set()
    n_bytes = 0
    # the last copy into a region is what the loader left there (a composed loader copies
    # the checkpoint tensor, then a function of it: Mamba's A = -exp(A_log))
    last = {c[:5]: c for c in log.copies}
    for mname, pname, offset, shape, stride, dtype, digest in last.values():
        full = param_name(mname, pname)
        if full not in record.kept:
            continue
        t = model.get_submodule(mname)._parameters.get(pname)
        if t is None or t.numel() == 0:
            continue
        region = t.detach().as_strided(shape, stride, t.storage_offset() + offset)
        seen.add(full)
        n_bytes += region.numel() * region.element_size()
        if checksum(region.to(dtype)) != digest and full not in bad:
            bad.add(full)
            problems.append(
                f"{full} holds other bytes than the checkpoint tensor its loader copied "
                "(a fresh load leaves it as loaded)"
            )
    return len(seen), n_bytes
