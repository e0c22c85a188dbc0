"""Rebalancing: from the membership view to the bucket leases this node holds.

Every node places the ALIVE members of its own view on the bounded
rendezvous placement (``ring.bounded``, or the oldest version any member
still runs: ``ring/versions.py``) and wants the buckets that land on
itself. Views differ for a moment during joins, crashes and partitions, so
two nodes may want the same bucket; the lease decides, and the fencing token
makes the overlap harmless.

States of the node's share (after kazoo's SetPartitioner, which also
releases before it acquires):

* stable: every wanted bucket is held, nothing else is;
* releasing: buckets no longer wanted are withdrawn from the poller at once,
  the batch in flight finishes, then their leases are released so the new
  owner need not wait for expiry;
* acquiring: wanted buckets another node still holds are retried every
  ``retry_interval`` until that node releases them or their lease expires.

Leases are renewed every TTL/3 in one bulk round trip whatever the state.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import structlog

from node.delivery.leases import LeaseManager
from node.errors import SchedulerError
from node.metrics import NodeMetrics
from ring import PLACEMENT_VERSION, in_use, owned_by, place

log = structlog.get_logger(__name__)

RETRY_INTERVAL = 0.25  # while a wanted bucket is still held elsewhere


class DeliveryLoop(Protocol):
    """What ownership needs of the poller (node/delivery/poller.py)."""

    def leases_changed(self) -> None:
        """Leases were gained, lost or withdrawn: look at them again now."""

    async def quiesce(self, buckets: set[int] | None = None) -> None:
        """Return once no claimed work in ``buckets`` (default: any) is in flight."""


class Ownership:
    def __init__(
        self,
        node_id: str,
        bucket_count: int,
        leases: LeaseManager,
        poller: DeliveryLoop,
        metrics: NodeMetrics,
        *,
        # member id -> the newest placement version it runs (ring/versions.py)
        alive_members: Callable[[], Mapping[str, int]],
        joined: Callable[[], bool] = lambda: True,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node_id = node_id
        self.bucket_count = bucket_count
        self.leases = leases
        self.poller = poller
        self.metrics = metrics
        self.alive_members = alive_members
        self.joined = joined
        self.monotonic = monotonic
        self.owners: tuple[str, ...] = ()
        self.wanted: frozenset[int] = frozenset()
        self._view: tuple[tuple[str, int], ...] = ()
        self.placement_version = PLACEMENT_VERSION
        self._changed = True
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._unsettled_since: float | None = None
        self._next_renew = 0.0

    # -- inputs ------------------------------------------------------------------

    def view_changed(self) -> None:
        self._changed = True
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def owner_of(self, bucket: int) -> str | None:
        return self.owners[bucket] if bucket < len(self.owners) else None

    @property
    def settled(self) -> bool:
        return self._unsettled_since is None

    # -- the loop ------------------------------------------------------------------

    async def run(self) -> None:
        while not self._stopping.is_set():
            delay = self.leases.renew_interval
            # Cleared before the round: a view change during it then cuts the
            # following wait short instead of being noticed a renew later.
            self._wake.clear()
            try:
                delay = await self.step()
            except Exception as exc:
                self.metrics.lease_errors.inc()
                if isinstance(exc, SchedulerError) and exc.retriable:
                    log.warning("lease round failed", error=str(exc))
                else:
                    log.exception("unexpected error in the lease round")
            self.metrics.buckets_owned.set(len(self.leases.usable()))
            # asyncio.timeout: wait_for (3.11) may swallow a cancellation.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()

    async def step(self) -> float:
        """One round; returns how long to wait before the next."""
        if not self.joined():
            # SetPartitioner waits for membership to settle before it
            # allocates: a node still joining would want every bucket.
            return RETRY_INTERVAL
        if self._changed:
            self._changed = False
            self._replace()
        # Renew before releasing: a release waits for the work in flight in
        # its buckets and for the store, and every other lease's deadline
        # runs meanwhile. Leases just taken by a slow acquire have little of
        # their term left: three nodes taking 4,096 buckets on the embedded
        # store took 3.3 s of a 4.8 s deadline, a release of 697 then 1.5 s,
        # and the renew after it found all 1,329 kept leases lapsed.
        now = self.monotonic()
        if now >= self._next_renew:
            self._next_renew = now + self.leases.renew_interval
            dropped = await self.leases.renew()
            if dropped:
                self.metrics.lease_losses.inc(len(dropped))
                self.poller.leases_changed()
        lost = set(self.leases.held) - self.wanted
        if lost:
            await self._release(lost)
        missing = self.wanted - set(self.leases.held)
        if missing:
            began = self.monotonic()
            gained = await self.leases.acquire(missing)
            log.debug(
                "acquire round",
                missing=len(missing),
                gained=len(gained),
                seconds=round(self.monotonic() - began, 3),
            )
            if gained:
                self.metrics.lease_acquisitions.inc(len(gained))
                self.poller.leases_changed()
            missing -= set(gained)
        if not missing and self._unsettled_since is not None:
            took = self.monotonic() - self._unsettled_since
            self._unsettled_since = None
            self.metrics.rebalance_seconds.observe(took)
            log.info("rebalanced", held=len(self.leases.held), seconds=round(took, 3))
        return RETRY_INTERVAL if missing else max(0.0, self._next_renew - self.monotonic())

    def _replace(self) -> None:
        # Ourselves among them unless we cannot work (the process decides:
        # reachability.Workers); alone, until our view has anyone.
        members = dict(self.alive_members()) or {self.node_id: PLACEMENT_VERSION}
        view = tuple(sorted(members.items()))
        if view == self._view:
            return
        self._view = view
        self.placement_version = in_use(members)
        self.owners = place(members, self.bucket_count)
        wanted = owned_by(self.owners, self.node_id)
        if wanted != self.wanted:
            gained, lost = wanted - self.wanted, self.wanted - wanted
            self.wanted = wanted
            if self._unsettled_since is None:
                self._unsettled_since = self.monotonic()
            log.info(
                "placement changed",
                members=len(view),
                placement_version=self.placement_version,
                wanted=len(wanted),
                gained=len(gained),
                lost=len(lost),
            )

    async def _release(self, buckets: set[int]) -> None:
        # Withdraw first, so no new round includes them; let the work already
        # claimed in them finish under its valid lease; then hand them over.
        self.leases.suspend(buckets)
        self.poller.leases_changed()
        await self.poller.quiesce(buckets)
        released = await self.leases.release(buckets)
        log.info("released buckets to their new owners", buckets=len(released))

    async def release_all(self) -> None:
        """Graceful leave: the poller has stopped; hand every lease over."""
        self.wanted = frozenset()
        if self.leases.held:
            await self._release(set(self.leases.held))
