"""The README tour: declare four stages, run both phases, re-run the KV phase, print the trace.

Run it with ``python examples/tour.py``.
"""

from __future__ import annotations

from initpipe import REQUIRED, Pipeline, stage

FREED: list[str] = []


@stage(needs="model")
def layer_specs(model: dict, block_size: int) -> dict:
    """Describe each layer's KV page (model phase: no KV config needed)."""
    return {name: {"heads": heads, "block": block_size} for name, heads in model.items()}


def _free(buffers: dict) -> None:
    FREED.append(f"{len(buffers)} buffers of {sum(buffers.values())} bytes")


@stage(needs="kv_cache_config", teardown=_free)
def buffers(layer_specs: dict, kv_cache_config: dict) -> dict:
    """Size one buffer per layer from the KV config (released by its teardown)."""
    n = kv_cache_config["num_blocks"]
    return {name: n * s["heads"] * s["block"] for name, s in layer_specs.items()}


@stage(needs="kv_cache_config", provides=("total_bytes", "largest"))
def summary(buffers: dict) -> dict:
    """Two outputs from one stage: the total and the largest layer."""
    return {"total_bytes": sum(buffers.values()), "largest": max(buffers, key=buffers.get)}


PIPELINE = Pipeline(
    [summary, buffers, layer_specs],
    start_inputs=("block_size",),
    kv_inputs={"kv_cache_config": REQUIRED, "is_profiling": False},
)


def main() -> None:
    """Run the tour and print what happened."""
    print("order:", " -> ".join(PIPELINE.order))
    run = PIPELINE.start(block_size=16)
    run.load(model={"layer.0": 2, "layer.1": 4})
    run.initialize_kv_cache({"num_blocks": 1}, is_profiling=True)  # a profiling pass
    run.initialize_kv_cache({"num_blocks": 512})  # the real one: the first is torn down
    print("total bytes:", run.outputs["total_bytes"], "largest:", run.outputs["largest"])
    run.close()
    print("freed:", FREED)
    for e in run.trace.events:
        print(
            f"  {e.kind:8} {e.phase:16} gen={e.generation} {e.name:12} "
            f"{e.duration * 1e6:8.1f} us {e.outcome}"
        )
    print("critical path:", " -> ".join(n for n, _ in run.critical_path()))


if __name__ == "__main__":
    main()
