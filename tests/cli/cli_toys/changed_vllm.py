"""mini_vllm with changes, to diff against: one stage removed, one added, one phase moved."""

from cli_toys.mini_vllm import INITPIPE_INPUTS, attn_backends, attn_layers, kv_caches  # noqa: F401
from initpipe import stage


@stage(needs="kv_cache_config", effects=["shared_kv_cache_layers"])
def kv_cache_spec(attn_layers, vllm_config, kv_cache_config):
    """Now built in the KV phase."""
    return {}


@stage(needs="kv_cache_config")
def metadata_builders(kv_caches, attn_backends, kv_cache_config):
    """No longer reads the cudagraph mode."""
    return []


@stage(needs="kv_cache_config")
def profile(metadata_builders):
    """A new stage."""
    return None
