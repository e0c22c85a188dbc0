"""Who can work holds the buckets (issue 17, finding 4; issue 26, finding
2): a node cut off from the store, or from the broker, but not from its
peers steps out of the placement, the others take its buckets and deliver
what falls due in them, and it steps back in once it reaches that server
again. Before, placement followed gossip alone: the others kept placing
those buckets on the cut node; cut from the store its leases lapsed, cut
from the broker it kept renewing them, and nothing in them was delivered
until the cut healed.

Node a reaches the store through a relay the test cuts (a black hole, as a
partition is); node b reaches it directly; both gossip freely. The broker
cut is made at node a's producer (every publish and probe fails as a
connection would), since a broker tells its clients to connect to its
advertised address, past any relay in front of it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime

import pytest

from node.delivery.sink import Failed, Trouble
from node.delivery.sinks.kafka import KafkaPublisher
from node.ops import embedded
from node.schedule.record import Record
from ring import bucket_for
from tests.conftest import (
    HOST,
    EmbeddedServers,
    NodeFactory,
    NodeHandle,
    TopicReader,
    unique,
    wait_until,
)
from tests.helpers import metric, stamp
from tests.tcp_cut import CuttableRelay

BUCKETS = 16


@pytest.fixture
async def relay(servers: EmbeddedServers) -> AsyncIterator[CuttableRelay]:
    # Requested before start_node, so it outlives the nodes (teardown runs in reverse).
    relay = CuttableRelay((servers.mongo_host, servers.mongo_port))
    await relay.start(HOST)
    try:
        yield relay
    finally:
        await relay.stop()


def settings(node_id: str, **more: str) -> dict[str, str]:
    # A short lease (3 s) keeps the test short; the hysteresis is one term each way.
    return {
        "node_id": node_id,
        "membership_preset": "fast",
        "buckets": str(BUCKETS),
        "lease_ttl": "3",
        "store_timeout": "1",
        **more,
    }


def ids_in(buckets: set[int], count: int) -> list[str]:
    """``count`` fresh schedule ids whose buckets are among ``buckets``."""
    found: list[str] = []
    while len(found) < count:
        candidate = unique("cut")
        if bucket_for(candidate, BUCKETS) in buckets:
            found.append(candidate)
    return found


def advertises_cut(observer: NodeHandle, member: str, server: str = "store") -> bool:
    return any(
        m.id == member and dict(m.meta).get(server) == "cut" for m in observer.node.members()
    )


async def split(a: NodeHandle, b: NodeHandle) -> None:
    async def both_hold() -> bool:
        return bool(a.node.leases.usable()) and bool(b.node.leases.usable())

    await wait_until(both_hold, within=60, what="a and b to split the buckets")


async def delivered_while_cut(buckets: set[int], b: NodeHandle, servers: EmbeddedServers) -> None:
    """Schedules due now in ``buckets`` (those the cut node held), made
    through b: b publishes every one and marks it DELIVERED while the other
    is still cut."""
    topic = unique("cut-topic")
    ids = ids_in(buckets, 8)
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        now = stamp(datetime.now(UTC))
        for schedule_id in ids:
            body = {"id": schedule_id, "topic": topic, "executeAt": now, "payload": 1}
            status, _ = await b.request("POST", "/v1/schedules", json=body)
            assert status == 201
        await reader.wait_for(len(ids), within=60)
    assert set(reader.by_id()) == set(ids)

    async def all_marked() -> bool:
        # The mark follows Kafka's acknowledgement: the reader can be first.
        for schedule_id in ids:
            _, view = await b.request("GET", f"/v1/schedules/{schedule_id}")
            if view.get("status") != "DELIVERED":
                return False
        return True

    await wait_until(all_marked, within=30, what="every one marked DELIVERED by b")


async def test_a_node_cut_from_the_store_hands_its_buckets_to_those_that_can_work(
    relay: CuttableRelay, start_node: NodeFactory, servers: EmbeddedServers
) -> None:
    # Node a's driver gives up on a silent socket only after the test: its
    # own deadlines (STORE_TIMEOUT, the probe's) must be what notices.
    via_relay = embedded.mongo_uri(HOST, relay.port) + "&connectTimeoutMS=120000"
    a = await start_node(**settings("a", mongo_uri=via_relay, unhealthy_after="8"))
    seed = a.node.membership.address  # type: ignore[union-attr]
    b = await start_node(**settings("b", seeds=seed))

    await split(a, b)
    held_by_a = set(a.node.ownership.wanted)

    relay.cut()

    async def a_steps_out() -> bool:
        return (
            advertises_cut(b, "a")
            and set(b.node.leases.usable()) == set(range(BUCKETS))
            and a.node.ownership.wanted == frozenset()  # a's own view places nothing on a
        )

    await wait_until(a_steps_out, within=60, what="b to hold every bucket, a's too")
    assert await metric(a, "scheduler_placeable") == 0

    await delivered_while_cut(held_by_a, b, servers)

    # Liveness fails past UNHEALTHY_AFTER (8 s here) without the store.
    async def a_unhealthy() -> bool:
        status, body = await a.request("GET", "/healthz")
        return status == 503 and body["status"] == "store_unreachable"

    await wait_until(a_unhealthy, within=60, what="a's /healthz to fail")

    relay.heal()

    async def a_back() -> bool:
        status, _ = await a.request("GET", "/healthz")
        return (
            status == 200
            and not advertises_cut(b, "a")
            and bool(a.node.leases.usable())
            and set(a.node.leases.usable()) | set(b.node.leases.usable()) == set(range(BUCKETS))
            and not set(a.node.leases.usable()) & set(b.node.leases.usable())
        )

    await wait_until(a_back, within=90, what="a back in the placement, holding buckets again")
    assert await metric(a, "scheduler_placeable") == 1


class BrokerCut:
    """Node a's producer as a broker cut would leave it: every probe goes
    unanswered and every publish fails as the broker's trouble (no attempt
    spent), until healed."""

    def __init__(self, publisher: KafkaPublisher) -> None:
        self.publisher = publisher
        self.reachable, self.publish = publisher.reachable, publisher.publish
        self.cut = False
        self.publishes_while_cut = 0

    async def fake_reachable(self) -> bool:
        return False if self.cut else await self.reachable()

    async def fake_publish(self, records: Sequence[Record]) -> list[Failed | None]:
        if not self.cut:
            return await self.publish(records)
        self.publishes_while_cut += 1
        return [Failed("KafkaConnectionError: no route to the broker", Trouble.DESTINATION)] * len(
            records
        )

    def install(self) -> None:
        self.publisher.reachable = self.fake_reachable  # type: ignore[method-assign]
        self.publisher.publish = self.fake_publish  # type: ignore[method-assign]


async def test_a_node_cut_from_the_broker_hands_its_buckets_to_those_that_can_work(
    start_node: NodeFactory, servers: EmbeddedServers
) -> None:
    a = await start_node(**settings("a"))
    seed = a.node.membership.address  # type: ignore[union-attr]
    b = await start_node(**settings("b", seeds=seed))
    cut = BrokerCut(a.node.publisher)
    cut.install()

    await split(a, b)
    held_by_a = set(a.node.ownership.wanted)

    cut.cut = True

    async def a_steps_out() -> bool:
        # Calls keep arriving meanwhile, as they would: they ask how many
        # nodes share a tenant's budgets, which must leave the placement's
        # count of the cut's grace alone (in the chaos run `broker-cut` such
        # a question once took the placement's "ask again", and b never took
        # a's buckets).
        status, _ = await b.request("GET", "/v1/schedules?limit=1")
        assert status == 200
        return (
            advertises_cut(b, "a", "broker")
            and set(b.node.leases.usable()) == set(range(BUCKETS))
            and not a.node.leases.usable()  # released, not merely expired: a still renews
        )

    await wait_until(a_steps_out, within=60, what="b to hold every bucket, a's too")
    assert await metric(a, "scheduler_placeable") == 0
    status, readiness = await a.request("GET", "/readyz")
    assert status == 503 and readiness["checks"]["broker"] is False

    await delivered_while_cut(held_by_a, b, servers)

    cut.cut = False

    async def a_back() -> bool:
        return (
            not advertises_cut(b, "a", "broker")
            and bool(a.node.leases.usable())
            and set(a.node.leases.usable()) | set(b.node.leases.usable()) == set(range(BUCKETS))
        )

    await wait_until(a_back, within=90, what="a back in the placement, holding buckets again")
    assert await metric(a, "scheduler_placeable") == 1
