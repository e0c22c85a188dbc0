"""Per-bucket leases with fencing tokens (DESIGN.md "Leases with fencing tokens").

One document per bucket in ``buckets``: ``{_id, owner, token, expiresAt}``.

States of a bucket, from this node's side (after kazoo's SetPartitioner):

* not held: another node holds it, or nobody wants it from here;
* held: acquired with token ``t``; usable while the local deadline (last
  successful renew sent + TTL - margin, on the monotonic clock) is ahead;
* lost: a renew matched nothing (a newer owner took it) or the deadline
  passed; work stops at once and the bucket counts as not held.

A lease lasts ``term`` seconds: the configured TTL, stretched to three
times the slowest of the last few lease round trips when the store is that
slow (Lifeguard's local health multiplier, applied to leases). A store
saturated by a backlog answers a renew only after the queries queued ahead
of it; with a fixed term, a renew slower than the TTL less a renew interval
and the margin loses every lease, the batch in flight is redone under a new
token, and the store stays saturated: the cluster livelocks on one batch
(python -m bench delivery, 2 nodes, 20,000 due at once, TTL 6 s). Stretched,
failover after a crash waits longer only while the store is that slow.
Time this process stood still (node/stalls.py) is not the store's and is
left out of the round trips.

Expiry is judged by the database server's clock (``$$NOW`` in an update
pipeline), so nodes' wall clocks never decide who owns what. The local
deadline is a second guard that needs no database: it starts before the
renew is sent, so it always falls before the server-side expiry.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from pymongo import UpdateMany, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError

log = structlog.get_logger("node.leases")

DUPLICATE_KEY = 11000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The term is at least this many times the slowest recent round trip: a renew
# that slow still lands before the deadline (term - margin - renew interval).
STRETCH = 3.0
# Round trips remembered: about 15 s of renews at the default TTL.
RECENT_ROUND_TRIPS = 8
# However slow the store, a crashed owner's buckets wait at most this many TTLs.
MAX_STRETCH = 5.0


@dataclass(frozen=True)
class Lease:
    bucket: int
    token: int
    deadline: float  # monotonic seconds


class LeaseManager:
    """Acquires, renews and releases this node's bucket leases in bulk.

    Each call is one or two round trips for all buckets together; a node
    holding 256 buckets renews them with one ``bulk_write``.
    """

    def __init__(
        self,
        collection: AsyncCollection[dict[str, Any]],
        node_id: str,
        ttl: float,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        stalled_since: Callable[[float], float] = lambda _since: 0.0,
        unfenced: bool = False,
    ) -> None:
        self.collection = collection
        self.node_id = node_id
        self.ttl = ttl
        self.monotonic = monotonic
        # Seconds the process stood still since a monotonic time (node/stalls.py).
        self.stalled_since = stalled_since
        self.held: dict[int, Lease] = {}
        # Held but withdrawn from new work: about to be released.
        self.suspended: set[int] = set()
        self.losses = 0
        # Chaos testing only (CHAOS_MODE=unfenced): trust every lease taken
        # until it is released: no local deadline, no loss on a renew that
        # matched nothing. It makes a paused node a true zombie, so the chaos
        # checker can show that it catches the double claims that follow.
        self.unfenced = unfenced
        self._round_trips: deque[float] = deque(maxlen=RECENT_ROUND_TRIPS)

    @property
    def renew_interval(self) -> float:
        # From the configured TTL, not the term: a slow store gets renews as
        # often as a fast one, so the term comes back as soon as it recovers.
        return self.ttl / 3

    @property
    def term(self) -> float:
        """How long the next lease written lasts, in seconds."""
        slowest = max(self._round_trips, default=0.0)
        return min(max(self.ttl, STRETCH * slowest), MAX_STRETCH * self.ttl)

    def margin(self, term: float) -> float:
        """Covers clock-rate drift between this host and the database and the
        time a renew spends in flight: 20% of the term, at least half a second."""
        return max(0.2 * term, min(0.5, term / 2))

    def _deadline(self, sent: float, term: float) -> float:
        return sent + term - self.margin(term)

    def _timed(self, sent: float) -> None:
        # Only the store's share: a reply that waited out a pause of this
        # process (SIGSTOP, a frozen VM) must not stretch the next leases.
        elapsed = self.monotonic() - sent
        self._round_trips.append(max(0.0, elapsed - self.stalled_since(sent)))

    def usable(self) -> dict[int, int]:
        """bucket -> token for every lease new work may start under: held,
        not about to be released, local deadline still ahead."""
        now = self.monotonic()
        return {
            b: lease.token
            for b, lease in self.held.items()
            if self._current(lease, now) and b not in self.suspended
        }

    def suspend(self, buckets: Iterable[int]) -> None:
        """Start no new work on these; work already claimed may finish."""
        self.suspended.update(set(buckets) & set(self.held))

    def is_usable(self, bucket: int, token: int) -> bool:
        lease = self.held.get(bucket)
        return lease is not None and lease.token == token and self._current(lease, self.monotonic())

    def _current(self, lease: Lease, now: float) -> bool:
        return self.unfenced or lease.deadline > now

    @staticmethod
    def _expires_at(term: float) -> dict[str, Any]:
        return {"$add": ["$$NOW", int(term * 1000)]}

    async def renew(self) -> list[int]:
        """Extend every held lease; returns the buckets found lost."""
        self._drop_expired()
        if not self.held:
            return []
        sent, term = self.monotonic(), self.term
        # This renew may take effect on the server even if we never hear
        # back, and a shorter term than the last one moves the server's
        # expiry earlier: the local deadline must not outlive it.
        latest = self._deadline(sent, term)
        for bucket, lease in list(self.held.items()):
            if latest < lease.deadline:
                self.held[bucket] = Lease(bucket, lease.token, latest)
        held = dict(self.held)
        # One update for all: owner is our unique node id, and only we set it,
        # so it stands for (owner, token) here; the read below checks tokens
        # whenever the count says something changed.
        result = await self.collection.update_many(
            {"_id": {"$in": sorted(held)}, "owner": self.node_id},
            [{"$set": {"expiresAt": self._expires_at(term)}}],
        )
        self._timed(sent)
        kept = set(held)
        if result.matched_count != len(held):
            current = await self.collection.find(
                {"_id": {"$in": list(held)}}, {"owner": 1, "token": 1}, batch_size=len(held)
            ).to_list()
            kept = {
                d["_id"]
                for d in current
                if d.get("owner") == self.node_id and d.get("token") == held[d["_id"]].token
            }
        lost = [] if self.unfenced else sorted(set(held) - kept)
        for bucket in kept:
            if self.held.get(bucket) == held[bucket]:
                self.held[bucket] = Lease(bucket, held[bucket].token, self._deadline(sent, term))
        for bucket in lost:
            self._lose(bucket, "renew matched nothing")
        return lost

    async def acquire(self, wanted: Iterable[int]) -> list[int]:
        """Take every wanted bucket that is free, expired or already ours.

        One aggregate finds the candidates by the server's clock; one bulk
        write takes them: a single conditional update for buckets whose
        document exists, an upsert each for buckets never leased before (a
        duplicate-key error there means another node won it); one read
        learns the new tokens.
        """
        self._drop_expired()
        want = set(wanted) - set(self.held)
        if not want:
            return []
        existing = await (
            await self.collection.aggregate(
                [
                    {"$match": {"_id": {"$in": sorted(want)}}},
                    {"$project": {"_id": 1, "takeable": self._takeable_expr()}},
                ],
                batchSize=len(want),
            )
        ).to_list()
        takeable = sorted(d["_id"] for d in existing if d["takeable"])
        unseen = sorted(want - {d["_id"] for d in existing})
        candidates = sorted([*takeable, *unseen])
        if not candidates:
            return []
        sent, term = self.monotonic(), self.term
        take = [
            {
                "$set": {
                    "owner": self.node_id,
                    "token": {"$add": [{"$ifNull": ["$token", 0]}, 1]},
                    "expiresAt": self._expires_at(term),
                    "acquiredAt": "$$NOW",
                }
            }
        ]
        ops: list[UpdateMany | UpdateOne] = []
        if takeable:
            # The filter re-checks each bucket atomically: one taken since
            # the aggregate is simply not matched.
            ops.append(UpdateMany({"_id": {"$in": takeable}, "$expr": self._takeable_expr()}, take))
        ops.extend(
            UpdateOne({"_id": b, "$expr": self._takeable_expr()}, take, upsert=True) for b in unseen
        )
        try:
            await self.collection.bulk_write(ops, ordered=False)
        except BulkWriteError as exc:
            others = [e for e in exc.details.get("writeErrors", []) if e["code"] != DUPLICATE_KEY]
            if others:
                raise
        self._timed(sent)
        won = await self.collection.find(
            {"_id": {"$in": candidates}, "owner": self.node_id},
            {"token": 1},
            batch_size=len(candidates),
        ).to_list()
        gained = []
        for doc in won:
            bucket = int(doc["_id"])
            self.held[bucket] = Lease(bucket, int(doc["token"]), self._deadline(sent, term))
            gained.append(bucket)
        if gained:
            log.info("leases acquired", buckets=len(gained), held=len(self.held))
        return sorted(gained)

    async def release(self, buckets: Iterable[int] | None = None) -> list[int]:
        """Give leases back so the next owner need not wait for expiry.

        Call only after work on these buckets has stopped.
        """
        chosen = sorted(self.held if buckets is None else set(buckets) & set(self.held))
        if not chosen:
            return []
        for bucket in chosen:
            self.held.pop(bucket)
        self.suspended.difference_update(chosen)
        await self.collection.update_many(
            {"_id": {"$in": chosen}, "owner": self.node_id},
            {"$set": {"owner": None, "expiresAt": EPOCH}},
        )
        log.info("leases released", buckets=len(chosen))
        return chosen

    def _takeable_expr(self) -> dict[str, Any]:
        return {
            "$or": [
                {"$eq": [{"$ifNull": ["$owner", None]}, None]},
                {"$eq": ["$owner", self.node_id]},
                # Compared as epoch milliseconds: the embedded SecantusDB
                # (0.7.0b3) answers false for any date-vs-$$NOW comparison in
                # an expression; $toLong is the same order on MongoDB 4.0+.
                {"$lt": [{"$toLong": "$expiresAt"}, {"$toLong": "$$NOW"}]},
            ]
        }

    def _drop_expired(self) -> None:
        now = self.monotonic()
        for bucket in [b for b, lease in self.held.items() if not self._current(lease, now)]:
            self._lose(bucket, "local deadline passed")

    def _lose(self, bucket: int, reason: str) -> None:
        self.suspended.discard(bucket)
        if self.held.pop(bucket, None) is not None:
            self.losses += 1
            log.warning("lease lost", bucket=bucket, reason=reason)
