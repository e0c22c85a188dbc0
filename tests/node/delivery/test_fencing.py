"""Two pollers on one bucket: the first freezes mid-batch (a GC pause, a
SIGSTOP), the second takes over, then the first resumes. Nothing is lost,
the frozen owner's writes are rejected, and its only duplicates are the
batch it had in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from node.delivery.leases import LeaseManager
from node.delivery.sinks.kafka import KafkaPublisher
from node.schedule.record import Record
from node.store.leases import LeaseStore
from node.store.schedules import ScheduleStore
from tests.conftest import EmbeddedServers, TopicReader, metric_samples, unique, wait_until
from tests.helpers import poller, store_overdue


class FrozenPublisher(KafkaPublisher):
    """Blocks its first publish until released: the owner freezes between
    claiming a batch and publishing it."""

    def __init__(self, inner: KafkaPublisher) -> None:
        self.inner = inner
        self.frozen = asyncio.Event()
        self.release = asyncio.Event()
        self.calls = 0

    async def publish(self, records: Sequence[Record]) -> list[BaseException | None]:
        self.calls += 1
        if self.calls == 1:
            self.frozen.set()
            await self.release.wait()
        return await self.inner.publish(records)


async def test_a_frozen_owner_cannot_overwrite_its_successor(
    servers: EmbeddedServers, mongo: Any
) -> None:
    topic = unique("fence")
    store = ScheduleStore(mongo, 1)
    ids = [f"f{i}" for i in range(25)]
    await store_overdue(store, topic, ids)

    real_a = KafkaPublisher([servers.kafka_bootstrap], client_id="a")
    real_b = KafkaPublisher([servers.kafka_bootstrap], client_id="b")
    await real_a.start()
    await real_b.start()
    frozen = FrozenPublisher(real_a)
    # A short lease for a, which will not renew it while frozen.
    leases_a = LeaseManager(LeaseStore(mongo.buckets, "a"), ttl=2.0)
    leases_b = LeaseManager(LeaseStore(mongo.buckets, "b"), ttl=30.0)
    poller_a = poller(store, leases_a, frozen, "a")
    poller_b = poller(store, leases_b, real_b, "b")
    try:
        assert await leases_a.acquire([0]) == [0]
        token_a = leases_a.usable()[0]
        task_a = asyncio.create_task(poller_a.run_once())
        await asyncio.wait_for(frozen.frozen.wait(), 30)  # a claimed 10 and froze

        async def b_took_over() -> bool:
            return await leases_b.acquire([0]) == [0]

        await wait_until(b_took_over, what="b to take the expired lease")
        token_b = leases_b.usable()[0]
        assert token_b > token_a

        async def b_delivered_everything() -> bool:
            await poller_b.run_once()
            done = await mongo.schedules.count_documents({"status": "DELIVERED"})
            return bool(done == len(ids))

        await wait_until(b_delivered_everything, what="b to deliver every schedule")
        assert poller_b.metrics.recovered._value.get() == 10  # a's batch, made due again

        frozen.release.set()  # a wakes up and carries on with its old batch
        await asyncio.wait_for(task_a, 30)
        docs = await mongo.schedules.find({}).to_list()
        assert {d["status"] for d in docs} == {"DELIVERED"}
        assert {d["token"] for d in docs} == {token_b}
        assert {d["owner"] for d in docs} == {"b"}
        # a's marks matched nothing, and a knows it.
        assert poller_a.metrics.deliveries.labels("fenced")._value.get() == 10
        assert poller_a.metrics.deliveries.labels("delivered")._value.get() == 0
        assert metric_samples(poller_a.metrics, "scheduler_tenant_deliveries_total") == {
            ("default", "fenced"): 10
        }

        async with TopicReader(servers.kafka_bootstrap, topic) as reader:
            await reader.wait_for(len(ids) + 10)
            by_id = reader.by_id()
        assert sorted(by_id) == sorted(ids)  # nothing lost
        duplicated = {i for i, records in by_id.items() if len(records) > 1}
        assert len(duplicated) == 10  # exactly a's batch in flight
        for schedule_id in duplicated:
            tokens = sorted(int(dict(r.headers)["fence-token"]) for r in by_id[schedule_id])
            assert tokens == [token_a, token_b]  # each repeat explained by a token change
    finally:
        frozen.release.set()
        await real_a.stop()
        await real_b.stop()
