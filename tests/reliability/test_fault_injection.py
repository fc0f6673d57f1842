"""Make every catalog stage fail in turn on a pipelined runner (``Run.inject_fault``).

For each stage of the installed vLLM release's catalog (``installed_catalog()``: its
variants included; both phases), before it runs and right after it
completed (``after=True``: its output exists and must be rolled back), check that:

- the ``StageError`` names the stage, its phase and the stages that had completed;
- the runner is exactly as vLLM's ``_cleanup_profiling_kv_cache`` leaves it (snapshot equal
  to the same runner's after a clean init + cleanup): no attention groups, no KV tensors,
  every layer's ``kv_cache`` empty, cudagraph mode and dispatcher keys as stock's cleanup
  leaves them, the input batch untouched;
- every KV storage allocated (the failed pass's and the one it replaced) is freed;
- after ``clear_faults()`` a retry succeeds and its snapshot equals a clean run's.

The Mamba SSU globals (``ssu_dispatch._mamba_ssu_backend``, ``_flashinfer_replayssm_kernel``)
are process state the KV phase sets only on a model with Mamba layers: they are checked on a
hybrid model (tiny-nemotron-h), for faults around the ``mamba_ssu_backend`` stage, with a
sentinel planted before the failing re-init. Stock's cleanup never resets them, so a fault
before the stage leaves the sentinel and one at or after it leaves what stock selects.

KV-stage faults hit a runner that holds a KV cache and goes through vLLM's re-init
sequence (``_cleanup_profiling_kv_cache()`` releases the old cache, then the new pass
fails). Model-stage faults hit a fresh run of the model
phase and surface from ``get_kv_cache_spec()`` or ``initialize_kv_cache()``.
"""

from __future__ import annotations

import pytest
from relkit import AllocationSpy, Rig, frozen_gc

from initpipe import KV, MODEL, StageError
from initpipe.testing import clear_faults, inject_fault
from initpipe_vllm.compat import v1_runner_installed
from initpipe_vllm.runner import start_inputs
from initpipe_vllm.testing import installed_catalog

if not v1_runner_installed():  # its rigs are v1 runners; MRv2's: test_mrv2_engineless.py
    pytest.skip("this vLLM has no Model Runner V1 (0.34.0 removed it)", allow_module_level=True)

CATALOG = installed_catalog()
ORDER = CATALOG.order
KV_STAGES = CATALOG.phase_order(KV)
MODEL_STAGES = CATALOG.phase_order(MODEL)
WHEN = {"before": False, "after": True}


class Injected(RuntimeError):
    """The injected failure (a distinct type, so the cause is checked exactly)."""


@pytest.fixture(scope="module")
def rig():
    with frozen_gc(), AllocationSpy() as spy:
        rig = Rig()
        rig.spy = spy
        yield rig


#: A hybrid model (Mamba2 + attention) whose KV phase selects the Mamba SSU backend.
HYBRID = "tiny-nemotron-h"
_SSU = KV_STAGES.index("mamba_ssu_backend")
#: The KV stages around the SSU selection: the one before it, it, the one after it.
SSU_STAGES = KV_STAGES[_SSU - 1 : _SSU + 2]


class _Sentinel:
    """Planted in the SSU globals before a failing re-init: whatever replaces it was set by
    that re-init."""

    def __repr__(self) -> str:
        return "<sentinel planted before the re-init>"


SENTINEL = _Sentinel()


@pytest.fixture(scope="module")
def hybrid_rig():
    """A loaded pipelined :data:`HYBRID` runner (its own config and forward context)."""
    return Rig(HYBRID)


def _ssu_globals():
    from vllm.model_executor.layers.mamba.ops import ssu_dispatch

    return ssu_dispatch._mamba_ssu_backend, ssu_dispatch._flashinfer_replayssm_kernel


def _set_ssu_globals(backend, kernel) -> None:
    from vllm.model_executor.layers.mamba.ops import ssu_dispatch

    ssu_dispatch._mamba_ssu_backend = backend
    ssu_dispatch._flashinfer_replayssm_kernel = kernel


def _stock_ssu_selection(rig):
    """``(backend class, replay kernel)`` that stock's ``initialize_kv_cache`` leaves for the
    rig's config: vLLM's ``initialize_mamba_ssu_backend`` called as
    ``GPUModelRunner.initialize_kv_cache`` calls it, from unset globals (restored after)."""
    from vllm.model_executor.layers.mamba.ops.ssu_dispatch import initialize_mamba_ssu_backend

    saved = _ssu_globals()
    _set_ssu_globals(None, None)
    try:
        cfg = rig.cfg
        initialize_mamba_ssu_backend(
            cfg.mamba_config, rig.kv_cache_config, use_replayssm=cfg.cache_config.use_replayssm
        )
        backend, kernel = _ssu_globals()
        return type(backend), kernel
    finally:
        _set_ssu_globals(*saved)


def _expected_completed(order, name, after):
    i = order.index(name)
    return order[: i + 1] if after else order[:i]


def _check_error(err, name, phase, completed):
    assert err.stage == name and err.phase == phase
    assert err.qualname == CATALOG.specs[name].qualname
    assert list(err.completed) == completed
    assert list(err.rolled_back) == completed[::-1]  # every completed stage undone
    assert err.teardown_error is None
    assert isinstance(err.__cause__, Injected)
    text = str(err)
    assert f"stage {name!r}" in text and "completed in this phase: " in text
    for done in completed:
        assert done in text


def _check_cleaned(rig, batch_before):
    runner = rig.runner
    assert rig.diff(rig.cleaned) == []
    # the same facts, spelled out (the snapshot covers them; these name the failure)
    assert runner.attn_groups == [] and runner.kv_caches == []
    assert not hasattr(runner, "kv_cache_config")
    ctx = rig.cfg.compilation_config.static_forward_context
    assert all(layer.kv_cache.numel() == 0 for layer in ctx.values())
    assert runner.input_batch is batch_before  # no half-built input batch
    run = runner.initpipe_run
    assert run.completed(KV) == [] and not run.kv_ready
    assert not any(
        k in run.outputs
        for k in ("allocated_kv_caches", "kv_caches", "runner_kv_caches", "attn_groups")
    )


@pytest.mark.parametrize("when", list(WHEN))
@pytest.mark.parametrize("name", KV_STAGES)
def test_kv_stage_fault_rolls_back_frees_kv_and_retry_works(rig, name, when) -> None:
    after = WHEN[when]
    rig.reinit()  # a KV cache in place
    assert rig.diff(rig.clean) == []
    batch = rig.runner.input_batch
    n_before = len(rig.spy.allocations)
    run = rig.runner.initpipe_run
    inject_fault(run, name, Injected(f"injected into {name}"), after=after)
    try:
        with pytest.raises(StageError, match=f"stage '{name}'") as info:
            rig.reinit()
    finally:
        clear_faults(run)
    _check_error(info.value, name, KV, _expected_completed(KV_STAGES, name, after))
    _check_cleaned(rig, batch)
    allocated = len(rig.spy.allocations) - n_before
    reached = KV_STAGES.index(name) + after > KV_STAGES.index("allocated_kv_caches")
    assert allocated == (1 if reached else 0)
    assert rig.spy.live() == 0  # old and failed caches freed
    rig.init()  # the retry
    assert rig.diff(rig.clean) == []
    assert rig.runner.initpipe_run.kv_ready


@pytest.mark.parametrize("when", list(WHEN))
@pytest.mark.parametrize("name", MODEL_STAGES)
def test_model_stage_fault_surfaces_from_the_runner_and_retry_works(rig, name, when) -> None:
    after = WHEN[when]
    rig.cleanup()
    runner = rig.runner
    # A fresh run of the model phase, as the runner itself starts one when the block
    # size changes before any KV phase (PipelinedRunnerMixin._initpipe_model_outputs).
    runner.initpipe_run.close()
    runner.initpipe_run = run = runner.initpipe_pipeline.start(**start_inputs(runner))
    batch = runner.input_batch
    inject_fault(run, name, Injected(f"injected into {name}"), after=after)
    # before: the engine's get_kv_cache_spec() RPC; after: a direct initialize_kv_cache()
    call = rig.init if after else runner.get_kv_cache_spec
    try:
        with pytest.raises(StageError, match=f"stage '{name}'") as info:
            call()
    finally:
        clear_faults(run)
    _check_error(info.value, name, MODEL, _expected_completed(MODEL_STAGES, name, after))
    assert run.state == "started" and run.completed(MODEL) == []
    assert rig.spy.live() == 0
    _check_cleaned(rig, batch)
    assert runner.get_kv_cache_spec() == rig.specs  # the retry
    rig.init()
    assert rig.diff(rig.clean) == []


@pytest.mark.parametrize("when", list(WHEN))
@pytest.mark.parametrize("name", SSU_STAGES)
def test_a_kv_fault_leaves_the_mamba_ssu_globals_as_stocks_cleanup_does(
    hybrid_rig, name, when
) -> None:
    """Before ``mamba_ssu_backend`` ran, the planted sentinel stays (nothing selected yet);
    once it ran, the globals hold stock's selection: the rollback does not undo it (stock's
    cleanup does not either), and neither does the cleanup before the failing pass."""
    rig, after = hybrid_rig, WHEN[when]
    stock_backend, stock_kernel = _stock_ssu_selection(rig)
    assert stock_backend is not type(None), f"{HYBRID}: stock selects no SSU backend"
    selected = KV_STAGES.index(name) + after > _SSU
    rig.reinit()
    run = rig.runner.initpipe_run
    saved = _ssu_globals()
    inject_fault(run, name, Injected(f"injected into {name}"), after=after)
    _set_ssu_globals(SENTINEL, SENTINEL)
    try:
        try:
            with pytest.raises(StageError, match=f"stage '{name}'") as info:
                rig.reinit()
        finally:
            clear_faults(run)
        _check_error(info.value, name, KV, _expected_completed(KV_STAGES, name, after))
        backend, kernel = _ssu_globals()
        if selected:
            assert (type(backend), kernel) == (stock_backend, stock_kernel), (name, when)
        else:
            assert (backend, kernel) == (SENTINEL, SENTINEL), (name, when)
        _set_ssu_globals(SENTINEL, SENTINEL)
        rig.init()  # the retry selects as stock does
        backend, kernel = _ssu_globals()
        assert (type(backend), kernel) == (stock_backend, stock_kernel), "the retry"
    finally:
        _set_ssu_globals(*saved)


def test_every_catalog_stage_is_covered() -> None:
    assert sorted(KV_STAGES + MODEL_STAGES) == sorted(ORDER) and len(ORDER) == 24
