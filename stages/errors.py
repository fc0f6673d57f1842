"""Every error the vLLM catalog and its integration raise, each naming the culprit.

::

    initpipe.InitpipeError
    └── InitpipeVllmError                      root of this package's errors
        ├── CatalogError (ValueError)           bad input to a catalog stage
        │   ├── KVCacheConfigError              a KVCacheConfig that does not fit the model
        │   └── ModelPhaseError                 model-phase facts that do not hold (e.g. a
        │                                       sharing target that is not attention)
        └── UnsupportedRunnerError (NotImplementedError)
                                                a vLLM version, runner or worker variant
                                                the catalog does not cover

They subclass the builtin they mean so callers that catch ``ValueError`` or
``NotImplementedError`` keep working, and ``initpipe.InitpipeError`` catches both packages'
errors. The facts ride on attributes (``.layer``, ``.field``) that tests assert on.
"""

from __future__ import annotations

from initpipe.errors import InitpipeError

__all__ = [
    "CatalogError",
    "InitpipeVllmError",
    "KVCacheConfigError",
    "ModelPhaseError",
    "UnsupportedRunnerError",
]


class InitpipeVllmError(InitpipeError):
    """Base class of every error ``initpipe_vllm`` raises."""


class CatalogError(InitpipeVllmError, ValueError):
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


class UnsupportedRunnerError(InitpipeVllmError, NotImplementedError):
    """The runner or worker variant is not covered by the catalog (says which)."""
