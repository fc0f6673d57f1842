"""Weight refit vs its physical floor and an engine restart, on a tiny and a 250 MB Llama.

For each model, a child process (``benchmarks/_refit_child.py``; an in-process engine
mutates its process) builds two seeded weights folders (seed 0 and 1,
``initpipe_vllm.testing.weights.seeded_model``), starts an in-process engine with the
pipelined worker (``INITPIPE_VLLM=1``, ``load_format="auto"``, an explicit
``kv_cache_memory_bytes``, vLLM's own prefill chunk) on the first and:

- refits it alternately to the other folder (``initpipe_vllm.refit``), once with the default
  probe and once with ``probe=False`` per repeat, generating between refits; each receipt
  gives the per-step milliseconds (``digest``, the weights digest's own cost, and
  ``probe``, reported apart, beside the probe's prompts served as plain requests: the
  model's compute the probe cannot avoid);
- measures each refit's physical floor in the same process: reading every safetensors file
  of the new folder fully into a tensor, plus ``torch.zeros`` of the engine's KV bytes per
  rank;
- then restarts the engine as users without sleep mode do: shuts it down, starts a fresh
  one (same arguments) on the other weights and serves one request.

The large model is tiny-llama's ``config.json`` enlarged in a temporary folder (hidden
1024, 4 layers, vocab 8000: 63 M parameters, 252 MB in float32). Goals (issue 36): a refit
within 1.3x its floor + 50 ms; a restart >= 20x slower than a refit. Untested on GPU.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ._common import Row, child_json, mm

FLOOR_FACTOR, FLOOR_SLACK_S = 1.3, 0.050
MIN_RESTART_RATIO = 20.0
#: tiny-llama enlarged: >= 200 MB of float32 weights, yet quick to build on 2 cores
LARGE = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "num_hidden_layers": 4,
    "vocab_size": 8000,
}


def llama_params(cfg: dict[str, Any]) -> int:
    """Parameters of a Llama config (untied embeddings, no biases)."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
    return int(cfg["num_hidden_layers"] * layer + 2 * v * h + h)


def large_model(tmp: Path) -> Path:
    """A folder holding the enlarged config (weights come from ``seeded_model``)."""
    from initpipe_vllm.testing import model_dir

    cfg = json.loads((Path(model_dir("tiny-llama")) / "config.json").read_text())
    cfg.update(LARGE)
    assert llama_params(cfg) * 4 >= 200e6, llama_params(cfg)
    folder = tmp / "llama-250mb"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    return folder


def measure(model: Path, cache: Path, kv_bytes: int, repeats: int, restarts: int) -> Any:
    """Run the child on ``model``; its JSON result."""
    from ._refit_child import MARK

    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cpu"),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "INITPIPE_VLLM": "1",
    }
    args = [str(model), str(cache), str(kv_bytes), str(repeats), str(restarts)]
    return child_json(
        "benchmarks._refit_child", args, MARK, env, f"refit child ({model.name})", 1800
    )


def _step_medians(receipts: list[dict[str, Any]]) -> dict[str, float]:
    """Median milliseconds of each step, in the receipts' order."""
    names = [s["name"] for s in receipts[0]["steps"]]
    per = {
        n: [next(s["ms"] for s in r["steps"] if s["name"] == n) for r in receipts] for n in names
    }
    return {n: mm(v)[1] for n, v in per.items()}


def model_rows(res: dict[str, Any]) -> list[Row]:
    """One model's rows: the refit (probed and not) against its floor, its digest and
    probe steps, and a restart against the refit."""
    label = f"{res['model']} ({res['weight_bytes'] / 1e6:.0f} MB)"
    floor_s = res["floor_s"]
    read_s, memset_s = mm(res["read_s"])[1], mm(res["memset_s"])[1]
    kv = res["refits"][0]["kv_bytes_per_rank"][0]
    bound = FLOOR_FACTOR * floor_s + FLOOR_SLACK_S
    floor_text = (
        f"floor {floor_s * 1e3:.1f} ms (read {res['weight_bytes'] / 1e6:.1f} MB of safetensors "
        f"{read_s * 1e3:.1f} + torch.zeros of {kv / (1 << 20):.1f} MiB KV {memset_s * 1e3:.1f})"
    )
    out: list[Row] = []
    medians: dict[str, float] = {}
    for key, what in (("refits", "refit A<->B"), ("unprobed", "refit A<->B, probe=False")):
        totals = [r["total_s"] for r in res[key]]
        t_min, t_med = mm(totals)
        medians[key] = t_med
        steps = ", ".join(f"{k} {v:.1f}" for k, v in _step_medians(res[key]).items())
        out.append(
            Row(
                bench="refit",
                name=f"{label} {what} (median)",
                value=round(t_med * 1e3, 2),
                unit="ms",
                target=f"<= {FLOOR_FACTOR:g} x floor + {FLOOR_SLACK_S * 1e3:g} ms "
                f"= {bound * 1e3:.1f} ms",
                met=t_med <= bound,
                detail=f"{t_med / floor_s:.2f}x the {floor_text}; min {t_min * 1e3:.1f} ms "
                f"over {len(totals)} refits; median per step (ms): {steps}",
            )
        )
    out.append(
        Row(
            bench="refit",
            name=f"{label} floor: read the weights + KV memset (median)",
            value=round(floor_s * 1e3, 2),
            unit="ms",
            detail=floor_text + f"; {len(res['read_s'])} samples, same process",
        )
    )
    reload_s = mm(res["stock_reload_s"])[1]
    out.append(
        Row(
            bench="refit",
            name=f"{label} vLLM's reload_weights + reset_prefix_cache by hand (median)",
            value=round(reload_s * 1e3, 2),
            unit="ms",
            detail=f"{reload_s / floor_s:.2f}x the floor; the refit (probe=False) costs "
            f"{medians['unprobed'] / reload_s:.2f}x it: its KV release and re-allocation, "
            f"digest, checks and receipt; {len(res['stock_reload_s'])} samples, same process",
        )
    )
    step_ms = _step_medians(res["refits"])

    def moved(name: str) -> float:
        return mm(
            [next(s["bytes"] for s in r["steps"] if s["name"] == name) for r in res["refits"]]
        )[1]

    for step in ("verify", "digest", "probe"):
        if step == "verify":
            extra = (
                f"the load against the fresh load's record: coverage, ties, kernels, and "
                f"{moved('verify') / 1e6:.1f} MB of kept parameters compared with the "
                "checkpoint; their sources are hashed during the load step"
            )
        elif step == "digest":
            extra = f"hashes {moved('digest') / 1e6:.1f} MB per refit"
        else:
            extra = (
                f"default probe; {step_ms[step] / (medians['refits'] * 1e3):.0%} of the "
                f"refit; its prompts served as plain requests (cold, then warm) take "
                f"{mm(res['probe_plain_s'])[1] * 1e3:.1f} ms"
            )
        out.append(
            Row(
                bench="refit",
                name=f"{label} refit step {step} (median)",
                value=round(step_ms[step], 2),
                unit="ms",
                detail=extra,
            )
        )
    if res["restart_s"]:
        r_med = mm(res["restart_s"])[1]
        ratio = r_med / medians["refits"]
        out.append(
            Row(
                bench="refit",
                name=f"{label} engine restart (median)",
                value=round(r_med * 1e3, 1),
                unit="ms",
                detail=f"shutdown, gc, LLM() on the other weights (same arguments), one "
                f"request; {len(res['restart_s'])} sample(s), engine start alone "
                f"{res['start_s'] * 1e3:.0f} ms the first time",
            )
        )
        out.append(
            Row(
                bench="refit",
                name=f"{label} engine restart / refit (median)",
                value=round(ratio, 1),
                unit="x",
                target=f">= {MIN_RESTART_RATIO:g}",
                met=ratio >= MIN_RESTART_RATIO,
                detail=f"restart (shutdown, LLM() on the other weights, one request) median "
                f"{r_med * 1e3:.0f} ms over {len(res['restart_s'])}; refit median "
                f"{medians['refits'] * 1e3:.1f} ms; restart / refit with probe=False "
                f"{r_med / medians['unprobed']:.1f}x",
            )
        )
    return out


def run(smoke: bool = False) -> list[Row]:
    """Rows for the benchmark runner: the tiny model (and, without ``--smoke``, the large)."""
    from initpipe_vllm.testing import model_dir

    with tempfile.TemporaryDirectory(prefix="initpipe_refit_bench_") as tmp:
        cache = Path(tmp) / "weights"
        if smoke:
            runs = [(Path(model_dir("tiny-llama")), 8 << 20, 1, 1)]
        else:
            runs = [
                (Path(model_dir("tiny-llama")), 8 << 20, 10, 3),
                (large_model(Path(tmp)), 32 << 20, 5, 2),
            ]
        return [
            row
            for model, kv, repeats, restarts in runs
            for row in model_rows(measure(model, cache, kv, repeats, restarts))
        ]
