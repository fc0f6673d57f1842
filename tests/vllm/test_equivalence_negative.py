"""The equivalence chain says DIFFERENT: a pipelined engine wrong by one detail is caught.

Two test-only extensions (``negative_ext/initpipe_negative_ext.py``, enabled through
``INITPIPE_EXTENSIONS`` like any installed one) alter only the pipelined engine: one fills
one KV block of one layer with ones, one exchanges two layers' KV bindings. Each entry point
of the chain must report the difference by its path and exit 1:

- ``python -m initpipe_vllm.testing.equivalence`` with the block perturbation: its exit
  status and printed lines, and its ``--json`` report, which is :func:`compare_model`'s
  return value (``equal``, ``diffs``);
- ``initpipe run --compare-stock`` with the swapped bindings, whose outputs stay the same
  (each layer reads what it wrote): only the runner snapshot can show it.

Both run with ``INITPIPE_VLLM=1`` exported (the README's opt-in): were a stock oracle built
with ``worker_cls="auto"`` to pick it up, it would run the perturbed pipeline too and
compare equal; the reports must name vLLM's own runner on the stock side.

One subprocess runs both command lines in turn (an in-process engine mutates its process,
and one vLLM import is the cheaper half): the ``python -m`` one through :mod:`runpy` as
``__main__``, ``initpipe run`` through :func:`initpipe.cli.main`, the function behind the
console script; each exit status is what the process would have exited with. The same
subprocess also describes one vLLM error raised by vLLM and, with the same words, from
elsewhere: "failing the same way" (stock refuses a config, the pipelined engine must too)
compares where it was raised, not only the words. Run as a script
(``python test_equivalence_negative.py OUT.json WEIGHTS_DIR``) this file is that subprocess.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

EXT_DIR = Path(__file__).resolve().parent / "negative_ext"
ENTRY_POINTS = {
    "perturb_kv_block": "initpipe_negative_ext:PERTURB_KV_BLOCK",
    "swap_kv_bindings": "initpipe_negative_ext:SWAP_KV_BINDINGS",
}


def _installed(site: Path) -> Path:
    """A dist-info in ``site`` naming the test extensions' entry points (the module itself
    is imported from :data:`EXT_DIR`, also on ``PYTHONPATH``)."""
    info = site / "initpipe_negative_ext-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: initpipe-negative-ext\nVersion: 0.1\n"
    )
    lines = [f"{name} = {value}" for name, value in ENTRY_POINTS.items()]
    (info / "entry_points.txt").write_text("[initpipe.stages]\n" + "\n".join(lines) + "\n")
    return site


def _captured(call: Callable[[], Any]) -> dict[str, Any]:
    """Run a command line's function; its exit status and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = call()
        except SystemExit as exit_:
            status = exit_.code
    print(out.getvalue(), err.getvalue(), sep="\n", flush=True)  # kept in the log
    return {"status": status, "stdout": out.getvalue(), "stderr": err.getvalue()}


def _python_m(module: str, argv: list[str]) -> Any:
    """``python -m module *argv``, in this process."""
    saved = sys.argv
    sys.argv = [module, *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        sys.argv = saved


def main(json_out: str, weights_dir: str) -> None:
    """The subprocess: both command lines, each with its extension enabled."""
    from initpipe_vllm.testing import model_dir

    report = Path(json_out).with_name("equivalence.json")
    os.environ["INITPIPE_EXTENSIONS"] = "perturb_kv_block"
    argv = ["--model", str(model_dir("tiny-llama")), "--no-reinit"]
    argv += ["--weights-dir", weights_dir, "--json", str(report)]
    found: dict[str, Any] = {
        "equivalence": _captured(lambda: _python_m("initpipe_vllm.testing.equivalence", argv))
    }
    (found["equivalence"]["report"],) = json.loads(report.read_text())

    from initpipe.cli import main as initpipe_main

    os.environ["INITPIPE_EXTENSIONS"] = "swap_kv_bindings"
    run_argv = ["run", "--model", "tiny-llama", "--compare-stock", "--weights-dir", weights_dir]
    found["run"] = _captured(lambda: initpipe_main(run_argv))
    found["failures"] = _failure_cases()
    Path(json_out).write_text(json.dumps(found, default=repr))


# -- the tests ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory, seeded_weights_dir: Path) -> dict:
    tmp = tmp_path_factory.mktemp("negative")
    site = _installed(tmp / "site")
    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_LOGGING_STREAM": "ext://sys.stderr",
        "INITPIPE_VLLM": "1",  # the opt-in exported: every oracle must stay stock anyway
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(site), str(EXT_DIR), os.environ.get("PYTHONPATH")) if p
        ),
    }
    out = tmp / "found.json"
    cmd = [sys.executable, __file__, str(out), str(seeded_weights_dir)]
    from waiting import run_watched  # not at the top: this file runs as the script too

    proc = run_watched(cmd, env=env, cwd=tmp)
    (tmp / "script.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0 and out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_compare_model_and_python_m_equivalence_name_one_perturbed_kv_block(found) -> None:
    res = found["equivalence"]
    rep = res["report"]  # compare_model's return value
    last = rep["stock"]["init"]["kv_cache_config"]["num_blocks"] - 1
    block = f"/init/nonzero_blocks[0]: [] != [{last}]"
    assert rep["equal"] is False
    assert block in rep["diffs"]
    assert any(d.startswith("/init/kv_digest[0]: ") for d in rep["diffs"])
    # only the first layer's block, and vLLM never wrote there: nothing else differs
    assert not [d for d in rep["diffs"] if "[1]" in d or d.startswith("/outputs")]
    assert res["status"] == 1, res["stdout"][-3000:] + res["stderr"][-3000:]
    model = rep["model"]
    assert f"{model}: DIFFERENT ({len(rep['diffs'])})" in res["stdout"]
    assert f"  {block}" in res["stdout"].splitlines()


def test_initpipe_run_compare_stock_names_two_swapped_layer_bindings(found) -> None:
    res = found["run"]
    assert res["status"] == 1, res["stdout"][-3000:] + res["stderr"][-3000:]
    # it compared: the stock engine was stock (no "Error: ... is not stock vLLM")
    assert not [line for line in res["stderr"].splitlines() if line.startswith("Error:")]
    lines = res["stdout"].splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("DIFFERENT from stock vLLM"))
    diffs = [line.strip() for line in lines[head + 1 :] if line.startswith("  /")]
    for layer in ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"):
        assert any(d.startswith(f"/init/layers/{layer}/kv_cache/storage_offset: ") for d in diffs)
        assert any(d.startswith(f"/after/layers/{layer}/kv_cache/storage_offset: ") for d in diffs)
    # each layer reads what it wrote: the outputs cannot show it, the runner state does
    assert not [d for d in diffs if d.startswith("/outputs")]
    assert "SAME as stock vLLM" not in res["stdout"]


def test_with_the_opt_in_exported_every_oracle_ran_vllms_own_runner(found) -> None:
    """INITPIPE_VLLM=1 was in the environment: the stock sides still ran stock vLLM."""
    meta = found["equivalence"]["report"]["meta"]
    assert [pipelined for _, pipelined in meta["stock"]["runners"]] == [False]
    assert meta["stock"]["runners"][0][0] == "vllm.v1.worker.cpu_model_runner.CPUModelRunner"
    assert [pipelined for _, pipelined in meta["pipelined"]["runners"]] == [True]
    assert not [d for d in found["equivalence"]["report"]["diffs"] if d.startswith("/meta")]


# -- failing the same way: the same error, raised in the same place (no engine) -------------
def _no_kv_memory(where: str) -> BaseException:
    """vLLM's "No available memory for the cache blocks" ValueError, raised by vLLM's
    own check (``where="vllm"``) or, with the same words, by this function."""
    from vllm.v1.core import kv_cache_utils

    def vllm_check() -> None:
        kv_cache_utils._check_enough_kv_cache_memory(0, lambda: 0, 1, lambda _: 0)

    try:
        vllm_check()
    except ValueError as err:
        if where == "vllm":
            return err
        words = str(err)
    try:
        raise ValueError(words)
    except ValueError as err:
        return err


def _failure_cases() -> dict[str, Any]:
    """vLLM's error raised by vLLM, again by vLLM, and with its words from elsewhere:
    each described, and the differences of the last two from the first (in the
    subprocess, where vLLM is imported anyway)."""
    from initpipe_vllm.testing.failures import describe_failure, failure_differences

    stock = describe_failure(_no_kv_memory("vllm"))
    again = describe_failure(_no_kv_memory("vllm"))
    elsewhere = describe_failure(_no_kv_memory("here"))
    return {
        "stock": stock,
        "elsewhere": elsewhere,
        "diffs_again": failure_differences(stock, again),
        "diffs_elsewhere": failure_differences(stock, elsewhere),
    }


def test_the_same_error_raised_in_another_place_is_a_difference(found) -> None:
    """Stock's words are not enough: where the error was raised is compared too."""
    cases = found["failures"]
    stock, elsewhere = cases["stock"], cases["elsewhere"]
    assert stock["error"] == elsewhere["error"]
    assert stock["error"].startswith("ValueError: No available memory for the cache blocks")
    where = "vllm.v1.core.kv_cache_utils:_check_enough_kv_cache_memory"
    assert stock["raised_in"] == stock["vllm_frame"] == where
    assert cases["diffs_again"] == []
    assert cases["diffs_elsewhere"] == [
        f"/refused/where: stock raised_in={where}, vllm_frame={where}; pipelined "
        "raised_in=__main__:_no_kv_memory, vllm_frame=None, stage=None"
    ]


if __name__ == "__main__":
    main(*sys.argv[1:])
