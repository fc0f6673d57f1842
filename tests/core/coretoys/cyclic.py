"""Toy: a -> b -> c -> a, a cycle through three data keys."""

from initpipe import stage

INITPIPE_INPUTS = {"model": ["model"]}


@stage(needs="model")
def a(c, model):
    return c


@stage(needs="model")
def b(a):
    return a


@stage(needs="model")
def c(b):
    return b
