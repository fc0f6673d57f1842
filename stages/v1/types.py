"""Plain value types passed between the runner and the catalog stages.

What belongs here: small frozen records of runner facts that stages read. They replace the
``self.*`` attributes ``GPUModelRunner.__init__`` (``vllm/v1/worker/gpu_model_runner.py``)
sets and ``initialize_kv_cache`` reads later, so a stage's inputs say exactly what it uses.
No torch or vllm import.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

import attrs

__all__ = ["InputBatchGeometry", "RunnerSettings", "read_fields"]

T = TypeVar("T")


def read_fields(cls: type[T], obj: Any) -> T:
    """``cls`` (an attrs class) built from ``obj``'s attributes of its fields' names."""
    return cls(**{f.name: getattr(obj, f.name) for f in attrs.fields(cls)})  # type: ignore[arg-type]


@attrs.frozen(kw_only=True)
class RunnerSettings:
    """Runner scalars fixed at construction that the KV phase reads.

    Attributes:
        kv_cache_dtype: the torch dtype of the KV cache (``runner.kv_cache_dtype``).
        max_num_reqs: ``scheduler_config.max_num_seqs``.
        max_num_tokens: ``scheduler_config.max_num_batched_tokens``.
        max_encoder_len: encoder input budget (0 without an encoder).
        uniform_decode_query_len: ``1 + num_spec_tokens``.
        num_spec_tokens: speculative tokens per step.
        is_pooling_model: the runner serves a pooling model.
    """

    kv_cache_dtype: Any
    max_num_reqs: int = attrs.field(validator=attrs.validators.ge(1))
    max_num_tokens: int = attrs.field(validator=attrs.validators.ge(1))
    max_encoder_len: int = attrs.field(validator=attrs.validators.ge(0))
    uniform_decode_query_len: int = attrs.field(validator=attrs.validators.ge(1))
    num_spec_tokens: int = attrs.field(validator=attrs.validators.ge(0))
    is_pooling_model: bool

    @classmethod
    def from_runner(cls, runner: Any) -> RunnerSettings:
        """Read the settings from a constructed ``GPUModelRunner`` (same names)."""
        return read_fields(cls, runner)


def _ints(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


def _items(values: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(values)


@attrs.frozen(kw_only=True)
class InputBatchGeometry:
    """The KV geometry an ``InputBatch`` was built for (the runner's ``_init_*`` fields).

    An empty geometry (``block_sizes=()``) forces a rebuild, as vLLM's
    ``_cleanup_profiling_kv_cache`` forces one by setting ``_init_block_sizes = []``.
    """

    block_sizes: tuple[int, ...] = attrs.field(converter=_ints)
    max_num_blocks: tuple[int, ...] = attrs.field(converter=_ints)
    slot_mapping_modes: tuple[Any, ...] = attrs.field(converter=_items)
    cp_kv_cache_interleave_size: int

    @classmethod
    def from_runner(cls, runner: Any) -> InputBatchGeometry:
        """Read the geometry of the runner's current input batch."""
        return cls(
            block_sizes=runner._init_block_sizes,
            max_num_blocks=runner._init_max_num_blocks,
            slot_mapping_modes=runner._init_slot_mapping_modes,
            cp_kv_cache_interleave_size=runner.cp_kv_cache_interleave_size,
        )
