"""Toy: a linear chain a -> b (model) -> c -> d (KV)."""

from initpipe import stage

INITPIPE_INPUTS = {"start": ["config"], "model": ["model"], "kv_cache_config": ["kv_cache_config"]}


@stage(needs="model")
def a(config, model):
    """Combine config and model."""
    return config + model


@stage(needs="model")
def b(a):
    return a * 2


@stage(needs="kv_cache_config")
def c(b, kv_cache_config):
    return b + kv_cache_config


@stage(needs="kv_cache_config")
def d(c):
    return c + 1
