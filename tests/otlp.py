"""A tiny OTLP/HTTP trace receiver: what an OpenTelemetry collector would get."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root span
    kind: int
    status_code: int  # 0 unset, 1 ok, 2 error
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    service: str


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


class Receiver:
    """Spans posted to ``url`` + ``/v1/traces`` (protobuf, maybe gzipped)."""

    def __init__(self, server: ThreadingHTTPServer) -> None:
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        self.spans: list[ReceivedSpan] = []
        self.lock = threading.Lock()

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        found = []
        for resource in request.resource_spans:
            attrs = {kv.key: _value(kv.value) for kv in resource.resource.attributes}
            for scope in resource.scope_spans:
                for span in scope.spans:
                    found.append(
                        ReceivedSpan(
                            span.name,
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            span.kind,
                            span.status.code,
                            span.start_time_unix_nano,
                            span.end_time_unix_nano,
                            {kv.key: _value(kv.value) for kv in span.attributes},
                            str(attrs.get("service.name", "")),
                        )
                    )
        with self.lock:
            self.spans.extend(found)

    def received(self) -> list[ReceivedSpan]:
        with self.lock:
            return list(self.spans)


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """A receiver on a free loopback port, answering every export with 200."""
    receiver: Receiver | None = None

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            status = 404
            if self.path == "/v1/traces" and receiver is not None:
                receiver.add(body)
                status = 200
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = Receiver(server)
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
