"""Tracing on: the OpenTelemetry SDK exporting over OTLP/HTTP, imported only
when ``node/telemetry.py`` finds an endpoint configured."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.aiohttp_server import AioHttpServerInstrumentor
from opentelemetry.instrumentation.pymongo import PymongoInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from node.schedule.trace import TRACEPARENT_HEADER
from node.tracing import Outgoing, Tracing, Value

SERVICE = "bucket-scheduler"
EXCLUDED_URLS = "/healthz,/readyz,/metrics,/v1/internal/wake"


class _Traced(Outgoing[Value]):
    def __init__(self, headers: Sequence[tuple[str, Value]], span: trace.Span) -> None:
        super().__init__(headers)
        self.span = span

    def failed(self, reason: str) -> None:
        self.span.set_status(Status(StatusCode.ERROR, reason))


class OtelTracing(Tracing):
    enabled = True

    def __init__(self, node_id: str, version: str) -> None:
        resource = Resource.create(
            {"service.name": SERVICE, "service.instance.id": node_id, "service.version": version}
        )
        self.provider = TracerProvider(resource=resource)
        # The exporter reads OTEL_EXPORTER_OTLP_* (endpoint, headers, timeout).
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(self.provider)
        PymongoInstrumentor().instrument(tracer_provider=self.provider)
        # Probes, scrapes and the nodes' wake-ups come every few seconds:
        # no spans for them unless the operator names other URLs to skip.
        os.environ.setdefault("OTEL_PYTHON_AIOHTTP_SERVER_EXCLUDED_URLS", EXCLUDED_URLS)
        # Every aiohttp Application made from now on runs its middleware
        # first (the node's is made at start, after this).
        AioHttpServerInstrumentor().instrument(tracer_provider=self.provider)
        self.tracer = self.provider.get_tracer("node.delivery")
        self.propagator = TraceContextTextMapPropagator()

    def current_traceparent(self) -> str | None:
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier)
        return carrier.get(TRACEPARENT_HEADER)

    def _parent(self, traceparent: str | None) -> otel_context.Context | None:
        if traceparent is None:
            return None
        return self.propagator.extract({TRACEPARENT_HEADER: traceparent})

    @contextlib.contextmanager
    def publishing(
        self, topic: str, headers: Sequence[tuple[str, bytes]]
    ) -> Iterator[Outgoing[bytes]]:
        stored = next((v.decode() for n, v in headers if n == TRACEPARENT_HEADER), None)
        attributes = {
            "messaging.system": "kafka",
            "messaging.operation.type": "send",
            "messaging.destination.name": topic,
        }
        with self.tracer.start_as_current_span(
            f"send {topic}", context=self._parent(stored), kind=SpanKind.PRODUCER,
            attributes=attributes,
        ) as span:  # fmt: skip
            passed_on = (self.current_traceparent() or "").encode()
            yield _Traced(_replaced(headers, passed_on), span)

    @contextlib.contextmanager
    def calling(
        self, method: str, host: str, headers: Sequence[tuple[str, str]]
    ) -> Iterator[Outgoing[str]]:
        stored = next((v for n, v in headers if n.lower() == TRACEPARENT_HEADER), None)
        attributes = {"http.request.method": method, "server.address": host}
        with self.tracer.start_as_current_span(
            method, context=self._parent(stored), kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            yield _Traced(_replaced(headers, self.current_traceparent() or ""), span)

    def close(self) -> None:
        self.provider.shutdown()


def _replaced(headers: Sequence[tuple[str, Value]], traceparent: Value) -> list[tuple[str, Value]]:
    """``headers`` passing on ``traceparent`` (this span's) in place of the
    stored one: the receiver's work becomes this delivery's child."""
    kept: list[tuple[str, Value]] = [(n, v) for n, v in headers if n.lower() != TRACEPARENT_HEADER]
    return [*kept, (TRACEPARENT_HEADER, traceparent)] if traceparent else kept
