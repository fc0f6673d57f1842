"""Toy: two stages need 'kv_cache_confg' (a typo), which nobody provides."""

from initpipe import stage

INITPIPE_INPUTS = {"model": ["model"], "kv_cache_config": ["kv_cache_config"]}


@stage(needs="kv_cache_config")
def groups(model, kv_cache_confg):
    return 1


@stage(needs="kv_cache_config")
def tensors(groups, kv_cache_confg):
    return 2
