"""The worker hook: ``PipelinedWorker`` resolves to the platform's variant, stays thin."""

from __future__ import annotations

import pytest

import initpipe_vllm.worker as worker_mod


def test_pipelined_worker_is_the_cpu_variant_on_cpu() -> None:
    from vllm.v1.worker.cpu_worker import CPUWorker

    cls = worker_mod.PipelinedWorker
    assert cls is worker_mod.PipelinedCPUWorker and issubclass(cls, CPUWorker)
    assert cls.__qualname__ == "PipelinedCPUWorker" and cls.__module__ == "initpipe_vllm.worker"
    assert set(vars(cls)) - {"__module__", "__qualname__", "__doc__"} == {"init_device"}


def test_gpu_variant_overrides_only_the_runner_factory_and_the_v2_check() -> None:
    from vllm.v1.worker.gpu_worker import Worker

    cls = worker_mod.PipelinedGPUWorker
    assert issubclass(cls, Worker)
    assert set(vars(cls)) - {"__module__", "__qualname__", "__doc__"} == {
        "__init__",
        "_make_model_runner",
    }
    # the rest are the shared tracing wrappers, the same on both platforms
    traced = {
        "load_model",
        "determine_available_memory",
        "initialize_from_config",
        "compile_or_warm_up_model",
        "shutdown",
    }
    assert all(getattr(cls, m) is getattr(worker_mod.PipelinedCPUWorker, m) for m in traced)


def test_vllm_resolves_the_worker_by_qualname() -> None:
    from vllm.utils.import_utils import resolve_obj_by_qualname

    assert (
        resolve_obj_by_qualname("initpipe_vllm.worker.PipelinedWorker")
        is worker_mod.PipelinedCPUWorker
    )


def test_unknown_attribute() -> None:
    with pytest.raises(AttributeError, match="NoSuchWorker"):
        worker_mod.NoSuchWorker  # noqa: B018
