"""A Model Runner V2 runner's initialization state as plain data (stock vs pipelined).

What belongs here: :func:`runner_snapshot_v2`, the MRv2 counterpart of
:func:`~initpipe_vllm.testing.snapshot.runner_snapshot`. It reads every attribute MRv2's
``GPUModelRunner.load_model``, ``initialize_kv_cache`` and ``_init_kv_zero_meta``
(``vllm/v1/worker/gpu/model_runner.py``) assign: the working KV cache config, attention
groups and their builders, kernel block sizes, ``block_tables`` (geometry and buffer
shapes), the model state (class, settings, its Mamba KV state), the CUDA-graph manager and
fast-prefill helper, the PCP / microbatch / adaptive-verification managers, the runner-held
KV connector and aux-output connector, the KV block zeroer (``kv_block_zeroer``, public in
MRv2), the model-phase objects (samplers, workers, pooling runner), the runner's
``kv_caches`` (aliases kept) and every layer's bound view — shapes, strides, dtypes, storage
sharing, which blocks hold data and a digest of the bytes. Replaces nothing in vLLM.
"""

from __future__ import annotations

from typing import Any

from ..mrv2.model_phase import BUILT_AFTER_WEIGHTS
from .snapshot import (
    _attn_group,
    _digest,
    _nonzero_blocks,
    _present,
    _process_globals,
    _scalar,
    _spec,
    _Storages,
    kv_cache_config_data,
    layer_bindings,
    runner_config_data,
    zeroer_table,
)

__all__ = ["MODEL_PHASE_ATTRS", "runner_snapshot_v2"]

#: Objects stock MRv2's ``load_model`` builds after the weights (recorded by class).
MODEL_PHASE_ATTRS = BUILT_AFTER_WEIGHTS

#: Managers MRv2's KV phase builds (recorded by class; None when not built).
_KV_MANAGERS = ("pcp_manager", "ubatch_runner", "adaptive_verification", "aux_output_connector")


def _settings(obj: Any) -> dict[str, Any]:
    """An object's class, scalar settings and tensor shapes (what it was built with)."""
    if obj is None:
        return {"class": None}
    out: dict[str, Any] = {"class": type(obj).__name__}
    for k, v in sorted(vars(obj).items()):
        s = _scalar(v)
        if s is not ...:
            out[k] = s
        elif type(v).__name__ == "Tensor":
            out[k] = {"tensor": list(v.shape), "dtype": str(v.dtype)}
    return out


#: ``BlockTables`` attributes that record what the last step did, not how the tables were
#: built: left out, as :data:`~.snapshot.SCHEDULER_HISTORY` is (vLLM 0.33.0's
#: ``_num_dirty_rows``: the rows of the shared input buffer the last batch wrote).
BLOCK_TABLES_HISTORY = frozenset({"_num_dirty_rows"})


def _block_tables(bt: Any) -> Any:
    if bt is None:
        return None
    out = {k: v for k, v in _settings(bt).items() if k not in BLOCK_TABLES_HISTORY}
    out["slot_mapping_enabled"] = _scalar(list(getattr(bt, "_slot_mapping_enabled", [])))
    out["dcp_sharded"] = bt.dcp_sharded.tolist()
    out["input_block_tables"] = [list(t.shape) for t in bt.input_block_tables]
    return out


def _model_state(ms: Any) -> Any:
    if ms is None:
        return None
    out = _settings(ms)
    out["kv_state"] = {
        "mamba_ctx": _present(getattr(ms, "_mamba_ctx", None)),
        "mamba_group_ids": _scalar(list(getattr(ms, "_mamba_group_ids", []) or [])),
        "mamba_spec": _spec(getattr(ms, "_mamba_spec", None)),
    }
    return out


def _cudagraph_manager(runner: Any) -> Any:
    mgr = getattr(runner, "cudagraph_manager", None)
    fp = getattr(runner, "fast_prefill", None)
    return {
        "manager": _settings(mgr),
        "fast_prefill": None
        if fp is None
        else {
            "class": type(fp).__name__,
            "max_num_tokens": fp.max_num_tokens,
            "holds_runner_manager": fp.cudagraph_manager is mgr,
        },
    }


def runner_snapshot_v2(runner: Any, *, blocks: bool = True) -> dict[str, Any]:
    """:func:`~initpipe_vllm.testing.snapshot.runner_snapshot` for an MRv2
    ``GPUModelRunner`` (stock or pipelined): its own attributes (block tables, model state,
    CUDA-graph managers, the objects ``load_model`` builds) beside the shared ones."""
    kv_list = list(getattr(runner, "kv_caches", []))
    storages = _Storages()
    snap: dict[str, Any] = {
        **runner_config_data(runner),
        "cp_interleave": runner.cp_interleave,
        "decode_query_len": getattr(runner, "decode_query_len", None),
        "model_memory_usage_known": isinstance(getattr(runner, "model_memory_usage", None), int),
        "kv_cache_config": kv_cache_config_data(getattr(runner, "kv_cache_config", None)),
        "attn_groups": [[_attn_group(g) for g in gs] for gs in getattr(runner, "attn_groups", [])],
        "kernel_block_sizes": list(getattr(runner, "kernel_block_sizes", []) or []),
        "block_tables": _block_tables(getattr(runner, "block_tables", None)),
        "model_state": _model_state(getattr(runner, "model_state", None)),
        "cudagraphs": _cudagraph_manager(runner),
        "kv_connector": type(runner.kv_connector).__name__,
        "model_phase": {a: _present(getattr(runner, a, None)) for a in MODEL_PHASE_ATTRS},
        "kv_managers": {a: _present(getattr(runner, a, None)) for a in _KV_MANAGERS},
        "speculator": _present(runner.speculator),
        "runner_kv_caches": [storages.view(t) for t in kv_list],
    }
    snap["layers"], layer_views = layer_bindings(runner, storages)
    snap["kv_block_zeroer"] = zeroer_table(
        getattr(runner, "kv_block_zeroer", None), storages, kv_list + layer_views
    )
    snap["process_globals"] = _process_globals()
    if blocks:
        snap["nonzero_blocks"] = [_nonzero_blocks(t) for t in kv_list]
        snap["kv_digest"] = [_digest(t) for t in kv_list]
    return snap
