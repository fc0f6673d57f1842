"""``use_initpipe_refit``'s refusals: each set-up the adapter cannot sync is refused before
training, naming what to change, and the trainer is left as it was. Duck-typed trainers
(what the adapter reads of TRL's), no engine: the adapter on TRL's real GRPOTrainer runs in
``test_trl_grpo.py``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from initpipe_vllm import RefitRefusedError
from initpipe_vllm.integrations.trl import DEFAULT_TEXT, use_initpipe_refit


def _sync() -> None:
    raise AssertionError("TRL's own sync ran")


def _trainer(**gen: Any) -> Any:
    generation = SimpleNamespace(
        mode="colocate", enable_sleep_mode=False, llm=object(), sync_weights=_sync
    )
    for key, value in gen.items():
        setattr(generation, key, value)
    return SimpleNamespace(
        vllm_generation=generation,
        accelerator=SimpleNamespace(num_processes=1, unwrap_model=lambda m: m),
        model=SimpleNamespace(),
        processing_class=lambda text: {"input_ids": list(range(len(text.split())))},
    )


@pytest.mark.parametrize(
    ("change", "culprit"),
    [
        (lambda t: delattr(t, "vllm_generation"), "use_vllm=True"),
        (lambda t: setattr(t.vllm_generation, "mode", "server"), "vllm_mode='colocate'"),
        (lambda t: setattr(t.vllm_generation, "enable_sleep_mode", True), "sleep mode"),
        (lambda t: setattr(t.accelerator, "num_processes", 2), "2 training processes"),
        (lambda t: setattr(t.model, "peft_config", {}), "PEFT"),
        (lambda t: setattr(t.vllm_generation, "_dist", SimpleNamespace(is_fsdp=True)), "FSDP"),
        (lambda t: setattr(t, "processing_class", None), "pass prompts="),
    ],
)
def test_a_setup_the_adapter_cannot_sync_is_refused_naming_what_to_change(
    change: Any, culprit: str
) -> None:
    trainer = _trainer()
    change(trainer)
    before = getattr(getattr(trainer, "vllm_generation", None), "sync_weights", None)
    with pytest.raises(RefitRefusedError, match=culprit.replace("(", r"\(")) as err:
        use_initpipe_refit(trainer)
    assert err.value.step == "arguments" and err.value.serving
    assert getattr(getattr(trainer, "vllm_generation", None), "sync_weights", None) is before


@pytest.mark.parametrize(
    ("kwargs", "culprit"),
    [
        ({"text": "one"}, "1 token"),
        ({"text": "a b", "prompts": [[1, 2]]}, "not both"),
        ({"prompts": [[1, 2]], "tolerance": (-1.0, 0.1)}, "reference_tolerance"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], culprit: str) -> None:
    with pytest.raises(RefitRefusedError, match=culprit):
        use_initpipe_refit(_trainer(), **kwargs)


def test_the_check_scores_the_default_text_through_the_trainers_tokenizer() -> None:
    """Without ``text=`` or ``prompts=``, the check's one prompt is :data:`DEFAULT_TEXT`
    through ``processing_class`` (here a word counter: one id per word)."""
    from initpipe_vllm.integrations.trl import _prompts

    (prompt,) = _prompts(_trainer(), None, None)
    assert prompt == tuple(range(len(DEFAULT_TEXT.split())))
    assert _prompts(_trainer(), "two words", None) == ((0, 1),)


def test_an_object_that_is_not_an_engine_is_refused_after_the_trainer_checks() -> None:
    """A trainer that passes every check, its ``llm`` not a vLLM engine: refused at the
    engine check, naming it; TRL's own sync stays in place."""
    trainer = _trainer()
    with pytest.raises(RefitRefusedError, match="is not a vLLM LLM"):
        use_initpipe_refit(trainer)
    assert trainer.vllm_generation.sync_weights is _sync
