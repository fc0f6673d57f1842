"""An extension names the pipelines it is written for (``Extension.applies_to``): enabled,
it changes only those (a host with two catalogs, v1 and Model Runner V2, picks one per
worker) and leaves any other pipeline as it is."""

import pytest
from coretoys import linear

from initpipe import Extension, Pipeline, apply_extensions, stage


@stage(needs="model", provides="b")
def triple(a):
    return a * 3


def _pipeline(name: str) -> Pipeline:
    return Pipeline.from_module(linear, name=name)


def _b(p: Pipeline) -> int:
    run = p.start(config=1)
    run.load(model=1)
    return run.outputs["b"]


def test_an_extension_changes_only_the_pipelines_it_names():
    ext = Extension(name="x", replace={"b": triple}, applies_to=["catalog_v1"])
    v1, v2 = _pipeline("catalog_v1"), _pipeline("catalog_v2")
    assert ext.applies("catalog_v1") and not ext.applies("catalog_v2")
    assert _b(apply_extensions(v1, [ext])) == 6  # replaced
    assert apply_extensions(v2, [ext]) is v2  # untouched: not even rebuilt
    assert _b(v2) == 4


def test_without_applies_to_an_extension_applies_to_every_pipeline():
    ext = Extension(name="x", replace={"b": triple})
    assert ext.applies_to == () and ext.applies("anything")
    assert _b(apply_extensions(_pipeline("catalog_v2"), [ext])) == 6


def test_applies_to_takes_pipeline_names_only():
    with pytest.raises(TypeError):
        Extension(name="x", applies_to=[1])
