"""TRL's weight sync as initpipe's refit, checked against the trainer's own model.

One line after building a TRL trainer that generates with vLLM in colocate mode::

    from initpipe_vllm.integrations.trl import use_initpipe_refit

    trainer = GRPOTrainer(model=..., args=GRPOConfig(use_vllm=True, vllm_mode="colocate"), ...)
    sync = use_initpipe_refit(trainer)  # TRL's weight sync is now a checked refit
    trainer.train()

What it replaces: TRL's ``VLLMGeneration.sync_weights`` (TRL 1.x), which hands each tensor to
the vLLM model's ``load_weights`` and then resets the prefix cache, trusting the result. On
vLLM's CPU build that load fails at the first linear layer (``'Parameter' object has no
attribute 'weight_loader'``: the layer's weight lives packed in a oneDNN kernel), and where it
loads, a tied head or a derived tensor can stay on the old weights unseen. Instead, every sync
is :func:`initpipe_vllm.refit` with the trainer's tensors (handed over in memory: TRL's engine
shares the trainer's process) and ``reference=`` the trainer's model: the engine's prompt
logprobs on a fixed text must agree with the trainer's own forward pass, or the sync raises
:class:`~initpipe_vllm.RefitError` and training stops there, the engine refusing requests.

What it needs: the engine started with initpipe's worker (``INITPIPE_VLLM=1`` in the
environment before the trainer is built), one training process, no sleep mode, no PEFT and
no FSDP or ZeRO-3 (the tensors are read as the model holds them). Anything else is refused
at :func:`use_initpipe_refit`, before training starts, naming what to change.

TRL is imported by nobody here: the trainer object is duck-typed (``trainer.vllm_generation``,
TRL 1.x's).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ..errors import ResizeRefusedError
from ..live.api import refit
from ..live.core.entry import rank_statuses
from ..live.frontend import engine_of, inproc_core
from ..live.refit.engine import refused
from ..live.refit.probe import Probe
from ..live.refit.receipt import RefitReceipt

__all__ = ["DEFAULT_TEXT", "RefitSync", "use_initpipe_refit"]

log = logging.getLogger(__name__)

#: The text the trainer and the engine both score after every sync when none is given: plain
#: English, so a correct engine agrees with the trainer well inside bf16's tolerance while a
#: head left on old weights does not (random tokens blur the two: see the refit page), and
#: longer than one 128-token KV block (130 tokens with SmolLM2's tokenizer), so the probe's
#: warm run reads the prefix cache the cold run filled.
DEFAULT_TEXT = (
    "The capital of France is Paris. It lies on the Seine, in the north of the country, and "
    "it has been the seat of the French government for most of the last thousand years. "
    "Rome is the capital of Italy, and Madrid is the capital of Spain. Water boils at one "
    "hundred degrees Celsius at sea level, and it freezes at zero. The Earth goes around the "
    "Sun once a year, and the Moon goes around the Earth about once a month. A week has "
    "seven days, and a year has twelve months. Bread is made from flour, water, salt and "
    "yeast, and most plants need light, water and air to grow."
)


def _generation(trainer: Any) -> Any:
    gen = getattr(trainer, "vllm_generation", None)
    if gen is None:
        raise refused(
            "arguments",
            f"{type(trainer).__name__} has no vllm_generation: build the trainer with "
            "use_vllm=True and vllm_mode='colocate' in its config (TRL 1.x's GRPOTrainer, "
            "RLOOTrainer...)",
        )
    mode = getattr(gen, "mode", None)
    if mode != "colocate":
        raise refused(
            "arguments",
            f"vllm_mode={mode!r}: the refit runs where the engine shares the trainer's "
            "process; set vllm_mode='colocate' (for a server, check its weights after TRL's "
            "sync with `initpipe check-weights`)",
        )
    if getattr(gen, "enable_sleep_mode", False):
        raise refused(
            "arguments",
            "vllm_enable_sleep_mode=True: the refit does not wake a sleeping engine; "
            "turn sleep mode off",
        )
    return gen


def _check_trainer(trainer: Any) -> Any:
    """The unwrapped model, after refusing the set-ups whose tensors are not the model's."""
    accelerator = getattr(trainer, "accelerator", None)
    processes = getattr(accelerator, "num_processes", 1)
    if processes != 1:
        raise refused(
            "arguments",
            f"{processes} training processes: the adapter runs one (each rank's engine "
            "would need its own shard); run a single process",
        )
    model = trainer.model
    if accelerator is not None and hasattr(accelerator, "unwrap_model"):
        model = accelerator.unwrap_model(model)
    if hasattr(model, "peft_config") or hasattr(model, "merge_adapter"):
        raise refused(
            "arguments",
            "a PEFT model: the adapter hands the engine the model's own tensors, and a "
            "PEFT model's are unmerged; merge the adapters (merge_and_unload) or use TRL's sync",
        )
    dist = getattr(getattr(trainer, "vllm_generation", None), "_dist", None)
    if getattr(dist, "is_fsdp", False) or getattr(dist, "is_zero3", False):
        raise refused("arguments", "FSDP or DeepSpeed ZeRO-3 shards the weights: not supported")
    return model


def _check_engine(llm: Any) -> None:
    """Refuse an engine a refit cannot follow (not initpipe's worker, above all) now, as the
    refit itself would at the first sync."""
    core = inproc_core(engine_of(llm, refused))
    if core is None:
        raise refused(
            "engine",
            "the engine core runs in its own process, not the trainer's: TRL's colocate mode "
            "runs it in the trainer's process (VLLM_ENABLE_V1_MULTIPROCESSING=0)",
        )
    try:
        rank_statuses(core, ("resize", "refit"))
    except ResizeRefusedError as err:
        raise refused("engine", err.reason) from None


def _prompts(trainer: Any, text: str | None, prompts: Sequence[Sequence[int]] | None) -> Any:
    if prompts is not None:
        if text is not None:
            raise refused("arguments", "give text= or prompts=, not both")
        return tuple(tuple(int(t) for t in p) for p in prompts)
    tokenizer = getattr(trainer, "processing_class", None)
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's tokenizer
    if tokenizer is None or not callable(tokenizer):
        raise refused(
            "arguments",
            "the trainer has no tokenizer (processing_class) to turn the check's text into "
            "tokens: pass prompts= (token ids)",
        )
    ids = list(tokenizer(DEFAULT_TEXT if text is None else text)["input_ids"])
    if len(ids) < 2:
        raise refused("arguments", f"text={text!r} is {len(ids)} token(s): give at least two")
    return (tuple(int(t) for t in ids),)


@attrs.define(kw_only=True)
class RefitSync:
    """TRL's ``sync_weights`` replaced: each call is one checked refit.

    Attributes:
        trainer: the TRL trainer it syncs from.
        prompts: the token-id prompts the engine and the trainer's model both score.
        tolerance: ``(per position, on average)`` for the check; None: the engine dtype's.
        receipts: every refit's receipt, in order.
        seconds: per sync, the wall time of reading the tensors, the reference pass and the
            refit together.
        on_receipt: called with each receipt (default: its first line logged at INFO).
    """

    trainer: Any
    prompts: tuple[tuple[int, ...], ...]
    tolerance: tuple[float, float] | None = None
    receipts: list[RefitReceipt] = attrs.field(factory=list)
    seconds: list[float] = attrs.field(factory=list)
    on_receipt: Callable[[RefitReceipt], None] | None = None

    def weights(self) -> list[tuple[str, Any]]:
        """The trainer's tensors under the names vLLM loads (TRL's own naming)."""
        gen = self.trainer.vllm_generation
        named = getattr(gen, "_iter_named_params", None)
        if named is not None:
            return [(name, tensor.detach()) for name, tensor in named()]
        model = _check_trainer(self.trainer)
        return [(name, p.detach()) for name, p in model.named_parameters()]

    def __call__(self) -> RefitReceipt:
        start = time.perf_counter()
        gen = self.trainer.vllm_generation
        model = _check_trainer(self.trainer)
        probe: dict[str, Any] = {"prompts": self.prompts}
        if self.tolerance is not None:
            probe["reference_tolerance"] = self.tolerance
        step = getattr(getattr(self.trainer, "state", None), "global_step", None)
        receipt = refit(
            gen.llm,
            self.weights(),
            probe=probe,
            reference=model,
            version=None if step is None else f"step-{step}",
        )
        self.seconds.append(time.perf_counter() - start)
        self.receipts.append(receipt)
        if self.on_receipt is not None:
            self.on_receipt(receipt)
        else:
            log.info("%s", str(receipt).splitlines()[0])
        return receipt


def use_initpipe_refit(
    trainer: Any,
    *,
    text: str | None = None,
    prompts: Sequence[Sequence[int]] | None = None,
    tolerance: tuple[float, float] | None = None,
    on_receipt: Callable[[RefitReceipt], None] | None = None,
) -> RefitSync:
    """Make ``trainer``'s weight sync a refit checked against its own model; return the
    sync (its ``receipts`` and ``seconds`` grow with every step).

    Args:
        trainer: a TRL trainer generating with vLLM in colocate mode (``use_vllm=True``,
            ``vllm_mode="colocate"``), its engine started with initpipe's worker
            (``INITPIPE_VLLM=1``).
        text: the text both score after each sync (default :data:`DEFAULT_TEXT`), tokenized
            by the trainer's ``processing_class``.
        prompts: token-id prompts instead of ``text``.
        tolerance: ``(per position, on average)`` in nats; default: the engine dtype's.
        on_receipt: called with each refit's receipt (default: its first line logged).

    Raises:
        RefitRefusedError: a set-up the adapter cannot sync (the message says what to change);
            the trainer is left as it was.
    """
    gen = _generation(trainer)
    _check_trainer(trainer)
    found = _prompts(trainer, text, prompts)
    bad = Probe(prompts=found, reference_tolerance=tolerance).problems()
    if bad:
        raise refused("arguments", "; ".join(bad))
    _check_engine(gen.llm)
    sync = RefitSync(trainer=trainer, prompts=found, tolerance=tolerance, on_receipt=on_receipt)
    gen.sync_weights = sync
    return sync
