"""``--diff OTHER``: compare with another target or a saved JSON export (exit 1 if they differ)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from initpipe.cli import main
from initpipe.cli.target import load_pipeline
from initpipe.view.diff import diff_views
from initpipe.view.export import export, load_export

MINI = "cli_toys.mini_vllm"


def graph(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["graph", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_identical_against_its_own_saved_export(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    saved = tmp_path / "baseline.json"
    assert graph(capsys, MINI, "-o", str(saved))[0] == 0
    code, out, _ = graph(capsys, MINI, "--diff", str(saved))
    assert code == 0
    assert out.splitlines() == [
        f"--- {saved} (baseline)",
        f"+++ {MINI}",
        "identical: same stages, phases, inputs, outputs and edges",
    ]


def test_differences_against_another_target(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = graph(capsys, MINI, "--diff", "cli_toys.changed_vllm")
    assert code == 1
    lines = out.splitlines()
    assert lines[:2] == ["--- cli_toys.changed_vllm (baseline)", "+++ cli_toys.mini_vllm"]
    assert "+ stage cudagraph (model)" in lines
    assert "+ stage warm_up (kv_cache_config)" in lines
    assert "- stage profile (kv_cache_config)" in lines
    assert "~ stage kv_cache_spec: phase kv_cache_config -> model" in lines
    assert (
        "~ stage metadata_builders: inputs [kv_caches, attn_backends, kv_cache_config] -> "
        "[kv_caches, attn_backends, cudagraph_mode, kv_cache_config]"
    ) in lines
    assert "+ edge cudagraph -> metadata_builders (cudagraph_mode)" in lines
    assert "+ edge metadata_builders -> warm_up (after/before)" in lines
    assert "- edge metadata_builders -> profile (metadata_builders)" in lines
    assert lines[-1] == "13 differences"


def test_diff_json_lists_each_kind(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = graph(capsys, MINI, "--diff", "cli_toys.changed_vllm", "-f", "json")
    d = json.loads(out)
    assert (code, d["identical"]) == (1, False)
    assert d["removed_stages"] == [{"name": "profile", "phase": "kv_cache_config"}]
    assert d["phase_changes"] == [
        {"name": "kv_cache_spec", "from": "kv_cache_config", "to": "model"}
    ]
    assert {"from": "cudagraph", "to": "warm_up", "key": "batch_sizes"} in d["added_edges"]


def test_diff_within_one_phase(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = graph(
        capsys, MINI, "--diff", "cli_toys.changed_vllm", "--phase", "model", "-f", "json"
    )
    d = json.loads(out)
    assert code == 1
    assert [s["name"] for s in d["added_stages"]] == ["cudagraph", "kv_cache_spec"]
    assert d["removed_stages"] == [] and d["phase_changes"] == []


def test_edited_saved_export_shows_the_edit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = export(load_pipeline(MINI))
    data["stages"] = [s for s in data["stages"] if s["name"] != "warm_up"]
    data["edges"] = [e for e in data["edges"] if e["to"] != "warm_up"]
    saved = tmp_path / "old.json"
    saved.write_text(json.dumps(data))
    code, out, _ = graph(capsys, MINI, "--diff", str(saved))
    assert code == 1
    assert "+ stage warm_up (kv_cache_config)" in out
    assert "+ edge kv_caches -> warm_up (kv_caches)" in out


def test_diff_of_an_export_with_itself_is_identical() -> None:
    view = export(load_pipeline("cli_toys.linear"))
    assert diff_views(view, view)["identical"] is True


@pytest.mark.parametrize(
    ("content", "message"),
    [("[1, 2]", "is not an initpipe graph export"), ("{", "cannot read graph export")],
)
def test_bad_saved_export_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, message: str
) -> None:
    saved = tmp_path / "bad.json"
    saved.write_text(content)
    code, _, err = graph(capsys, MINI, "--diff", str(saved))
    assert code == 2
    assert message in err


def test_invalid_other_target_reports_its_problems(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = graph(capsys, MINI, "--diff", "cli_toys.cyclic")
    assert code == 1
    assert err.startswith("invalid pipeline 'cli_toys.cyclic'")


def test_load_export_fills_optional_fields(tmp_path: Path) -> None:
    saved = tmp_path / "min.json"
    saved.write_text(
        json.dumps(
            {
                "stages": [{"name": "a", "phase": "model", "inputs": [], "outputs": ["a"]}],
                "edges": [],
            }
        )
    )
    view = load_export(saved)
    assert (view["order"], view["inputs"]) == (["a"], {})
