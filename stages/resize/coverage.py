"""What a fresh load of the model writes, derives and ties; the proof that a refit's reload
did the same; and the repair of what vLLM's layerwise reload leaves behind.

What belongs here: :class:`FreshLoad` (recorded on every rank when the pipelined worker
loads the model: the modules whose post-load processing a fresh load runs, and the groups
of parameters that share storage), :func:`tracking_reload` (while vLLM's
``reload_weights`` runs: which layers vLLM's layerwise reload processed and which of their
tensors it wrote, read from vLLM's own bookkeeping), :func:`repair` (vLLM's own post-load
processing re-run on a layer the reload left unprocessed because all its weights are tied
to another layer's) and :func:`check` (coverage and aliasing, each failure a line naming
the tensor or module).

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

from ..contract.declare import vllm_uses

__all__ = [
    "FRESH_ATTR",
    "FreshLoad",
    "ReloadLog",
    "check",
    "fresh_load",
    "record_fresh_load",
    "repair",
    "tracking_reload",
    "unrepairable",
]

#: Where :func:`record_fresh_load` keeps its record on the model.
FRESH_ATTR = "_initpipe_fresh_load"

#: Post-load processing initpipe re-runs on a tied layer the reload skipped: methods whose
#: processing reads the weight and leaves it as it is (the unquantized embedding's: on CPU
#: it packs a copy into a GEMM kernel, elsewhere it does nothing).
REPAIRABLE = ("UnquantizedEmbeddingMethod",)


@attrs.frozen(kw_only=True)
class FreshLoad:
    """What a fresh load of this rank's model did, recorded once it finished.

    Attributes:
        derived: the modules (qualified names) whose post-load processing a fresh load runs
            and which hold parameters: what they derive (packed kernels, repacked or
            absorbed tensors) depends on the weights.
        ties: the groups of two or more parameter names that share storage (each sorted,
            the groups sorted): ``lm_head.weight`` with ``model.embed_tokens.weight`` on a
            tied model.
        methods: each derived module's post-load processing (its quantization method's or
            attention's class name).
        kept: the parameters (qualified names) the fresh load's post-load processing left
            exactly as the loaders wrote them (same tensor, shape, dtype, no in-place
            write): their bytes after a reload must be the checkpoint's. None: the load
            could not be watched (a loader with its own ``load_model``).
    """

    derived: frozenset[str]
    ties: tuple[tuple[str, ...], ...]
    methods: dict[str, str] = attrs.field(factory=dict, hash=False)
    kept: frozenset[str] | None = None


def _storage(t: Any) -> int | None:
    """The storage a tensor's bytes live in (None: empty, meta, or no storage)."""
    try:
        if t.numel() == 0 or t.is_meta:
            return None
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, ValueError, AttributeError):
        return None


def _params(model: Any) -> list[tuple[str, str, Any, Any]]:
    """``(module name, parameter name, module, parameter)`` for every parameter of every
    module (a module reachable by two paths once, under its first name; a parameter two
    modules share, under each)."""
    out = []
    for mname, module in model.named_modules():
        for pname, p in module._parameters.items():
            if p is not None:
                out.append((mname, pname, module, p))
    return out


def _full(mname: str, pname: str) -> str:
    return f"{mname}.{pname}" if mname else pname


def ties_of(model: Any) -> tuple[tuple[str, ...], ...]:
    """The groups of parameter names sharing storage (see :attr:`FreshLoad.ties`)."""
    by_storage: dict[int, set[str]] = {}
    for mname, pname, _m, p in _params(model):
        ptr = _storage(p)
        if ptr is not None:
            by_storage.setdefault(ptr, set()).add(_full(mname, pname))
    return tuple(sorted(tuple(sorted(g)) for g in by_storage.values() if len(g) > 1))


@vllm_uses(
    "refit",
    mirrors=("vllm.model_executor.model_loader.utils:process_weights_after_loading",),
    calls=(
        "vllm.model_executor.layers.quantization.base_config:QuantizeMethodBase",
        "vllm.model_executor.layers.attention:is_deferred_attention_layer",
    ),
)
def _derived(model: Any) -> dict[str, str]:
    """The modules vLLM's fresh load post-processes (a quantization method, or a deferred
    attention layer), that hold parameters: name -> the processing's class name."""
    from vllm.model_executor.layers.attention import is_deferred_attention_layer
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    out = {}
    for name, module in model.named_modules():
        if not any(p is not None for p in module._parameters.values()):
            continue
        method = getattr(module, "quant_method", None)
        if isinstance(method, QuantizeMethodBase):
            out[name] = type(method).__name__
        elif is_deferred_attention_layer(module):
            out[name] = type(module).__name__
    return out


class _WriteLog:
    """A torch dispatch mode that collects the storages every in-place op writes (each op
    whose schema marks an argument written), and hands each ``copy_`` to ``on_copy``."""

    def __new__(cls, on_copy: Any = None) -> Any:
        from torch.utils._python_dispatch import TorchDispatchMode

        class WriteLog(TorchDispatchMode):
            def __init__(self) -> None:
                super().__init__()
                self.written: set[int] = set()

            def __torch_dispatch__(
                self, func: Any, types: Any, args: Any = (), kwargs: Any = None
            ) -> Any:
                kwargs = kwargs or {}
                for i, arg in enumerate(func._schema.arguments):
                    if arg.alias_info is None or not arg.alias_info.is_write:
                        continue
                    t = args[i] if i < len(args) else kwargs.get(arg.name)
                    ptr = _storage(t) if hasattr(t, "untyped_storage") else None
                    if ptr is not None:
                        self.written.add(ptr)
                out = func(*args, **kwargs)
                if on_copy is not None and func is _copy_op() and len(args) >= 2:
                    on_copy(args[0], args[1])
                return out

        return WriteLog()


def _copy_op() -> Any:
    import torch

    return torch.ops.aten.copy_.default


def _snapshot(model: Any) -> dict[str, tuple[int, Any, tuple[int, ...], Any]]:
    """name -> (tensor id, storage, shape, dtype) of every parameter."""
    out = {}
    for mname, pname, _m, p in _params(model):
        out[_full(mname, pname)] = (id(p), _storage(p), tuple(p.shape), p.dtype)
    return out


#: model id -> the parameters its fresh load's post-load processing left as loaded
_KEPT: dict[int, frozenset[str]] = {}


@vllm_uses(
    "refit",
    mirrors=("vllm.model_executor.model_loader.base_loader:BaseModelLoader.load_model",),
    calls=("vllm.model_executor.model_loader.utils:process_weights_after_loading",),
)
@contextlib.contextmanager
def watching_fresh_load() -> Iterator[None]:
    """Inside (the pipelined worker's ``load_model``): vLLM's post-load processing runs
    as it would, watched — which parameters it leaves exactly as the loaders wrote them
    (:attr:`FreshLoad.kept`). Nothing else changes."""
    import vllm.model_executor.model_loader.base_loader as base_loader

    original = base_loader.process_weights_after_loading

    def watched(model: Any, *args: Any, **kwargs: Any) -> Any:
        before = _snapshot(model)
        with _WriteLog() as log:
            out = original(model, *args, **kwargs)
        after = _snapshot(model)
        _KEPT[id(model)] = frozenset(
            name
            for name, (tid, ptr, shape, dtype) in before.items()
            if after.get(name) == (tid, ptr, shape, dtype)
            and ptr is not None
            and ptr not in log.written
        )
        return out

    base_loader.process_weights_after_loading = watched
    try:
        yield
    finally:
        base_loader.process_weights_after_loading = original


def record_fresh_load(model: Any) -> FreshLoad:
    """Record what a fresh load of ``model`` (just loaded and processed) holds, on the
    model itself (:data:`FRESH_ATTR`); return it."""
    methods = _derived(model)
    record = FreshLoad(
        derived=frozenset(methods),
        ties=ties_of(model),
        methods=methods,
        kept=_KEPT.pop(id(model), None),
    )
    object.__setattr__(model, FRESH_ATTR, record)
    return record


def fresh_load(model: Any) -> FreshLoad | None:
    """The record :func:`record_fresh_load` kept on ``model`` (None: none)."""
    return getattr(model, FRESH_ATTR, None)


@vllm_uses(
    "refit",
    mirrors=("vllm.model_executor.model_loader.weight_tying:_get_untied_lm_head",),
    calls=("vllm.model_executor.layers.vocab_parallel_embedding:VocabParallelEmbedding",),
)
def unrepairable(model: Any, record: FreshLoad) -> list[str]:
    """The tied heads a layerwise reload would leave unprocessed and initpipe cannot
    re-process safely, as lines (empty: a refit can proceed). Checked before anything
    changes. A tied head is found as vLLM's own weight tying finds one, by type: a
    vocabulary embedding or head (``VocabParallelEmbedding``) whose weight is another's;
    the checkpoint loads one of them, and the other is left unprocessed. Any other module
    left unprocessed is caught after the load (:func:`check`), and the refit fails closed."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    by_storage: dict[int, dict[int, tuple[str, Any]]] = {}
    for mname, _pname, module, p in _params(model):
        ptr = _storage(p)
        if ptr is not None and isinstance(module, VocabParallelEmbedding):
            by_storage.setdefault(ptr, {}).setdefault(id(module), (mname, module))
    lines = []
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
    return lines


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
    #: each loader copy into a parameter: (module, parameter, offset from the
    #: parameter's own, shape, stride, dtype, sha256 of the source as the parameter's dtype)
    copies: list[tuple[str, str, int, tuple[int, ...], tuple[int, ...], Any, str]] = attrs.field(
        factory=list
    )


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
    import vllm.model_executor.model_loader.reload.layerwise as layerwise

    from ..hook.packed import tensor_hash

    names = {id(m): n for n, m in model.named_modules()}
    log = ReloadLog()
    process, finalize = layerwise._layerwise_process, layerwise._finalize_attention_layer
    original_loader = layerwise._get_original_loader
    current: list[Any] = []  # the layer being processed

    def on_copy(dst: Any, src: Any) -> None:
        layer = current[-1] if current else None
        ptr = _storage(dst)
        if layer is None or ptr is None or dst.numel() != src.numel():
            return
        for pname, t in layer._parameters.items():
            if t is not None and _storage(t) == ptr:
                data = src.detach().to(dst.dtype).reshape(dst.shape)
                log.copies.append(
                    (
                        names[id(layer)],
                        pname,
                        int(dst.storage_offset() - t.storage_offset()),
                        tuple(dst.shape),
                        tuple(dst.stride()),
                        dst.dtype,
                        tensor_hash(data),
                    )
                )
                return

    def watched_loader(tensor: Any) -> Any:
        loader = original_loader(tensor)
        if not current:
            return loader

        @functools.wraps(loader)
        def load(*args: Any, **kwargs: Any) -> Any:
            with _WriteLog(on_copy):
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
    for mname, pname, _m, p in _params(model):
        if pname in log.written.get(mname, ()):
            ptr = _storage(p)
            if ptr is not None:
                out.setdefault(ptr, _full(mname, pname))
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
        ptrs = [_storage(p) for p in module._parameters.values() if p is not None]
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
    params = _params(model)
    n_written = n_tied = 0
    for mname, pname, _m, p in params:
        full = _full(mname, pname)
        if pname in log.written.get(mname, ()):
            n_written += 1
            continue
        ptr = _storage(p)
        if ptr is not None and ptr in written:
            n_tied += 1
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
    from ..hook.packed import tensor_hash

    if record.kept is None:
        return 0, 0
    seen: set[str] = set()
    bad: set[str] = set()
    n_bytes = 0
    for mname, pname, offset, shape, stride, dtype, digest in log.copies:
        full = _full(mname, pname)
        if full not in record.kept:
            continue
        t = model.get_submodule(mname)._parameters.get(pname)
        if t is None or t.numel() == 0:
            continue
        region = t.detach().as_strided(shape, stride, t.storage_offset() + offset)
        seen.add(full)
        n_bytes += region.numel() * region.element_size()
        if tensor_hash(region.to(dtype)) != digest and full not in bad:
            bad.add(full)
            problems.append(
                f"{full} holds other bytes than the checkpoint tensor its loader copied "
                "(a fresh load leaves it as loaded)"
            )
    return len(seen), n_bytes
