"""Engine-less Model Runner V2 checks, run as a script in a fresh process (MRv2 needs
Triton's interpreter set up before vLLM is imported: ``triton_cpu.environ()``).

``python engineless_script.py OUT.json`` writes, per check, plain data that
``test_mrv2_engineless.py`` asserts on (``python mrv2_engineless_script.py OUT.json [WEIGHTS]``):

- ``teardown``: per model, stock MRv2 and pipelined MRv2 runners side by side — snapshots
  after the KV phase, after stock's ``_teardown_profiling_state`` vs the pipelined
  ``initpipe_teardown_profiling_state`` (the deliberate differences applied), and after a
  second KV phase; plus the raw differences at the torn-down point, so the test sees that
  the deliberate ones are real and nothing else differs;
- ``faults``: every MRv2 stage failing before and after it runs, on a pipelined runner: the
  error's facts, the runner's state afterwards compared with its state before the failed
  call, whether every KV storage allocated by the failed call was freed, and whether a
  retry equals a clean run.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import sys
import weakref
from typing import Any

MODELS = ("tiny-llama", "tiny-gemma4-fastprefill")


class Injected(RuntimeError):
    """The injected failure."""


def _runners(model: str) -> tuple[Any, Any, Any, Any]:
    import vllm.v1.worker.cpu_worker  # noqa: F401  (the CPU shims MRv2's runner needs)
    from vllm.v1.worker.cpu.model_runner import CPUModelRunner

    from initpipe_vllm.hook.runner_v2 import pipelined_runner_v2_class
    from initpipe_vllm.testing import build_runner, tiny_vllm_config

    stock_cfg, piped_cfg = tiny_vllm_config(model), tiny_vllm_config(model)
    # 0.34.0 has no runner choice (Model Runner V2 only): no attribute to ask
    assert getattr(stock_cfg, "use_v2_model_runner", True), (
        "not Model Runner V2: run under triton_cpu.environ()"
    )
    stock = build_runner(stock_cfg, CPUModelRunner)
    piped = build_runner(piped_cfg, pipelined_runner_v2_class())
    return stock_cfg, stock, piped_cfg, piped


def _init(cfg: Any, runner: Any, kv_cfg: Any, **kwargs: Any) -> None:
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(cfg):
        runner.initialize_kv_cache(copy.deepcopy(kv_cfg), **kwargs)
        if kv_cfg.needs_kv_cache_zeroing and not kwargs.get("is_profiling"):
            runner._init_kv_zero_meta()  # what Worker.initialize_from_config does next
        cfg.cache_config.num_gpu_blocks = kv_cfg.num_blocks


def _teardown(cfg: Any, runner: Any) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.gpu.cudagraph_utils import _teardown_profiling_state

    with set_current_vllm_config(cfg):
        if hasattr(runner, "initpipe_teardown_profiling_state"):
            runner.initpipe_teardown_profiling_state()
        else:
            _teardown_profiling_state(runner)


def _plan(cfg: Any, runner: Any) -> Any:
    from initpipe_vllm.testing import plan_kv_cache_config

    return plan_kv_cache_config(runner)


def teardown_check(model: str) -> dict[str, Any]:
    from initpipe_vllm.testing.equivalence import runner_snapshot
    from initpipe_vllm.testing.snapshot import diff_snapshots, stock_differences

    stock_cfg, stock, piped_cfg, piped = _runners(model)
    kv_s, kv_p = _plan(stock_cfg, stock), _plan(piped_cfg, piped)
    out: dict[str, Any] = {"plans_equal": diff_snapshots(_kv(kv_s), _kv(kv_p)) == []}
    _init(stock_cfg, stock, kv_s)
    _init(piped_cfg, piped, kv_p)
    out["init"] = stock_differences(runner_snapshot(stock), runner_snapshot(piped), "/init")
    stock_before = {"fast_prefill": stock.fast_prefill is not None}
    _teardown(stock_cfg, stock)
    _teardown(piped_cfg, piped)
    s, p = runner_snapshot(stock, blocks=False), runner_snapshot(piped, blocks=False)
    out["torn_down"] = stock_differences(s, p, "/torn_down", torn_down=True)
    out["torn_down_raw"] = diff_snapshots(s, p, "/torn_down")
    out["stock_fast_prefill_before"] = stock_before["fast_prefill"]
    out["stock_kept"] = {
        "block_tables": getattr(stock, "block_tables", None) is not None,
        "fast_prefill": stock.fast_prefill is not None,
        "cudagraph_manager": stock.cudagraph_manager is not None,
    }
    out["pipelined_kept"] = {
        "block_tables": getattr(piped, "block_tables", None) is not None,
        "fast_prefill": piped.fast_prefill is not None,
        "cudagraph_manager": piped.cudagraph_manager is not None,
    }
    _init(stock_cfg, stock, kv_s)
    _init(piped_cfg, piped, kv_p)
    out["reinit"] = stock_differences(runner_snapshot(stock), runner_snapshot(piped), "/reinit")
    out["pipelined_class"] = type(piped).__name__
    out["stock_class"] = f"{type(stock).__module__}.{type(stock).__name__}"
    for cfg, runner in ((stock_cfg, stock), (piped_cfg, piped)):
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(cfg):
            runner.shutdown()
    return out


def _kv(cfg: Any) -> Any:
    from initpipe_vllm.testing.snapshot import kv_cache_config_data

    return kv_cache_config_data(cfg)


class _Spy:
    """Weakrefs every storage vLLM's ``allocate_kv_cache`` returns (as MRv2's
    ``init_kv_cache`` calls it, through ``vllm.v1.worker.gpu.attn_utils``)."""

    def __init__(self) -> None:
        self.allocations: list[list[weakref.ref[Any]]] = []

    def __enter__(self) -> _Spy:
        import vllm.v1.worker.gpu.attn_utils as attn_utils

        self._orig = orig = attn_utils.allocate_kv_cache

        def allocate_kv_cache(*args: Any, **kwargs: Any) -> Any:
            out = orig(*args, **kwargs)
            storages = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in out.values()}
            self.allocations.append([weakref.ref(s) for s in storages.values()])
            return out

        attn_utils.allocate_kv_cache = allocate_kv_cache
        return self

    def __exit__(self, *exc: object) -> None:
        import vllm.v1.worker.gpu.attn_utils as attn_utils

        attn_utils.allocate_kv_cache = self._orig

    def live_since(self, n: int) -> int:
        gc.collect()
        return sum(1 for refs in self.allocations[n:] if any(r() is not None for r in refs))


def _error_facts(err: BaseException) -> dict[str, Any]:
    from initpipe import StageError

    facts: dict[str, Any] = {
        "type": type(err).__name__,
        "is_stage_error": isinstance(err, StageError),
    }
    if isinstance(err, StageError):
        facts.update(
            stage=err.stage,
            phase=err.phase,
            qualname=err.qualname,
            completed=list(err.completed),
            rolled_back=list(err.rolled_back),
            teardown_error=None if err.teardown_error is None else str(err.teardown_error),
            cause=type(err.__cause__).__name__,
            keeps_cause_type=isinstance(err, Injected),
            text=str(err),
        )
    return facts


_MODEL_ATTRS = (
    "model_state",
    "sampler",
    "rejection_sampler",
    "prompt_logprobs_worker",
    "structured_outputs_worker",
    "pooling_runner",
)


def fault_checks(model: str) -> dict[str, Any]:
    from vllm.config import set_current_vllm_config

    from initpipe import KV, MODEL
    from initpipe.testing import clear_faults, inject_fault
    from initpipe_vllm.hook.runner_v2 import pipelined_runner_v2_class
    from initpipe_vllm.testing import build_runner, installed_catalog, tiny_vllm_config
    from initpipe_vllm.testing.equivalence import runner_snapshot
    from initpipe_vllm.testing.snapshot import diff_snapshots

    catalog = installed_catalog("v2")  # the installed release's: its variants fail too
    cfg = tiny_vllm_config(model)
    runner = build_runner(cfg, pipelined_runner_v2_class())
    kv_cfg = _plan(cfg, runner)
    results: dict[str, Any] = {
        "model": [],
        "kv": [],
        "order": {MODEL: catalog.phase_order(MODEL), KV: catalog.phase_order(KV)},
        "runner_catalog_is_installed": runner.initpipe_pipeline is catalog,
    }
    with set_current_vllm_config(cfg), _Spy() as spy:
        _init(cfg, runner, kv_cfg)
        clean = runner_snapshot(runner)
        _teardown(cfg, runner)
        torn = runner_snapshot(runner, blocks=False)
        for name in catalog.phase_order(KV):
            for after in (False, True):
                run = runner.initpipe_run
                n = len(spy.allocations)
                inject_fault(run, name, Injected(f"injected into {name}"), after=after)
                rec: dict[str, Any] = {"stage": name, "after": after}
                try:
                    _init(cfg, runner, kv_cfg)
                    rec["error"] = None
                except Exception as err:  # the facts are checked by the test
                    rec["error"] = _error_facts(err)
                rec["state_vs_torn_down"] = diff_snapshots(
                    torn, runner_snapshot(runner, blocks=False)
                )
                rec["kv_ready"] = run.kv_ready
                rec["live_kv_allocations"] = spy.live_since(n)
                clear_faults(run)
                _init(cfg, runner, kv_cfg)
                rec["retry_vs_clean"] = diff_snapshots(clean, runner_snapshot(runner))
                _teardown(cfg, runner)
                results["kv"].append(rec)
        # Model-stage faults: the model phase again on the loaded weights (a fresh run,
        # the runner's model-phase attributes reset to what __init__ leaves), so each case
        # costs the phase alone, not a weight load.
        for name in catalog.phase_order(MODEL):
            for after in (False, True):
                runner.initpipe_run.close()
                runner.initpipe_run = runner._initpipe_start()
                for attr in _MODEL_ATTRS:
                    setattr(runner, attr, None)
                run = runner.initpipe_run
                inject_fault(run, name, Injected(f"injected into {name}"), after=after)
                rec = {"stage": name, "after": after}
                try:
                    runner.load_model()
                    rec["error"] = None
                except Exception as err:
                    rec["error"] = _error_facts(err)
                rec["half_built"] = sorted(
                    a for a in _MODEL_ATTRS if getattr(runner, a, None) is not None
                )
                rec["run_state"] = run.state
                clear_faults(run)
                runner.load_model()  # the retry: the weights stay, the phase runs again
                rec["retry_built"] = sorted(
                    a for a in _MODEL_ATTRS if getattr(runner, a, None) is not None
                )
                results["model"].append(rec)
        runner.shutdown()
    return results


def main() -> None:
    out_path = sys.argv[1]
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    result = {
        "teardown": {m: teardown_check(m) for m in MODELS},
        "faults": fault_checks("tiny-llama"),
    }
    with open(out_path, "w") as f:
        json.dump(result, f, default=repr)


if __name__ == "__main__":
    main()
