"""What a fresh load of the model wrote, derived and tied, recorded on every rank as the
pipelined worker loads it: the reference a refit's reload is checked against.

What belongs here: :class:`FreshLoad` (the modules whose post-load processing a fresh load
runs, the groups of parameters that share storage, and the parameters the post-load
processing leaves exactly as the loaders wrote them), :func:`watching_fresh_load` (the
context the worker's ``load_model`` runs in: vLLM's ``process_weights_after_loading`` runs
as it would, watched by a torch dispatch mode that notes every in-place write) and
:func:`record_fresh_load` (kept on the model object). The refit's side — the reload
tracked, repaired and compared with this record — is ``resize/coverage.py``.

Importing this module imports neither torch nor vLLM.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import attrs

from ..contract.declare import vllm_uses
from ..contract.variants import by_release

__all__ = [
    "FRESH_ATTR",
    "FreshLoad",
    "WriteLog",
    "fresh_load",
    "hook_modules",
    "param_name",
    "parameters",
    "record_fresh_load",
    "storage",
    "ties_of",
    "watching_fresh_load",
]

#: Where :func:`record_fresh_load` keeps its record on the model.
FRESH_ATTR = "_initpipe_fresh_load"


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
        loaded: the parameters that existed when the loaders ran, before the post-load
            processing (the others it created: MLA's absorbed ``W_UV``, say, derived and
            written by no loader). None: not watched.
        outside: the parameters the model's ``load_weights`` wrote outside every weight
            loader (``param.copy_`` in the model's own code: GPT-OSS's expert stacks and
            attention sinks). vLLM's layerwise reload sees a load only through the
            parameters' weight loaders, so a reload leaves these stale. None: the model's
            ``load_weights`` did not run (dummy weights, a loader of its own).
    """

    derived: frozenset[str]
    ties: tuple[tuple[str, ...], ...]
    methods: dict[str, str] = attrs.field(factory=dict, hash=False)
    kept: frozenset[str] | None = None
    loaded: frozenset[str] | None = None
    outside: frozenset[str] | None = None


def storage(t: Any) -> int | None:
    """The storage a tensor's bytes live in (None: empty, meta, or no storage)."""
    try:
        if t.numel() == 0 or t.is_meta:
            return None
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, ValueError, AttributeError):
        return None


def parameters(model: Any) -> list[tuple[str, str, Any, Any]]:
    """``(module name, parameter name, module, parameter)`` for every parameter of every
    module (a module reachable by two paths once, under its first name; a parameter two
    modules share, under each)."""
    out = []
    for mname, module in model.named_modules():
        for pname, p in module._parameters.items():
            if p is not None:
                out.append((mname, pname, module, p))
    return out


def param_name(mname: str, pname: str) -> str:
    return f"{mname}.{pname}" if mname else pname


def ties_of(model: Any) -> tuple[tuple[str, ...], ...]:
    """The groups of parameter names sharing storage (see :attr:`FreshLoad.ties`)."""
    by_storage: dict[int, set[str]] = {}
    for mname, pname, _m, p in parameters(model):
        ptr = storage(p)
        if ptr is not None:
            by_storage.setdefault(ptr, set()).add(param_name(mname, pname))
    return tuple(sorted(tuple(sorted(g)) for g in by_storage.values() if len(g) > 1))


@by_release("refit")
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


@_derived.variant("0.34.0")
@vllm_uses(
    "refit",
    mirrors=(
        "vllm.model_executor.model_loader.utils:process_weights_after_loading",
        "vllm.model_executor.model_loader.weight_utils:finalize_model_weights",
    ),
    calls=("vllm.model_executor.layers.quantization.base_config:QuantizeMethodBase",),
    release="0.34.0",
    replaces=("initpipe_vllm.hook.fresh_load:_derived",),
)
def _derived_0_34_0(model: Any) -> dict[str, str]:
    """0.34's fresh load: the modules with a quantization method, as before, and every
    module whose own post-load hook ``finalize_model_weights`` runs (attention layers
    among them; :func:`hook_modules`), that hold parameters: name -> the quantization
    method's class name, else the module's."""
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    out = {}
    hooked = hook_modules(model)
    for name, module in model.named_modules():
        if not any(p is not None for p in module._parameters.values()):
            continue
        method = getattr(module, "quant_method", None)
        if isinstance(method, QuantizeMethodBase):
            out[name] = type(method).__name__
        elif name in hooked:
            out[name] = type(module).__name__
    return out


@vllm_uses(
    "refit",
    mirrors=("vllm.model_executor.model_loader.weight_utils:finalize_model_weights",),
    calls=("vllm.model_executor.layers.quantization.base_config:QuantizeMethodBase",),
    release="0.34.0",
)
def hook_modules(model: Any) -> dict[str, Any]:
    """The modules 0.34's ``finalize_model_weights`` runs an own post-load hook on: every
    module with a callable ``process_weights_after_loading``, but quantization methods and
    the submodules of a quantized module (their method processes them), by name."""
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    out: dict[str, Any] = {}

    def visit(prefix: str, module: Any) -> None:
        quantized = isinstance(getattr(module, "quant_method", None), QuantizeMethodBase)
        if not quantized:
            for child_name, child in module.named_children():
                visit(f"{prefix}.{child_name}" if prefix else child_name, child)
        if isinstance(module, QuantizeMethodBase):
            return
        if callable(getattr(module, "process_weights_after_loading", None)):
            out.setdefault(prefix, module)

    visit("", model)
    return out


class WriteLog:
    """A torch dispatch mode that collects the storages every in-place op writes (each op
    whose schema marks an argument written); with ``on_copy``, it only hands each
    ``copy_`` to it (``written`` stays empty: the cheap mode a reload runs in); with
    ``outside``, a write into a storage for which ``outside(storage)`` is true goes to
    ``written_outside`` instead."""

    def __new__(cls, on_copy: Any = None, outside: Any = None) -> Any:
        from torch.utils._python_dispatch import TorchDispatchMode

        copy_op = _copy_op()

        class WriteLog(TorchDispatchMode):
            def __init__(self) -> None:
                super().__init__()
                self.written: set[int] = set()
                self.written_outside: set[int] = set()

            def __torch_dispatch__(
                self, func: Any, types: Any, args: Any = (), kwargs: Any = None
            ) -> Any:
                kwargs = kwargs or {}
                if on_copy is not None:
                    out = func(*args, **kwargs)
                    if func is copy_op and len(args) >= 2:
                        on_copy(args[0], args[1])
                    return out
                for i, arg in enumerate(func._schema.arguments):
                    if arg.alias_info is None or not arg.alias_info.is_write:
                        continue
                    t = args[i] if i < len(args) else kwargs.get(arg.name)
                    ptr = storage(t) if hasattr(t, "untyped_storage") else None
                    if ptr is not None:
                        into = self.written_outside if outside and outside(ptr) else self.written
                        into.add(ptr)
                return func(*args, **kwargs)

        return WriteLog()


def _copy_op() -> Any:
    import torch

    return torch.ops.aten.copy_.default


def _snapshot(model: Any) -> dict[str, tuple[int, Any, tuple[int, ...], Any]]:
    """name -> (tensor id, storage, shape, dtype) of every parameter."""
    out = {}
    for mname, pname, _m, p in parameters(model):
        out[param_name(mname, pname)] = (id(p), storage(p), tuple(p.shape), p.dtype)
    return out


#: model id -> (the parameters its fresh load's post-load processing left as loaded, the
#: parameters there were before it)
_WATCHED: dict[int, tuple[frozenset[str], frozenset[str]]] = {}
#: model id -> the parameters its ``load_weights`` wrote outside every weight loader
_OUTSIDE: dict[int, frozenset[str]] = {}


def _codes(loader: Any) -> set[Any]:
    """The code objects a call of ``loader`` runs first: through bound methods, partials
    and ``functools.wraps`` wrappers (each layer's), or a callable object's ``__call__``."""
    out: set[Any] = set()
    seen: set[int] = set()
    todo = [loader]
    while todo:
        fn = todo.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        code = getattr(fn, "__code__", None)
        if code is not None:
            out.add(code)
        if isinstance(fn, functools.partial):
            todo.append(fn.func)
        todo += [getattr(fn, "__func__", None), getattr(fn, "__wrapped__", None)]
        if code is None and not isinstance(fn, functools.partial) and callable(fn):
            todo.append(type(fn).__dict__.get("__call__"))
    return out


@vllm_uses(
    "refit",
    mirrors=("vllm.model_executor.model_loader.reload.layerwise:_get_weight_loader",),
    calls=("vllm.model_executor.model_loader.weight_utils:default_weight_loader",),
)
def _watching_loaders(model: Any) -> Any:
    """``model.load_weights`` watched: every in-place write into a parameter's storage
    made while no weight loader is running (no frame of a parameter's ``weight_loader``,
    or of vLLM's ``default_weight_loader``, on the Python stack) is noted in
    :data:`_OUTSIDE`. That is what vLLM's layerwise reload cannot see: it wraps the
    parameters' weight loaders (``getattr(param, "weight_loader",
    default_weight_loader)``), and a write past them lands on the meta device. Nothing is
    changed: no attribute is set, the loaders and the writes run as they are."""
    import sys

    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    original = model.load_weights

    @functools.wraps(original)
    def load_weights(*args: Any, **kwargs: Any) -> Any:
        names: dict[int, set[str]] = {}
        codes = _codes(default_weight_loader)
        for mname, pname, _m, p in parameters(model):
            ptr = storage(p)
            if ptr is not None:
                names.setdefault(ptr, set()).add(param_name(mname, pname))
            codes |= _codes(getattr(p, "weight_loader", None))

        def outside(ptr: int) -> bool:
            if ptr not in names:
                return False  # not a parameter's storage
            frame: Any = sys._getframe(1)
            while frame is not None:
                if frame.f_code in codes:
                    return False
                frame = frame.f_back
            return True

        with WriteLog(outside=outside) as log:
            out = original(*args, **kwargs)
        _OUTSIDE[id(model)] = frozenset(
            n for ptr in log.written_outside for n in names.get(ptr, ())
        )
        return out

    return load_weights


@vllm_uses(
    "refit",
    mirrors=("vllm.model_executor.model_loader.base_loader:BaseModelLoader.load_model",),
    calls=(
        "vllm.model_executor.model_loader.utils:process_weights_after_loading",
        "vllm.model_executor.model_loader.base_loader:process_weights_after_loading",
        "vllm.model_executor.model_loader.base_loader:BaseModelLoader",
        "vllm.model_executor.model_loader.base_loader:BaseModelLoader.create_model",
    ),
)
@contextlib.contextmanager
def watching_fresh_load() -> Iterator[None]:
    """Inside (the pipelined worker's ``load_model``): vLLM's load runs as it would,
    watched — which parameters the model's ``load_weights`` writes outside its weight
    loaders (:attr:`FreshLoad.outside`), and which the post-load processing leaves exactly
    as the loaders wrote them (:attr:`FreshLoad.kept`). Nothing else changes."""
    import vllm.model_executor.model_loader.base_loader as base_loader

    original = base_loader.process_weights_after_loading
    loader_cls = base_loader.BaseModelLoader
    create = loader_cls.create_model
    wrapped: list[Any] = []

    def created(self: Any, *args: Any, **kwargs: Any) -> Any:
        model = create(self, *args, **kwargs)
        if callable(getattr(model, "load_weights", None)):
            object.__setattr__(model, "load_weights", _watching_loaders(model))
            wrapped.append(model)
        return model

    def watched(model: Any, *args: Any, **kwargs: Any) -> Any:
        before = _snapshot(model)
        with WriteLog() as log:
            out = original(model, *args, **kwargs)
        after = _snapshot(model)
        kept = frozenset(
            name
            for name, (tid, ptr, shape, dtype) in before.items()
            if after.get(name) == (tid, ptr, shape, dtype)
            and ptr is not None
            and ptr not in log.written
        )
        _WATCHED[id(model)] = (kept, frozenset(before))
        return out

    base_loader.process_weights_after_loading = watched
    loader_cls.create_model = created  # type: ignore[method-assign]
    try:
        yield
    finally:
        base_loader.process_weights_after_loading = original
        loader_cls.create_model = create  # type: ignore[method-assign]
        for model in wrapped:  # the model's own method again
            model.__dict__.pop("load_weights", None)


def record_fresh_load(model: Any) -> FreshLoad:
    """Record what a fresh load of ``model`` (just loaded and processed) holds, on the
    model itself (:data:`FRESH_ATTR`); return it. The release's variant of what a load
    post-processes is the contract's answer for the refit; a vLLM no refit lock matches
    (a refit then refuses it by name) gets the base's."""
    from ..errors import UnsupportedRunnerError

    try:
        methods = _derived(model)
    except UnsupportedRunnerError:
        methods = _derived.base(model)
    watched = _WATCHED.pop(id(model), None)
    record = FreshLoad(
        derived=frozenset(methods),
        ties=ties_of(model),
        methods=methods,
        kept=watched[0] if watched else None,
        loaded=watched[1] if watched else None,
        outside=_OUTSIDE.pop(id(model), None),
    )
    object.__setattr__(model, FRESH_ATTR, record)
    return record


def fresh_load(model: Any) -> FreshLoad | None:
    """The record :func:`record_fresh_load` kept on ``model`` (None: none)."""
    return getattr(model, FRESH_ATTR, None)
