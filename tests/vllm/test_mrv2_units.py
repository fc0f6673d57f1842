"""Model Runner V2 stages and adapter pieces that never run on this machine's engines,
unit-tested on CPU objects: the CUDA-graph profiling teardown's redirection, the
speculator stages, the process-global effects' refusal of a second registration.

These paths are written from vLLM 0.32.0's code and never ran on a GPU; here each
decision is checked with vLLM's own classes where they construct on CPU, and with plain
recording objects where they need a GPU (a draft-model speculator, an EPLB state).
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from initpipe_vllm.errors import ModelPhaseError
from initpipe_vllm.hook.runner_v2 import _teardown_through
from initpipe_vllm.mrv2 import kv_tensors, model_phase


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        def record(*args: Any) -> None:
            self.calls.append((name, args))

        return record


def test_the_profiling_teardown_goes_through_the_pipeline_for_its_runner_only() -> None:
    """``profile_cudagraph_memory`` calls vLLM's module function
    ``_teardown_profiling_state``: for the pipelined runner it becomes the pipeline's
    teardown, for any other runner it stays stock's, and it is restored afterwards."""
    calls: list[str] = []

    def stock(runner: Any) -> None:
        calls.append(f"stock {runner.name}")

    module = types.SimpleNamespace(_teardown_profiling_state=stock)
    mine = types.SimpleNamespace(
        name="mine", initpipe_teardown_profiling_state=lambda: calls.append("pipeline")
    )
    other = types.SimpleNamespace(name="other")
    with _teardown_through(mine, module):
        module._teardown_profiling_state(mine)
        module._teardown_profiling_state(other)
    assert calls == ["pipeline", "stock other"]
    assert module._teardown_profiling_state is stock
    with pytest.raises(RuntimeError), _teardown_through(mine, module):
        raise RuntimeError("capture failed")
    assert module._teardown_profiling_state is stock  # restored on failure too


def test_the_speculator_stages_do_nothing_without_a_speculator() -> None:
    assert kv_tensors.speculator_attn(None, None, None, None, None, []) is False
    assert kv_tensors.speculator_cudagraph_manager(None, "FULL") is False


def test_a_speculator_sizes_its_cudagraph_managers_to_the_resolved_mode() -> None:
    spec = _Recorder()
    assert kv_tensors.speculator_cudagraph_manager(spec, "PIECEWISE") is True
    assert spec.calls == [("init_cudagraph_manager", ("PIECEWISE",))]
    # not a DraftModelSpeculator: set_attn is vLLM's HACK(woosuk) for draft models only
    assert kv_tensors.speculator_attn(spec, None, None, None, None, []) is False


class _State:
    """Stands for vLLM's ``EplbState`` (a plain class)."""


class _Eplb:
    """What ``eplb_registration`` calls on vLLM's ``EPLBController`` (it needs a MoE model
    and EP groups to be real)."""

    def __init__(self) -> None:
        self.state = _State()
        self.registered = 0
        self.loops: list[bool] = []

    def maybe_register_model(self, model: Any, model_config: Any) -> bool:
        self.registered += 1
        return True

    def maybe_start_async_loop(self, added: bool, load_dummy_weights: bool = False) -> None:
        self.loops.append(added)


def test_eplb_registration_is_refused_a_second_time_on_the_same_state() -> None:
    tiny_config = types.SimpleNamespace(model_config=None)
    eplb = _Eplb()
    assert model_phase.eplb_registration(tiny_config, None, eplb, False, False) is True
    assert eplb.registered == 1 and eplb.loops == [True]
    with pytest.raises(ModelPhaseError, match="already holds the model"):
        model_phase.eplb_registration(tiny_config, None, eplb, False, False)
    assert eplb.registered == 1  # nothing registered twice
    eplb.state = _State()  # load_model's prepare_load makes a new state
    assert model_phase.eplb_registration(tiny_config, None, eplb, False, False) is True


def test_a_working_offloader_is_post_initialized_once_the_noop_one_freely() -> None:
    from vllm.model_executor.offloader import base

    class Working(base.NoopOffloader):
        posts = 0

        def post_init(self) -> None:
            type(self).posts += 1

    saved = base.get_offloader()
    try:
        base.set_offloader(None)  # vLLM's no-op offloader: any number of times
        assert model_phase.offloader_post_init() == "NoopOffloader"
        assert model_phase.offloader_post_init() == "NoopOffloader"
        base.set_offloader(Working())
        assert model_phase.offloader_post_init() == "Working"
        with pytest.raises(ModelPhaseError, match="post-initialized by an earlier"):
            model_phase.offloader_post_init()
        assert Working.posts == 1
    finally:
        base.set_offloader(saved)
