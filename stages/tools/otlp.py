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
import json
import os
import socket
import threading
import time
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import attrs

from ..errors import InitpipeVllmError

__all__ = ["PATH", "Receiver", "ReceiverError", "Span", "decode", "from_json", "read", "to_json"]

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


# -- OTLP JSON (a collector's file exporter, Jaeger/Tempo exports) -------------------------
_JSON_STATUS = {"STATUS_CODE_UNSET": "unset", "STATUS_CODE_OK": "ok", "STATUS_CODE_ERROR": "error"}


def _json_value(v: Any) -> Any:
    if not isinstance(v, dict) or not v:
        return None
    (kind, value), *_ = v.items()
    if kind == "arrayValue":
        return [_json_value(x) for x in (value or {}).get("values", [])]
    if kind == "kvlistValue":
        return _json_attrs((value or {}).get("values", []))
    if kind == "intValue":
        return int(value)
    if kind == "doubleValue":
        return float(value)
    return value


def _json_attrs(items: Any) -> dict[str, Any]:
    return {kv["key"]: _json_value(kv.get("value")) for kv in items or []}


def _hex_id(value: Any, size: int, what: str) -> str:
    text = str(value or "")
    if text and (len(text) != 2 * size or any(c not in "0123456789abcdefABCDEF" for c in text)):
        raise ReceiverError(
            f"{what} {text!r} is not {2 * size} hex digits (OTLP JSON writes ids in hex, "
            "not base64)"
        )
    return text.lower()


def _status_of(code: Any) -> str:
    if isinstance(code, str):
        return _JSON_STATUS.get(code, "unset")
    if isinstance(code, int):
        return _STATUS.get(code, "unset")
    return "unset"


def from_json(data: Any, where: str = "the input") -> list[Span]:
    """The spans of one OTLP JSON trace export (``{"resourceSpans": [...]}``: what the
    OpenTelemetry Collector's file exporter writes per line; ids in hex).

    Raises:
        ReceiverError: ``data`` is no such export (the message names ``where`` and the span).
    """
    if not isinstance(data, dict) or not isinstance(data.get("resourceSpans"), list):
        raise ReceiverError(f"{where}: not an OTLP JSON trace export (no resourceSpans list)")
    out = []
    try:
        for rs in data["resourceSpans"]:
            resource = _json_attrs((rs.get("resource") or {}).get("attributes"))
            for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or []:
                scope = (ss.get("scope") or ss.get("instrumentationLibrary") or {}).get("name", "")
                for s in ss.get("spans") or []:
                    name = s.get("name", "")
                    label = f"{where}: span {name!r}"
                    status = s.get("status") or {}
                    code = status.get("code", 0)
                    out.append(
                        Span(
                            name=name,
                            scope=scope,
                            trace_id=_hex_id(s.get("traceId"), 16, f"{label}: traceId"),
                            span_id=_hex_id(s.get("spanId"), 8, f"{label}: spanId"),
                            parent_id=_hex_id(s.get("parentSpanId"), 8, f"{label}: parentSpanId"),
                            start_ns=int(s["startTimeUnixNano"]),
                            end_ns=int(s["endTimeUnixNano"]),
                            attributes=_json_attrs(s.get("attributes")),
                            resource=resource,
                            status=_status_of(code),
                            status_message=str(status.get("message", "")),
                            events=tuple(
                                (e.get("name", ""), _json_attrs(e.get("attributes")))
                                for e in s.get("events") or []
                            ),
                        )
                    )
    except KeyError as err:
        raise ReceiverError(f"{where}: a span without {err.args[0]}") from None
    except (TypeError, ValueError, AttributeError) as err:
        if isinstance(err, ReceiverError):
            raise
        raise ReceiverError(f"{where}: malformed OTLP JSON ({err})") from None
    return out


def _to_value(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, (list, tuple)):
        return {"arrayValue": {"values": [_to_value(x) for x in v]}}
    if isinstance(v, dict):
        return {"kvlistValue": {"values": _to_attrs(v)}}
    return {"stringValue": str(v)}


def _to_attrs(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _to_value(v)} for k, v in d.items()]


_CODES = {"unset": 0, "ok": 1, "error": 2}


def to_json(spans: list[Span]) -> dict[str, Any]:
    """``spans`` as one OTLP JSON trace export (what :func:`from_json` reads back)."""
    groups: dict[tuple[str, str], list[Span]] = {}
    resources: dict[str, dict[str, Any]] = {}
    for s in spans:
        rkey = json.dumps(s.resource, sort_keys=True, default=str)
        resources[rkey] = s.resource
        groups.setdefault((rkey, s.scope), []).append(s)
    out: dict[str, dict[str, Any]] = {}
    for (rkey, scope), members in groups.items():
        rs = out.setdefault(
            rkey, {"resource": {"attributes": _to_attrs(resources[rkey])}, "scopeSpans": []}
        )
        rs["scopeSpans"].append(
            {
                "scope": {"name": scope},
                "spans": [
                    {
                        "traceId": m.trace_id,
                        "spanId": m.span_id,
                        "parentSpanId": m.parent_id,
                        "name": m.name,
                        "startTimeUnixNano": str(m.start_ns),
                        "endTimeUnixNano": str(m.end_ns),
                        "attributes": _to_attrs(m.attributes),
                        "status": {"code": _CODES.get(m.status, 0), "message": m.status_message},
                        "events": [{"name": n, "attributes": _to_attrs(a)} for n, a in m.events],
                    }
                    for m in members
                ],
            }
        )
    return {"resourceSpans": list(out.values())}


def read(path: str | os.PathLike[str]) -> tuple[str, Any]:
    """A file ``initpipe startup report`` reads: ``("report", dict)`` for a report JSON,
    ``("spans", [Span])`` for OTLP JSON (one export, or JSON Lines of them: the
    collector's file exporter) or OTLP protobuf (one ``ExportTraceServiceRequest``).

    Raises:
        ReceiverError: the file cannot be read or is none of these (the message says which
            line or span).
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as err:
        raise ReceiverError(f"cannot read {p}: {err.strerror or err}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise ReceiverError(f"{p}: not a readable gzip file ({err})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "spans", _protobuf(raw, p)
    stripped = text.strip()
    if not stripped:
        raise ReceiverError(f"{p}: the file is empty")
    if not stripped.startswith(("{", "[")):
        return "spans", _protobuf(raw, p)
    try:
        whole = json.loads(stripped)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict) and "schema" in whole and "spans" in whole:
        return "report", whole
    if whole is not None:
        docs = whole if isinstance(whole, list) else [whole]
        spans = []
        for i, doc in enumerate(docs):
            spans.extend(from_json(doc, f"{p}" + (f" [{i}]" if len(docs) > 1 else "")))
        return "spans", spans
    spans = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as err:
            raise ReceiverError(f"{p}:{n}: not JSON ({err.msg}, column {err.colno})") from None
        spans.extend(from_json(doc, f"{p}:{n}"))
    return "spans", spans


def _protobuf(raw: bytes, p: Path) -> list[Span]:
    import importlib.util

    try:
        missing = any(
            importlib.util.find_spec(m) is None for m in ("google.protobuf", "opentelemetry.proto")
        )
    except (ImportError, ValueError):
        missing = True
    if missing:
        raise ReceiverError(
            f"{p} is not JSON; reading OTLP protobuf needs opentelemetry-proto and protobuf: "
            "pip install 'initpipe[trace]'"
        ) from None
    try:
        return decode(raw)
    except ReceiverError as err:
        raise ReceiverError(f"{p}: neither JSON nor {err}") from None


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
