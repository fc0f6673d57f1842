"""``Problem``: an HTTP error the routes answer before (or instead of) asking the engine.

Its own module so that each group of routes (:mod:`.routes` for the KV cache,
:mod:`.weights` for the refit) can raise it without importing the other.
"""

from __future__ import annotations

from http import HTTPStatus

__all__ = ["Problem"]


class Problem(Exception):
    """An HTTP error answered before the engine is asked.

    Attributes:
        status: the HTTP status; message: what went wrong and what to do;
        param: the body field at fault, if one is; headers: extra response headers.
    """

    def __init__(
        self,
        status: HTTPStatus,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers
