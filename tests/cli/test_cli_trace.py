"""``--trace FILE``: durations on the nodes, the critical path, and ``--blame``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import MINI_CRITICAL, MINI_DURATIONS

from initpipe import Pipeline
from initpipe.cli import main

MINI = "cli_toys.mini_vllm"


def graph(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["graph", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_carries_durations_and_the_critical_path(
    capsys: pytest.CaptureFixture[str], trace_file: Path
) -> None:
    code, out, _ = graph(capsys, MINI, "--trace", str(trace_file), "-f", "json")
    data = json.loads(out)
    assert code == 0
    # the re-run of the KV phase wins over the profiling run (kv_caches: 1.2, not 9.9)
    assert {s["name"]: s["duration"] for s in data["stages"]} == pytest.approx(MINI_DURATIONS)
    assert data["critical_path"] == MINI_CRITICAL
    assert data["total"] == pytest.approx(sum(MINI_DURATIONS.values()))


def test_text_shows_durations_and_stars_the_critical_path(
    capsys: pytest.CaptureFixture[str], trace_file: Path
) -> None:
    code, out, _ = graph(capsys, MINI, "--trace", str(trace_file))
    assert code == 0
    rows = {
        ln.split()[3 if ln.startswith(" *") else 2]: ln
        for ln in out.splitlines()
        if ". " in ln and "->" in ln
    }
    assert rows["kv_caches"].startswith(" *  5.    1.200s kv_caches")
    assert rows["attn_backends"].startswith("    2.    50.0ms attn_backends")
    assert {n for n, ln in rows.items() if ln.startswith(" *")} == set(MINI_CRITICAL)
    assert out.splitlines()[-1] == (
        "critical path (*): " + " -> ".join(MINI_CRITICAL) + " = 2.120s of 2.180s total stage time"
    )


def test_dot_and_mermaid_highlight_the_critical_path(
    capsys: pytest.CaptureFixture[str], trace_file: Path
) -> None:
    _, dot, _ = graph(capsys, MINI, "--trace", str(trace_file), "-f", "dot")
    assert '"kv_caches" [label="kv_caches\\n1.200s"' in dot
    assert 'color="#dc2626", penwidth="3"' in dot.split('"kv_caches" [', 1)[1].split("\n")[0]
    assert 'penwidth="3"' not in dot.split('"attn_backends" [', 1)[1].split("\n")[0]
    crit_edge = dot.split('"kv_cache_spec" -> "kv_caches" [', 1)[1].split("\n")[0]
    assert 'color="#dc2626"' in crit_edge
    _, mm, _ = graph(capsys, MINI, "--trace", str(trace_file), "-f", "mermaid")
    assert 'n_kv_caches["kv_caches<br/>1.200s"]' in mm
    assert (
        "  class n_attn_layers,n_kv_cache_spec,n_kv_caches,n_metadata_builders,n_warm_up critical"
    ) in mm
    assert "  linkStyle " in mm


def test_blame_sorts_by_self_time_then_prints_the_critical_chain(
    capsys: pytest.CaptureFixture[str], trace_file: Path
) -> None:
    code, out, _ = graph(capsys, MINI, "--trace", str(trace_file), "--blame")
    assert code == 0
    blame_block, chain_block = out.split("\n\n")
    names = [ln.split()[1] for ln in blame_block.splitlines()]
    assert names == sorted(MINI_DURATIONS, key=lambda n: -MINI_DURATIONS[n])
    assert blame_block.splitlines()[0] == "   1.200s kv_caches          (kv_cache_config)"
    chain = chain_block.splitlines()
    assert chain[0] == "critical chain (@start +duration):"
    assert chain[1] == "attn_layers @2.000s +100.0ms"
    assert chain[3] == "    └─kv_caches @12.561s +1.200s"
    assert chain[-1] == "total stage time 2.180s"


def test_blame_json(capsys: pytest.CaptureFixture[str], trace_file: Path) -> None:
    code, out, _ = graph(capsys, MINI, "--trace", str(trace_file), "--blame", "-f", "json")
    data = json.loads(out)
    assert code == 0
    assert data["blame"][0] == {
        "name": "kv_caches",
        "phase": "kv_cache_config",
        "duration": pytest.approx(1.2),
    }
    assert [c["name"] for c in data["critical_path"]] == MINI_CRITICAL


def test_phase_filter_applies_to_the_blame(
    capsys: pytest.CaptureFixture[str], trace_file: Path
) -> None:
    _, out, _ = graph(capsys, MINI, "--trace", str(trace_file), "--blame", "--phase", "model")
    names = [ln.split()[1] for ln in out.split("\n\n")[0].splitlines()]
    assert names == ["kv_cache_spec", "attn_layers", "attn_backends", "cudagraph"]


def test_a_real_run_s_trace_is_accepted(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The trace written by Run.trace.write_json of a real run of the toy pipeline."""
    p = Pipeline.from_module(MINI)
    run = p.start(vllm_config=None)
    run.load(model="m")
    run.initialize_kv_cache({"blocks": 4})
    path = run.trace.write_json(tmp_path / "run.json", p.graph)
    code, out, _ = graph(capsys, MINI, "--trace", str(path), "-f", "json")
    data = json.loads(out)
    assert code == 0
    assert all(isinstance(s["duration"], float) for s in data["stages"])
    assert data["critical_path"][-1] == "warm_up"


def test_stages_missing_from_the_pipeline_are_noted(
    capsys: pytest.CaptureFixture[str], trace_file: Path, tmp_path: Path
) -> None:
    data = json.loads(trace_file.read_text())
    data["events"].append({**data["events"][1], "name": "ghost_stage"})
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    code, _, err = graph(capsys, MINI, "--trace", str(path))
    assert code == 0
    assert err == f"note: {path}: the trace has stages this pipeline lacks (ignored): ghost_stage\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "Error: cannot read trace"),
        ("not json", "Error: cannot read trace"),
        ('{"version": 1}', "is not an initpipe trace"),
    ],
)
def test_bad_trace_files_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "trace.json"
    if content is not None:
        path.write_text(content)
    code, out, err = graph(capsys, MINI, "--trace", str(path))
    assert (code, out) == (2, "")
    assert message in err


def _rank_trace(tmp_path: Path, rank: int, durations: dict[str, float]) -> Path:
    events, t = [], 0.0
    for name, dur in durations.items():
        phase = "model" if name in ("attn_layers", "attn_backends", "kv_cache_spec") else None
        events.append(
            {
                "name": name,
                "phase": phase or "kv_cache_config",
                "kind": "stage",
                "start": t,
                "duration": dur,
                "outcome": "ok",
                "generation": 1,
                "error": None,
            }
        )
        t += dur
    path = tmp_path / f"trace.rank{rank}.json"
    path.write_text(json.dumps({"version": 1, "wall_origin": 0.0, "events": events}))
    return path


def test_several_ranks_traces_give_each_stage_its_slowest_rank(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    r0 = _rank_trace(tmp_path, 0, {"attn_layers": 0.5, "kv_caches": 0.1})
    r1 = _rank_trace(tmp_path, 1, {"attn_layers": 0.2, "kv_caches": 0.9})
    code, out, _ = graph(capsys, MINI, "--trace", str(r0), "--trace", str(r1), "-f", "json")
    assert code == 0
    stages = {s["name"]: s for s in json.loads(out)["stages"]}
    assert (stages["attn_layers"]["duration"], stages["attn_layers"]["slowest"]) == (0.5, "rank 0")
    assert (stages["kv_caches"]["duration"], stages["kv_caches"]["slowest"]) == (0.9, "rank 1")
    _, text, _ = graph(capsys, MINI, "--trace", str(r0), "--trace", str(r1))
    (line,) = [ln for ln in text.splitlines() if "900.0ms kv_caches " in ln]
    assert line.endswith("[slowest: rank 1]")
    _, blame_out, _ = graph(capsys, MINI, "--trace", str(r0), "--trace", str(r1), "--blame")
    assert blame_out.splitlines()[0].endswith("(kv_cache_config, slowest: rank 1)")
    # one file: no rank column anywhere
    _, one, _ = graph(capsys, MINI, "--trace", str(r1), "-f", "json")
    assert all("slowest" not in s for s in json.loads(one)["stages"])
