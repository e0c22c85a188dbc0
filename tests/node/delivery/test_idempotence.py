"""KAFKA_IDEMPOTENCE: an idempotent producer where the broker grants one.

The embedded broker refuses one (its InitProducerId answers an error): with
``on`` the node refuses to start and says why, with ``auto`` it runs without
and says so in /readyz and a metric. A stand-in that grants producer ids
(tests/kafka_standin.py, a proxy in front of a real broker that answers
InitProducerId itself) shows the other half: the producer id taken and
records delivered through it.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import structlog

from node.delivery.sinks.kafka import KafkaPublisher
from node.errors import IdempotenceRefused
from node.ops import embedded
from node.process import Node
from tests.conftest import (
    HOST,
    TEST_CLUSTER_KEY,
    EmbeddedServers,
    NodeFactory,
    NodeHandle,
    TopicReader,
    make_config,
    unique,
)
from tests.kafka_standin import InitProducerIdStandIn

# Starts brokers of its own besides the shared ones.
pytestmark = pytest.mark.servers


async def schedule_one(node: NodeHandle, topic: str) -> str:
    due = (datetime.now(UTC) + timedelta(milliseconds=200)).isoformat().replace("+00:00", "Z")
    schedule_id = unique("idem")
    status, body = await node.request(
        "POST",
        "/v1/schedules",
        json={"id": schedule_id, "topic": topic, "executeAt": due, "payload": {"n": 1}},
    )
    assert status == 201, body
    return schedule_id


async def metric(node: NodeHandle, name: str) -> float:
    status, text = await node.request("GET", "/metrics")
    assert status == 200
    line = next(line for line in text.splitlines() if line.startswith(name + " "))
    return float(line.split()[1])


async def test_on_refuses_to_start_against_a_broker_that_refuses(
    servers: EmbeddedServers, database_name: str
) -> None:
    node = Node(make_config(servers, database_name, kafka_idempotence="on"))
    try:
        with pytest.raises(IdempotenceRefused) as caught:
            await node.start()
    finally:
        await node.stop()
    message = str(caught.value)
    assert "KAFKA_IDEMPOTENCE=on" in message and "InitProducerId" in message
    assert node.http_port is None  # nothing was served


def test_python_m_node_run_exits_2_and_says_why(
    servers: EmbeddedServers, database_name: str
) -> None:
    env = {
        **os.environ,
        "NODE_ID": "strict",
        "CLUSTER_KEYS": TEST_CLUSTER_KEY,
        "HTTP_BIND": f"{HOST}:{embedded.free_port(HOST)}",
        "GOSSIP_BIND": f"{HOST}:{embedded.free_port(HOST)}",
        "MONGO_URI": servers.mongo_uri,
        "MONGO_DATABASE": database_name,
        "KAFKA_BOOTSTRAP": servers.kafka_bootstrap,
        "KAFKA_IDEMPOTENCE": "on",
        "AUTH": "off",
        "LOG_FORMAT": "json",
    }
    done = subprocess.run(
        [sys.executable, "-m", "node", "run"], env=env, capture_output=True, timeout=120
    )
    output = (done.stdout + done.stderr).decode()
    assert done.returncode == 2, output
    assert "refusing to start" in output and "KAFKA_IDEMPOTENCE=on" in output


async def test_auto_runs_without_idempotence_and_says_so(
    start_node: NodeFactory, servers: EmbeddedServers
) -> None:
    node = await start_node(kafka_idempotence="auto")
    status, ready = await node.request("GET", "/readyz")
    assert status == 200 and ready["ready"]
    assert ready["producer"]["idempotence"] == "auto"
    assert ready["producer"]["idempotent"] is False
    assert "InitProducerId" in ready["producer"]["refused"]
    assert await metric(node, "scheduler_producer_idempotent") == 0
    topic = unique("idem-auto")
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        schedule_id = await schedule_one(node, topic)
        await reader.wait_for(1)
    assert list(reader.by_id()) == [schedule_id]


async def test_auto_says_once_as_a_warning_that_the_broker_refused(
    servers: EmbeddedServers, caplog: pytest.LogCaptureFixture
) -> None:
    """Under auto a refusal is what was asked for: a warning, not an error
    (an error-level line means someone must act), said once however often
    the start is tried, and aiokafka's own error line about it not at all."""
    publisher = KafkaPublisher([servers.kafka_bootstrap], client_id=unique("auto"))
    with structlog.testing.capture_logs() as said, caplog.at_level(logging.DEBUG):
        for _ in range(2):  # a start tried again (node.process retries one)
            await publisher.start()
            assert publisher.started and not publisher.idempotent
            await publisher.stop()
    refusals = [e for e in said if "refused an idempotent producer" in e["event"]]
    assert [(e["log_level"], e["reason"]) for e in refusals] == [
        ("warning", "InitProducerId answered UnknownError")
    ]
    assert [e for e in said if e["log_level"] in {"error", "critical"}] == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert any(r.name.startswith("aiokafka") for r in caplog.records)  # it was heard


@pytest.fixture
async def granting_broker() -> AsyncIterator[tuple[str, InitProducerIdStandIn]]:
    """A real broker behind a proxy that grants producer ids; clients are
    told to connect to the proxy."""
    broker_port, proxy_port = embedded.free_port(HOST), embedded.free_port(HOST)
    broker = embedded.spawn(embedded.kafka_argv(HOST, broker_port, advertised_port=proxy_port))
    standin = InitProducerIdStandIn((HOST, broker_port))
    try:
        embedded.wait_for_port(HOST, broker_port, 60, broker)
        await standin.start(HOST, proxy_port)
        yield f"{HOST}:{proxy_port}", standin
    finally:
        await standin.stop()
        embedded.discard(broker)


@pytest.mark.parametrize("mode", ["on", "auto"])
async def test_an_idempotent_producer_where_the_broker_grants_one(
    start_node: NodeFactory, granting_broker: tuple[str, InitProducerIdStandIn], mode: str
) -> None:
    bootstrap, standin = granting_broker
    node = await start_node(kafka_bootstrap=bootstrap, kafka_idempotence=mode)
    assert standin.granted >= 1
    status, ready = await node.request("GET", "/readyz")
    assert status == 200
    assert ready["producer"] == {"idempotence": mode, "idempotent": True}
    assert await metric(node, "scheduler_producer_idempotent") == 1
    topic = unique("idem-granted")
    async with TopicReader(bootstrap, topic) as reader:
        schedule_id = await schedule_one(node, topic)
        await reader.wait_for(1)
    assert list(reader.by_id()) == [schedule_id]


async def test_off_never_asks_for_a_producer_id(
    start_node: NodeFactory, granting_broker: tuple[str, InitProducerIdStandIn]
) -> None:
    bootstrap, standin = granting_broker
    node = await start_node(kafka_bootstrap=bootstrap, kafka_idempotence="off")
    assert standin.granted == 0
    status, ready = await node.request("GET", "/readyz")
    assert status == 200 and ready["producer"] == {"idempotence": "off", "idempotent": False}
