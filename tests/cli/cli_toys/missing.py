"""A stage whose input has a typo: nobody provides 'kv_cache_spce'."""

from initpipe import stage


@stage(needs="model")
def kv_cache_spec(model):
    """Provide the spec."""
    return {}


@stage(needs="kv_cache_config")
def allocate(kv_cache_spce, kv_cache_config):
    """Typo in the input name."""
    return {}
