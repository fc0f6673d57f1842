"""A loopback OTLP/HTTP trace receiver: the spans a vLLM start sends, decoded in-process.

What belongs here: receiving ``POST /v1/traces`` (OTLP/HTTP protobuf, gzip accepted),
decoding ``ExportTraceServiceRequest`` with ``opentelemetry-proto`` (vLLM brings it) into
plain :class:`Span` records, and nothing about what they mean (``initpipe startup``'s
report reads them). It binds only to a loopback address, on a free port.

Usage::

    with Receiver() as rx:            # rx.endpoint: "http://127.0.0.1:PORT/v1/traces"
        ...start vLLM with otlp_traces_endpoint=rx.endpoint and
        ...OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf...
        spans = rx.wait_for(lambda spans: ..., timeout=60)
"""

from __future__ import annotations

import gzip
import ipaddress
import socket
import threading
import time
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs

from ..errors import InitpipeVllmError

__all__ = ["PATH", "Receiver", "ReceiverError", "Span", "decode"]

#: The OTLP/HTTP traces path.
PATH = "/v1/traces"


class ReceiverError(InitpipeVllmError, ValueError):
    """A bind address that is not loopback, or a body that is no OTLP trace export."""


@attrs.frozen
class Span:
    """One received span.

    Attributes:
        name: the span's name.
        scope: its instrumentation scope (``initpipe`` for initpipe's stages).
        trace_id / span_id / parent_id: hex ids (``parent_id`` empty for a root).
        start_ns / end_ns: wall-clock nanoseconds since the epoch.
        attributes: the span's attributes.
        resource: its resource's attributes (``vllm.process_kind``, ``vllm.process_id``...).
        status: ``"unset"``, ``"ok"`` or ``"error"``; status_message: the error's text.
        events: ``(name, attributes)`` of each event (``exception`` for a failed stage).
    """

    name: str
    scope: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status: str
    status_message: str = ""
    events: tuple[tuple[str, dict[str, Any]], ...] = ()


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind)


def _attrs(items: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in items}


_STATUS = {0: "unset", 1: "ok", 2: "error"}


def decode(body: bytes) -> list[Span]:
    """The spans of one ``ExportTraceServiceRequest`` (protobuf bytes).

    Raises:
        ReceiverError: the bytes are not such a message.
    """
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except DecodeError as err:
        raise ReceiverError(f"not an OTLP trace export (protobuf): {err}") from None
    out = []
    for rs in request.resource_spans:
        resource = _attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    Span(
                        name=s.name,
                        scope=ss.scope.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(),
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes=_attrs(s.attributes),
                        resource=resource,
                        status=_STATUS.get(s.status.code, "unset"),
                        status_message=s.status.message,
                        events=tuple((e.name, _attrs(e.attributes)) for e in s.events),
                    )
                )
    return out


class _Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class Receiver:
    """An OTLP/HTTP trace receiver on ``host`` (loopback only) and a free port.

    Raises:
        ReceiverError: ``host`` is not a loopback address.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ReceiverError(
                f"the trace receiver binds only to a loopback address, not {host!r} "
                "(spans carry the engine's configuration): use 127.0.0.1 or ::1"
            )
        self.spans: list[Span] = []
        self.errors: list[str] = []
        self._lock = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    length = -1
                try:
                    if length < 0:
                        raise ReceiverError("a bad Content-Length")
                    body = self.rfile.read(length)
                    if self.path != PATH:
                        raise ReceiverError(f"unknown path {self.path!r} (OTLP uses {PATH})")
                    if self.headers.get("Content-Encoding", "").lower() == "gzip":
                        body = gzip.decompress(body)
                    spans = decode(body)
                except (ReceiverError, OSError, EOFError, zlib.error) as err:
                    receiver._note_error(str(err))
                    self.send_response(400)
                    self.end_headers()
                    return
                receiver._add(spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: the report says what arrived

        server_cls = _Server6 if ":" in host else ThreadingHTTPServer
        self._server = server_cls((host, 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        port = self._server.server_address[1]
        bracketed = f"[{host}]" if ":" in host else host
        #: the URL to give vLLM as ``otlp_traces_endpoint``
        self.endpoint = f"http://{bracketed}:{port}{PATH}"

    def _add(self, spans: list[Span]) -> None:
        with self._lock:
            self.spans.extend(spans)
            self._lock.notify_all()

    def _note_error(self, text: str) -> None:
        with self._lock:
            self.errors.append(text)

    def wait_for(self, done: Callable[[list[Span]], bool], timeout: float) -> list[Span]:
        """The spans received once ``done(spans)`` holds, or when ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not done(list(self.spans)):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(left)
            return list(self.spans)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
