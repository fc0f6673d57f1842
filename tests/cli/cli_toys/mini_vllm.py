"""A small vLLM-shaped catalog: a diamond in the model phase, a KV phase, an ordering edge."""

from initpipe import stage

INITPIPE_INPUTS = {"start": {"vllm_config": None, "device": "cpu"}}


@stage(needs="model")
def attn_layers(model, vllm_config):
    """Find the attention layers of the loaded model."""
    return {"layers.0.attn": object()}


@stage(
    needs="model",
    effects=["shared_kv_cache_layers"],
    meta={"mirrors": ["toyvllm.runner:Runner.get_kv_cache_spec"], "since": "0.1"},
)
def kv_cache_spec(attn_layers, vllm_config):
    """Build each layer's KV cache spec <and> "record" shared layers."""
    return dict.fromkeys(attn_layers, "FullAttentionSpec")


@stage(needs="model")
def attn_backends(attn_layers, device):
    """Pick the attention backend of every layer."""
    return dict.fromkeys(attn_layers, "CPU_ATTN")


@stage(needs="model", provides=("cudagraph_mode", "batch_sizes"), effects=["compilation_config"])
def cudagraph(attn_backends, kv_cache_spec):
    """Resolve the cudagraph mode from the backends."""
    return {"cudagraph_mode": "NONE", "batch_sizes": [1, 2, 4]}


@stage(needs="kv_cache_config", effects=["layer.kv_cache"])
def kv_caches(kv_cache_config, kv_cache_spec, device):
    """Allocate the KV cache tensors and bind them to the layers."""
    return {}


@stage(needs="kv_cache_config")
def metadata_builders(kv_caches, attn_backends, cudagraph_mode, kv_cache_config):
    """Construct one attention metadata builder per KV cache group."""
    return []


@stage(needs="kv_cache_config", after="metadata_builders")
def warm_up(kv_caches, batch_sizes):
    """Touch every KV block once (ordered after the builders)."""
    return True
