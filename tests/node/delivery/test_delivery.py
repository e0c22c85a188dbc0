"""Schedules reach Kafka: on time, once, with the contract's headers;
cancel wins; failures retry and dead-letter; restarts lose nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from node.ops import embedded
from node.process import Node
from tests.conftest import (
    EmbeddedServers,
    NodeFactory,
    NodeHandle,
    TopicReader,
    make_config,
    start_mongo,
    unique,
    wait_until,
)
from tests.helpers import at, failing_node, parse, status_of, wait_status


async def test_record_has_key_value_and_headers_and_is_never_early(
    start_node: NodeFactory, servers: EmbeddedServers
) -> None:
    topic = unique("deliver")
    node = await start_node()
    execute_at = at(1.5)
    status, created = await node.request(
        "POST",
        "/v1/schedules",
        json={
            "id": "remind-1",
            "topic": topic,
            "executeAt": execute_at,
            "payload": {"user": 7, "text": "héllo"},
            "key": "user-7",
            "headers": {"trace-id": "abc"},
            "tenant": "shop",
        },
    )
    assert status == 201
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        [record] = await reader.wait_for(1)
    assert record.key == b"user-7"
    assert record.value == '{"user":7,"text":"héllo"}'.encode()
    headers = dict(record.headers)
    assert headers["schedule-id"] == b"remind-1"
    assert headers["execute-at"] == created["executeAt"].encode()
    assert headers["tenant"] == b"shop"
    assert headers["attempt"] == b"1"
    assert int(headers["fence-token"]) >= 1
    assert headers["trace-id"] == b"abc"

    done = await wait_status(node, "remind-1?tenant=shop", "DELIVERED")
    assert done["attempts"] == 1
    assert parse(done["deliveredAt"]) >= parse(done["executeAt"])
    assert record.timestamp / 1000 >= parse(execute_at).timestamp()


async def test_base64_payload_is_published_as_raw_bytes(
    start_node: NodeFactory, servers: EmbeddedServers
) -> None:
    topic = unique("raw")
    node = await start_node()
    await node.request(
        "POST",
        "/v1/schedules",
        json={"id": "bin", "topic": topic, "executeAt": at(0), "payloadBase64": "AP8A"},
    )
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        [record] = await reader.wait_for(1)
    assert record.value == b"\x00\xff\x00"
    assert record.key == b"bin"


async def test_poller_wakes_at_the_due_time_not_the_poll_interval(
    start_node: NodeFactory, servers: EmbeddedServers
) -> None:
    # With a 60 s poll interval, only the wake-up on the next due time (and
    # the hint from the API) can deliver within the 40 s wait below.
    topic = unique("wake")
    node = await start_node(poll_interval="60")

    async def leased() -> bool:
        return len(node.node.leases.usable()) == 16

    await wait_until(leased, what="leases")
    await asyncio.sleep(0.2)  # let the poller fall asleep on its long interval
    await node.request(
        "POST", "/v1/schedules", json={"topic": topic, "executeAt": at(1), "payload": 1}
    )
    await node.request(
        "POST", "/v1/schedules", json={"topic": topic, "executeAt": at(2), "payload": 2}
    )
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        records = await reader.wait_for(2, within=40)
    assert sorted(r.value for r in records) == [b"1", b"2"]


async def test_cancel_wins(start_node: NodeFactory, servers: EmbeddedServers) -> None:
    topic = unique("cancel")
    node = await start_node()
    await node.request(
        "POST", "/v1/schedules", json={"id": "c", "topic": topic, "executeAt": at(1), "payload": 0}
    )
    status, body = await node.request("DELETE", "/v1/schedules/c")
    assert (status, body["status"]) == (200, "CANCELLED")
    # A later schedule on the same topic marks the time by which the
    # cancelled one would have been published.
    await node.request(
        "POST",
        "/v1/schedules",
        json={"id": "after", "topic": topic, "executeAt": at(2), "payload": 1},
    )
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        await reader.wait_for(1)
        await wait_status(node, "after", "DELIVERED")
        await reader.poll()
        assert set(reader.by_id()) == {"after"}
    assert await status_of(node, "c") == "CANCELLED"


async def test_burst_is_delivered_exactly_once_each(
    start_node: NodeFactory, servers: EmbeddedServers, mongo: Any
) -> None:
    topic = unique("burst")
    node = await start_node(batch_size="50")
    due = at(0)
    ids = [f"b-{i}" for i in range(300)]
    for schedule_id in ids:
        status, _ = await node.request(
            "POST",
            "/v1/schedules",
            json={"id": schedule_id, "topic": topic, "executeAt": due, "payload": schedule_id},
        )
        assert status == 201
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        await reader.wait_for(len(ids))

        async def all_marked() -> bool:
            n = await mongo.schedules.count_documents({"status": "DELIVERED"})
            return bool(n == len(ids))

        await wait_until(all_marked, what="every schedule marked DELIVERED")
        await reader.poll()
        by_id = reader.by_id()
    assert sorted(by_id) == sorted(ids)
    assert all(len(records) == 1 for records in by_id.values())


async def test_failed_publish_is_retried_with_backoff(
    start_node: NodeFactory, servers: EmbeddedServers, database_name: str
) -> None:
    topic = unique("retry")
    node = await failing_node(
        start_node,
        servers,
        database_name,
        topic,
        {"flaky": 2},
        retry_backoff="0.2",
        max_attempts="5",
    )
    await node.request(
        "POST",
        "/v1/schedules",
        json={"id": "flaky", "topic": topic, "executeAt": at(0), "payload": 1},
    )
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        [record] = await reader.wait_for(1)
    assert dict(record.headers)["attempt"] == b"3"
    done = await wait_status(node, "flaky", "DELIVERED")
    assert done["attempts"] == 3
    assert done["lastError"] is None


async def test_past_the_retry_limit_it_fails_to_the_dead_letter_topic(
    start_node: NodeFactory, servers: EmbeddedServers, database_name: str
) -> None:
    topic, dead = unique("poison"), unique("dlq")
    node = await failing_node(
        start_node,
        servers,
        database_name,
        topic,
        {"poison": 99},
        retry_backoff="0.05",
        max_attempts="3",
        dead_letter_topic=dead,
    )
    await node.request(
        "POST",
        "/v1/schedules",
        json={"id": "poison", "topic": topic, "executeAt": at(0), "payload": 1},
    )
    # The poison message does not block the bucket: a healthy one goes through.
    await node.request(
        "POST",
        "/v1/schedules",
        json={"id": "healthy", "topic": topic, "executeAt": at(0), "payload": 2},
    )
    failed = await wait_status(node, "poison", "DELIVERY_FAILED")
    assert failed["attempts"] == 3
    assert "injected failure 3" in failed["lastError"]
    await wait_status(node, "healthy", "DELIVERED")
    async with TopicReader(servers.kafka_bootstrap, dead) as reader:
        [record] = await reader.wait_for(1)
    headers = dict(record.headers)
    assert headers["schedule-id"] == b"poison"
    assert headers["original-topic"] == topic.encode()
    assert b"injected failure 3" in headers["error"]


async def test_pending_schedules_survive_a_restart_of_node_and_database(
    servers: EmbeddedServers, tmp_path: Path, start_node: NodeFactory
) -> None:
    topic = unique("restart")
    mongo, port = start_mongo(tmp_path / "db")
    try:
        restart_servers = EmbeddedServers(
            servers.mongo_host, port, servers.kafka_bootstrap, tmp_path, mongo, servers.kafka
        )
        first = Node(make_config(restart_servers, "restart"))
        assert await first.start()
        async with aiohttp.ClientSession() as session:
            handle = NodeHandle(first, session)
            status, _ = await handle.request(
                "POST",
                "/v1/schedules",
                json={
                    "id": "survivor",
                    "topic": topic,
                    "executeAt": at(4),
                    "payload": "still here",
                },
            )
            assert status == 201
        await first.stop()

        embedded.stop(mongo)
        mongo, _ = start_mongo(tmp_path / "db", port)

        second = await start_node(Node(make_config(restart_servers, "restart", node_id="node-b")))
        assert await status_of(second, "survivor") == "PENDING"
        async with TopicReader(servers.kafka_bootstrap, topic) as reader:
            [record] = await reader.wait_for(1)
        assert record.value == b'"still here"'
        await wait_status(second, "survivor", "DELIVERED")
        await second.node.stop()
    finally:
        embedded.stop(mongo)
