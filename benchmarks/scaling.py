"""Scaling: build + validate + order 1k, 10k and 20k random stages (fixed seed)."""

from __future__ import annotations

import random
import types

from initpipe import Pipeline
from initpipe._stage import StageSpec, make_spec

from ._common import Row, alternate, mm


def random_specs(n: int, seed: int = 1) -> list[StageSpec]:
    """n stages, each reading up to 3 earlier outputs; first half model, second half KV."""
    rng = random.Random(seed)
    mod = types.ModuleType("initpipe_bench_random")
    specs = []
    half = n // 2
    for i in range(n):
        # model stages (i < half) can only read earlier model stages: no phase violation
        preds = sorted(rng.sample(range(i), k=min(i, rng.randint(0, 3))))
        needs = "model" if i < half else "kv_cache_config"
        params = ", ".join(f"s{j}" for j in preds) or "model"
        exec(f"def s{i}({params}):\n    return {i}", mod.__dict__)
        specs.append(make_spec(mod.__dict__[f"s{i}"], needs=needs))
    return specs


def run(smoke: bool = False) -> list[Row]:
    """Measure and return rows."""
    sizes = (100, 1000, 2000) if smoke else (1000, 10_000, 20_000)
    specs = {n: random_specs(n) for n in sizes}
    times = {}
    for n in sizes:
        times[n] = alternate({n: lambda n=n: Pipeline(specs[n])}, 2 if smoke else 5)[n]
    rows = [
        Row(
            bench="scaling",
            name=f"build+validate+order {n} stages",
            value=round(mm(times[n])[0], 4),
            unit="s",
            target="< 0.5" if n == 10_000 else "",
            met=mm(times[n])[0] < 0.5 if n == 10_000 else None,
            detail=f"min/median {mm(times[n])[0]:.4f}/{mm(times[n])[1]:.4f} s",
        )
        for n in sizes
    ]
    big, mid = sizes[2], sizes[1]
    ratio = mm(times[big])[0] / mm(times[mid])[0]
    rows.append(
        Row(
            bench="scaling",
            name=f"{big} / {mid} stages",
            value=round(ratio, 2),
            unit="x",
            target="<= 2.3",
            met=ratio <= 2.3,
        )
    )
    return rows
