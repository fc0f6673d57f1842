"""Resolving TARGET: a module, or module:attribute (Pipeline, list, factory, dotted path)."""

from __future__ import annotations

import pytest

from initpipe import Pipeline, PipelineValidationError, StageDeclarationError
from initpipe.cli.target import DEFAULT_TARGET, load_pipeline
from initpipe.errors import TargetError


def test_module_target_collects_top_level_stages_and_inputs() -> None:
    p = load_pipeline("cli_toys.mini_vllm")
    assert p.name == "cli_toys.mini_vllm"
    assert p.order[0] == "attn_layers"
    assert p.inputs["start"] == {"vllm_config": None, "device": "cpu"}


@pytest.mark.parametrize("attr", ["PIPELINE", "make", "Holder.pipeline"])
def test_attribute_target_returns_the_pipeline(attr: str) -> None:
    from cli_toys import pipelines

    assert load_pipeline(f"cli_toys.pipelines:{attr}") is pipelines.PIPELINE


def test_list_attribute_becomes_a_pipeline_named_after_the_target() -> None:
    p = load_pipeline("cli_toys.pipelines:STAGES")
    assert isinstance(p, Pipeline)
    assert (p.name, p.order) == ("cli_toys.pipelines:STAGES", ["first", "second"])


def test_default_target_is_the_vllm_catalog_with_enabled_extensions(monkeypatch) -> None:
    monkeypatch.delenv("INITPIPE_EXTENSIONS", raising=False)
    from initpipe import Pipeline

    pipeline = load_pipeline(DEFAULT_TARGET)
    assert pipeline.order == Pipeline.from_module("initpipe_vllm").order
    assert all(s.package is None for s in pipeline.specs.values())


@pytest.mark.parametrize(
    ("target", "match"),
    [
        ("no_such_module_xyz", "no module named 'no_such_module_xyz'"),
        (
            "cli_toys.needs_missing_dep",
            "needs 'initpipe_no_such_dependency', which is not installed",
        ),
        ("cli_toys.empty", "declares no stages"),
        ("cli_toys.pipelines:PIPELNE", "has no attribute 'PIPELNE'. Did you mean 'PIPELINE'"),
        ("cli_toys.pipelines:NOT_A_PIPELINE", "is of type int; expected a Pipeline"),
        ("cli_toys.pipelines:", "bad target"),
        (":PIPELINE", "bad target"),
    ],
)
def test_bad_targets_raise_target_error(target: str, match: str) -> None:
    with pytest.raises(TargetError, match=match):
        load_pipeline(target)


def test_invalid_pipeline_raises_with_every_problem() -> None:
    with pytest.raises(PipelineValidationError) as info:
        load_pipeline("cli_toys.broken")
    kinds = sorted(type(p).__name__ for p in info.value.problems)
    assert kinds == [
        "CycleError",
        "DuplicateProducerError",
        "MissingInputError",
        "PhaseViolationError",
    ]


def test_malformed_stage_surfaces_its_declaration_error() -> None:
    with pytest.raises(StageDeclarationError, match="needs='modle'") as info:
        load_pipeline("cli_toys.bad_declaration")
    assert info.value.field == "needs"
