"""Whether this node can work: the probe of the store and the broker that
decides it, and whom to place the buckets on as a result.

Every few seconds the node reads the store's clock (``clock.py``: the
reading is also the probe of the store) and asks the broker whether it
answers; each answer goes to that server's ``Reachability``. When either
turns (a server out of reach for a lease's term, or back for as long), the
node says so in its gossip metadata (``advertised``) and places again; the
others read that metadata and place without it (``Workers``). DESIGN.md:
who can work holds the buckets.

One loop for the node process (``node/process.py``) and for the simulated
cluster (``chaos/sim/``): the same probes, the same hysteresis, the same
placement input, with the clocks and the servers injected.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

from node.delivery.clock import READ_EVERY, StoreClock
from node.delivery.reachability import Reachability, Workers, advertised
from node.errors import SchedulerError
from ring import parse_version


class ServerWatch:
    def __init__(
        self,
        clock: StoreClock,
        broker_reachable: Callable[[], Awaitable[bool]],
        *,
        lease_ttl: float,
        unhealthy_after: float | None = None,
        broker_started: Callable[[], bool] = lambda: True,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.broker_reachable = broker_reachable
        self.broker_started = broker_started
        # Without the store for a lease's term, the node's leases have lapsed
        # and it steps out of the placement.
        self.store = Reachability(
            cut_after=lease_ttl,
            back_after=lease_ttl,
            dead_after=unhealthy_after or float("inf"),
            monotonic=monotonic,
        )
        # The broker likewise, with the same hysteresis: a node cut from it
        # would hold its buckets and publish nothing.
        self.broker = Reachability(cut_after=lease_ttl, back_after=lease_ttl, monotonic=monotonic)
        self.every = min(READ_EVERY, lease_ttl / 3)
        # A cut counts once it has lasted two probe intervals while others
        # could work: about the spread of the moments the nodes notice a
        # server gone for all of them (each probes on its own phase, then
        # gossips), so such an outage moves nothing.
        self.workers = Workers(grace=2 * self.every, monotonic=monotonic)

    @property
    def placeable(self) -> bool:
        """Whether this node reaches both servers, as far as the hysteresis says."""
        return self.store.placeable and self.broker.placeable

    def advertised(self) -> dict[str, str]:
        """The gossip metadata entries that say which servers it cannot reach."""
        return advertised(store=self.store.placeable, broker=self.broker.placeable)

    async def run(self, changed: Callable[[], None], ask_again: Callable[[], None]) -> None:
        """Probe both servers every ``every`` seconds; ``changed`` when this
        node's placeability turned (advertise it, place again), else
        ``ask_again`` while a member's cut grace runs (place again)."""
        while True:
            if await self.probe():
                changed()
            elif self.workers.pending():
                ask_again()  # a cut's grace may have run out
            await asyncio.sleep(self.every)

    async def probe(self) -> bool:
        """Probe both servers once; whether placeability turned."""
        store_changed, broker_changed = await asyncio.gather(
            self._probe_store(), self._probe_broker()
        )
        return store_changed or broker_changed

    async def _probe_store(self) -> bool:
        try:
            await asyncio.wait_for(self.clock.read(), timeout=self.every)
        except (SchedulerError, TimeoutError):
            return self.store.failed()
        return self.store.succeeded()

    async def _probe_broker(self) -> bool:
        if not self.broker_started():
            return False  # still starting: the node waits for the broker itself
        if await self.broker_reachable():
            return self.broker.succeeded()
        return self.broker.failed()

    def placed(self, answered: Mapping[str, Mapping[str, str]]) -> dict[str, int]:
        """The placement's input: of the alive members that answered our
        probes (id -> gossip metadata), those that can work -> the placement
        version each advertises. Asked by the placement only: ``Workers``
        counts a cut's grace between its answers."""
        return {
            member: parse_version(answered[member].get("placement"))
            for member in self.workers(answered)
        }
