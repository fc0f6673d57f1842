"""Toy: a model stage depends (through another model stage) on a KV stage."""

from initpipe import stage

INITPIPE_INPUTS = {"model": ["model"], "kv_cache_config": ["kv_cache_config"]}


@stage(needs="kv_cache_config")
def groups(kv_cache_config):
    return 1


@stage(needs="model")
def specs(groups, model):
    return 2


@stage(needs="model")
def backends(specs):
    return 3
