"""Toy: a diamond top -> (left, right) -> bottom, with a multi-output stage."""

from initpipe import stage

INITPIPE_INPUTS = {"start": [], "model": ["model"], "kv_cache_config": ["kv_cache_config"]}


@stage(needs="model", provides=("left_in", "right_in"))
def top(model):
    return {"left_in": model + 1, "right_in": model + 2}


@stage(needs="model")
def left(left_in):
    return left_in * 10


@stage(needs="model")
def right(right_in):
    return right_in * 100


@stage(needs="kv_cache_config")
def bottom(left, right, kv_cache_config):
    return left + right + kv_cache_config
