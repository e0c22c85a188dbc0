"""Nothing stays IN_FLIGHT under a live token for good (issue 26, finding 3).

When the broker took some records of a batch and deferred the others, and
the store then refused the deferred ones' put-back, the delivered ones'
completions were never computed, written or kept: they stayed IN_FLIGHT
under the owner's live token, which recovery (of older tokens only) never
touched. Now every outcome is decided before any write and kept whole for
the next round on any error; and as a safety net, the recovery sweep takes
what the owner's own token has held IN_FLIGHT for longer than any round.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from node.delivery.leases import LeaseManager
from node.delivery.poller import BucketPoller
from node.delivery.sink import Failed, Trouble
from node.delivery.sinks.kafka import KafkaPublisher
from node.errors import StoreUnavailable
from node.schedule.record import Record
from node.store.contract import Claimed
from node.store.leases import LeaseStore
from node.store.schedules import ScheduleStore
from tests.conftest import EmbeddedServers, TopicReader, unique, wait_until
from tests.helpers import poller, store_overdue


class HalfTaken(KafkaPublisher):
    """A broker that takes every other record of the first batch and is
    unreachable for the rest of it; everything after goes through."""

    def __init__(self, inner: KafkaPublisher) -> None:
        self.inner = inner
        self.batches = 0

    async def publish(self, records: Sequence[Record]) -> list[Failed | None]:
        self.batches += 1
        if self.batches > 1:
            return await self.inner.publish(records)
        taken = await self.inner.publish(records[::2])
        results: list[Failed | None] = [
            Failed("KafkaConnectionError: broker went away", Trouble.DESTINATION)
        ] * len(records)
        results[::2] = taken
        return results


class RefusesOnePutBack(ScheduleStore):
    """The store times out on the first put-back of deferred claims."""

    refused = 0

    async def unclaim(self, claims: Sequence[Claimed]) -> int:
        if not self.refused:
            self.refused += 1
            raise StoreUnavailable("timed out putting the deferred claims back")
        return await super().unclaim(claims)


async def statuses(mongo: Any) -> dict[str, str]:
    return {d["_id"]: d["status"] for d in await mongo.schedules.find({}).to_list()}


async def test_a_failed_put_back_leaves_no_published_schedule_in_flight(
    servers: EmbeddedServers, mongo: Any
) -> None:
    topic = unique("half")
    store = RefusesOnePutBack(mongo, 1)
    ids = [f"h{i}" for i in range(6)]
    await store_overdue(store, topic, ids)
    real = KafkaPublisher([servers.kafka_bootstrap], client_id="half")
    await real.start()
    leases = LeaseManager(LeaseStore(mongo.buckets, "a"), ttl=30.0)
    owner: BucketPoller = poller(store, leases, HalfTaken(real), "a")
    try:
        assert await leases.acquire([0]) == [0]
        with pytest.raises(StoreUnavailable):
            await owner.run_once()  # three published, three deferred, the put-back refused
        assert store.refused == 1

        async def all_delivered() -> bool:
            await owner.run_once()
            return set((await statuses(mongo)).values()) == {"DELIVERED"}

        await wait_until(all_delivered, what="every schedule DELIVERED, none left IN_FLIGHT")
        async with TopicReader(servers.kafka_bootstrap, topic) as reader:
            await reader.wait_for(len(ids))
        assert set(reader.by_id()) == set(ids)
        # The three the broker took first were marked, not published again.
        assert sum(len(r) for r in reader.by_id().values()) == len(ids)
    finally:
        await real.stop()


async def test_a_claim_no_round_holds_is_recovered_under_the_owners_own_token(
    servers: EmbeddedServers, mongo: Any
) -> None:
    """A claim the store applied after its answer was lost (or anything a
    round failed to keep) sits IN_FLIGHT under the owner's live token: the
    sweep takes it once it is older than the longest round."""
    topic = unique("stranded")
    store = ScheduleStore(mongo, 1)
    ids = [f"s{i}" for i in range(4)]
    await store_overdue(store, topic, ids)
    real = KafkaPublisher([servers.kafka_bootstrap], client_id="stranded")
    await real.start()
    leases = LeaseManager(LeaseStore(mongo.buckets, "a"), ttl=30.0)
    owner = poller(store, leases, real, "a")
    try:
        assert await leases.acquire([0]) == [0]
        tokens = dict(leases.usable())
        docs = await mongo.schedules.find({}).to_list()
        long_ago = datetime.now(UTC) - owner.stranded_after - timedelta(seconds=1)
        assert len(await store.claim(docs, tokens, "a", long_ago)) == len(ids)

        async def all_delivered() -> bool:
            await owner.run_once()
            return set((await statuses(mongo)).values()) == {"DELIVERED"}

        await wait_until(all_delivered, what="the stranded claims recovered and delivered")
        assert owner.metrics.recovered._value.get() == len(ids)
        # Each carries the mark of it: were it past a deadline now, its
        # EXPIRED would say an earlier attempt may have gone out.
        recovered = await mongo.schedules.find({"_id": {"$in": ids}}).to_list()
        assert all(d.get("recovered") is True for d in recovered)
        # A claim younger than that is a round's own: the sweep leaves it be.
        [fresh] = await store_fresh(store, topic)
        claimed = await store.claim([fresh], tokens, "a", datetime.now(UTC))
        assert await store.recover_in_flight(tokens, long_ago) == []
        assert [c.id for c in claimed] == [fresh["_id"]]
    finally:
        await real.stop()


async def store_fresh(store: ScheduleStore, topic: str) -> list[dict[str, Any]]:
    """One more overdue schedule, as stored."""
    await store_overdue(store, topic, ["fresh"])
    return await store.schedules.find({"_id": "fresh"}).to_list()
