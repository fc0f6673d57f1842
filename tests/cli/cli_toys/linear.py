"""A linear pipeline: load -> prepare (model phase) -> allocate (KV phase)."""

from initpipe import stage

INITPIPE_INPUTS = {"start": ["vllm_config"]}


@stage(needs="model")
def layers(model, vllm_config):
    """Collect the attention layers."""
    return ["l0", "l1"]


@stage(needs="model")
def spec(layers):
    """Describe each layer's KV cache."""
    return dict.fromkeys(layers, 16)


@stage(needs="kv_cache_config")
def allocate(spec, kv_cache_config):
    """Allocate the KV tensors."""
    return {name: [0] * size for name, size in spec.items()}
