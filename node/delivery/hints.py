"""Wake-up hints: the one place that decides who wakes when a schedule is
accepted, and the best-effort messages to other nodes' HTTP API.

A node that accepts a schedule due before its owner's next look wakes that
owner: its own poller directly, another node's by a hint (``POST
/v1/internal/wake``) when the schedule is due within a poll interval, so the
owner wakes at the due time instead of at its next poll. A lost hint costs
lateness up to one poll interval, never a delivery: the owner's own
look-ahead still finds it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

import aiohttp
import structlog

from node.metrics import NodeMetrics
from node.schedule.times import format_time, utcnow

log = structlog.get_logger("node.hints")

HINT_TIMEOUT = 1.0
MAX_IN_FLIGHT = 64  # beyond this, hints are dropped: the look-ahead covers them


class WakeHints:
    def __init__(self, node_id: str, metrics: NodeMetrics) -> None:
        self.node_id = node_id
        self.metrics = metrics
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def send(self, address: str, bucket: int, due_at: datetime) -> None:
        if len(self._tasks) >= MAX_IN_FLIGHT:
            self.metrics.hints.labels("dropped").inc()
            return
        task = asyncio.create_task(self._post(address, bucket, due_at))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, address: str, bucket: int, due_at: datetime) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HINT_TIMEOUT))
        body = {"bucket": bucket, "dueAt": format_time(due_at), "from": self.node_id}
        try:
            async with self._session.post(f"http://{address}/v1/internal/wake", json=body) as r:
                self.metrics.hints.labels("sent" if r.status < 300 else "refused").inc()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.metrics.hints.labels("failed").inc()
            log.debug("wake hint failed", address=address, error=str(exc))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()


class Wakeable(Protocol):
    """The delivery loop a hint wakes (node/delivery/poller.py)."""

    def hint(self, bucket: int, due_at: datetime) -> None:
        """A schedule of ``bucket`` (held here) falls due at ``due_at``."""

    def accepted(self, doc: dict[str, Any]) -> None:
        """This node stored ``doc``, in a bucket held here."""


class WakeRouter:
    """Who must wake for a schedule: our own poller, or its owner's."""

    def __init__(
        self,
        node_id: str,
        *,
        poller: Wakeable,
        hints: WakeHints,
        usable: Callable[[], Mapping[int, int]],
        owner_of: Callable[[int], str | None],
        address_of: Callable[[str], str | None],
        poll_interval: float,
        wall: Callable[[], datetime] = utcnow,
    ) -> None:
        self.node_id = node_id
        self.poller = poller
        self.hints = hints
        self.usable = usable  # bucket -> token of the leases we may work
        self.owner_of = owner_of  # where our view places a bucket
        self.address_of = address_of  # a member's HTTP address
        self.poll_interval = poll_interval
        self.wall = wall

    def accepted(self, doc: dict[str, Any]) -> None:
        """Make sure the owner of a new schedule wakes in time for it.

        Ours: wake our poller if the schedule is due before its next round.
        Another node's: tell it over HTTP when it is due within a poll
        interval, so lateness does not depend on that node's poll interval.
        """
        bucket, due_at = doc["bucket"], doc["dueAt"]
        if bucket in self.usable():
            self.poller.accepted(doc)
            return
        owner = self.owner_of(bucket)
        if owner is None or owner == self.node_id:
            return
        if (due_at - self.wall()).total_seconds() > self.poll_interval:
            return  # the owner's own look-ahead will see it in time
        address = self.address_of(owner)
        if address:
            self.hints.send(address, bucket, due_at)

    def wake(self, bucket: int, due_at: datetime) -> bool:
        """A schedule of ``bucket`` falls due at ``due_at``: True when we hold
        the bucket and woke our poller."""
        if bucket in self.usable():
            self.poller.hint(bucket, due_at)
            return True
        return False
