"""The vLLM calls that move between releases, each bound once: every caller uses these.

What belongs here: one function per vLLM call whose module or signature differs between
the vLLM releases initpipe supports, and nothing else (attrs' ``_compat`` is the model: the
binding is chosen in one place, callers never ask which release runs). A release that
moves a call adds its variant beside the one here, declared for that release
(``@vllm_uses(..., release=..., replaces=...)``, :mod:`initpipe_vllm.contract.declare`),
and the variant is picked by the release the contract matched
(:func:`initpipe_vllm.contract.report.installed_release`), never by a version string.
Nothing here imports vLLM at import time.

Bound so far: KV cache planning. Every planner of initpipe (live resize, ``initpipe plan``,
the test kit) ran vLLM's planning with ``cache_config.num_gpu_blocks_override`` set for the
call and restored after; :func:`plan_kv_cache_configs` (``get_kv_cache_configs``),
:func:`kv_cache_groups` and :func:`kv_cache_config_from_groups` (``get_kv_cache_groups`` /
``get_kv_cache_config_from_groups``, the test kit's profiling-size cache) do it once,
through :func:`blocks_override`.

vLLM 0.33.0 moved planning to ``vllm.v1.core.kv_cache_planning`` and made it pluggable:
``get_global_kv_cache_groups`` groups every worker's layers, then ``get_kv_cache_configs``
takes those groups, both through the platform's ``KVCacheConfigBuilder``
(``Platform.get_kv_cache_config_builder_cls``; the default builder also honours a model's
own grouping). The 0.33.0 variants below call exactly that, so a platform's or a model's
builder plans initpipe's caches as it plans vLLM's.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from .contract.declare import vllm_uses
from .contract.variants import by_release

__all__ = [
    "CLEARED",
    "blocks_override",
    "kv_cache_config_from_groups",
    "kv_cache_groups",
    "plan_kv_cache_configs",
]


class _Override(enum.Enum):
    CLEARED = "cleared"


#: ``num_blocks=CLEARED``: the config's own ``num_gpu_blocks_override`` is cleared for the
#: call, so the memory given alone sizes the cache (what a resize by bytes needs).
CLEARED: Final = _Override.CLEARED

#: What a planning call sizes the cache by: a block count; None, the config's own
#: ``num_gpu_blocks_override`` (if any), else the memory; :data:`CLEARED`, the memory.
Blocks = int | None | _Override


@contextlib.contextmanager
def blocks_override(cache_config: Any, num_blocks: Blocks) -> Iterator[None]:
    """``cache_config.num_gpu_blocks_override`` as ``num_blocks`` says (:data:`Blocks`)
    for the ``with`` block, and restored afterwards, also when the block raises."""
    saved = cache_config.num_gpu_blocks_override
    if num_blocks is CLEARED:
        cache_config.num_gpu_blocks_override = None
    elif num_blocks is not None:
        cache_config.num_gpu_blocks_override = num_blocks
    try:
        yield
    finally:
        cache_config.num_gpu_blocks_override = saved


def v1_runner_installed() -> bool:
    """Whether the installed vLLM has Model Runner V1 (0.32, 0.33; 0.34.0 removed it), read
    from its files without importing it: a process may choose its runner (the
    ``VLLM_USE_V2_MODEL_RUNNER`` variable, which 0.34 refuses at ``0``) before vLLM loads."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return False
    root = Path(next(iter(spec.submodule_search_locations)))
    return (root / "v1" / "worker" / "gpu_model_runner.py").is_file()


def runner_choice_env(runner: str) -> dict[str, str]:
    """The environment that makes vLLM build ``runner``'s model runner (``"v1"`` or
    ``"v2"``): ``VLLM_USE_V2_MODEL_RUNNER`` where the installed vLLM has both runners;
    nothing where it has Model Runner V2 only (0.34 warns on ``1`` and refuses ``0``).

    Raises:
        UnsupportedRunnerError: ``"v1"`` on a vLLM without Model Runner V1.
    """
    if v1_runner_installed():
        return {"VLLM_USE_V2_MODEL_RUNNER": "0" if runner == "v1" else "1"}
    if runner == "v1":
        from .errors import UnsupportedRunnerError

        raise UnsupportedRunnerError(
            "the installed vLLM has no Model Runner V1 (vLLM 0.34.0 removed it): run "
            "Model Runner V2 (`--model-runner v2`, or leave it to vLLM), or install "
            "vLLM 0.32.0 or 0.33.0 for the v1 runner."
        )
    return {}


def runner_from_env() -> str:
    """The runner (``"v1"`` or ``"v2"``) this process's environment makes vLLM build, as
    :func:`runner_choice_env` set it: ``"v2"`` under ``VLLM_USE_V2_MODEL_RUNNER=1`` or where
    vLLM has Model Runner V2 only, else ``"v1"``."""
    import os

    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1" or not v1_runner_installed():
        return "v2"
    return "v1"


@by_release("resize")
@vllm_uses(("plan", "resize"), calls=("vllm.v1.core.kv_cache_utils:get_kv_cache_configs",))
def plan_kv_cache_configs(
    vllm_config: Any,
    specs: Sequence[Mapping[str, Any]],
    memory: Sequence[int],
    *,
    num_blocks: Blocks = None,
) -> list[Any]:
    """vLLM's ``KVCacheConfig`` of each worker (``get_kv_cache_configs``): one per entry of
    ``specs`` (a worker's layer name -> ``KVCacheSpec``) with that worker's available
    ``memory`` in bytes, sized by ``num_blocks`` (:data:`Blocks`).

    Raises:
        ValueError: from vLLM, e.g. the size cannot hold one ``max_model_len`` request.
    """
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

    with blocks_override(vllm_config.cache_config, num_blocks):
        return get_kv_cache_configs(vllm_config, specs, memory)  # type: ignore[no-any-return]


@plan_kv_cache_configs.variant("0.33.0", "0.34.0")
@vllm_uses(
    ("plan", "resize"),
    calls=(
        "vllm.v1.core.kv_cache_planning:get_global_kv_cache_groups",
        "vllm.v1.core.kv_cache_planning:get_kv_cache_configs",
    ),
    release=("0.33.0", "0.34.0"),
    replaces=("initpipe_vllm.compat:plan_kv_cache_configs",),
)
def _plan_kv_cache_configs_0_33_0(
    vllm_config: Any,
    specs: Sequence[Mapping[str, Any]],
    memory: Sequence[int],
    *,
    num_blocks: Blocks = None,
) -> list[Any]:
    """vLLM 0.33.0: as ``EngineCore._initialize_kv_caches`` plans — the whole model's
    groups (``get_global_kv_cache_groups``), then each worker's config from them
    (``get_kv_cache_configs``), both through the platform's ``KVCacheConfigBuilder``."""
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs  # type: ignore[import-not-found, unused-ignore]

    with blocks_override(vllm_config.cache_config, num_blocks):
        groups = get_global_kv_cache_groups(vllm_config, list(specs))
        return get_kv_cache_configs(vllm_config, specs, memory, groups)  # type: ignore[no-any-return]


@by_release("resize")
def kv_cache_groups(vllm_config: Any, spec: Mapping[str, Any]) -> list[Any]:
    """vLLM's KV cache groups of one worker's layers (``get_kv_cache_groups``), as the
    runner groups them for its profiling-size cache. The test kit's; declares nothing."""
    from vllm.v1.core.kv_cache_utils import get_kv_cache_groups

    return get_kv_cache_groups(vllm_config, spec)  # type: ignore[no-any-return]


@kv_cache_groups.variant("0.33.0", "0.34.0")
def _kv_cache_groups_0_33_0(vllm_config: Any, spec: Mapping[str, Any]) -> list[Any]:
    """vLLM 0.33.0: through the platform's ``KVCacheConfigBuilder``
    (``get_kv_cache_groups_from_builder``), as ``_init_minimal_kv_cache_for_profiling``."""
    from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder  # type: ignore[import-not-found, unused-ignore]
    from vllm.v1.core.kv_cache_planning import get_kv_cache_groups_from_builder  # type: ignore[import-not-found, unused-ignore]

    builder = get_kv_cache_config_builder(vllm_config)
    return get_kv_cache_groups_from_builder(builder, vllm_config, spec)  # type: ignore[no-any-return]


@by_release("resize")
def kv_cache_config_from_groups(
    vllm_config: Any, groups: Sequence[Any], *, num_blocks: Blocks, available_memory: int = 0
) -> Any:
    """vLLM's ``KVCacheConfig`` of one worker's KV cache groups
    (``get_kv_cache_config_from_groups``), sized by ``num_blocks`` (:data:`Blocks`). The
    test kit's (its profiling-size cache); no capability depends on it, so it declares
    nothing to the contract."""
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups

    with blocks_override(vllm_config.cache_config, num_blocks):
        return get_kv_cache_config_from_groups(
            vllm_config, groups, available_memory=available_memory
        )


@kv_cache_config_from_groups.variant("0.33.0", "0.34.0")
def _kv_cache_config_from_groups_0_33_0(
    vllm_config: Any, groups: Sequence[Any], *, num_blocks: Blocks, available_memory: int = 0
) -> Any:
    """vLLM 0.33.0: a block count goes to the platform's ``KVCacheConfigBuilder`` (its
    ``get_kv_cache_config_from_groups(vllm_config, groups, num_blocks)``, as
    ``_init_minimal_kv_cache_for_profiling`` calls it); otherwise the memory sizes the
    cache through ``kv_cache_planning.get_kv_cache_config_from_groups``."""
    from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder  # type: ignore[import-not-found, unused-ignore]
    from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups  # type: ignore[import-not-found, unused-ignore]

    with blocks_override(vllm_config.cache_config, num_blocks):
        if isinstance(num_blocks, int):
            builder = get_kv_cache_config_builder(vllm_config)
            return builder.get_kv_cache_config_from_groups(vllm_config, list(groups), num_blocks)
        return get_kv_cache_config_from_groups(vllm_config, list(groups), available_memory)
