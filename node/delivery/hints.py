"""Wake-up hints: the one place that decides who wakes when a schedule is
accepted, and the best-effort messages to other nodes' HTTP API.

A node that accepts a schedule due before its owner's next look wakes that
owner: its own poller directly, another node's by a hint (``POST
/v1/internal/wake``) when the schedule is due within a poll interval, so the
owner wakes at the due time instead of at its next poll. A lost hint costs
lateness up to one poll interval, never a delivery: the owner's own
look-ahead still finds it.

With cluster keys (CLUSTER_KEYS, the keys that sign gossip) a hint is signed:
HMAC-SHA256 of the body with the first key, in the ``X-Scheduler-Signature``
header, and the body carries the time it was sent (``sentAt``). A receiver
takes a hint signed by any of the keys (rotation) and sent within
REPLAY_WINDOW of its own clock; anything else is a 401 (``verify``). Without
keys (the dev stack) hints are unsigned and the route is open.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

import aiohttp
import structlog

from node.errors import Unauthorized
from node.metrics import NodeMetrics
from node.schedule.times import format_time, parse_time, utcnow

log = structlog.get_logger(__name__)

HINT_TIMEOUT = 1.0
MAX_IN_FLIGHT = 64  # beyond this, hints are dropped: the look-ahead covers them
# The header that carries a hint's signature; node/api/cluster.py reads it.
SIGNATURE_HEADER = "X-Scheduler-Signature"
# How far a signed hint's sentAt may be from the receiver's clock, either way:
# a hint replayed later is refused. (Within it, a replay only wakes a poller
# early, which a poller takes in its stride.)
REPLAY_WINDOW = 60.0


def sign(key: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


class WakeHints:
    def __init__(
        self,
        node_id: str,
        metrics: NodeMetrics,
        keys: Sequence[bytes] = (),
        *,
        wall: Callable[[], datetime] = utcnow,
    ) -> None:
        self.node_id = node_id
        self.metrics = metrics
        self.keys = tuple(keys)  # the first signs, any verifies; none: unsigned, open
        self.wall = wall
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def encode(self, bucket: int, due_at: datetime) -> tuple[bytes, dict[str, str]]:
        """A hint's body and headers, signed when there are keys."""
        body = json.dumps(
            {
                "bucket": bucket,
                "dueAt": format_time(due_at),
                "from": self.node_id,
                "sentAt": format_time(self.wall()),
            },
            separators=(",", ":"),
        ).encode()
        headers = {"Content-Type": "application/json"}
        if self.keys:
            headers[SIGNATURE_HEADER] = sign(self.keys[0], body)
        return body, headers

    def verify(self, body: bytes, signature: str | None) -> None:
        """Accept a received hint's body, or raise Unauthorized: with keys,
        unless one of them signed it and it was sent within REPLAY_WINDOW."""
        if not self.keys:
            return  # no cluster keys: the route is open (the dev stack)
        if not signature:
            raise Unauthorized(f"a wake hint needs the cluster's signature ({SIGNATURE_HEADER})")
        given = signature.encode("utf-8", "replace")
        if not any(hmac.compare_digest(given, sign(k, body).encode()) for k in self.keys):
            raise Unauthorized("the wake hint's signature is not the cluster's")
        try:
            sent_at = parse_time(json.loads(body)["sentAt"], "sentAt")
            skew = abs((self.wall() - sent_at).total_seconds())
        except Exception:  # signed, so from a member: but not one that speaks this format
            raise Unauthorized("a signed wake hint must say when it was sent (sentAt)") from None
        if skew > REPLAY_WINDOW:
            raise Unauthorized(
                f"the wake hint was sent {skew:.0f} s from now, outside {REPLAY_WINDOW:g} s"
            )

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
        body, headers = self.encode(bucket, due_at)
        url = f"http://{address}/v1/internal/wake"
        try:
            async with self._session.post(url, data=body, headers=headers) as r:
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
        if doc["bucket"] in self.usable():
            self.poller.accepted(doc)
            return
        self.due(doc["bucket"], doc["dueAt"])

    def due(self, bucket: int, due_at: datetime) -> None:
        """Work of ``bucket`` falls due at ``due_at`` (a verb on many made it
        PENDING): wake its owner in time, ours or another node."""
        if bucket in self.usable():
            self.poller.hint(bucket, due_at)
            return
        owner = self.owner_of(bucket)
        if owner is None or owner == self.node_id:
            return
        if (due_at - self.wall()).total_seconds() > self.poll_interval:
            return  # the owner's own look-ahead will see it in time
        address = self.address_of(owner)
        if address:
            self.hints.send(address, bucket, due_at)

    def verify(self, body: bytes, signature: str | None) -> None:
        """A received hint is the cluster's (see ``WakeHints.verify``)."""
        self.hints.verify(body, signature)

    def wake(self, bucket: int, due_at: datetime) -> bool:
        """A schedule of ``bucket`` falls due at ``due_at``: True when we hold
        the bucket and woke our poller."""
        if bucket in self.usable():
            self.poller.hint(bucket, due_at)
            return True
        return False
