"""``initpipe graph`` in-process through ``main(argv)``: formats, filters, --check, -o."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from initpipe.cli import main

MINI = "cli_toys.mini_vllm"
MINI_ORDER = [
    "attn_layers",
    "attn_backends",
    "kv_cache_spec",
    "cudagraph",
    "kv_caches",
    "metadata_builders",
    "warm_up",
]


def graph(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["graph", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_text_lists_stages_in_order_grouped_by_phase(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = graph(capsys, MINI)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == (
        "pipeline 'cli_toys.mini_vllm': 7 stages (model: 4, kv_cache_config: 3), 11 edges"
    )
    assert lines[1] == (
        "inputs: start: vllm_config, device; model: model; kv_cache_config: kv_cache_config"
    )
    model_at = next(i for i, ln in enumerate(lines) if ln.startswith("model phase"))
    kv_at = next(i for i, ln in enumerate(lines) if ln.startswith("kv_cache_config phase"))
    positions = [next(i for i, ln in enumerate(lines) if f". {n} " in ln) for n in MINI_ORDER]
    assert positions == sorted(positions)
    assert model_at < positions[0] and positions[3] < kv_at < positions[4]
    spec_line = lines[positions[2]]
    assert "attn_layers, vllm_config -> kv_cache_spec" in spec_line
    assert spec_line.endswith("[effects: shared_kv_cache_layers]")


def test_json_follows_the_documented_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = graph(capsys, MINI, "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["order"] == MINI_ORDER
    assert [s["name"] for s in data["stages"]] == MINI_ORDER
    spec = data["stages"][2]
    assert spec == {
        "name": "kv_cache_spec",
        "phase": "model",
        "inputs": ["attn_layers", "vllm_config"],
        "outputs": ["kv_cache_spec"],
        "effects": ["shared_kv_cache_layers"],
        "after": [],
        "before": [],
        "module": "cli_toys.mini_vllm",
        "qualname": "cli_toys.mini_vllm:kv_cache_spec",
        "package": None,
        "doc": 'Build each layer\'s KV cache spec <and> "record" shared layers.',
        "meta": {"mirrors": ["toyvllm.runner:Runner.get_kv_cache_spec"], "since": "0.1"},
    }
    assert data["stages"][0]["meta"] == {}  # a stage that declares none
    edges = data["edges"]
    assert {"from": "cudagraph", "to": "warm_up", "key": "batch_sizes", "kind": "data"} in edges
    assert {"from": "metadata_builders", "to": "warm_up", "key": None, "kind": "order"} in edges
    assert all(set(e) == {"from", "to", "key", "kind"} for e in data["edges"])
    assert data["inputs"]["start"] == ["vllm_config", "device"]
    assert data["version"] == 1


def test_mermaid_has_a_subgraph_per_phase_and_keyed_edges(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = graph(capsys, MINI, "-f", "mermaid")
    assert code == 0
    assert out.startswith("flowchart TD\n")
    assert '  subgraph phase_model["model phase"]' in out
    assert '  subgraph phase_kv_cache_config["kv_cache_config phase"]' in out
    assert '  n_cudagraph -->|"batch_sizes"| n_warm_up' in out
    assert '  n_metadata_builders -.->|"after/before"| n_warm_up' in out
    assert "  class n_kv_caches kv_cache_config" in out


def test_dot_has_clusters_ids_and_tooltips(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = graph(capsys, MINI, "-f", "dot")
    assert code == 0
    assert out.startswith('digraph "cli_toys.mini_vllm" {')
    assert 'subgraph "cluster_model"' in out and 'subgraph "cluster_kv_cache_config"' in out
    assert 'id="stage-kv_caches"' in out
    assert 'tooltip="kv_cache_config, kv_cache_spec, device -> kv_caches"' in out
    assert '"kv_caches" -> "warm_up" [label="kv_caches"' in out


@pytest.mark.parametrize(
    ("phase", "expected"), [("model", MINI_ORDER[:4]), ("kv_cache_config", MINI_ORDER[4:])]
)
def test_phase_keeps_only_that_phase(
    capsys: pytest.CaptureFixture[str], phase: str, expected: list[str]
) -> None:
    code, out, _ = graph(capsys, MINI, "--phase", phase, "-f", "json")
    data = json.loads(out)
    assert (code, data["order"]) == (0, expected)
    assert all(e["from"] in expected and e["to"] in expected for e in data["edges"])


def test_focus_keeps_ancestors_and_descendants(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = graph(capsys, MINI, "--focus", "attn_backends", "-f", "json")
    assert code == 0
    assert json.loads(out)["order"] == [
        "attn_layers",
        "attn_backends",
        "cudagraph",
        "metadata_builders",
        "warm_up",
    ]


def test_focus_and_phase_combine(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = graph(capsys, MINI, "--focus", "kv_cache_spec", "--phase", "model", "-f", "json")
    assert (code, json.loads(out)["order"]) == (0, ["attn_layers", "kv_cache_spec", "cudagraph"])


def test_unknown_focus_suggests_close_names(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = graph(capsys, MINI, "--focus", "kv_cache_spc")
    assert (code, out) == (2, "")
    assert err == (
        "Error: --focus: pipeline 'cli_toys.mini_vllm' has no stage 'kv_cache_spc'. "
        "Did you mean 'kv_cache_spec' or 'kv_caches'?\n"
    )


def test_check_valid_prints_one_ok_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = graph(capsys, MINI, "--check")
    assert (code, err) == (0, "")
    assert out == (
        "OK: pipeline 'cli_toys.mini_vllm' is valid: 7 stages "
        "(model: 4, kv_cache_config: 3), 11 edges\n"
    )


def test_check_lists_every_problem_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = graph(capsys, "cli_toys.broken", "--check")
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == "invalid pipeline 'cli_toys.broken': 4 problems"
    body = "\n".join(lines[1:])
    assert "DuplicateProducerError: duplicate producer for 'weights'" in body
    assert "MissingInputError: missing input 'nowhere': needed by cli_toys.broken:load_a" in body
    assert "CycleError: cycle: ping -> pong -> ping" in body
    assert (
        "PhaseViolationError: phase violation: model-phase stage 'cli_toys.broken:too_early'"
    ) in body
    assert "kv_side -> too_early" in body


def test_check_json_carries_each_problem_s_facts(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = graph(capsys, "cli_toys.broken", "--check", "-f", "json")
    data = json.loads(out)
    assert (code, data["ok"]) == (1, False)
    by_type = {p["type"]: p for p in data["problems"]}
    assert by_type["CycleError"]["cycle"] == ["ping", "pong", "ping"]
    assert by_type["MissingInputError"]["consumers"] == ["cli_toys.broken:load_a"]
    assert by_type["DuplicateProducerError"]["producers"] == [
        "cli_toys.broken:load_a",
        "cli_toys.broken:load_b",
    ]
    assert by_type["PhaseViolationError"]["path"] == ["kv_side", "too_early"]


def test_check_missing_input_suggests_the_close_key(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = graph(capsys, "cli_toys.missing", "--check")
    assert code == 1
    assert "missing input 'kv_cache_spce': needed by cli_toys.missing:allocate" in out
    assert "Did you mean 'kv_cache_spec'" in out


def test_check_reports_a_malformed_stage_as_a_problem(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = graph(capsys, "cli_toys.bad_declaration", "--check")
    assert code == 1
    assert "StageDeclarationError: stage cli_toys.bad_declaration:oops: needs='modle'" in out


def test_invalid_pipeline_without_check_prints_problems_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = graph(capsys, "cli_toys.cyclic")
    assert (code, out) == (1, "")
    assert err.startswith(
        "invalid pipeline 'cli_toys.cyclic': 1 problem\n  1. CycleError: cycle: a -> b -> a"
    )


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module_xyz", "Error: no module named 'no_such_module_xyz'"),
        (
            "cli_toys.pipelines:NOPE",
            "Error: cli_toys.pipelines:NOPE: 'cli_toys.pipelines' has no attribute 'NOPE'",
        ),
        ("cli_toys.empty", "Error: module 'cli_toys.empty' declares no stages"),
    ],
)
def test_bad_targets_exit_2_with_error(
    capsys: pytest.CaptureFixture[str], target: str, message: str
) -> None:
    code, out, err = graph(capsys, target)
    assert (code, out) == (2, "")
    assert err.startswith(message)


@pytest.mark.parametrize(
    "argv",
    [
        ["--blame"],
        ["--check", "--diff", "cli_toys.linear"],
        ["--diff", "cli_toys.linear", "--focus", "spec"],
    ],
)
def test_conflicting_flags_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, _, err = graph(capsys, "cli_toys.linear", *argv)
    assert code == 2
    assert err.startswith("Error: ")


def test_output_file_is_written_atomically_in_the_suffix_format(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "g.json"
    target.write_text("old")
    code, out, _ = graph(capsys, MINI, "-o", str(target))
    assert (code, out) == (0, "")
    assert json.loads(target.read_text())["order"] == MINI_ORDER
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json"]  # no temp file left


def test_explicit_format_wins_over_the_suffix(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "g.json"
    assert graph(capsys, MINI, "-o", str(target), "-f", "mermaid")[0] == 0
    assert target.read_text().startswith("flowchart TD")


def test_unwritable_output_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = graph(capsys, MINI, "-o", str(tmp_path / "missing-dir" / "g.txt"))
    assert code == 2
    assert err.startswith("Error: cannot write")
