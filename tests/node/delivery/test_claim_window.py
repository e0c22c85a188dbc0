"""The claim window: a burst's first claim is small, later ones double up to
the batch size, and an idle round starts it over. Pure rules first, then a
real poller on the embedded store and broker."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import pytest

from node.delivery.claim_window import FIRST, ClaimWindow
from node.delivery.leases import LeaseManager
from node.delivery.sinks.kafka import KafkaPublisher
from node.store.contract import Claimed
from node.store.leases import LeaseStore
from node.store.schedules import ScheduleStore
from tests.conftest import EmbeddedServers, TopicReader, unique
from tests.helpers import poller as fencing_poller
from tests.helpers import store_overdue


def test_a_window_opens_small_and_doubles_while_rounds_fill_it() -> None:
    window = ClaimWindow(500)
    sizes = []
    for _ in range(6):
        sizes.append(window.size)
        window.took(window.size)
    assert sizes == [FIRST, 2 * FIRST, 4 * FIRST, 8 * FIRST, 500, 500]


def test_a_round_that_does_not_fill_the_window_keeps_it() -> None:
    window = ClaimWindow(500)
    window.took(FIRST)
    window.took(2 * FIRST - 1)
    assert window.size == 2 * FIRST


def test_an_idle_round_starts_the_window_over() -> None:
    window = ClaimWindow(500)
    for _ in range(5):
        window.took(window.size)
    assert window.size == 500
    window.took(0)
    assert window.size == FIRST


def test_a_batch_size_below_the_first_claim_is_the_whole_window() -> None:
    window = ClaimWindow(10)
    assert window.size == 10
    window.took(10)
    assert window.size == 10


@pytest.mark.parametrize("ceiling, first", [(0, 32), (10, 0)])
def test_an_empty_window_is_refused(ceiling: int, first: int) -> None:
    with pytest.raises(ValueError):
        ClaimWindow(ceiling, first)


class RecordingStore(ScheduleStore):
    """The real store, noting how many schedules each claim asked for."""

    claims: list[int]

    async def claim(
        self, docs: Sequence[dict[str, Any]], tokens: Mapping[int, int], owner: str, now: datetime
    ) -> list[Claimed]:
        self.claims.append(len(docs))
        return await super().claim(docs, tokens, owner, now)


async def test_a_burst_is_claimed_in_growing_batches_and_each_delivered_once(
    servers: EmbeddedServers, mongo: Any
) -> None:
    topic = unique("window")
    store = RecordingStore(mongo, 1)
    store.claims = []
    ids = [f"w{i}" for i in range(300)]
    await store_overdue(store, topic, ids)
    publisher = KafkaPublisher([servers.kafka_bootstrap], client_id="window")
    await publisher.start()
    leases = LeaseManager(LeaseStore(mongo.buckets, "w"), ttl=30.0)
    poller = fencing_poller(store, leases, publisher, "w", batch_size=100)
    try:
        assert await leases.acquire([0]) == [0]
        for _ in range(20):  # five rounds take 300; a few more may find the rest
            await poller.run_once()
            if sum(store.claims) >= len(ids):
                break
        async with TopicReader(servers.kafka_bootstrap, topic) as reader:
            await reader.wait_for(len(ids))
            by_id = reader.by_id()
    finally:
        await publisher.stop()
    assert store.claims[0] == FIRST
    assert store.claims[1] == 2 * FIRST
    assert max(store.claims) == 100  # opened up to the batch size, never past it
    assert sum(store.claims) == len(ids)
    assert sorted(by_id) == sorted(ids)
    assert all(len(records) == 1 for records in by_id.values())

    # Nothing left: an idle round, and the next burst starts small again.
    await poller.run_once()
    assert poller.window.size == FIRST
