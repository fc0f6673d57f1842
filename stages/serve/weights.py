"""The weights routes' own parts: where a refit may load from, the two calls, the metrics.

``POST /initpipe/weights/refit`` loads a folder on the server's own disk, so the folder is
confined: the operator names a root with :data:`REFIT_ROOT_ENV` when starting the server,
and a path that does not resolve inside it (after :meth:`pathlib.Path.resolve`: ``..`` and
symlinks cannot lead out) is refused with 403 before the engine is asked. Without the
variable the refit route is off (403, saying how to turn it on); ``GET /initpipe/weights``
answers either way. The check is made when the request arrives: whoever may write inside
the root can also swap a folder for a link between the check and the load, so give write
access to the root only to whoever may choose the weights anyway.

Metrics (Prometheus, the default registry vLLM's ``/metrics`` serves; registered once, when
the middleware is built): ``initpipe_refits_total`` (refits completed),
``initpipe_refit_failures_total`` (refits that started and failed: the engine failed
closed; refusals change nothing and are not counted), ``initpipe_last_refit_seconds``
(the last completed refit's wall seconds in the engine core).

Importing this module imports neither torch, vllm nor prometheus_client.
"""

from __future__ import annotations

import functools
import os
from http import HTTPStatus
from pathlib import Path
from typing import Any

import attrs

from ..errors import RefitError, RefitRefusedError
from ..live.api import refit_async, weights_info_async
from .problem import Problem

__all__ = [
    "REFIT_FIELDS",
    "REFIT_ROOT_ENV",
    "WEIGHTS_PREFIX",
    "RefitMetrics",
    "refit",
    "refit_body",
    "refit_metrics",
    "refit_path",
    "refit_root",
    "weights_info",
]

#: The weights routes' paths start with this.
WEIGHTS_PREFIX = "/initpipe/weights"
#: The folder (in the server's environment) inside which refits may load weights; unset:
#: ``POST /initpipe/weights/refit`` answers 403.
REFIT_ROOT_ENV = "INITPIPE_REFIT_ROOT"
#: The refit body's fields (``path`` required).
REFIT_FIELDS = (
    "path",
    "version",
    "num_blocks",
    "kv_cache_memory_bytes",
    "mode",
    "expected_digest",
    "probe",
)


def refit_root() -> Path:
    """The folder refits may load from (:data:`REFIT_ROOT_ENV`, resolved).

    Raises:
        Problem: 403 when the variable is unset or empty, or not a folder.
    """
    given = os.environ.get(REFIT_ROOT_ENV, "")
    if not given:
        raise Problem(
            HTTPStatus.FORBIDDEN,
            f"refit over HTTP is off: this server has no {REFIT_ROOT_ENV}. Start it with "
            f"{REFIT_ROOT_ENV}=/a/folder in its environment; POST {WEIGHTS_PREFIX}/refit then "
            "loads weights from folders inside that one (paths relative to it)",
        )
    root = Path(given).expanduser().resolve()
    if not root.is_dir():
        raise Problem(
            HTTPStatus.FORBIDDEN,
            f"refit over HTTP is off: {REFIT_ROOT_ENV}={given!r} is not a folder on the server",
        )
    return root


def refit_path(given: Any, root: Path) -> Path:
    """``given`` (absolute, or relative to ``root``) resolved, if it lies inside ``root``.

    Raises:
        Problem: 400 when ``given`` is not a non-empty string; 403 when it resolves
            outside ``root``.
    """
    if not isinstance(given, str) or not given:
        raise Problem(
            HTTPStatus.BAD_REQUEST,
            f"path={given!r}: pass the weights folder as a string, absolute or relative to "
            f'{REFIT_ROOT_ENV}, e.g. {{"path": "model-v2"}}',
            param="path",
        )
    try:
        target = (root / given).resolve()  # an absolute ``given`` replaces ``root``
    except (OSError, ValueError, RuntimeError) as err:  # NUL byte, symlink loop
        raise Problem(
            HTTPStatus.BAD_REQUEST, f"path={given!r} cannot be resolved: {err}", param="path"
        ) from None
    if not target.is_relative_to(root):
        raise Problem(
            HTTPStatus.FORBIDDEN,
            f"path={given!r} resolves to {target}, outside {REFIT_ROOT_ENV} ({root}): this "
            "server loads weights only from folders inside it",
            param="path",
        )
    return target


# -- metrics ------------------------------------------------------------------------------
@attrs.frozen
class RefitMetrics:
    """The refit's Prometheus metrics (see the module docstring)."""

    refits: Any
    failures: Any
    last_seconds: Any

    def completed(self, seconds: float) -> None:
        """Count a completed refit that took ``seconds``."""
        self.refits.inc()
        self.last_seconds.set(seconds)

    def failed(self) -> None:
        """Count a refit that started and failed."""
        self.failures.inc()


def _registered(registry: Any, name: str, make: Any) -> Any:
    # the collector already registered under this name (a second import of this module, a
    # second app in one process) or a new one: registering twice raises
    found = registry._names_to_collectors.get(name)
    return found if found is not None else make()


@functools.cache
def refit_metrics() -> RefitMetrics | None:
    """The refit metrics, registered in Prometheus' default registry on the first call
    (later calls, and a module imported again, reuse them); None without
    prometheus_client."""
    try:
        from prometheus_client import REGISTRY, Counter, Gauge
    except ImportError:  # pragma: no cover -- vLLM's server requires it
        return None
    return RefitMetrics(
        refits=_registered(
            REGISTRY,
            "initpipe_refits_total",
            lambda: Counter("initpipe_refits", "Weight refits completed (initpipe)."),
        ),
        failures=_registered(
            REGISTRY,
            "initpipe_refit_failures_total",
            lambda: Counter(
                "initpipe_refit_failures",
                "Weight refits that started and failed: the engine failed closed (initpipe).",
            ),
        ),
        last_seconds=_registered(
            REGISTRY,
            "initpipe_last_refit_seconds",
            lambda: Gauge(
                "initpipe_last_refit_seconds",
                "Wall seconds of the last completed weight refit (initpipe).",
                multiprocess_mode="mostrecent",
            ),
        ),
    )


# -- the calls ----------------------------------------------------------------------------
async def weights_info(engine: Any, body: dict[str, Any]) -> dict[str, Any]:
    """``GET /initpipe/weights``: :func:`~initpipe_vllm.weights_info_async`, as a dict."""
    return (await weights_info_async(engine)).to_dict()


def refit_body(body: dict[str, Any]) -> dict[str, Any]:
    """The refit's body with its ``path`` resolved inside :data:`REFIT_ROOT_ENV` (checked
    before the engine is asked).

    Raises:
        Problem: see :func:`refit_root` and :func:`refit_path`.
    """
    return {**body, "path": str(refit_path(body.get("path"), refit_root()))}


async def refit(engine: Any, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /initpipe/weights/refit``: :func:`~initpipe_vllm.refit_async` on the folder
    ``body["path"]`` names (resolved by :func:`refit_body`), the other fields as its
    keyword arguments; the receipt as a dict. Counts the outcome in :func:`refit_metrics`."""
    kwargs = dict(body)
    path = kwargs.pop("path")
    metrics = refit_metrics()
    try:
        receipt = await refit_async(engine, path, **kwargs)
    except RefitError as err:
        if metrics is not None and not isinstance(err, RefitRefusedError):
            metrics.failed()
        raise
    if metrics is not None:
        metrics.completed(receipt.total_s)
    return receipt.to_dict()
