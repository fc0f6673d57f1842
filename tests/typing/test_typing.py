"""``@stage`` keeps the decorated function's type, checked by running mypy on examples."""

from __future__ import annotations

from pathlib import Path

from requires import module

api = module("mypy.api", "mypy comes with the dev extra")

HERE = Path(__file__).resolve().parent


def _mypy(path: Path, tmp_path: Path) -> tuple[str, int]:
    out, err, status = api.run(
        [
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "mypy_cache"),
            "--no-error-summary",
            str(path),
        ]
    )
    return out + err, status


def test_stage_keeps_the_function_type(tmp_path: Path) -> None:
    out, status = _mypy(HERE / "stage_types.py", tmp_path)
    assert status == 0, out


def test_a_wrong_call_of_a_stage_is_a_type_error(tmp_path: Path) -> None:
    out, status = _mypy(HERE / "stage_types_bad.py", tmp_path)
    assert status == 1
    assert 'Argument 2 to "layer_count" has incompatible type "str"; expected "int"' in out
    assert 'No overload variant of "stage" matches argument types' in out  # needs="modle"
