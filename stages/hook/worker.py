"""Worker classes that run the runner's initialization through the initpipe catalog.

What belongs here: the thin worker hook only — it swaps vLLM's runner for the pipelined
one, records vLLM's own startup steps as spans of the trace and writes the trace file on
request (:mod:`.progress`); it changes nothing else. Replaces the runner construction in
``vllm/v1/worker/cpu_worker.py`` (``CPUWorker.init_device``),
``vllm/v1/worker/gpu_worker.py`` (``Worker._make_model_runner``, CUDA and ROCm) and
``vllm/v1/worker/xpu_worker.py`` (``XPUWorker._make_model_runner``). Also here: the one
decision of whether the pipelined worker can run a config at all
(:func:`why_not_pipelined`), which the opt-in plugin (:mod:`.plugin`) and the workers
themselves both use.

Use as ``LLM(..., worker_cls="initpipe_vllm.worker.PipelinedWorker")`` (or
``--worker-cls``); ``PipelinedWorker`` resolves to the platform's variant, and refuses by
name on a platform it has none for. Works in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
and in spawned worker processes (the package is installed, so the qualname resolves
there). The classes are built on first attribute access, so importing this module on a GPU
host never imports the CPU worker (whose import monkeypatches torch's CUDA APIs).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal, NoReturn, get_args

import attrs

from ..contract.declare import Capability, vllm_uses
from ..errors import UnsupportedRunnerError
from ..vllm_names import MRV2_RUNNER, PLATFORM as _PLATFORM, V1_RUNNER
from .adapter import (
    RunnerAdapter,
    has_runner_choice,
    pipelined_class,
    runner_adapters,
    which_runner,
)

__all__ = [
    "EXTENSIBLE_KV_CACHE_DECLINED",
    "PIPELINED_VARIANTS",
    "SUPPORTED_VLLM",
    "PipelinedCPUWorker",  # noqa: F822  (built on first access, by __getattr__)
    "PipelinedGPUWorker",  # noqa: F822  (built on first access, by __getattr__)
    "PipelinedWorker",  # noqa: F822  (built on first access, by __getattr__)
    "PipelinedXPUWorker",  # noqa: F822  (built on first access, by __getattr__)
    "Reason",
    "Refusal",
    "check_vllm_version",
    "contract_match",
    "contract_release",
    "refuse_unsupported",
    "release_adapter",
    "runner_version",
    "why_not_pipelined",
]


#: The vLLM release the catalogs were first written against (informational: what runs is
#: decided by the contract, :mod:`initpipe_vllm.contract`, on any version).
SUPPORTED_VLLM = "0.32.0"

_CPU_WORKER = "vllm.v1.worker.cpu_worker.CPUWorker"
_GPU_WORKER = "vllm.v1.worker.gpu_worker.Worker"
_XPU_WORKER = "vllm.v1.worker.xpu_worker.XPUWorker"

#: vLLM 0.32.0's stock workers, as each platform's ``check_and_update_config`` resolves
#: ``worker_cls="auto"`` (``vllm/platforms/cpu.py``; ``cuda.py`` and ``rocm.py``;
#: ``xpu.py``), and the name of the pipelined variant of each in this module.
PIPELINED_VARIANTS: Mapping[str, str] = MappingProxyType(
    {
        _CPU_WORKER: "PipelinedCPUWorker",
        _GPU_WORKER: "PipelinedGPUWorker",
        _XPU_WORKER: "PipelinedXPUWorker",
    }
)

# vLLM names for the declarations (``module:qualname``).
_BOTH: tuple[Capability, ...] = ("catalog_v1", "catalog_mrv2")
_WORKER = "vllm.v1.worker.gpu_worker:Worker"
_CPU = "vllm.v1.worker.cpu_worker:CPUWorker"
_XPU = "vllm.v1.worker.xpu_worker:XPUWorker"
_VLLM_CONFIG = "vllm.config.vllm:VllmConfig"
_CURRENT_PLATFORM = "vllm.platforms:current_platform"
_USE_V2_ENV = "vllm.envs:VLLM_USE_V2_MODEL_RUNNER"
#: Where each platform resolves ``worker_cls="auto"`` to its stock worker.
_CONFIG_HOOKS = (
    "vllm.platforms.cpu:CpuPlatform.check_and_update_config",
    "vllm.platforms.cuda:CudaPlatformBase.check_and_update_config",
    "vllm.platforms.rocm:RocmPlatform.check_and_update_config",
    "vllm.platforms.xpu:XPUPlatform.check_and_update_config",
)
_PLATFORM_CHECKS = (
    _CURRENT_PLATFORM,
    f"{_PLATFORM}.is_cpu",
    f"{_PLATFORM}.is_xpu",
    f"{_PLATFORM}.is_cuda_alike",
)

#: Why the pipelined worker cannot run a config (:attr:`Refusal.reason`).
Reason = Literal["vllm-contract", "platform", "model-runner-v2"]
#: Why a pipelined worker declines vLLM's extensible KV cache (vLLM logs it, prefixed
#: "Disabling the extensible KV cache: "; the start-up report shows it).
EXTENSIBLE_KV_CACHE_DECLINED = (
    "initpipe's pipelined runner does not mirror the extensible (VMM-backed) KV cache; its "
    "size comes from memory profiling instead, as with --no-enable-extensible-kv-cache"
)
#: Appended when an explicitly chosen pipelined worker refuses (the opt-in falls back to it).
_STOCK_HINT = "vLLM's stock worker (worker_cls='auto') runs this config."


# -- whether the pipelined worker can run a config ----------------------------------------
@attrs.frozen(kw_only=True)
class Refusal:
    """Why the pipelined worker cannot run a config, and what would let it.

    Attributes:
        reason: ``"vllm-contract"`` (the installed vLLM's code that the catalog mirrors
            differs from every release initpipe has locked), ``"platform"`` (no pipelined variant
            of the platform's worker) or ``"model-runner-v2"`` (vLLM builds a Model Runner
            V2 variant no catalog covers: ``MMEncoderModelRunner``).
        message: the cause and the fix, in words, for a log line or an error.
    """

    reason: Reason = attrs.field(validator=attrs.validators.in_(get_args(Reason)))
    message: str


@vllm_uses(
    _BOTH,
    mirrors=(
        *_CONFIG_HOOKS,
        f"{_WORKER}._make_model_runner",
        f"{_XPU}._make_model_runner",
    ),
    calls=(*_PLATFORM_CHECKS, f"{_VLLM_CONFIG}.is_mm_encoder_only"),
)
def why_not_pipelined(vllm_config: Any, stock_worker: str | None) -> Refusal | None:
    """Why the pipelined worker cannot stand in for ``stock_worker`` on ``vllm_config``.

    The one decision behind both entry points: with ``INITPIPE_VLLM=1`` the plugin keeps
    vLLM's stock worker and logs the refusal; an explicit ``worker_cls=PipelinedWorker``
    raises it (:func:`refuse_unsupported`). First reason wins:

    1. the contract (:mod:`initpipe_vllm.contract`): the vLLM code the catalog vLLM will
       run mirrors and calls is not identical to one release initpipe has locked (read from
       the installed files, bytes first; any vLLM version passes when it is). Neither
       catalog matching refuses before any config field is read;
    2. the platform: ``stock_worker`` is not the worker of this platform that
       :data:`PIPELINED_VARIANTS` has a pipelined variant of;
    3. vLLM will build a runner neither catalog covers: ``MMEncoderModelRunner``, which
       the GPU and XPU workers build for encoder-only configs under Model Runner V2.
       Model Runner V2 itself is covered (the :mod:`initpipe_vllm.mrv2` catalog); whether
       vLLM builds it is vLLM's own decision, ``VllmConfig.use_v2_model_runner``
       (``vllm/config/vllm.py``): forced by HiSparse or watermarking, chosen by
       ``VLLM_USE_V2_MODEL_RUNNER``, else the default wherever Triton is available.

    Only the CPU paths run on this project's test machines; the CUDA, ROCm and XPU paths
    are exercised on CPU objects with the platform simulated, never on the hardware.

    Args:
        vllm_config: the engine's ``VllmConfig``, after the platform's
            ``check_and_update_config`` (which may change what the V2 decision reads).
        stock_worker: the dotted name of the worker the pipelined one replaces (what the
            platform resolved ``"auto"`` to); None when there is none.

    Returns:
        The :class:`Refusal`, or None when the pipelined worker can run.
    """
    return (
        _contract_refusal(vllm_config)
        or _platform_refusal(stock_worker)
        or _standalone_refusal(stock_worker)
        or _model_runner_refusal(vllm_config, stock_worker)
    )


def refuse_unsupported(vllm_config: Any, stock_worker: str | None) -> None:
    """Raise when the pipelined worker cannot run ``vllm_config`` (:func:`why_not_pipelined`).

    Raises:
        UnsupportedRunnerError: naming the reason and the fix.
    """
    refusal = why_not_pipelined(vllm_config, stock_worker)
    if refusal is not None:
        _raise(refusal)
    _log_match(contract_match(vllm_config))


def contract_match(vllm_config: Any) -> str:
    """The sentence saying the installed vLLM matches the contract of the catalog
    ``vllm_config`` needs (version, number of declared functions, the lock)."""
    from ..contract.report import verdict

    return verdict(which_runner(vllm_config).capability).describe()


def contract_release(vllm_config: Any) -> str:
    """The release (``"0.32.0"``) whose locked code the installed vLLM's is identical to,
    for the catalog ``vllm_config`` needs: the release whose catalog and variants run
    (:func:`initpipe_vllm.contract.report.installed_release`).

    Raises:
        UnsupportedRunnerError: no locked release matches that catalog's code (naming the
            functions that differ), or the installed vLLM's source cannot be read.
    """
    from ..contract.report import installed_release

    return installed_release(which_runner(vllm_config).capability)


def release_adapter(subject: Any, vllm_config: Any) -> RunnerAdapter:
    """The adapter of the runner ``subject`` (a config or a worker) needs, for the release
    the contract matched (:func:`contract_release`): the release picks the catalog and
    its variants, never the version string. Called after :func:`refuse_unsupported`, so
    the contract's verdict is already read (cached for the process)."""
    from ..contract.report import installed_release

    runner = which_runner(subject)
    return which_runner(subject, installed_release(runner.capability))


def check_vllm_version(version: str | None = None) -> None:
    """Refuse, before anything is swapped in, a vLLM that neither catalog's contract
    matches (:mod:`initpipe_vllm.contract`): the stable name of the check the worker
    factories run. Which catalog a config needs is decided later (:func:`why_not_pipelined`).

    Args:
        version: ignored; the installed vLLM's files decide (kept for existing callers).

    Raises:
        UnsupportedRunnerError: naming the vLLM functions that differ and what to do.
    """
    del version
    refusal = _contract_refusal(None)
    if refusal is not None:
        _raise(refusal)


def _raise(refusal: Refusal) -> NoReturn:
    raise UnsupportedRunnerError(f"{refusal.message} {_STOCK_HINT}")


def _contract_refusal(vllm_config: Any) -> Refusal | None:
    """Refuse when the catalog ``vllm_config`` needs (either, for None) does not match the
    installed vLLM: its declared vLLM functions are not identical to one locked release.
    Neither catalog matching refuses before any config field is read; a vLLM whose source
    cannot be read (a zipped or ``.pyc``-only install) is refused, never a crash. The
    worker logs a match once (:func:`refuse_unsupported`); the plugin's line says it."""
    from ..contract.report import refusal_fix, verdict

    fix = refusal_fix()
    adapters: dict[str, RunnerAdapter] = {a.capability: a for a in runner_adapters()}
    try:
        verdicts = {a.capability: verdict(a.capability) for a in adapters.values()}
    except Exception as err:  # the gate never crashes vLLM's start
        return Refusal(
            reason="vllm-contract",
            message=(
                f"initpipe could not read the installed vLLM's source to check its contract "
                f"({type(err).__name__}: {err}). {fix}"
            ),
        )
    if not any(v.ok for v in verdicts.values()):
        wanted = list(verdicts.values())
    elif vllm_config is None:
        return None
    else:  # a matching catalog vouches for the config field which_runner reads
        wanted = [verdicts[which_runner(vllm_config).capability]]
        if wanted[0].ok:
            return None
    names = " and ".join(adapters[v.capability].labels.catalog for v in wanted)
    return Refusal(
        reason="vllm-contract",
        message=(
            f"{'; '.join(v.describe() for v in wanted)}; initpipe cannot vouch for {names} "
            f"on it. {fix}"
        ),
    )


@functools.cache
def _log_match(line: str) -> None:
    import logging

    logging.getLogger("vllm.initpipe").info("initpipe: %s.", line)


@vllm_uses(_BOTH, mirrors=_CONFIG_HOOKS, calls=_PLATFORM_CHECKS)
def _platform_stock_worker() -> str | None:
    """The worker this platform resolves ``"auto"`` to, if initpipe has a variant of it.

    Mirrors ``check_and_update_config`` of ``vllm/platforms/cpu.py`` (``CPUWorker``),
    ``cuda.py`` and ``rocm.py`` (``Worker``) and ``xpu.py`` (``XPUWorker``).
    """
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return _CPU_WORKER
    if current_platform.is_xpu():
        return _XPU_WORKER
    if current_platform.is_cuda_alike():
        return _GPU_WORKER
    return None


def _platform_refusal(stock_worker: str | None) -> Refusal | None:
    expected = _platform_stock_worker()
    if expected is not None and stock_worker == expected:
        return None
    from vllm.platforms import current_platform

    platform = type(current_platform).__name__
    covered = ", ".join(PIPELINED_VARIANTS)
    if expected is None:
        why = f"initpipe has no pipelined worker for the platform {platform}"
    else:
        why = (
            f"the platform {platform} runs the worker {stock_worker!r}, but initpipe's "
            f"pipelined worker there extends {expected!r}"
        )
    return Refusal(
        reason="platform",
        message=f"{why}; pipelined variants exist only of {covered}.",
    )


@vllm_uses(
    "catalog_mrv2",
    mirrors=("vllm.v1.worker.cpu_worker:CPUWorker.init_device",),
    calls=(
        _CURRENT_PLATFORM,
        "vllm.platforms.interface:Platform.uses_standalone_cpu_model_runner",
        "vllm.v1.worker.cpu.standalone_model_runner:StandaloneCPUModelRunner",
    ),
    release="0.34.0",
)
def _standalone_refusal(stock_worker: str | None) -> Refusal | None:
    """Refuse, by name, the CPU runner that is not Model Runner V2: from 0.34 the CPU
    worker builds ``StandaloneCPUModelRunner`` where the platform says so (a CPU other
    than x86 without Triton), and no catalog covers it. A vLLM without that choice (0.32,
    0.33) never refuses here."""
    if stock_worker != _CPU_WORKER:
        return None
    from vllm.platforms import current_platform

    # read off the class: the instance's __getattr__ logs a warning for a missing name (0.32)
    standalone = getattr(type(current_platform), "uses_standalone_cpu_model_runner", None)
    if standalone is None or not standalone():
        return None
    return _v2_refusal(
        "this CPU has no Triton, so vLLM's CPU worker builds StandaloneCPUModelRunner, "
        "which is not Model Runner V2",
        "initpipe has no catalog of StandaloneCPUModelRunner; run it with vLLM's stock "
        "worker, or install Triton for this CPU",
    )


def _model_runner_refusal(vllm_config: Any, stock_worker: str | None) -> Refusal | None:
    """Refuse, by name, the one Model Runner V2 variant the MRv2 catalog does not cover:
    ``MMEncoderModelRunner`` (encoder-only disaggregation), which the GPU and XPU workers
    build instead of MRv2 when ``vllm_config.is_mm_encoder_only`` (the CPU worker never
    does: it builds MRv2's ``CPUModelRunner`` there too)."""
    try:
        use_v2 = _vllm_chose_v2(vllm_config)
    except ValueError:
        # HiSparse with VLLM_USE_V2_MODEL_RUNNER=0: vLLM raises this itself right after the
        # platform hook (VllmConfig.__post_init__), with its own message; the pipelined
        # worker lets vLLM say it.
        return None
    if not use_v2 or stock_worker == _CPU_WORKER or not vllm_config.is_mm_encoder_only:
        return None
    why, _ = _why_model_runner_v2(vllm_config)
    return _v2_refusal(
        f"{why}, and for an encoder-only (disaggregated multimodal encoder) config vLLM "
        "builds MMEncoderModelRunner",
        "initpipe has no catalog of MMEncoderModelRunner; run it with vLLM's stock worker",
    )


@vllm_uses(_BOTH, mirrors=(f"{_VLLM_CONFIG}.use_v2_model_runner",), runner="v1")
def _vllm_chose_v2(vllm_config: Any) -> bool:
    """vLLM's own choice of Model Runner V2 (``VllmConfig.use_v2_model_runner``); a vLLM
    without the attribute has no v1 runner to choose (0.34.0 removed it): True.

    Raises:
        ValueError: vLLM's own, for HiSparse with ``VLLM_USE_V2_MODEL_RUNNER=0``.
    """
    if not has_runner_choice(vllm_config):
        return True
    return bool(vllm_config.use_v2_model_runner)


@vllm_uses(
    _BOTH,
    calls=(
        _USE_V2_ENV,
        f"{_VLLM_CONFIG}.watermark_config",
        "vllm.config.attention:AttentionConfig.hisparse_config",
    ),
    runner="v1",
)
def _why_model_runner_v2(vllm_config: Any) -> tuple[str, str]:
    """Which of vLLM's reasons chose Model Runner V2, and the fix for v1.

    Only names the cause: the decision itself is ``VllmConfig.use_v2_model_runner``. The
    causes are tested in its order (``vllm/config/vllm.py``, 0.32.0). A vLLM without the v1
    runner (0.34.0) has one reason, and no fix.
    """
    if not has_runner_choice(vllm_config):
        return ("vLLM has Model Runner V2 only", "this vLLM has no v1 runner")
    import vllm.envs as envs

    if vllm_config.attention_config.hisparse_config is not None:
        return (
            "HiSparse (attention_config.hisparse_config, or a HiSparseConnector) requires "
            "Model Runner V2",
            "HiSparse runs on Model Runner V2 only",
        )
    if getattr(vllm_config, "watermark_config", None) is not None:
        return (
            "watermarking (watermark_config) requires Model Runner V2",
            "watermarking runs on Model Runner V2 only",
        )
    if envs.VLLM_USE_V2_MODEL_RUNNER:
        return (
            "VLLM_USE_V2_MODEL_RUNNER=1 selects Model Runner V2",
            "unset it (or set VLLM_USE_V2_MODEL_RUNNER=0) for the v1 runner",
        )
    return (
        "Model Runner V2 is vLLM's default here (Triton is available and no enabled "
        "feature needs the v1 runner)",
        "set VLLM_USE_V2_MODEL_RUNNER=0 for the v1 runner",
    )


def runner_version(vllm_config: Any) -> str:
    """``"v2"`` where vLLM builds Model Runner V2 for ``vllm_config``, else ``"v1"``
    (:func:`~.adapter.which_runner` decides)."""
    return which_runner(vllm_config).runner


def _v2_refusal(why: str, fix: str) -> Refusal:
    return Refusal(reason="model-runner-v2", message=f"{why}; {fix}.")


class _TracedWorkerMixin:
    """What both pipelined workers add: vLLM's own startup steps as spans of the runner's
    trace, and the trace file written on request (``INITPIPE_TRACE``, see :mod:`.progress`).
    """

    def _initpipe_span(self, name: str) -> Any:
        runner = getattr(self, "model_runner", None)
        trace = getattr(runner, "initpipe_trace", None)
        if trace is None:
            return contextlib.nullcontext()
        return trace.span(name, phase="vllm")

    def _initpipe_write_trace(self) -> None:
        from .progress import logger, trace_paths, write_trace

        runner = getattr(self, "model_runner", None)
        parallel = self.vllm_config.parallel_config  # type: ignore[attr-defined]
        paths = trace_paths(parallel.rank, parallel.world_size)
        if paths is None or runner is None or not hasattr(runner, "initpipe_trace"):
            return
        try:
            json_path, chrome_path = write_trace(
                runner.initpipe_trace, runner.initpipe_pipeline.graph, paths
            )
        except OSError as err:
            logger.error("initpipe: could not write the trace to %s: %s", paths[0], err)
            return
        logger.info(
            "initpipe: trace written to %s%s",
            json_path,
            f" and {chrome_path}" if chrome_path is not None else "",
        )

    @vllm_uses(_BOTH, calls=(f"{_WORKER}.load_model",))
    def load_model(self, *args: Any, **kwargs: Any) -> Any:
        # on CPU: the hash of each weight packed into a kernel handle, for a refit's digest
        # what a fresh load wrote, derived and tied: a refit's reload is checked against it
        from .fresh_load import record_fresh_load, watching_fresh_load
        from .packed import recording_packed_weights

        with (
            self._initpipe_span("load_model (weights)"),
            recording_packed_weights(),
            watching_fresh_load(),
        ):
            result = super().load_model(*args, **kwargs)  # type: ignore[misc]

        record_fresh_load(self.model_runner.get_model())  # type: ignore[attr-defined]
        return result

    @vllm_uses(
        _BOTH,
        calls=(f"{_WORKER}.determine_available_memory", f"{_CPU}.determine_available_memory"),
    )
    def determine_available_memory(self) -> Any:
        with self._initpipe_span("determine_available_memory (memory profiling)"):
            return super().determine_available_memory()  # type: ignore[misc]

    @vllm_uses(_BOTH, calls=(f"{_WORKER}.initialize_from_config",))
    def initialize_from_config(self, kv_cache_config: Any) -> Any:
        with self._initpipe_span("initialize_from_config (KV cache)"):
            return super().initialize_from_config(kv_cache_config)  # type: ignore[misc]

    @vllm_uses(
        _BOTH,
        calls=(f"{_WORKER}.compile_or_warm_up_model", f"{_CPU}.compile_or_warm_up_model"),
    )
    def compile_or_warm_up_model(self) -> Any:
        with self._initpipe_span("compile_or_warm_up_model (warm-up, compile, capture)"):
            result = super().compile_or_warm_up_model()  # type: ignore[misc]
        done = getattr(self.model_runner, "initpipe_startup_done", None)  # type: ignore[attr-defined]
        if done is not None:  # start-up is over: one summary line per phase from now on
            done()
        self._initpipe_write_trace()
        return result

    @vllm_uses(
        "catalog_mrv2",
        calls=(
            f"{_WORKER}.extensible_kv_cache_unsupported_reason",
            "vllm.v1.executor.abstract:Executor.disable_extensible_kv_cache",
            "vllm.config.cache:CacheConfig.enable_extensible_kv_cache",
        ),
        release="0.34.0",
    )
    def extensible_kv_cache_unsupported_reason(self) -> str | None:
        """vLLM's switch for its extensible (VMM-backed) KV cache (0.34.0: on by default on
        CUDA and ROCm; never on CPU): the pipelined runner does not mirror it, so this
        worker declines it, and the engine turns it off on every rank and logs this
        reason (``Executor.disable_extensible_kv_cache``). The KV cache is then sized by
        memory profiling, as stock sizes it with the feature off
        (``--no-enable-extensible-kv-cache``). Written from vLLM's code; never run on a
        GPU here."""
        from .marks import note

        note(f"the extensible KV cache is off: {EXTENSIBLE_KV_CACHE_DECLINED}")
        return EXTENSIBLE_KV_CACHE_DECLINED

    @vllm_uses(_BOTH, calls=(f"{_WORKER}.shutdown", f"{_XPU}.shutdown"))
    def shutdown(self) -> None:
        try:
            self._initpipe_write_trace()
        finally:
            super().shutdown()  # type: ignore[misc]


@vllm_uses(
    _BOTH,
    mirrors=(
        f"{_CPU}.init_device",
        # the module global init_device builds the runner from, patched for the call
        "vllm.v1.worker.cpu_worker:CPUModelRunner",
    ),
    calls=(
        _CPU,
        "vllm.v1.worker.gpu.model_runner:GPUModelRunner.__init__",
        f"{_CPU}.model_runner",
        _CURRENT_PLATFORM,
    ),
)
@functools.cache
def _cpu_worker() -> type:
    check_vllm_version()
    from vllm.v1.worker.cpu_worker import CPUWorker

    class PipelinedCPUWorker(_TracedWorkerMixin, CPUWorker):
        """``CPUWorker`` whose runner initializes through the initpipe catalog.

        ``CPUWorker.init_device`` hard-codes ``CPUModelRunner`` (a module global of
        ``vllm/v1/worker/cpu_worker.py``; for Model Runner V2 the class it imports from
        ``vllm/v1/worker/cpu/model_runner.py`` inside the call); that name is pointed at
        the pipelined class (v1 or MRv2, as vLLM decided) for the duration of the call,
        so the runner is built once, directly (building the stock one and replacing it
        cost a second runner construction, about 1% of engine start).
        :func:`refuse_unsupported` runs first in ``init_device``, before the distributed
        setup and the runner (``CPUWorker.__init__`` has only bound the memory node).
        """

        def init_device(self) -> None:
            refuse_unsupported(self.vllm_config, _CPU_WORKER)
            adapter = release_adapter(self.vllm_config, self.vllm_config)
            # The module global init_device reads (not re-exported by vLLM, hence getattr).
            module_name, _, name = _cpu_runner_global(adapter.runner).partition(":")
            module = importlib.import_module(module_name)
            saved = getattr(module, name)
            cls = pipelined_class(adapter, saved)
            setattr(module, name, cls)
            try:
                super().init_device()
            finally:
                setattr(module, name, saved)
            if not hasattr(getattr(self, "model_runner", None), "initpipe_run"):
                # vLLM changed init_device: build the pipelined runner here instead
                self.model_runner = cls(self.vllm_config, self.device)

    PipelinedCPUWorker.__module__ = "initpipe_vllm.worker"  # the stable re-export
    PipelinedCPUWorker.__qualname__ = "PipelinedCPUWorker"
    return PipelinedCPUWorker


@vllm_uses(
    _BOTH,
    mirrors=(f"{_WORKER}._make_model_runner", f"{_XPU}._make_model_runner"),
    calls=(f"{_WORKER}.__init__", _CURRENT_PLATFORM),
)
def _accelerator_worker(
    name: str,
    stock: Any,
    stock_name: str,
    bases: Mapping[str, Callable[[RunnerAdapter], type]],
    doc: str,
) -> type:
    """A pipelined subclass of a ``gpu_worker.Worker`` (or of a subclass that builds its
    runner in ``_make_model_runner``, as ``XPUWorker`` does): v1 or MRv2, as vLLM decides.
    """

    class PipelinedAcceleratorWorker(_TracedWorkerMixin, stock):
        def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
            # Before the stock worker's __init__: nothing is touched when this refuses.
            refuse_unsupported(vllm_config, stock_name)
            super().__init__(vllm_config, *args, **kwargs)

        def _make_model_runner(self) -> Any:
            # MMEncoderModelRunner was refused in __init__: this is v1 or MRv2 proper, as
            # the worker's use_v2_model_runner says.
            adapter = _worker_chose(self, self.vllm_config)
            cls = pipelined_class(adapter, bases[adapter.runner](adapter))
            return cls(self.vllm_config, self.device)

    cls = PipelinedAcceleratorWorker
    cls.__name__ = cls.__qualname__ = name
    cls.__module__ = "initpipe_vllm.worker"  # the stable re-export
    cls.__doc__ = doc
    return cls


#: Where vLLM has both runners (0.32, 0.33): the module global ``CPUWorker.init_device``
#: builds each from (for MRv2, its class's own module, imported by ``init_device`` at call
#: time). A vLLM with MRv2 only (0.34) builds it from ``cpu_worker``'s own global.
_CPU_RUNNER_GLOBALS = {
    "v1": "vllm.v1.worker.cpu_worker:CPUModelRunner",
    "v2": "vllm.v1.worker.cpu.model_runner:CPUModelRunner",
}


@vllm_uses(
    _BOTH,
    mirrors=(f"{_CPU}.init_device", _CPU_RUNNER_GLOBALS["v2"]),
    calls=(
        "vllm.v1.worker.cpu_model_runner:CPUModelRunner",
        "vllm.v1.worker.cpu_model_runner:CPUModelRunner.__init__",
        _USE_V2_ENV,
    ),
    runner="v1",
)
def _cpu_runner_global(runner: str) -> str:
    """The ``module:name`` of the global ``CPUWorker.init_device`` builds ``runner``
    (``"v1"``/``"v2"``) from: :data:`_CPU_RUNNER_GLOBALS` where vLLM has a v1 runner, else
    ``cpu_worker``'s own ``CPUModelRunner`` (0.34.0 imports MRv2's class there)."""
    from ..compat import v1_runner_installed

    if not v1_runner_installed():
        return _CPU_RUNNER_GLOBALS["v1"]  # the same name, MRv2's class on 0.34
    return _CPU_RUNNER_GLOBALS[runner]


@vllm_uses("catalog_mrv2", calls=(MRV2_RUNNER,))
def _gpu_v2_runner(adapter: RunnerAdapter) -> type:
    del adapter
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    return GPUModelRunner


@vllm_uses(_BOTH, calls=(V1_RUNNER,), runner="v1")
def _gpu_v1_runner(adapter: RunnerAdapter) -> type:
    del adapter
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return GPUModelRunner


def _declared_runner(adapter: RunnerAdapter, stable: str) -> type:
    """The vLLM class the adapter declares under the stable pipelined name ``stable`` (its
    ``classes``: the XPU MRv2 runner is ``XPUModelRunnerV2`` through 0.33 and
    ``XPUModelRunner`` from 0.34)."""
    module, _, qualname = adapter.classes[stable].partition(":")
    found: type = getattr(importlib.import_module(module), qualname)
    return found


@vllm_uses(
    _BOTH,
    calls=("vllm.v1.worker.xpu_model_runner:XPUModelRunner", _USE_V2_ENV),
    runner="v1",
)
def _xpu_v1_runner(adapter: RunnerAdapter) -> type:
    del adapter
    from vllm.v1.worker.xpu_model_runner import XPUModelRunner

    return XPUModelRunner


@vllm_uses(
    _BOTH,
    calls=(f"{_WORKER}.use_v2_model_runner", _USE_V2_ENV),
    runner="v1",
)
def _worker_chose(worker: Any, vllm_config: Any) -> RunnerAdapter:
    """The adapter of the runner a GPU or XPU worker builds (its ``use_v2_model_runner``
    where vLLM has the choice; Model Runner V2 where it has not), for the release the
    contract matched."""
    return release_adapter(worker, vllm_config)


@vllm_uses(
    _BOTH,
    mirrors=(f"{_WORKER}._make_model_runner",),
    calls=(_WORKER, MRV2_RUNNER, _CURRENT_PLATFORM),
)
@functools.cache
def _gpu_worker() -> type:
    check_vllm_version()
    from vllm.v1.worker.gpu_worker import Worker

    return _accelerator_worker(
        "PipelinedGPUWorker",
        Worker,
        _GPU_WORKER,
        {"v1": _gpu_v1_runner, "v2": _gpu_v2_runner},
        """GPU ``Worker`` (CUDA, ROCm) whose runner initializes through an initpipe catalog:
        Model Runner V2 (vLLM's default on CUDA) or the v1 runner, as vLLM decides.

        Untested on hardware (no GPU here). The check (:func:`refuse_unsupported`) runs
        before ``Worker.__init__``, so nothing is half-applied.
        """,
    )


@vllm_uses(
    _BOTH,
    mirrors=(f"{_XPU}._make_model_runner",),
    calls=(_XPU, f"{_XPU}.__init__", _CURRENT_PLATFORM),
)
@functools.cache
def _xpu_worker() -> type:
    check_vllm_version()
    from vllm.v1.worker.xpu_worker import XPUWorker

    return _accelerator_worker(
        "PipelinedXPUWorker",
        XPUWorker,
        _XPU_WORKER,
        {
            "v1": _xpu_v1_runner,
            "v2": functools.partial(_declared_runner, stable="PipelinedXPUModelRunnerV2"),
        },
        """``XPUWorker`` whose runner (``XPUModelRunnerV2`` or v1's ``XPUModelRunner``,
        built under vLLM's torch.cuda-to-xpu shim) initializes through an initpipe catalog.

        Untested on hardware (no XPU here). ``XPUWorker`` subclasses the GPU ``Worker`` and
        builds its runner in ``_make_model_runner`` (``vllm/v1/worker/xpu_worker.py``);
        that is the one method replaced.
        """,
    )


_BUILDERS: Mapping[str, Callable[[], type]] = MappingProxyType(
    {
        "PipelinedCPUWorker": _cpu_worker,
        "PipelinedGPUWorker": _gpu_worker,
        "PipelinedXPUWorker": _xpu_worker,
    }
)


def __getattr__(name: str) -> Any:
    if name in _BUILDERS:
        return _BUILDERS[name]()
    if name == "PipelinedWorker":
        stock = _platform_stock_worker()
        if stock is None:
            refusal = _platform_refusal(None)
            assert refusal is not None  # no stock worker is always a refusal
            _raise(refusal)
        return _BUILDERS[PIPELINED_VARIANTS[stock]]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
