"""A malformed @stage: the error surfaces while the module is imported."""

from initpipe import stage


@stage(needs="modle")
def oops(model):
    """Misspelled phase."""
    return 1
