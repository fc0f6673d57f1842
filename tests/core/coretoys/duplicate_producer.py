"""Toy: two stages both provide 'kv_caches'."""

from initpipe import stage

INITPIPE_INPUTS = {"model": ["model"], "kv_cache_config": ["kv_cache_config"]}


@stage(needs="kv_cache_config", provides="kv_caches")
def allocate(kv_cache_config):
    return 1


@stage(needs="kv_cache_config", provides="kv_caches")
def allocate_again(kv_cache_config):
    return 2
