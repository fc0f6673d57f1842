"""Dispatch overhead: a 30-stage no-op pipeline through initpipe vs direct calls vs
graphlib vs Apache Hamilton (if installed: ``pip install -e '.[bench]'``).

Overhead per stage = (framework time - direct time) / 30, tracing on (it always is).
"""

from __future__ import annotations

import graphlib
import sys
import types
from typing import Any

from initpipe import Pipeline
from initpipe._stage import make_spec

from ._common import Row, alternate, mm

N_STAGES = 30
N_MODEL = 15


def _sources() -> list[tuple[str, list[str], str]]:
    """(name, params, phase): stage i reads the two previous outputs (a braid, not a chain)."""
    out = []
    for i in range(N_STAGES):
        phase = "model" if i < N_MODEL else "kv_cache_config"
        params = [f"s{j}" for j in (i - 1, i - 2) if j >= 0]
        if i == 0:
            params = ["model"]
        if i == N_MODEL:
            params.append("kv_cache_config")
        out.append((f"s{i}", params, phase))
    return out


def build_functions() -> types.ModuleType:
    """A module of 30 annotated no-op functions (Hamilton needs type hints)."""
    mod = types.ModuleType("initpipe_bench_stages")
    sys.modules[mod.__name__] = mod  # Hamilton looks functions up through their module
    src = []
    for name, params, _ in _sources():
        args = ", ".join(f"{p}: int" for p in params)
        src.append(f"def {name}({args}) -> int:\n    return 1\n")
    exec("\n".join(src), mod.__dict__)
    for name, *_ in _sources():
        getattr(mod, name).__module__ = mod.__name__
    return mod


def run(smoke: bool = False) -> list[Row]:
    """Measure and return rows."""
    mod = build_functions()
    srcs = _sources()
    pipeline = Pipeline([make_spec(getattr(mod, n), needs=ph) for n, _, ph in srcs])
    funcs = [(getattr(mod, n), params, n) for n, params, _ in srcs]

    def direct() -> None:
        v: dict[str, Any] = {"model": 0, "kv_cache_config": 0}
        s0 = mod.s0(0)
        s1 = mod.s1(s0)
        v = [s0, s1]
        for i in range(2, N_STAGES):
            f = funcs[i][0]
            v.append(f(v[i - 1], v[i - 2], 0) if i == N_MODEL else f(v[i - 1], v[i - 2]))

    def initpipe() -> None:
        r = pipeline.start()
        r.load(model=0)
        r.initialize_kv_cache(0)

    order = list(
        graphlib.TopologicalSorter(
            {n: [p for p in params if p.startswith("s")] for n, params, _ in srcs}
        ).static_order()
    )
    by_name = {n: (f, params) for f, params, n in funcs}

    def graphlib_loop() -> None:
        v: dict[str, Any] = {"model": 0, "kv_cache_config": 0}
        for n in order:
            f, params = by_name[n]
            v[n] = f(**{p: v[p] for p in params})

    fns = {"direct": direct, "initpipe": initpipe, "graphlib": graphlib_loop}
    try:
        from hamilton import driver

        dr = driver.Builder().with_modules(mod).build()
        outs = [n for n, *_ in srcs]

        def hamilton() -> None:
            dr.execute(outs, inputs={"model": 0, "kv_cache_config": 0})

        fns["hamilton"] = hamilton
    except ImportError:
        pass
    repeats, number = (3, 20) if smoke else (15, 400)
    if "hamilton" in fns:
        times = alternate({k: v for k, v in fns.items() if k != "hamilton"}, repeats, number)
        times.update(alternate({"hamilton": fns["hamilton"]}, repeats, max(1, number // 20)))
    else:
        times = alternate(fns, repeats, number)
    d_min, d_med = mm(times["direct"])
    rows = []
    per = {}
    for name in [k for k in fns if k != "direct"]:
        f_min, f_med = mm(times[name])
        per[name] = (f_med - d_med) / N_STAGES * 1e6
        rows.append(
            Row(
                bench="dispatch",
                name=f"overhead per stage: {name}",
                value=round(per[name], 3),
                unit="µs",
                target="<= 5" if name == "initpipe" else "",
                met=per[name] <= 5 if name == "initpipe" else None,
                detail=f"pipeline min/median {f_min * 1e6:.1f}/{f_med * 1e6:.1f} µs; "
                f"direct {d_min * 1e6:.1f}/{d_med * 1e6:.1f} µs",
            )
        )
    if "hamilton" in per:
        ratio = per["hamilton"] / per["initpipe"]
        rows.append(
            Row(
                bench="dispatch",
                name="Hamilton overhead / initpipe overhead",
                value=round(ratio, 1),
                unit="x",
                target=">= 10",
                met=ratio >= 10,
            )
        )
    return rows
