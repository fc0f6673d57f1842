"""Every error the vLLM catalog and its integration raise, each naming the culprit.

::

    initpipe.InitpipeError
    └── InitpipeVllmError                      root of this package's errors
        ├── CatalogError (ValueError)           bad input to a catalog stage
        │   ├── KVCacheConfigError              a KVCacheConfig that does not fit the model
        │   └── ModelPhaseError                 model-phase facts that do not hold (e.g. a
        │                                       sharing target that is not attention)
        ├── UnsupportedRunnerError (NotImplementedError)
        │                                       a vLLM version, runner or worker variant
        │                                       the catalog does not cover
        ├── ResizeError (RuntimeError)          a KV cache resize/release/resume failed;
        │   │                                   ``.rolled_back`` says whether the engine
        │   │                                   is back at its previous size
        │   └── ResizeRefusedError (ValueError) refused before anything changed (bad
        │                                       size, config it cannot follow, requests)
        ├── KVCacheReleasedError (RuntimeError) a request while the KV cache is released
        ├── RefitError (RuntimeError)           a weight refit failed; ``.serving`` says
        │   │                                   whether the engine still serves (False:
        │   │                                   it failed closed, refit again)
        │   └── RefitRefusedError (ValueError)  refused before anything changed (bad
        │                                       weights, state, engine)
        ├── RefitFailedError (RuntimeError)     a request while the last refit has failed
        └── VllmSourceError (ValueError)        a path given as a vLLM (``initpipe doctor
                                                --source``) that holds no vLLM

They subclass the builtin they mean so callers that catch ``ValueError`` or
``NotImplementedError`` keep working, and ``initpipe.InitpipeError`` catches both packages'
errors. The facts ride on attributes (``.layer``, ``.field``) that tests assert on.
"""

from __future__ import annotations

from typing import Any

from initpipe.errors import InitpipeError

__all__ = [
    "CatalogError",
    "InitpipeVllmError",
    "KVCacheConfigError",
    "KVCacheReleasedError",
    "ModelPhaseError",
    "RefitError",
    "RefitFailedError",
    "RefitRefusedError",
    "ResizeError",
    "ResizeRefusedError",
    "UnsupportedRunnerError",
    "VllmSourceError",
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


class ResizeError(InitpipeVllmError, RuntimeError):
    """A KV cache resize, release or resume did not complete.

    Attributes:
        step: where it failed: ``planning``, ``requests``, ``memory``, ``teardown``,
            ``kv_phase``, ``warmup``, ``scheduler``, ``rollback``.
        stage: the catalog stage that raised (``allocated_kv_caches`` ...), if one did.
        rank: the worker rank that failed, if a worker did.
        reason: the cause, in words.
        rolled_back: True when the engine is back at its previous size and serving;
            False when nothing had changed (a refusal) or when the rollback itself failed
            (then ``step == "rollback"`` and the engine refuses requests: restart it).
    """

    def __init__(
        self,
        msg: str,
        *,
        step: str,
        reason: str = "",
        stage: str | None = None,
        rank: int | None = None,
        rolled_back: bool = False,
    ) -> None:
        super().__init__(msg)
        self.step = step
        self.stage = stage
        self.rank = rank
        self.reason = reason or msg
        self.rolled_back = rolled_back

    def __reduce__(self) -> tuple[object, ...]:
        kwargs = {
            "step": self.step,
            "reason": self.reason,
            "stage": self.stage,
            "rank": self.rank,
            "rolled_back": self.rolled_back,
        }
        return (_rebuild, (type(self), str(self), kwargs))


class ResizeRefusedError(ResizeError, ValueError):
    """Refused before anything changed: the engine serves on at its current size."""


class KVCacheReleasedError(InitpipeVllmError, RuntimeError):
    """A request reached an engine whose KV cache is released; ``resume_kv_cache`` first."""


class RefitError(InitpipeVllmError, RuntimeError):
    """A weight refit did not complete (:func:`initpipe_vllm.refit`).

    Attributes:
        step: the step that failed (``arguments``, ``engine``, ``state``, ``weights``,
            ``requests``, ``memory``, ``pause``, ``teardown``, ``load``, ``digest``,
            ``kv_phase``, ``warmup``, ``scheduler``, ``caches``, ``probe``).
        rank: the worker rank that failed, if a worker did.
        reason: the cause, in words.
        serving: True when the engine still serves its previous weights (a refusal:
            nothing changed); False when it failed closed: it refuses requests
            (:class:`RefitFailedError`, HTTP 503) until a later refit succeeds.
    """

    def __init__(
        self, msg: str, *, step: str, reason: str = "", rank: int | None = None, serving: bool
    ) -> None:
        super().__init__(msg)
        self.step = step
        self.rank = rank
        self.reason = reason or msg
        self.serving = serving

    def __reduce__(self) -> tuple[object, ...]:
        kwargs = {"step": self.step, "reason": self.reason, "rank": self.rank}
        if not isinstance(self, RefitRefusedError):
            kwargs["serving"] = self.serving
        return (_rebuild, (type(self), str(self), kwargs))


class RefitRefusedError(RefitError, ValueError):
    """Refused before anything changed: the engine serves on with its previous weights."""

    def __init__(self, msg: str, *, step: str, reason: str = "", rank: int | None = None) -> None:
        super().__init__(msg, step=step, reason=reason, rank=rank, serving=True)


class RefitFailedError(InitpipeVllmError, RuntimeError):
    """A request reached an engine whose last refit failed: it serves nothing until a
    refit succeeds (the message names the failed step)."""


class VllmSourceError(InitpipeVllmError, ValueError):
    """A path given as a vLLM holds none (no ``vllm/__init__.py``), or cannot be read.

    Attributes:
        path: the path as given.
    """

    def __init__(self, msg: str, *, path: str) -> None:
        super().__init__(msg)
        self.path = path


def _rebuild(cls: type[Any], msg: str, kwargs: dict[str, object]) -> Any:
    return cls(msg, **kwargs)  # type: ignore[arg-type]
