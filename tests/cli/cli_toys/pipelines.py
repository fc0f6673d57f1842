"""module:attribute targets: a Pipeline object, a list of stages, a factory, a non-pipeline."""

from initpipe import Pipeline, stage


@stage(needs="model")
def first(model):
    """Start from the model."""
    return 1


@stage(needs="kv_cache_config")
def second(first, kv_cache_config):
    """Use the KV config."""
    return 2


PIPELINE = Pipeline([first, second], name="two-stage")
STAGES = [first, second]
NOT_A_PIPELINE = 42


def make() -> Pipeline:
    """Build the pipeline on demand."""
    return PIPELINE


class Holder:
    """Holds a pipeline as a class attribute (dotted attribute paths)."""

    pipeline = PIPELINE
