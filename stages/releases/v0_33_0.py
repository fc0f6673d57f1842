"""vLLM 0.33.0: the catalog stages whose mirrored vLLM code changed in a way that matters.

Each overlay replaces a stage of a catalog pipeline with its 0.33.0 variant; the variant's
body sits here (or beside the stage it varies, reusing its body with ``catalogs.respec``),
declared for this release (``@vllm_uses(..., release="0.33.0", replaces=...)``). Functions
outside the catalogs (live resize, planning, the start-up report) keep their 0.33.0
variants beside the base function, registered with
:func:`initpipe_vllm.contract.variants.by_release`. Which release runs is the contract's
answer (the lock the installed vLLM matches), never a version string.
"""

from __future__ import annotations

from initpipe import Extension

__all__ = ["OVERLAYS", "RELEASE"]

#: The release this module describes (checked against its name and ``RELEASES``).
RELEASE = "0.33.0"
#: The stage overlays for this release, applied by ``initpipe_vllm.catalogs.build``.
OVERLAYS: tuple[Extension, ...] = ()
