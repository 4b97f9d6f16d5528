"""Sending spans: the process's OTLP exporter, built after a fork, and the
finished spans :mod:`orchestrator.tracing` hands it.

Nothing here imports the OpenTelemetry SDK until a span is sent or a worker
process starts with tracing on (:func:`enabled`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from orchestrator.trace_context import JobTrace

_enabled: bool | None = None


def enabled() -> bool:
    """Is an OTLP endpoint configured (and the SDK not disabled)? Read once a process."""
    global _enabled
    if _enabled is None:
        env = os.environ
        off = env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or (
            env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none"
        )
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        _enabled = bool(endpoint) and not off and _installed()
    return _enabled


def _installed() -> bool:
    if importlib.util.find_spec("opentelemetry.sdk") is not None:
        return True
    logging.getLogger(__name__).warning(
        "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed "
        "(pip install 'chorus[tracing]'): no traces are sent"
    )
    return False


@dataclass
class Span:
    """A finished span, built here and sent by the process's :class:`_Sink`."""

    name: str
    trace: JobTrace
    span_id: int
    parent_id: int
    start_ns: int
    attributes: dict[str, Any]
    kind: str = "INTERNAL"
    error: str | None = None
    end_ns: int = field(default_factory=time.time_ns)


class _Sink:
    """The process's exporter: OTLP over HTTP behind a batch processor, and
    a tracer provider on the same processor for spans a tool makes itself
    (set as the global one unless the application set its own)."""

    def __init__(self) -> None:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        name = os.environ.get("OTEL_SERVICE_NAME") or "chorus"
        self.resource = Resource.create({"service.name": name})
        self.scope = InstrumentationScope("chorus")
        self.processor = BatchSpanProcessor(OTLPSpanExporter())
        self.provider = TracerProvider(resource=self.resource)
        self.provider.add_span_processor(self.processor)
        if type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider":
            trace.set_tracer_provider(self.provider)

    def send(self, span: Span) -> None:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        flags = TraceFlags(TraceFlags.SAMPLED if span.trace.sampled else 0)
        if not span.trace.sampled:
            return
        parent = (
            SpanContext(span.trace.trace_id, span.parent_id, True, flags)
            if span.parent_id
            else None
        )
        status = Status(StatusCode.ERROR, span.error) if span.error is not None else Status()
        self.processor.on_end(
            ReadableSpan(
                span.name,
                SpanContext(span.trace.trace_id, span.span_id, False, flags),
                parent,
                self.resource,
                span.attributes,
                kind=SpanKind[span.kind],
                status=status,
                start_time=span.start_ns,
                end_time=span.end_ns,
                instrumentation_scope=self.scope,
            )
        )


_sink: tuple[int, _Sink] | None = None
_sink_lock = threading.Lock()


def start() -> None:
    """Build this process's exporter now (a worker, once it runs), not at its first span."""
    if enabled():
        _process_sink()


def _process_sink() -> _Sink:
    global _sink
    with _sink_lock:
        if _sink is None or _sink[0] != os.getpid():  # a forked child builds its own
            _sink = (os.getpid(), _Sink())
        return _sink[1]


def send(span: Span) -> None:
    _process_sink().send(span)


def flush() -> None:
    """Send the spans still batched (a process about to exit)."""
    if _sink is not None and _sink[0] == os.getpid():
        _sink[1].processor.force_flush(5_000)


@contextmanager
def current(trace: JobTrace, span_id: int) -> Iterator[None]:
    """``span_id`` as the OpenTelemetry current span: spans a tool or a model
    client makes itself are its children."""
    from opentelemetry import context
    from opentelemetry import trace as api

    parent = api.SpanContext(trace.trace_id, span_id, False, api.TraceFlags(int(trace.sampled)))
    token = context.attach(api.set_span_in_context(api.NonRecordingSpan(parent)))
    try:
        yield
    finally:
        context.detach(token)
