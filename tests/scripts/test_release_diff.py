"""The porting checklist (scripts/release_diff.py): what it reads of a source, and its
answer to a source that is not there."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "release_diff", ROOT / "scripts" / "release_diff.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


diff = _module()


def test_a_missing_source_is_named_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-vllm.whl"
    assert diff.main([str(missing), str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and str(missing) in err and "Traceback" not in err
    assert "a vLLM .whl file" in err  # what to give instead


def test_a_segment_is_the_source_of_one_qualified_name(tmp_path: Path) -> None:
    pkg = tmp_path / "vllm" / "v1"
    pkg.mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("__version__ = '9.9.9'\n")
    (pkg / "__init__.py").write_text("")
    (pkg / "runner.py").write_text(
        "class Runner:\n    def load_model(self):\n        return 1\n\n"
        "    def other(self):\n        return 2\n\n\ndef helper():\n    pass\n"
    )
    source = diff.contract_source.open_source(tmp_path)
    got = diff.segment(source, "vllm.v1.runner:Runner.load_model")
    assert got is not None and "def load_model" in got and "def other" not in got
    assert "def helper" in (diff.segment(source, "vllm.v1.runner:helper") or "")
    assert diff.segment(source, "vllm.v1.runner:Runner.gone") is None
    assert diff.segment(source, "vllm.v1.nowhere:helper") is None
