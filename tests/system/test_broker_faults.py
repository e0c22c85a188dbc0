"""What a broker fault costs: a broker outage delays delivery and spends no
retry attempt; only a record's own fault does. /readyz and a metric say
when the broker is down, and the metrics how much waits and for how long;
a dead-letter publish the broker refuses keeps the schedule retrying; a
topic the broker does not have is refused at admission; one record waiting
for its topic does not hold up the others.

A broker of the test's own (the session's is shared) is stopped and started
again on the same port for the outage.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from node.delivery.sink import Failed, Trouble
from node.delivery.sinks.kafka import KafkaPublisher
from node.ops import embedded
from node.process import Node
from node.schedule.record import Record
from node.store.schedules import ScheduleStore
from tests.conftest import (
    HOST,
    EmbeddedServers,
    NodeFactory,
    NodeHandle,
    TopicReader,
    make_config,
    unique,
    wait_until,
)
from tests.helpers import FailingPublisher, stamp
from tests.virtual import schedule


class Broker:
    """An embedded broker on a fixed port that can be stopped and started."""

    def __init__(self) -> None:
        self.port = embedded.free_port(HOST)
        self.process: Any = None

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def start(self) -> None:
        self.process = embedded.spawn(embedded.kafka_argv(HOST, self.port))
        embedded.wait_for_port(HOST, self.port, 60, self.process)

    def stop(self) -> None:
        if self.process is not None:
            embedded.discard(self.process)
            self.process = None


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    own = Broker()
    own.start()
    try:
        yield own
    finally:
        await asyncio.to_thread(own.stop)


async def metric(node: NodeHandle, line_start: str) -> float:
    _, text = await node.request("GET", "/metrics")
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    return 0.0


async def test_a_broker_outage_spends_no_attempt_and_readyz_says_so(
    start_node: NodeFactory, broker: Broker, mongo: Any
) -> None:
    # Two attempts and a 50 ms backoff: before, an outage of a second or two
    # turned everything due into DELIVERY_FAILED (finding 6: 1,939 of 5,875
    # after a 5-minute outage).
    node = await start_node(
        kafka_bootstrap=broker.bootstrap,
        max_attempts="2",
        retry_backoff="0.05",
        poll_interval="0.2",
    )
    topic = unique("outage")
    await asyncio.to_thread(broker.stop)
    ids = [f"o{i}" for i in range(5)]
    for schedule_id in ids:
        body = {
            "id": schedule_id,
            "topic": topic,
            "executeAt": stamp(datetime.now(UTC)),
            "payload": 1,
        }
        status, _ = await node.request("POST", "/v1/schedules", json=body)
        assert status == 201  # the broker's outage does not stop intake

    async def deferred() -> bool:
        # The counter moves before the batch is put back and claiming paused
        # (the gauge): wait for both, then look.
        return (
            await metric(node, 'scheduler_deliveries_total{outcome="deferred"}') >= 1
            and await metric(node, "scheduler_broker_available") == 0
        )

    await wait_until(deferred, within=60, what="the poller to find the broker down")
    status, ready = await node.request("GET", "/readyz")
    assert status == 503 and ready["checks"]["broker"] is False
    assert await metric(node, "scheduler_broker_available") == 0
    docs = await mongo.schedules.find({"_id": {"$in": ids}}).to_list()
    assert {(d["status"], d["attempts"]) for d in docs} == {("PENDING", 0)}

    await asyncio.to_thread(broker.start)
    async with TopicReader(broker.bootstrap, topic) as reader:

        async def delivered() -> bool:
            docs = await mongo.schedules.find({"_id": {"$in": ids}}).to_list()
            return all(d["status"] == "DELIVERED" for d in docs)

        await wait_until(delivered, within=90, what="delivery once the broker is back")
        await reader.wait_for(len(ids))
    docs = await mongo.schedules.find({"_id": {"$in": ids}}).to_list()
    assert {d["attempts"] for d in docs} == {1}  # the outage cost no attempt
    assert await mongo.schedules.count_documents({"status": "DELIVERY_FAILED"}) == 0

    async def ready_again() -> bool:
        status, _ = await node.request("GET", "/readyz")
        return status == 200

    await wait_until(ready_again, what="/readyz to say the broker is back")
    assert await metric(node, "scheduler_broker_available") == 1


async def gauge(node: NodeHandle, name: str) -> float:
    """A gauge without labels as the node's /metrics says it (it must be there)."""
    _, text = await node.request("GET", "/metrics")
    [value] = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    return value


async def test_an_outages_due_backlog_and_its_age_show_in_the_metrics_until_it_drains(
    start_node: NodeFactory, broker: Broker, mongo: Any
) -> None:
    # Four buckets and a small batch: each bucket's view reads 20 of its 50
    # or so (the read budget is four batches), so the backlog past the
    # views is counted in the store (node/delivery/due_outlook.py). Stored
    # as another node's API would (a node's own go into its views whole).
    node = await start_node(
        kafka_bootstrap=broker.bootstrap, buckets="4", batch_size="20", poll_interval="0.2"
    )
    assert await gauge(node, "scheduler_due_backlog") == 0
    assert await gauge(node, "scheduler_oldest_due_age_seconds") == 0
    topic = unique("backlog")
    await asyncio.to_thread(broker.stop)
    elsewhere = ScheduleStore(mongo, 4)
    now = datetime.now(UTC)
    await elsewhere.prepare(now)
    for index in range(200):
        await elsewhere.insert(schedule(f"b{index}", now, now, topic=topic), now)

    async def all_waiting() -> bool:
        return await gauge(node, "scheduler_due_backlog") == 200

    await wait_until(all_waiting, within=60, what="the backlog of 200 in the metrics")
    first = await gauge(node, "scheduler_oldest_due_age_seconds")
    assert first > 0

    async def older() -> bool:
        return await gauge(node, "scheduler_oldest_due_age_seconds") > first

    await wait_until(older, what="the oldest due schedule's age to grow")

    await asyncio.to_thread(broker.start)

    async def drained() -> bool:
        return (
            await gauge(node, "scheduler_due_backlog") == 0
            and await gauge(node, "scheduler_oldest_due_age_seconds") == 0
        )

    await wait_until(drained, within=90, what="the backlog to drain once the broker is back")
    # Nothing was left out meanwhile: not a batch being claimed or published.
    assert await mongo.schedules.count_documents({"status": "DELIVERED"}) == 200


class RefusingDeadLetters(FailingPublisher):
    """Every publish of the schedule fails on its own account, and the dead-
    letter topic refuses its first ``refusals`` records too."""

    def __init__(self, inner: KafkaPublisher, topic: str, dead: str, refusals: int) -> None:
        super().__init__(inner, topic, {"doomed": 1000})
        self.dead, self.refusals = dead, refusals

    async def publish(self, records: Sequence[Record]) -> list[Failed | None]:
        if records and records[0].topic == self.dead and self.refusals > 0:
            self.refusals -= 1
            return [
                Failed("TopicAuthorizationFailedError: injected", Trouble.RETRY) for _ in records
            ]
        return await super().publish(records)


async def test_a_dead_letter_the_broker_refuses_keeps_the_schedule_retrying(
    start_node: NodeFactory, servers: EmbeddedServers, database_name: str, mongo: Any
) -> None:
    topic, dead = unique("doomed"), unique("dead")
    node = Node(
        make_config(
            servers,
            database_name,
            max_attempts="2",
            retry_backoff="0.05",
            retry_backoff_max="0.1",
            dead_letter_topic=dead,
        )
    )
    refusing = RefusingDeadLetters(node.publisher, topic, dead, refusals=2)
    node.publisher = node.poller.publisher = refusing
    handle = await start_node(node)
    async with TopicReader(servers.kafka_bootstrap, dead) as reader:
        body = {"id": "doomed", "topic": topic, "executeAt": stamp(datetime.now(UTC)), "payload": 1}
        assert (await handle.request("POST", "/v1/schedules", json=body))[0] == 201

        async def failed() -> bool:
            doc = await mongo.schedules.find_one({"_id": "doomed"})
            return doc is not None and doc["status"] == "DELIVERY_FAILED"

        await wait_until(failed, within=60, what="the schedule to fail, with its dead letter")
        await reader.wait_for(1)
    doc = await mongo.schedules.find_one({"_id": "doomed"})
    assert refusing.refusals == 0
    # Attempts went on past the limit while the dead-letter topic refused: it
    # never ended without its record.
    assert doc["attempts"] > 2
    assert [dict(r.headers)["schedule-id"] for r in reader.records] == [b"doomed"]


async def test_a_topic_the_broker_does_not_have_is_refused_at_admission(
    start_node: NodeFactory, servers: EmbeddedServers, database_name: str, mongo: Any
) -> None:
    # The embedded broker creates every topic on first use; a Kafka with
    # auto.create.topics.enable=false answers UNKNOWN_TOPIC_OR_PARTITION, as
    # this stand-in does for "absent" (and "mute" does not answer at all).
    node = Node(make_config(servers, database_name))
    answers = {"absent": False, "mute": None}

    async def topic_known(topic: str) -> bool | None:
        return answers.get(topic, True)

    node.admission.topic_known = topic_known
    handle = await start_node(node)
    later = stamp(datetime.now(UTC) + timedelta(hours=1))
    status, body = await handle.request(
        "POST", "/v1/schedules", json={"topic": "absent", "executeAt": later, "payload": 1}
    )
    assert (status, body["error"]["code"], body["error"]["field"]) == (
        422,
        "unknown_topic",
        "topic",
    )
    status, body = await handle.request(
        "POST",
        "/v1/schedules:batch",
        json={"schedules": [{"topic": t, "executeAt": later, "payload": 1} for t in answers]},
    )
    assert [r["status"] for r in body["results"]] == [422, 201]  # the broker did not answer: taken
    assert await mongo.schedules.count_documents({"topic": "absent"}) == 0


async def test_one_record_waiting_for_its_topic_does_not_hold_the_others(
    servers: EmbeddedServers,
) -> None:
    publisher = KafkaPublisher([servers.kafka_bootstrap], client_id="slow-topic")
    await publisher.start()
    try:
        producer = publisher._producer
        assert producer is not None
        real_send = producer.send

        async def send(topic: str, *args: Any, **kwargs: Any) -> Any:
            if topic == "stuck":
                await asyncio.Event().wait()  # its metadata never comes
            return await real_send(topic, *args, **kwargs)

        producer.send = send  # type: ignore[method-assign]
        ok = unique("ok")
        records = [Record(t, b"k", b"v", []) for t in ("stuck", ok, ok)]
        # A hang guard, not a performance assertion: before, the batch waited
        # for the stuck record forever.
        results = await asyncio.wait_for(publisher.publish(records), timeout=60)
    finally:
        await publisher.stop()
    assert results[1:] == [None, None]
    assert isinstance(results[0], Failed)


class NoTopics:
    """A producer whose every send fails as a topic the broker does not know."""

    async def send(self, topic: str, value: bytes, **kwargs: Any) -> Any:
        from aiokafka.errors import UnknownTopicOrPartitionError

        raise UnknownTopicOrPartitionError()


async def test_a_failed_batch_asks_the_broker_about_each_topic_once() -> None:
    """Before, every failed record of a batch asked the broker about its
    topic again: 100 records of 2 topics were 100 metadata requests."""
    publisher = KafkaPublisher(["127.0.0.1:1"], client_id="probe")
    publisher._producer = NoTopics()  # type: ignore[assignment]
    asked: list[str] = []

    async def topic_known(topic: str) -> bool | None:
        asked.append(topic)
        return topic == "kept"

    publisher.topic_known = topic_known  # type: ignore[method-assign]
    records = [Record("kept" if i % 2 else "gone", b"k", b"v", []) for i in range(100)]
    results = await publisher.publish(records)
    assert sorted(asked) == ["gone", "kept"]
    assert all(r is not None for r in results)
    troubles = {rec.topic: r.trouble for r, rec in zip(results, records, strict=True) if r}
    assert troubles == {"kept": Trouble.DESTINATION, "gone": Trouble.RETRY}


async def test_readyz_costs_the_store_and_the_broker_nothing(start_node: NodeFactory) -> None:
    """/readyz is open to anyone: it answers from what the node's own probes
    last found (before, each call pinged the store and fetched the whole
    cluster's metadata from the broker)."""
    node = await start_node()
    calls: list[str] = []
    database = node.node.store.database  # the API's: the node's probes use the other
    client = node.node.publisher._producer.client  # type: ignore[union-attr]
    command, fetch_all = database.command, client.fetch_all_metadata

    async def counted_command(*args: Any, **kwargs: Any) -> Any:
        calls.append(f"store {args[0]}")
        return await command(*args, **kwargs)

    async def counted_fetch_all() -> Any:
        calls.append("metadata")
        return await fetch_all()

    database.command = counted_command  # type: ignore[method-assign]
    client.fetch_all_metadata = counted_fetch_all  # type: ignore[method-assign]
    for _ in range(50):
        status, body = await node.request("GET", "/readyz")
        assert status == 200 and body["ready"] is True
    assert calls == []
