"""An extension names the pipelines it is written for (``Extension.applies_to``): enabled,
it changes only those (a host with two catalogs, v1 and Model Runner V2, picks one per
worker) and leaves any other pipeline as it is."""

import pytest
from coretoys import linear

from initpipe import Extension, Pipeline, apply_extensions, stage
from initpipe.errors import ExtensionError, UnknownStageNameError


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


# -- remove: a variant that drops a stage, or changes outputs (remove, then add) -----------
@stage(needs="kv_cache_config", provides="e")
def e_from_b(b, kv_cache_config):
    return b * 10 + kv_cache_config


def test_an_extension_removes_stages_then_adds_their_variant():
    ext = Extension(name="v", remove=("c", "d"), add=(e_from_b,), applies_to=["catalog_v1"])
    p = apply_extensions(_pipeline("catalog_v1"), [ext])
    assert p.order == ["a", "b", "e_from_b"]
    run = p.start(config=1)
    run.load(model=1)
    run.initialize_kv_cache(kv_cache_config=5)
    assert run.outputs["e"] == 45
    assert ext.remove == ("c", "d") and Extension(name="w", remove="d").remove == ("d",)


def test_removing_a_stage_another_reads_names_the_reader():
    ext = Extension(name="v", remove="c")
    with pytest.raises(ExtensionError, match="extension 'v' cannot be applied") as info:
        apply_extensions(_pipeline("catalog_v1"), [ext])
    assert any("'c'" in str(p) and "d" in str(p) for p in info.value.problems)


def test_removing_an_unknown_stage_suggests_close_names():
    with pytest.raises(UnknownStageNameError, match=r"no stage 'cc'.*Did you mean 'c'"):
        _pipeline("p").remove("cc")
