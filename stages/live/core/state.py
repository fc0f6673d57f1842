"""What the live package keeps on vLLM's ``EngineCore`` between calls.

What belongs here: :class:`EngineState` (serving, released or failed; the action running;
what the next resume or refit starts from), read and written by every room, and the words a
request is refused with while the engine is ``failed``. A room keeps its own state beside
it (the refit's :class:`~initpipe_vllm.live.refit.engine.WeightsState`).
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from ...contract.declare import vllm_uses

__all__ = [
    "EngineState",
    "engine_state",
    "failed_message",
    "failure_text",
    "released_figures",
    "weights_version",
]


@attrs.define
class EngineState:
    """What the live transactions keep on the engine core between calls."""

    #: ``failed``: a weight refit failed; no KV cache, requests refused until one succeeds
    state: Literal["serving", "released", "failed"] = "serving"
    resume_blocks: int | None = None
    #: the pause state the user had set before a release (restored by the resume)
    user_pause: Any = None
    bytes_per_rank: tuple[int, ...] = ()
    #: the last resize, release or resume's report (a ``ResizeReport``)
    last_report: Any = None
    #: the action accepted and not yet answered (a second one is refused meanwhile)
    busy: str | None = None
    #: which vLLM model runner the workers run ("v1" or "v2"), read from rank 0 once
    model_runner: str | None = None
    #: the vLLM release the contract matched (``Verdict.release``), read at each check
    release: str | None = None
    #: the weights version (vLLM's ``get_weight_version()``) the prefix cache's blocks were
    #: computed under: vLLM's start value, then the version at each transaction that
    #: emptied or kept the cache (a refit's new one)
    cache_weights: str = "default"
    #: while ``failed``: where the last refit failed (``step``, ``rank``, ``error``)
    failure: dict[str, Any] | None = None


def engine_state(core: Any) -> EngineState:
    """``core``'s live state (created serving on first use)."""
    st = getattr(core, "_initpipe_kv_state", None)
    if st is None:
        st = core._initpipe_kv_state = EngineState()
    return st


@vllm_uses("resize", calls=("vllm.v1.engine.core:EngineCore.get_weight_version",))
def weights_version(core: Any) -> str:
    """vLLM's weights version of the engine (``EngineCore.get_weight_version``)."""
    return str(core.get_weight_version())


def released_figures(core: Any) -> None:
    """While released (or failed) the engine reports no KV capacity."""
    cache = core.vllm_config.cache_config
    cache.num_gpu_blocks = 0
    cache.kv_cache_size_tokens = 0
    cache.kv_cache_max_concurrency = 0.0


def failure_text(failure: dict[str, Any] | None) -> str:
    """What a request or a refused action is told while the last refit has failed."""
    f = failure or {}
    on_rank = "" if f.get("rank") is None else f" on rank {f['rank']}"
    return (
        f"the engine's last weight refit failed at step {f.get('step')!r}{on_rank} "
        f"({f.get('error')}): it serves nothing until a refit succeeds "
        "(initpipe_vllm.refit, or POST /initpipe/weights/refit)"
    )


def failed_message(core: Any) -> str | None:
    """:func:`failure_text` while the engine is ``failed`` (None: it is not)."""
    st = engine_state(core)
    return failure_text(st.failure) if st.state == "failed" else None
