"""Ownership (``node/delivery/ownership.py``) and the lease book
(``node/delivery/leases.py``) in virtual time, on the memory store: who
holds which bucket as views change, when a crashed owner's buckets move,
and that renewing keeps them. Each node's rounds are driven by hand; the
store's clock and every node's monotonic clock are one virtual clock."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from node.delivery.leases import LeaseManager
from node.delivery.ownership import RETRY_INTERVAL, Ownership
from node.metrics import NodeMetrics
from node.store.memory import MemoryLeases
from ring import PLACEMENT_VERSION, owned_by, place
from tests.virtual import VirtualTime

BUCKETS = 32
TTL = 6.0


class Loop:
    """The poller as ownership sees it: told of lease changes, asked to let
    withdrawn buckets' work finish (none is in flight here)."""

    def __init__(self) -> None:
        self.changes = 0
        self.quiesced: list[set[int] | None] = []

    def leases_changed(self) -> None:
        self.changes += 1

    async def quiesce(self, buckets: set[int] | None = None) -> None:
        self.quiesced.append(buckets)


class Cluster:
    """Nodes sharing one lease table, each with its own view of who is alive."""

    def __init__(self, time: VirtualTime) -> None:
        self.time = time
        self.table = MemoryLeases("", time.wall)
        self.nodes: dict[str, Ownership] = {}
        self.views: dict[str, set[str]] = {}

    def add(self, name: str) -> Ownership:
        leases = LeaseManager(self.table.of(name), TTL, monotonic=self.time.monotonic)
        self.views[name] = {name}

        def alive() -> Mapping[str, int]:
            return dict.fromkeys(sorted(self.views[name]), PLACEMENT_VERSION)

        node = Ownership(
            name, BUCKETS, leases, Loop(), NodeMetrics(),
            alive_members=alive, monotonic=self.time.monotonic,
        )  # fmt: skip
        self.nodes[name] = node
        return node

    def see(self, members: set[str], *, on: set[str] | None = None) -> None:
        """The nodes ``on`` (default: all of them) now see ``members``."""
        for name in on or set(self.nodes):
            self.views[name] = set(members)
            self.nodes[name].view_changed()

    async def steps(self, names: set[str] | None = None) -> float:
        """One round of each named node (default: all); returns the soonest
        next round any asked for."""
        delays = [await self.nodes[n].step() for n in sorted(names or self.nodes)]
        return min(delays)

    async def run(self, seconds: float, names: set[str] | None = None) -> None:
        end = self.time.elapsed + seconds
        while self.time.elapsed < end:
            self.time.advance(min(await self.steps(names), end - self.time.elapsed) or 0.01)

    def held(self, name: str) -> set[int]:
        return set(self.nodes[name].leases.usable())

    async def owners(self) -> dict[int, str | None]:
        return {d["_id"]: d["owner"] for d in await self.table.all()}


@pytest.fixture
def cluster() -> Cluster:
    return Cluster(VirtualTime())


async def test_nodes_with_one_view_split_the_buckets_by_the_placement(cluster: Cluster) -> None:
    for name in ("a", "b", "c"):
        cluster.add(name)
    cluster.see({"a", "b", "c"})
    await cluster.run(1.0)
    placement = place(dict.fromkeys(["a", "b", "c"], PLACEMENT_VERSION), BUCKETS)
    for name in ("a", "b", "c"):
        assert cluster.held(name) == owned_by(placement, name)
        assert cluster.nodes[name].settled
    assert await cluster.owners() == dict(enumerate(placement))


async def test_a_joining_node_gets_its_share_at_once_from_releases(cluster: Cluster) -> None:
    a, b = cluster.add("a"), cluster.add("b")
    cluster.see({"a", "b"})
    await cluster.run(1.0)
    tokens = {**a.leases.usable(), **b.leases.usable()}
    before = {"a": cluster.held("a"), "b": cluster.held("b")}
    cluster.add("c")
    cluster.see({"a", "b", "c"})
    await cluster.steps()  # no time passes: a and b release, c takes
    await cluster.steps({"c"})
    placement = place(dict.fromkeys(["a", "b", "c"], PLACEMENT_VERSION), BUCKETS)
    moved = owned_by(placement, "c")
    assert moved and cluster.held("c") == moved
    # Each moved bucket changed hands once: its token one newer.
    assert cluster.nodes["c"].leases.usable() == {b_: tokens[b_] + 1 for b_ in moved}
    assert cluster.held("a") | cluster.held("b") == set(range(BUCKETS)) - moved
    # Released only after their work was let finish (SetPartitioner's order).
    for old in (a, b):
        assert isinstance(old.poller, Loop)
        [withdrawn] = old.poller.quiesced
        assert withdrawn == before[old.node_id] - cluster.held(old.node_id) and withdrawn


class SlowToQuiesce(Loop):
    """A batch in flight in a withdrawn bucket takes ``seconds`` to finish."""

    def __init__(self, time: VirtualTime, seconds: float) -> None:
        super().__init__()
        self.time, self.seconds = time, seconds

    async def quiesce(self, buckets: set[int] | None = None) -> None:
        await super().quiesce(buckets)
        self.time.advance(self.seconds)


async def test_a_slow_release_does_not_hold_back_the_renew_that_is_due(cluster: Cluster) -> None:
    a = cluster.add("a")
    cluster.see({"a"})
    await cluster.run(1.0)
    tokens = a.leases.usable()
    assert len(tokens) == BUCKETS
    # A renew is due when b joins; the work in a's withdrawn buckets then
    # takes longer than what is left of the other leases' terms.
    cluster.time.advance(a.leases.renew_interval - 1.0)
    a.poller = SlowToQuiesce(cluster.time, TTL - a.leases.margin(TTL) - 1.0)
    cluster.add("b")
    cluster.see({"a", "b"}, on={"a"})
    await a.step()
    kept = owned_by(place(dict.fromkeys(["a", "b"], PLACEMENT_VERSION), BUCKETS), "a")
    assert a.leases.usable() == {b: tokens[b] for b in kept}
    assert a.leases.losses == 0


async def test_a_crashed_nodes_buckets_move_once_its_leases_expire(cluster: Cluster) -> None:
    cluster.add("a")
    cluster.add("b")
    cluster.see({"a", "b"})
    await cluster.run(1.0)
    lost = cluster.held("b")
    # b crashes: it renews nothing more. a's view drops it at once.
    cluster.see({"a"}, on={"a"})
    delay = await cluster.steps({"a"})
    assert delay == RETRY_INTERVAL  # wanted, still held elsewhere: retried
    await cluster.run(TTL - 1.5, {"a"})  # b's lease, last renewed ~1 s in, still runs
    assert cluster.held("a").isdisjoint(lost)
    await cluster.run(1.5, {"a"})
    assert cluster.held("a") == set(range(BUCKETS))
    assert {owner for owner in (await cluster.owners()).values()} == {"a"}


async def test_renewing_keeps_every_lease_through_many_terms(cluster: Cluster) -> None:
    a = cluster.add("a")
    cluster.see({"a"})
    await cluster.run(1.0)
    tokens = a.leases.usable()
    assert len(tokens) == BUCKETS
    await cluster.run(50 * TTL)
    assert a.leases.usable() == tokens  # the same terms: never lost, never retaken
    assert a.leases.losses == 0


async def test_a_node_that_stops_renewing_stops_working_before_its_lease_ends(
    cluster: Cluster,
) -> None:
    a, b = cluster.add("a"), cluster.add("b")
    cluster.see({"a", "b"})
    await cluster.run(1.0)
    mine = cluster.held("a")
    # a's rounds stop (a store that hangs for it, a paused process): b's view
    # still has it, so nobody else wants its buckets; its work stops anyway
    # at its local deadline, before the store would let another owner in.
    cluster.time.advance(TTL - a.leases.margin(TTL))
    assert cluster.held("a") == set()
    leases = await cluster.table.of("b").takeable(mine, within=1.0)
    assert leases == ([], [])  # not yet expired on the store: b could not take them
    assert b.leases.held  # b's lease book is its own
