"""The book of this node's bucket leases (DESIGN.md "Leases with fencing
tokens"): which it holds, under which token, until when it may work them.
The lease documents and their queries are ``node/store/leases.py``.

States of a bucket, from this node's side (after kazoo's SetPartitioner):

* not held: another node holds it, or nobody wants it from here;
* held: acquired with token ``t`` under this process's session; usable
  while the local deadline (the session's last successful renew sent + term
  - margin, on the monotonic clock) is ahead;
* lost: the session ended (a renew found it over: every lease goes), a
  verify found the lease another's, or the deadline passed; work stops at
  once and the bucket counts as not held.

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

Expiry is judged by the database server's clock, so nodes' wall clocks
never decide who owns what. The local deadline is a second guard that needs
no database: it starts before the renew is sent, so it always falls before
the server-side expiry.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog

from node.store.contract import BucketLeases

log = structlog.get_logger(__name__)

# The term is at least this many times the slowest recent round trip: a renew
# that slow still lands before the deadline (term - margin - renew interval).
STRETCH = 3.0
# Round trips remembered: about 15 s of renews at the default TTL.
RECENT_ROUND_TRIPS = 8
# However slow the store, a crashed owner's buckets wait at most this many TTLs.
MAX_STRETCH = 5.0
# Every this many renews the held leases are read back (``verify``): about
# once a minute at the default TTL. A lease is only taken from a live session
# by a second process under the same node id or by hand, and the fencing
# tokens keep that safe; the read is what is left per bucket of an idle
# node's lease work (4,096 leases read whole on the embedded store: 80 ms).
VERIFY_EVERY = 30


@dataclass(frozen=True)
class Lease:
    bucket: int
    token: int
    deadline: float  # monotonic seconds


class LeaseManager:
    """Acquires, renews and releases this node's bucket leases in bulk.

    Each call is one or two round trips for all buckets together; the leases
    last as long as the node's session, so a renew is one write of one
    document, whether the node holds 4 buckets or 4,096.
    """

    def __init__(
        self,
        store: BucketLeases,
        ttl: float,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] | None = None,
        stalled_since: Callable[[float], float] = lambda _since: 0.0,
        unfenced: bool = False,
    ) -> None:
        self.store = store
        self.node_id = store.node_id
        self.ttl = ttl
        self.monotonic = monotonic
        # A second clock (seconds; the host's wall clock, which a freeze
        # does not stop): a lease runs out by whichever of the two ran
        # further since the last renew. The monotonic clock alone misses a freeze it does not
        # count: a suspended VM's CLOCK_MONOTONIC stands still, and on
        # resume the node would go on claiming under leases other owners
        # took meanwhile (until its next renew, a third of a TTL later).
        self.wall = wall
        self._anchor: tuple[float, float] | None = None  # (monotonic, wall), read together
        # Seconds the process stood still since a monotonic time (node/stalls.py).
        self.stalled_since = stalled_since
        self.held: dict[int, Lease] = {}
        # Held but withdrawn from new work: about to be released.
        self.suspended: set[int] = set()
        # Buckets a take or a release may have left ours in the store without
        # our knowing (its answer lost, or it failed): not held here, so never
        # renewed, released or used, but no other node can take them while
        # this node's session lives. Given back at the next round (``_settle``).
        self.unsure: set[int] = set()
        self.losses = 0
        # Chaos testing only (CHAOS_MODE=unfenced): trust every lease taken
        # until it is released: no local deadline, no loss on a renew that
        # matched nothing. It makes a paused node a true zombie, so the chaos
        # checker can show that it catches the double claims that follow.
        self.unfenced = unfenced
        self._round_trips: deque[float] = deque(maxlen=RECENT_ROUND_TRIPS)
        # The local deadline of the session the leases are held under (None:
        # no session open, or it ended).
        self._session_deadline: float | None = None
        self._renews = 0

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

    def _sent(self) -> tuple[float, float | None]:
        """The monotonic time a renew or a session is sent at, and the wall
        clock's reading beside it: the anchor ``_now`` measures from once
        the store has answered (``_anchored``)."""
        return self.monotonic(), None if self.wall is None else self.wall()

    def _anchored(self, sent: tuple[float, float | None]) -> None:
        """The store answered what was sent at ``sent``: measure from it.
        Only then: a call that failed proves nothing, and moving the anchor
        to it would drop what the wall clock says of a freeze before it (a
        node resumed from one while the store was down opened no session,
        moved its anchor, and on its next try took leases under the session
        it had before the freeze, ended in the store: two owners; found by
        ``python -m chaos simulate``)."""
        if sent[1] is not None:
            self._anchor = (sent[0], sent[1])

    def _now(self) -> float:
        """Now on the monotonic clock's scale, moved on to the wall clock's
        where that ran further since the last renew (a freeze the monotonic
        clock did not count). A wall clock stepped back moves nothing."""
        now = self.monotonic()
        if self.wall is None or self._anchor is None:
            return now
        sent, wall = self._anchor
        return max(now, sent + (self.wall() - wall))

    def usable(self) -> dict[int, int]:
        """bucket -> token for every lease new work may start under: held,
        not about to be released, local deadline still ahead."""
        now = self._now()
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
        return lease is not None and lease.token == token and self._current(lease, self._now())

    def _current(self, lease: Lease, now: float) -> bool:
        return self.unfenced or lease.deadline > now

    async def renew(self) -> list[int]:
        """Extend the session every held lease lasts by (one write, however
        many); returns the buckets found lost. Every VERIFY_EVERY renews the
        leases are read as well, to find one taken under a live session (a
        second process under this node's id, an operator's hand): the
        fencing tokens keep such a lease's writes out either way, this only
        stops the node asking."""
        self._drop_expired()
        await self._settle()
        if not self.held:
            return []
        anchor, term = self._sent(), self.term
        sent = anchor[0]
        # This renew may take effect on the server even if we never hear
        # back, and a shorter term than the last one moves the server's
        # expiry earlier: the local deadline must not outlive it.
        latest = self._deadline(sent, term)
        for bucket, lease in list(self.held.items()):
            if latest < lease.deadline:
                self.held[bucket] = Lease(bucket, lease.token, latest)
        if self._session_deadline is not None:
            self._session_deadline = min(self._session_deadline, latest)
        held = dict(self.held)
        alive = await self.store.renew_session(term, within=term)
        self._timed(sent)
        self._anchored(anchor)
        self._renews += 1
        if not alive and not self.unfenced:
            self._session_deadline = None
            lost = sorted(held)
            for bucket in lost:
                self._lose(bucket, "session ended")
            return lost
        self._session_deadline = self._deadline(sent, term)
        for bucket in held:
            if self.held.get(bucket) == held[bucket]:
                self.held[bucket] = Lease(bucket, held[bucket].token, self._session_deadline)
        if self._renews % VERIFY_EVERY == 0:
            return await self.verify()
        return []

    async def verify(self) -> list[int]:
        """Read the held leases back; returns those now another's (lost)."""
        held = dict(self.held)
        if not held:
            return []
        current = await self.store.tokens(list(held), within=self.term)
        kept = {
            b
            for b, (owner, token) in current.items()
            if owner == self.node_id and token == held[b].token
        }
        lost = [] if self.unfenced else sorted(set(held) - kept)
        for bucket in lost:
            if self.held.get(bucket) == held[bucket]:
                self._lose(bucket, "taken by another")
        return lost

    async def _session(self) -> float:
        """The local deadline of this node's session, opening a new one when
        there is none or its deadline has passed (the old one may still be
        alive on the server; nothing is held under it here)."""
        now = self._now()
        if self._session_deadline is None or self._session_deadline <= now:
            anchor, term = self._sent(), self.term
            await self.store.open_session(term, within=term)
            self._timed(anchor[0])
            self._anchored(anchor)
            self._session_deadline = self._deadline(anchor[0], term)
        return self._session_deadline

    async def acquire(self, wanted: Iterable[int]) -> list[int]:
        """Take every wanted bucket that is free, held under an ended session
        or already ours.

        One read finds the candidates by the server's clock, one bulk write
        takes them, one read learns the new tokens (node/store/leases.py).
        A lease taken lasts as long as the session it is taken under: its
        local deadline is the session's.
        """
        self._drop_expired()
        await self._settle()
        want = set(wanted) - set(self.held)
        if not want:
            return []
        deadline = await self._session()
        term = self.term
        takeable, unseen = await self.store.takeable(want, within=term)
        candidates = sorted([*takeable, *unseen])
        if not candidates:
            return []
        sent = self.monotonic()
        try:
            await self.store.take(takeable, unseen, within=term)
            self._timed(sent)
            won = await self.store.ours(candidates, within=term)
        except BaseException:
            self.unsure.update(candidates)  # some may be ours in the store now
            raise
        gained = []
        for bucket, token in sorted(won.items()):
            self.held[bucket] = Lease(bucket, token, deadline)
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
        try:
            await self.store.release(chosen, within=self.ttl)
        except BaseException:
            self.unsure.update(chosen)  # still ours in the store, perhaps
            raise
        log.info("leases released", buckets=len(chosen))
        return chosen

    async def _settle(self) -> None:
        """Give back, in the store, the buckets a lost take or release may
        have left ours there (a release matches only our own leases; one
        held here again since is left alone)."""
        loose = sorted(self.unsure - set(self.held))
        self.unsure.clear()
        if not loose:
            return
        try:
            await self.store.release(loose, within=self.ttl)
        except BaseException:
            self.unsure.update(loose)
            raise
        log.info("leases given back after an unknown outcome", buckets=len(loose))

    def _drop_expired(self) -> None:
        now = self._now()
        for bucket in [b for b, lease in self.held.items() if not self._current(lease, now)]:
            self._lose(bucket, "local deadline passed")

    def _lose(self, bucket: int, reason: str) -> None:
        self.suspended.discard(bucket)
        if self.held.pop(bucket, None) is not None:
            self.losses += 1
            log.warning("lease lost", bucket=bucket, reason=reason)
