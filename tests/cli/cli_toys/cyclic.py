"""Two model stages that need each other."""

from initpipe import stage


@stage(needs="model")
def a(b, model):
    """Needs b."""
    return 1


@stage(needs="model")
def b(a):
    """Needs a."""
    return 2
