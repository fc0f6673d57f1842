"""Every kind of graph problem at once: cycle, missing input, duplicate producer, phase."""

from initpipe import stage


@stage(needs="model")
def ping(pong, model):
    """Half of a cycle."""
    return 1


@stage(needs="model")
def pong(ping):
    """The other half."""
    return 2


@stage(needs="model", provides="weights")
def load_a(model, nowhere):
    """Provides weights and needs a key nobody provides."""
    return 3


@stage(needs="model", provides="weights")
def load_b(model):
    """Provides weights too."""
    return 4


@stage(needs="kv_cache_config")
def kv_side(kv_cache_config):
    """A KV-phase stage."""
    return 5


@stage(needs="model")
def too_early(kv_side):
    """A model stage reading a KV-phase output."""
    return 6
