"""Deterministic topological order: respects every edge, independent of declaration order
and of PYTHONHASHSEED."""

import os
import random
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings, strategies as st

from initpipe import Pipeline
from initpipe._stage import make_spec


def random_dag(n, seed, kv_share=0.5):
    """n stages; stage i reads outputs of some j < i; KV stages come after model ones."""
    rng = random.Random(seed)
    n_model = int(n * (1 - kv_share))
    specs = []
    for i in range(n):
        preds = rng.sample(range(i), k=min(i, rng.randint(0, 3)))
        needs = "model" if i < n_model else "kv_cache_config"
        if needs == "model":
            preds = [j for j in preds if j < n_model]
        params = [f"k{j}" for j in sorted(preds)] or ["model"]
        ns = {}
        exec(f"def s{i}({', '.join(params)}):\n    return {i}", ns)
        specs.append(make_spec(ns[f"s{i}"], needs=needs, provides=f"k{i}"))
    return specs


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=200),
    seed=st.integers(0, 10_000),
    shuffle_seed=st.integers(0, 10_000),
)
def test_order_respects_every_edge_and_ignores_declaration_order(n, seed, shuffle_seed):
    specs = random_dag(n, seed)
    p = Pipeline(specs)
    pos = {name: i for i, name in enumerate(p.order)}
    assert len(pos) == n
    for a, b in p.graph.edges:
        assert pos[a] < pos[b]
    phases = [p.specs[s].needs for s in p.order]
    assert phases == sorted(phases, key=lambda x: x != "model")  # model phase first
    shuffled = specs[:]
    random.Random(shuffle_seed).shuffle(shuffled)
    assert Pipeline(shuffled).order == p.order


def test_ties_are_broken_by_name():
    specs = random_dag(1, 0, kv_share=0.0)
    ns = {}
    for name in ("zeta", "alpha", "mid"):
        exec(f"def {name}(model):\n    return 1", ns)
    p = Pipeline([make_spec(ns[n], needs="model") for n in ("zeta", "alpha", "mid")] + specs)
    assert p.order == ["alpha", "mid", "s0", "zeta"]


def test_order_is_identical_under_two_hash_seeds(tmp_path):
    script = tmp_path / "order.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_order import random_dag
        from initpipe import Pipeline
        specs = random_dag(150, 7)
        specs = list(reversed(specs))
        print(",".join(Pipeline(specs).order))
    """)
    )
    outs = []
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        res = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, env=env, check=True
        )
        outs.append(res.stdout.strip())
    assert outs[0] == outs[1]
    assert len(outs[0].split(",")) == 150


def test_a_pipeline_cannot_be_changed_after_it_is_built():
    """Documented immutable, and it is: a frozen graph, read-only mappings, a copied order."""
    import networkx as nx
    from coretoys import diamond

    p = Pipeline.from_module(diamond)
    with pytest.raises(nx.NetworkXError, match="Frozen graph can't be modified"):
        p.graph.add_edge("bottom", "top")
    with pytest.raises(TypeError):
        p.specs["extra"] = p.specs["top"]  # type: ignore[index]
    with pytest.raises(TypeError):
        p.inputs["model"]["extra"] = 1  # type: ignore[index]
    with pytest.raises(TypeError):
        p.kept_inputs["model"] = ()  # type: ignore[index]
    with pytest.raises(AttributeError):
        p.name = "renamed"  # type: ignore[misc]
    p.order.append("extra")
    assert p.order == ["top", "left", "right", "bottom"]
    assert p.steps["model"][0].name == "top" and len(p.steps["kv_cache_config"]) == 1
