"""Units of a refit's checks, on small torch modules and vLLM's own layer methods (no
engine): the load check against a fresh load (:mod:`initpipe_vllm.live.refit.coverage`), the
weights' schema rules (a tied head's copy, dtype casts) and the probe's tolerance.
The engine-level proofs are ``test_refit_models.py`` and ``test_refit.py``."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch

from initpipe_vllm.live.refit import coverage
from initpipe_vllm.live.refit.probe import DTYPE_ATOL, _agreeing, default_atol
from initpipe_vllm.live.refit.weights import casts, mismatches, tied_copies


class Tied(torch.nn.Module):
    """An embedding, a norm and a head tied to the embedding, as vLLM's tied models are."""

    def __init__(self) -> None:
        super().__init__()
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            UnquantizedEmbeddingMethod,
        )

        self.embed = torch.nn.Module()
        self.embed.weight = torch.nn.Parameter(torch.randn(64, 32), requires_grad=False)
        self.embed.quant_method = UnquantizedEmbeddingMethod()
        self.norm = torch.nn.Module()
        self.norm.weight = torch.nn.Parameter(torch.ones(32), requires_grad=False)
        self.head = torch.nn.Module()
        self.head.weight = self.embed.weight
        self.head.quant_method = UnquantizedEmbeddingMethod()


def _loaded(model: Any, *, skip: tuple[str, ...] = ()) -> coverage.ReloadLog:
    """A log as vLLM's layerwise reload leaves it: the embedding and the norm processed with
    their weights written; the tied head never reached."""
    log = coverage.ReloadLog()
    for name in ("embed", "norm"):
        if name not in skip:
            log.processed[name] = "layerwise"
            log.written[name] = {"weight"}
    return log


@pytest.fixture
def tied() -> Tied:
    torch.manual_seed(0)
    model = Tied()
    for module in (model.embed, model.head):  # the fresh load's processing
        module.quant_method.process_weights_after_loading(module)
    return model


def test_a_fresh_load_records_what_it_derives_and_ties(tied: Tied) -> None:
    record = coverage.record_fresh_load(tied)
    assert record.derived == {"embed", "head"}
    assert record.ties == (("embed.weight", "head.weight"),)
    assert coverage.fresh_load(tied) is record
    assert coverage.unrepairable(tied, record) == []  # not VocabParallelEmbedding: by type


def _vocab_layer(weight: torch.nn.Parameter, method: Any) -> Any:
    """A vLLM ``VocabParallelEmbedding`` (what the refusal looks for, by type) holding
    ``weight``, built without a tensor-parallel group."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    layer = VocabParallelEmbedding.__new__(VocabParallelEmbedding)
    torch.nn.Module.__init__(layer)
    layer.weight = weight
    layer.quant_method = method
    return layer


def test_a_tied_head_initpipe_cannot_reprocess_is_refused_by_name() -> None:
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    class Packed(QuantizeMethodBase):  # a quantized head's processing: not re-runnable
        def create_weights(self, *args: Any, **kwargs: Any) -> None: ...

        def apply(self, *args: Any, **kwargs: Any) -> Any: ...

    model = torch.nn.Module()
    weight = torch.nn.Parameter(torch.randn(64, 32), requires_grad=False)
    model.embed = _vocab_layer(weight, UnquantizedEmbeddingMethod())
    model.head = _vocab_layer(weight, UnquantizedEmbeddingMethod())
    record = coverage.record_fresh_load(model)
    assert coverage.unrepairable(model, record) == []
    model.head.quant_method = Packed()
    record = coverage.record_fresh_load(model)
    lines = coverage.unrepairable(model, record)
    assert len(lines) == 1 and lines[0].startswith("head (Packed) is tied to embed:")
    model.head.weight = torch.nn.Parameter(weight.detach().clone(), requires_grad=False)
    record = coverage.record_fresh_load(model)
    assert coverage.unrepairable(model, record) == []  # untied: the reload loads it


class SelfLoading(torch.nn.Module):
    """A model whose ``load_weights`` loads ``a`` through its weight loader, ``b`` through
    vLLM's default loader (no attribute), picking the call by comparing the loader with
    ``default_weight_loader`` as Llama 4 and GPT-OSS do, and writes ``sink`` itself, as
    GPT-OSS does."""

    def __init__(self) -> None:
        super().__init__()
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        self.a = torch.nn.Parameter(torch.zeros(4), requires_grad=False)
        self.a.weight_loader = default_weight_loader  # set, as vLLM's layers set theirs
        self.b = torch.nn.Parameter(torch.zeros(4), requires_grad=False)
        self.sink = torch.nn.Parameter(torch.zeros(2), requires_grad=False)

    def load_weights(self, weights: Any) -> set[str]:
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        for name, t in weights:
            param = getattr(self, name)
            loader = getattr(param, "weight_loader", default_weight_loader)
            if name == "sink":
                param.copy_(t)
            elif loader == default_weight_loader:
                loader(param, t)
            else:
                loader(param, t, "shard")  # a stacked parameter's call: not these
        return {n for n, _t in weights}


def test_a_fresh_load_records_what_load_weights_writes_outside_the_loaders() -> None:
    """Watched as vLLM's reload would see it; the load itself and the loaders unchanged
    (a loader compared with ``default_weight_loader`` still is it)."""
    from initpipe_vllm.hook.fresh_load import _OUTSIDE, _watching_loaders

    model = SelfLoading()
    loader_a = model.a.weight_loader
    weights = [("a", torch.ones(4)), ("b", torch.full((4,), 2.0)), ("sink", torch.ones(2))]
    assert _watching_loaders(model)(weights) == {"a", "b", "sink"}
    assert _OUTSIDE.pop(id(model)) == {"sink"}
    assert model.a.tolist() == [1.0] * 4 and model.b.tolist() == [2.0] * 4
    assert model.sink.tolist() == [1.0, 1.0]
    assert model.a.weight_loader is loader_a and not hasattr(model.b, "weight_loader")
    record = attrs.evolve(coverage.record_fresh_load(model), outside=frozenset({"sink"}))
    (line,) = coverage.unrepairable(model, record)
    assert line.startswith(
        "1 parameter is written by SelfLoading.load_weights outside their weight "
        "loaders (sink): vLLM's layerwise reload"
    )


def test_a_tied_head_left_unprocessed_is_repaired_then_passes(tied: Tied) -> None:
    record = coverage.record_fresh_load(tied)
    with torch.no_grad():
        tied.embed.weight.copy_(torch.randn(64, 32))  # the reload writes the shared storage
    tied.embed.quant_method.process_weights_after_loading(tied.embed)  # and processes it
    log = _loaded(tied)
    before = coverage.check(tied, record, log)
    assert any("head: its post-load processing" in p for p in before.problems)
    if hasattr(tied.head, "cpu_linear"):  # on CPU: the head's kernel holds the old copy
        assert any("head: its packed kernel computes other values" in p for p in before.problems)
    assert coverage.repair(tied, record, log) == {"head": "embed.weight"}
    after = coverage.check(tied, record, log)
    assert after.problems == ()
    assert (after.written, after.tied, after.ties) == (2, 1, 1)


def test_a_parameter_no_loader_wrote_is_named(tied: Tied) -> None:
    record = coverage.record_fresh_load(tied)
    log = _loaded(tied, skip=("norm",))
    coverage.repair(tied, record, log)
    problems = coverage.check(tied, record, log).problems
    assert [p for p in problems if "norm.weight was not written" in p]


def test_a_tie_undone_or_made_is_named(tied: Tied) -> None:
    record = coverage.record_fresh_load(tied)
    log = _loaded(tied)
    coverage.repair(tied, record, log)
    tied.head.weight = torch.nn.Parameter(tied.embed.weight.detach().clone())
    problems = coverage.check(tied, record, log).problems
    assert "tie undone: embed.weight and head.weight no longer share storage" in problems
    tied.head.weight = tied.embed.weight
    tied.norm.weight = tied.head.weight  # a tie a fresh load does not have
    problems = coverage.check(tied, record, log).problems
    assert any(
        p.startswith("new tie: embed.weight and head.weight and norm.weight") for p in problems
    )


def test_a_layer_processed_with_part_of_its_elements_is_named(tied: Tied) -> None:
    record = coverage.record_fresh_load(tied)
    log = _loaded(tied)
    coverage.repair(tied, record, log)
    log.partial["embed"] = (1024, 2048)
    problems = coverage.check(tied, record, log).problems
    assert problems == (
        "embed was processed with 1024 of its 2048 elements loaded: the rest "
        "hold no checkpoint data",
    )


def test_the_bytes_a_fresh_load_keeps_are_compared_with_the_checkpoints(tied: Tied) -> None:
    record = coverage.record_fresh_load(tied)
    record = type(record)(
        derived=record.derived,
        ties=record.ties,
        methods=record.methods,
        kept=frozenset({"norm.weight"}),
    )
    log = _loaded(tied)
    coverage.repair(tied, record, log)
    source = torch.ones(32)
    log.copies.append(("norm", "weight", 0, (32,), (1,), torch.float32, coverage.checksum(source)))
    ok = coverage.check(tied, record, log)
    assert ok.problems == () and (ok.tensors_compared, ok.bytes_compared) == (1, 128)
    with torch.no_grad():
        tied.norm.weight[3] = 2.0
    problems = coverage.check(tied, record, log).problems
    assert problems == (
        "norm.weight holds other bytes than the checkpoint tensor its loader "
        "copied (a fresh load leaves it as loaded)",
    )


def test_a_tied_heads_copy_is_recognised_and_dtypes_cast_as_a_fresh_load_does() -> None:
    reference = {"embed.weight": ((4, 2), "bfloat16"), "norm.weight": ((2,), "bfloat16")}
    new = {
        "embed.weight": ((4, 2), "float32"),
        "norm.weight": ((2,), "float32"),
        "lm_head.weight": ((4, 2), "float32"),
    }
    ties = [("embed.weight", "lm_head.weight")]
    copies = tied_copies(reference, new, ties)
    assert copies == {"lm_head.weight": "embed.weight"}
    assert mismatches(reference, new, redundant=copies) == []
    assert mismatches(reference, new) == ["unexpected tensor 'lm_head.weight'"]
    assert casts(reference, new) == {"float32->bfloat16": 2}
    quantized = {**new, "norm.weight": ((2,), "int8")}
    assert mismatches(reference, quantized, redundant=copies) == [
        "tensor 'norm.weight' has dtype int8, expected bfloat16"
    ]


def test_the_probes_tolerance_follows_the_dtype() -> None:
    assert default_atol(torch.float32) == DTYPE_ATOL["float32"] == 1e-3
    assert default_atol("bfloat16") == 0.25 and default_atol(torch.float16) == 0.05


def test_a_greedy_pick_at_a_near_tie_is_no_fault_and_a_far_one_is() -> None:
    cold = {"tokens": [5, 7, 9], "logprobs": [-0.5, -1.20, -0.3]}
    near = {"tokens": [5, 8, 2], "logprobs": [-0.5, -1.21, -2.0]}
    assert _agreeing(cold, near, 0.05) == (2, "")
    far = {"tokens": [5, 8, 2], "logprobs": [-0.5, -2.5, -2.0]}
    n, why = _agreeing(cold, far, 0.05)
    assert n == 1 and "not a near tie" in why and "position 1" in why
    assert _agreeing(cold, cold, 0.0) == (3, "")
