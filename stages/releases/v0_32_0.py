"""vLLM 0.32.0: what differs for this release — nothing, the catalogs are written for it.

The catalog packages (``v1/``, ``mrv2/``) mirror 0.32.0 as they stand, so its overlays are
empty. A later release's module holds its stage variants here, as ``initpipe.Extension``
overlays naming the catalog pipeline they change, e.g.::

    OVERLAYS = (
        Extension(
            name="vllm 0.33.0 (v1)",
            applies_to=("initpipe_vllm",),
            replace={"runner_kv_cache_config": runner_kv_cache_config_0_33},
            remove=("a_stage_0_33_dropped",),
        ),
    )
"""

from __future__ import annotations

from initpipe import Extension

__all__ = ["OVERLAYS", "RELEASE", "RUNNERS"]

#: The release this module describes (checked against its name and ``RELEASES``).
RELEASE = "0.32.0"
#: The runners this release has (catalog names): both.
RUNNERS = ("v1", "mrv2")
#: The stage overlays for this release, applied by ``initpipe_vllm.catalogs.build``.
OVERLAYS: tuple[Extension, ...] = ()
