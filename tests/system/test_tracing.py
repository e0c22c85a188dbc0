"""OpenTelemetry, opt-in (node/telemetry.py): off, nothing of it is loaded;
on, a node exports over OTLP the span of each API call, of its store calls,
and of each delivery, the delivery's the child of the create's span (through
the ``traceparent`` stored with the schedule) and passed on to the consumer.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from node import telemetry
from node.errors import CannotStart
from node.schedule.webhook import new_secret
from tests.conftest import EmbeddedServers, TopicReader, unique, wait_until
from tests.helpers import serving
from tests.node_process import NodeProcess

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def test_off_by_default_and_nothing_of_opentelemetry_is_imported() -> None:
    """In a process of its own: this one has the SDK loaded by other tests."""
    program = (
        "import sys\n"
        "from node import telemetry\n"
        "from node.process import Node\n"
        "from node.api.app import build_app\n"
        "tracing = telemetry.start('n', '0', environ={})\n"
        "assert tracing is telemetry.OFF and not tracing.enabled\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_an_endpoint_without_the_extra_installed_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "node.otel", None)  # as if not installed
    with pytest.raises(CannotStart, match=r"bucket-scheduler\[otel\]"):
        telemetry.start("n", "0", environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"})


class Collector:
    """An OTLP/HTTP receiver: keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.hooks: list[str | None] = []

    async def hook(self, request: web.Request) -> web.Response:
        await request.read()
        self.hooks.append(request.headers.get("traceparent"))
        return web.Response(status=204)

    async def handle(self, request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        for resource in export.resource_spans:
            for scope in resource.scope_spans:
                self.spans.extend(scope.spans)
        return web.Response(
            body=b"", content_type="application/x-protobuf"
        )  # an empty ExportTraceServiceResponse

    def named(self, name: str) -> list[Any]:
        return [span for span in self.spans if span.name == name]


@pytest.fixture
async def collector() -> AsyncIterator[tuple[Collector, str]]:
    """The OTLP receiver, and at /hook an HTTP destination keeping each
    call's traceparent (in ``collector.hooks``)."""
    collector = Collector()
    app = web.Application()
    app.router.add_post("/v1/traces", collector.handle)
    app.router.add_post("/hook", collector.hook)
    async with serving(app) as url:
        yield collector, url


async def test_a_delivery_span_is_the_child_of_the_create_and_passed_on(
    servers: EmbeddedServers,
    database_name: str,
    tmp_path: Path,
    collector: tuple[Collector, str],
) -> None:
    spans, endpoint = collector
    topic = unique("otel")
    node = NodeProcess(
        tmp_path / "node.log",
        MONGO_URI=servers.mongo_uri,
        MONGO_DATABASE=database_name,
        KAFKA_BOOTSTRAP=servers.kafka_bootstrap,
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_BSP_SCHEDULE_DELAY="100",
        HTTP_TARGETS_ALLOW="127.0.0.0/8",
        HTTP_SIGNING_SECRET=new_secret(),
    )
    await node.start()
    try:
        async with (
            aiohttp.ClientSession() as session,
            TopicReader(servers.kafka_bootstrap, topic) as reader,
        ):
            await node.wait_ready(session)
            due = (datetime.now(UTC) + timedelta(seconds=0.3)).isoformat()
            async with session.post(
                node.url + "/v1/schedules",
                json={"topic": topic, "executeAt": due, "payload": 1},
                headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"},
            ) as response:
                created = await response.json()
                assert response.status == 201, created
            async with session.post(
                node.url + "/v1/schedules",
                json={"http": {"url": endpoint + "/hook"}, "executeAt": due, "payload": 1},
                headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"},
            ) as response:
                assert response.status == 201, await response.text()
            [record] = await reader.wait_for(1)

            async def exported() -> bool:
                return bool(spans.named(f"send {topic}")) and bool(spans.named("POST"))

            await wait_until(exported, 60, "the delivery's span to be exported")
    finally:
        assert await node.stop() == 0
    # The two creates, in the order they were made: the Kafka one, then the HTTP one.
    create, create_http = sorted(
        (
            s
            for s in spans.spans
            if s.kind == s.SPAN_KIND_SERVER and s.trace_id.hex() == CALLER_TRACE
        ),
        key=lambda s: s.start_time_unix_nano,
    )
    assert create.parent_span_id.hex() == CALLER_SPAN  # the caller's span is its parent
    [send] = spans.named(f"send {topic}")
    assert send.kind == send.SPAN_KIND_PRODUCER
    assert send.trace_id.hex() == CALLER_TRACE
    assert send.parent_span_id == create.span_id  # the delivery, the create's child
    # The stored context is the create's span, and the schedule shows it.
    assert created["traceparent"] == f"00-{CALLER_TRACE}-{create.span_id.hex()}-01"
    # The consumer continues from the delivery's span.
    passed_on = dict(record.headers)["traceparent"].decode()
    assert passed_on == f"00-{CALLER_TRACE}-{send.span_id.hex()}-01"
    # An HTTP delivery likewise: a client span, the child of its create, and
    # the destination continues from it.
    [call] = spans.named("POST")
    assert call.kind == call.SPAN_KIND_CLIENT and call.parent_span_id == create_http.span_id
    assert collector[0].hooks == [f"00-{CALLER_TRACE}-{call.span_id.hex()}-01"]
    # The request id is the trace's, and the store's calls have spans too.
    assert created["requestId"] == CALLER_TRACE
    assert any(s.kind == s.SPAN_KIND_CLIENT and "insert" in s.name for s in spans.spans), [
        s.name for s in spans.spans
    ]
