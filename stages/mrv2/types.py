"""Plain value types of the Model Runner V2 catalog.

What belongs here: frozen records of the runner facts MRv2's stages read, in place of the
``self.*`` attributes ``GPUModelRunner.__init__`` (``vllm/v1/worker/gpu/model_runner.py``)
sets and ``load_model`` / ``initialize_kv_cache`` read later. No torch or vllm import.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from ..v1.types import read_fields

__all__ = ["BlockTableGeometry", "RunnerV2Settings"]


@attrs.frozen(kw_only=True)
class RunnerV2Settings:
    """Scalars MRv2's ``__init__`` fixes and its initialization reads.

    Attributes:
        max_num_reqs: ``scheduler_config.max_num_seqs``.
        max_num_tokens: ``scheduler_config.max_num_batched_tokens``.
        vocab_size: the model's vocabulary size.
        num_speculative_steps: ``vllm_config.num_speculative_tokens``.
        is_pooling_model: ``runner_type == "pooling"``.
        is_first_pp_rank / is_last_pp_rank: this worker's place in the pipeline.
        is_encoder_decoder: the model has cross-attention.
        supports_mm_inputs: the model takes multimodal inputs.
        dcp_size / dcp_rank: decode context parallelism.
    """

    max_num_reqs: int = attrs.field(validator=attrs.validators.ge(1))
    max_num_tokens: int = attrs.field(validator=attrs.validators.ge(1))
    vocab_size: int = attrs.field(validator=attrs.validators.ge(1))
    num_speculative_steps: int = attrs.field(validator=attrs.validators.ge(0))
    is_pooling_model: bool
    is_first_pp_rank: bool
    is_last_pp_rank: bool
    is_encoder_decoder: bool
    supports_mm_inputs: bool
    dcp_size: int = attrs.field(validator=attrs.validators.ge(1))
    dcp_rank: int = attrs.field(validator=attrs.validators.ge(0))

    @classmethod
    def from_runner(cls, runner: Any) -> RunnerV2Settings:
        """Read the settings from a constructed MRv2 ``GPUModelRunner`` (same names)."""
        return read_fields(cls, runner)


def _ints(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


def _bools(values: Iterable[bool]) -> tuple[bool, ...]:
    return tuple(bool(v) for v in values)


@attrs.frozen(kw_only=True)
class BlockTableGeometry:
    """Per KV cache group: what MRv2's ``BlockTables`` is built from.

    Attributes:
        block_sizes: each group's manager block size.
        max_num_blocks_per_group: each group's block-table width (topology-aware, aligned).
        slot_mapping_enabled: whether the group's layers use a slot mapping.
        dcp_sharded: whether the group's cache is sharded over DCP ranks.
        cp_interleave: ``parallel_config.cp_kv_cache_interleave_size`` at KV time.
        sliding_window_reach: each group's sliding-window reach (the tokens below a
            request's first scheduled position attention may still read; 0: not a sliding
            window), for the releases whose ``BlockTables`` takes it (0.33.0); None where
            the release's does not.
    """

    block_sizes: tuple[int, ...] = attrs.field(converter=_ints)
    max_num_blocks_per_group: tuple[int, ...] = attrs.field(converter=_ints)
    slot_mapping_enabled: tuple[bool, ...] = attrs.field(converter=_bools)
    dcp_sharded: tuple[bool, ...] = attrs.field(converter=_bools)
    cp_interleave: int
    sliding_window_reach: tuple[int, ...] | None = attrs.field(
        default=None, converter=attrs.converters.optional(_ints)
    )
