"""Errors the vLLM catalog raises for bad inputs, each naming the culprit.

::

    CatalogError (ValueError)
    ├── KVCacheConfigError      a KVCacheConfig that does not fit the loaded model
    └── ModelPhaseError         model-phase facts that do not hold (e.g. a sharing target
                                that is not an attention layer)
    UnsupportedRunnerError (NotImplementedError)
                                a runner/worker variant the catalog does not cover

They subclass the builtin they mean so callers that catch ``ValueError`` keep working; the
facts ride on attributes (``.layer``, ``.field``) that tests assert on.
"""

from __future__ import annotations

__all__ = ["CatalogError", "KVCacheConfigError", "ModelPhaseError", "UnsupportedRunnerError"]


class CatalogError(ValueError):
    """Base class of the catalog's input errors."""


class KVCacheConfigError(CatalogError):
    """The KV cache config names an unknown layer, has no blocks, or mismatched sizes.

    Attributes:
        field: the config field at fault (``kv_cache_groups``, ``num_blocks``, ...).
        layer: the offending layer name, when one is at fault.
    """

    def __init__(self, msg: str, *, field: str, layer: str | None = None) -> None:
        super().__init__(msg)
        self.field = field
        self.layer = layer


class ModelPhaseError(CatalogError):
    """A model-phase fact is inconsistent (the layer is named in ``.layer``)."""

    def __init__(self, msg: str, *, layer: str | None = None) -> None:
        super().__init__(msg)
        self.layer = layer


class UnsupportedRunnerError(NotImplementedError):
    """The runner or worker variant is not covered by the catalog (says which)."""
