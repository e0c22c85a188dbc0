"""The store's contract: what the rest of the node may ask of it, method
by method, and the types it speaks (after APScheduler 4's ``abc.DataStore``).

``node/delivery/`` and ``node/api/`` see the store only through the
Protocols here: ``Schedules`` (the ``schedules`` collection), ``BucketLeases``
(one lease document per bucket), ``AttemptHistory`` (one record per
delivery attempt) and ``FlowGates`` (the counts behind flow control).
Two stores implement them and the same tests run over both (the
``store`` fixture of ``tests/conftest.py``):

* MongoDB (``schedules.ScheduleStore``, ``leases.LeaseStore``,
  ``history.HistoryStore``, ``flow.FlowStore``), what a node runs on;
* memory (``memory.py``), the twin with an injected clock that virtual-time
  tests of the poller and ownership run on, with no IO and no sleeping.

Every decision a store makes about one schedule (what a claim takes, what a
completion writes, what a cancel or a verb may change) is written once, as
data, in ``statements.py``: the Mongo store sends those filters and updates
to the server; the memory store applies the same ones to its documents.

Errors: a store that cannot answer raises ``node.errors.StoreUnavailable``
(retriable), never its driver's own error (``boundary.py``); the errors a
method names below are the ones its callers handle.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from node.errors import ScheduleConflict
from node.schedule.changes import BulkVerb, Change
from node.schedule.flow import Slice
from node.schedule.model import NewSchedule, Status, public_id
from node.schedule.times import aware
from node.store.listing import Listing, Page, Selector

# Tenants asked for their own due work in one round when a backlog fills the
# window (the poller rotates the list, so with more all are served in turn).
MAX_TENANTS_PER_ROUND = 32
# How long a schedule is kept once it has ended (RETENTION's default).
DEFAULT_RETENTION = timedelta(days=7)
# A verb reads the schedule, decides, and writes under the status and version
# it read; a claim or another verb in between makes it read and decide again,
# at most this many times (each loss means the schedule did change).
CHANGE_ATTEMPTS = 5
# A bulk verb (``Schedules.change_matching``) reads and writes this many at a
# time, and at most BULK_LIMIT in one call (the answer says whether more match).
BULK_BATCH = 500
BULK_LIMIT = 10_000
# What a bulk verb reads of each match: what the verbs decide on
# (``node/schedule/changes.py``) and write under, never a payload.
BULK_FIELDS = {
    name: 1
    for name in ("bucket", "status", "version", "dueAt", "recurrence", "deadline", "expireAfterMs")
}


@dataclass(frozen=True)
class Bulk:
    """What one call of a bulk verb did."""

    matched: int  # schedules the selector matched in the verb's statuses
    changed: int  # of those, changed (the rest moved meanwhile: a claim, a verb)
    more: bool  # call again: more match, or a match is still in flight
    # The earliest due time, by bucket, of what it made PENDING: the owners
    # to wake (``node/delivery/hints.py``).
    due: Mapping[int, datetime] = field(default_factory=dict)


@dataclass(frozen=True)
class DueChange:
    """A write that may make work due sooner than a bucket's owner knows: a
    schedule of ``bucket`` stored PENDING (``inserted``), made PENDING again
    (a resume, a retry, a put-back, a recovery, a delivery's retry or next
    occurrence) or given a new due time (a PATCH, a trigger). ``due_at``:
    when it is due now (None: the write did not say; read the bucket)."""

    bucket: int
    schedule_id: str
    due_at: datetime | None
    inserted: bool
    # An insert's priority (None: the default, or not said).
    priority: int | None = None


class ChangeFeed(Protocol):
    """The store's stream of ``DueChange``, from the moment it was opened
    (``Schedules.watch_due``), in the order the writes were made. Iterating
    raises ``StoreUnavailable`` when the stream breaks (the store restarted,
    failed over past what the stream could resume, the connection dropped):
    what was written meanwhile is not told, so the owner reads everything
    again once a new feed is open."""

    # Whether it started where an earlier feed ended (``Schedules.watch_due``'s
    # ``resume_after``), nothing lost between them; False: from its opening.
    resumed: bool

    @property
    def resume_token(self) -> Any:
        """Where it is: a later feed may start after it (None: nowhere yet)."""

    def __aiter__(self) -> AsyncIterator[DueChange]: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class Claimed:
    """A schedule this node now holds IN_FLIGHT under ``token`` (the document
    as read before the claim; the claim itself incremented its counters)."""

    doc: dict[str, Any]
    token: int

    @property
    def id(self) -> str:
        return str(self.doc["_id"])

    @property
    def bucket(self) -> int:
        return int(self.doc["bucket"])

    @property
    def run(self) -> int:
        return int(self.doc.get("runs", 0)) + 1

    @property
    def recurring(self) -> bool:
        return bool(self.doc.get("recurrence"))

    @property
    def triggered(self) -> bool:
        """An extra occurrence of a recurring schedule, asked for by a trigger."""
        return self.recurring and self.doc.get("triggeredAt") is not None

    @property
    def execute_at(self) -> datetime:
        """The time this attempt is for: the occurrence, or the trigger's."""
        return aware(self.doc["triggeredAt"] if self.triggered else self.doc["executeAt"])

    @property
    def attempt(self) -> int:
        # The claim incremented attempts in the store; the fetched copy is older.
        return int(self.doc.get("attempts", 0)) + 1


class Outcome(enum.StrEnum):
    """What became of one attempt (also the history record's ``outcome``)."""

    DELIVERED = "delivered"
    RETRYING = "retrying"
    FAILED = "failed"
    SKIPPED = "skipped"
    EXPIRED = "expired"
    # The destination asked to wait (a Retry-After, an open circuit): due
    # again later, the attempt not spent.
    DEFERRED = "deferred"


@dataclass(frozen=True)
class Occurrence:
    """How one occurrence of a recurring schedule ended, and where its chain
    goes next (``next_at`` None: the chain is over)."""

    execute_at: datetime
    next_at: datetime | None
    late_streak: int
    skipped: int  # later occurrences jumped over without delivery


@dataclass(frozen=True)
class Completion:
    """What a claimed schedule becomes, as delivery decided it. The store
    writes it only where ``claimed.token`` still holds the schedule."""

    claimed: Claimed
    outcome: Outcome
    status: Status  # PENDING again (a retry, the next occurrence) or final
    at: datetime
    error: str | None = None
    due_at: datetime | None = None  # PENDING: when it is due again
    occurrence: Occurrence | None = None  # recurring schedules only
    # An extra (triggered) occurrence of a recurring schedule is over: the
    # chain is due again at ``due_at``, its own next occurrence.
    extra: bool = False


@dataclass(frozen=True)
class Attempt:
    """One delivery attempt, as the history keeps it (``AttemptHistory``)."""

    schedule_id: str  # the stored id
    tenant: str
    run: int  # the schedule's attempts so far, this one included
    execute_at: datetime  # the occurrence
    attempt: int  # of this occurrence
    at: datetime
    node: str
    token: int
    outcome: str  # delivered, retrying, failed, skipped
    error: str | None
    life: datetime | None = None  # the schedule's createdAt (None: records made before lives)
    request_id: str | None = None  # of the call that made or last changed the schedule

    def to_document(self, cap: int) -> dict[str, Any]:
        """The stored record: its ``_id`` is ``<schedule>@<life>#<run mod cap>``,
        so a schedule's records are capped and an id's lives kept apart."""
        life = "" if self.life is None else f"@{int(self.life.timestamp() * 1000)}"
        return {
            "_id": f"{self.schedule_id}{life}#{self.run % cap}",
            "scheduleId": self.schedule_id,
            "tenant": self.tenant,
            "run": self.run,
            "executeAt": self.execute_at,
            "attempt": self.attempt,
            "at": self.at,
            "node": self.node,
            "token": self.token,
            "outcome": self.outcome,
            "error": self.error,
            **({"requestId": self.request_id} if self.request_id is not None else {}),
        }


class Schedules(Protocol):
    """The schedules: what the API reads and writes, and what a bucket's
    owner reads, claims and completes.

    A schedule document is what ``documents.schedule_document`` makes of a
    new schedule. Its ``status`` moves only along these edges:

    * PENDING -> IN_FLIGHT: a claim, under the bucket's lease token;
    * IN_FLIGHT -> PENDING (a retry, the next occurrence, a put-back) or a
      final status (DELIVERED, DELIVERY_FAILED, EXPIRED): a write under the
      token that claimed it, never another's;
    * IN_FLIGHT -> PENDING: a recovery, under a newer token (or under the
      same one, for a claim older than any round);
    * PENDING or PAUSED -> CANCELLED: a cancel; and the verbs' changes
      (``node/schedule/changes.py``): PENDING <-> PAUSED, PAUSED -> EXPIRED
      (resumed past its deadline), DELIVERY_FAILED -> PENDING (retry).

    Every write adds one to the document's ``version`` (the ETag; the
    condition of every read-modify-write). A write that ends a schedule (a
    final status) sets ``expireAt`` (now + RETENTION), after which the store
    may drop it.

    Times are judged by the caller's ``now`` (the store's clock as the node
    estimates it, ``node/delivery/clock.py``) or ``server_time``.
    """

    # -- the node's start ---------------------------------------------------------

    async def prepare(self, now: datetime) -> None:
        """Pin the bucket count (``BucketCountMismatch`` if the store was made
        with another) and make what the queries need; idempotent."""

    async def server_time(self) -> datetime:
        """The store's clock now: what decides that a schedule is due."""

    # -- the API's reads and writes -----------------------------------------------

    async def insert(self, new: NewSchedule, now: datetime) -> tuple[dict[str, Any], bool]:
        """Store a new schedule in one write, durably (journaled on a majority
        before it returns); returns (the document, created). A schedule is
        either wholly stored or not at all.

        The same client id with the same body (its ``fingerprint``) returns
        the stored schedule, created False; with another body,
        ``ScheduleConflict``. Concurrent calls may share one round trip;
        too many waiting: ``StoreBusy``."""

    async def get(self, schedule_id: str) -> dict[str, Any] | None:
        """The schedule with this stored id, or None."""

    async def count_pending(self, tenant: str) -> int:
        """A tenant's live schedules (PENDING or PAUSED), for its quota."""

    async def cancel(
        self, schedule_id: str, now: datetime, if_match: int | None = None
    ) -> dict[str, Any] | None:
        """PENDING or PAUSED -> CANCELLED in one conditional write (with
        ``cancelledAt`` and ``expireAt``); returns the schedule after, or None
        if there is none.

        The claim takes only PENDING schedules and this cancels only PENDING
        or PAUSED ones; the store applies one of the two first, so after a
        cancel succeeds no owner holds the schedule and none ever will.
        Already CANCELLED: returned as it is. Too late (IN_FLIGHT or ended):
        ``NotCancellable`` (retriable while an occurrence of a recurring one
        is in flight). ``if_match`` and another version: ``VersionMismatch``."""

    async def change(
        self,
        schedule_id: str,
        decide: Callable[[dict[str, Any]], Change | None],
        now: datetime,
        if_match: int | None = None,
    ) -> tuple[dict[str, Any], Change | None] | None:
        """A verb (PATCH, pause, resume, trigger, retry): read the schedule,
        ``decide`` what the verb makes of it (``node/schedule/changes.py``),
        and write that only where the schedule is still at the status and
        version it was read at; returns (the schedule after, the change
        written), or None when there is no such schedule.

        Lost to a concurrent write (a claim, another verb), it reads and
        decides again, so what ``decide`` refuses (in flight, ended) is
        refused on what is stored, never on a stale copy; still losing after
        a few tries: ``ScheduleConflict`` (retriable). A change to a final
        status sets ``expireAt``. ``if_match`` and another version:
        ``VersionMismatch``."""

    async def change_matching(
        self, tenant: str, selector: Selector, verb: BulkVerb, now: datetime
    ) -> Bulk:
        """Apply ``verb`` to the tenant's schedules ``selector`` matches in
        the verb's statuses, BULK_BATCH at a time, at most BULK_LIMIT in one
        call: each match is read (``BULK_FIELDS``), ``verb.decide`` judges
        it, and the change is written where it is still at the status and
        version read, so a match claimed meanwhile is delivered, not also
        changed (found again by the next call if it comes back). ``more``:
        more match past the limit, or one is in a status of
        ``verb.unsettled`` (in flight)."""

    async def count_matching(
        self, tenant: str, selector: Selector, statuses: Sequence[str], limit: int
    ) -> int:
        """How many of the tenant's schedules ``selector`` matches in
        ``statuses``, counting to ``limit`` at most (a bulk verb's dry run)."""

    async def list_page(
        self, listing: Listing, *, payloads: bool = False, max_bytes: int = 0
    ) -> Page:
        """One page of a tenant's schedules: at most ``listing.limit`` of those
        its filter matches (``Listing.filter``), in its order
        (``Listing.order``: ``_id``, or due time then ``_id``), after its
        cursor. Without payloads unless ``payloads``; then only as many as
        fit in ``max_bytes`` of payload (at least one: a page always moves
        on). ``Page.more``: whether more follow. A read too long for the
        store's bound: ``ReadTimedOut``."""

    async def count_by_status(self, listing: Listing, limit: int = 0) -> dict[str, int]:
        """status -> how many of the tenant's schedules ``listing``'s filter
        matches (its own status and cursor aside), each count stopping at
        ``limit`` (0: none)."""

    async def due_backlog(
        self, buckets: Collection[int], now: datetime, limit: int = 0
    ) -> dict[int, int]:
        """bucket -> PENDING schedules due by ``now``, for those of
        ``buckets`` (a node's own) that have any, each count stopping at
        ``limit`` (0: none)."""

    async def status_counts(self, buckets: Collection[int]) -> dict[str, int]:
        """status -> schedules of ``buckets`` (a node's own), every status named."""

    # -- the bucket owner's reads and writes ----------------------------------------

    async def find_due(
        self, bucket: int, until: datetime, limit: int, after: datetime | None = None
    ) -> list[dict[str, Any]]:
        """``bucket``'s PENDING schedules due by ``until`` (``dueAt <=
        until``) and, given ``after``, due after it (``dueAt > after``: what
        a view that holds everything up to ``after`` lacks), earliest first,
        at most ``limit``, without their large payloads
        (``node/schedule/payload.py``). Reads only; the claim decides."""

    async def next_due(self, bucket: int, after: datetime) -> datetime | None:
        """A time no later than when ``bucket``'s earliest PENDING schedule
        due after ``after`` is due: that due time itself where the store can
        answer it cheaply (MongoDB), else a bound before which there is none
        (the embedded server, ``schedules.PEEK_WINDOWS``); None: there is
        none at all. What a view that read up to ``after`` knows of what
        comes next, so that it need not read again before then
        (``node/delivery/due_book.py``). Reads index keys only."""

    async def watch_due(self, resume_after: Any = None) -> ChangeFeed:
        """Open the feed of writes that make work due sooner (``DueChange``),
        for every bucket: from its return on, every such write is told; or,
        given an earlier feed's ``resume_token``, every one after that feed's
        last (``resumed``) while the store keeps that history. Raises
        ``ChangesUnsupported`` when the store has no change streams,
        ``StoreUnavailable`` when it cannot answer."""

    async def find_due_past(
        self,
        buckets: Collection[int],
        until: datetime,
        limit: int,
        skipping: Collection[str | None],
    ) -> list[dict[str, Any]]:
        """``buckets``' PENDING schedules due by ``until`` but those of the
        lanes ``skipping`` (``node.schedule.destination.lane``: HTTP hosts,
        None for Kafka), earliest first, at most ``limit``, without their
        large payloads: the due work behind slow lanes' backlogs
        (``node/delivery/past_lanes.py``). Reads only."""

    async def oldest_due_of(
        self, tenants: Sequence[str], until: datetime, buckets: Collection[int], limit: int
    ) -> list[dict[str, Any]]:
        """For each of the first MAX_TENANTS_PER_ROUND ``tenants``: its
        earliest PENDING schedules of ``buckets`` (at most ``limit`` read),
        those due by ``until``; for the poller to share a backlog fairly."""

    async def large_payloads(self, claims: Sequence[Claimed]) -> dict[str, bytes]:
        """id -> large payload, for those of ``claims`` that have one."""

    async def claim(
        self, docs: Sequence[dict[str, Any]], tokens: Mapping[int, int], owner: str, now: datetime
    ) -> list[Claimed]:
        """PENDING -> IN_FLIGHT under each schedule's bucket's lease token
        (``tokens``), in one bulk write; returns the ``Claimed`` ones (each
        once, however often listed).

        A schedule is taken only if it is still PENDING, due by ``now``, at
        the version read (no verb changed it since: what is published is
        exactly the document read), and no newer token has written it
        (``token <= mine``). The claim sets ``token``, ``owner`` and
        ``claimedAt``, and adds one to ``attempts`` (of this occurrence),
        ``runs`` (of the schedule's life) and ``version``. Durable, as every
        write: an acknowledged claim survives a crash of the store (what is
        published next is then never PENDING again at its old version)."""

    async def complete(self, completions: Sequence[Completion]) -> int:
        """Write what delivery decided for each claimed schedule
        (``Completion``, built by ``node/delivery/outcomes.py``), durably,
        only where its token still holds it (IN_FLIGHT, ``token == mine``):
        a stale owner's completion matches nothing. Returns how many were
        written. What each writes is ``statements.completion_update``."""

    async def unclaim(self, claims: Sequence[Claimed]) -> int:
        """IN_FLIGHT -> PENDING again for claims never published (the broker
        could not take them, or a claim whose answer was lost), undoing the
        claim's ``attempts`` and ``runs``; only where the claim's token still
        holds them. Returns how many were put back."""

    async def recover_in_flight(
        self, tokens: Mapping[int, int], stranded_before: datetime | None = None
    ) -> list[str]:
        """Make due again, under our token, the schedules of ``tokens``'
        buckets left IN_FLIGHT under an older token (their owner died or
        lost its lease mid-batch), and, given ``stranded_before``, under our
        own token by a claim made before then (older than any round of ours
        can be: a claim the server applied after its answer was lost).
        Each becomes PENDING marked ``recovered``, re-delivered at least once;
        one claimed again meanwhile is left alone. Returns their ids."""


class BucketLeases(Protocol):
    """One lease per bucket, ``{_id: bucket, owner, holder, token,
    acquiredAt}``, and one holder document per session of a node's process,
    ``{_id: holder, node, expiresAt}``, as this node (``node_id``) sees and
    writes them.

    A node's leases last as long as its session: renewing is one write of
    the holder document, whatever the number of buckets (4,096 lease
    documents rewritten every renew interval were the whole store's idle
    work, bench idle). A session ends when its holder document expires by
    the store's clock (never a node's) and never renews after that, so a
    lease under an ended session stays takeable; the next session of the
    node is a new holder. Every call is one round trip for all the buckets
    it names and takes ``within``, the seconds it may take: a lease answer
    later than the lease's term is worth nothing. The book a node keeps of
    its own leases is ``node/delivery/leases.py``."""

    node_id: str

    async def open_session(self, term: float, within: float) -> None:
        """Begin a new session of this node, alive ``term`` seconds from the
        store's now; leases taken from here on are held under it."""

    async def renew_session(self, term: float, within: float) -> bool:
        """Extend the session to ``term`` seconds from the store's now, if it
        has not ended; False if it has (every lease under it is lost) or none
        was opened."""

    async def takeable(self, buckets: Iterable[int], within: float) -> tuple[list[int], list[int]]:
        """Of ``buckets``: those free, held under an ended session or already
        ours (``statements.lease_takeable``); and those never leased (no
        document yet)."""

    async def take(self, takeable: list[int], unseen: list[int], within: float) -> None:
        """Take each bucket that is still takeable (re-checked atomically: one
        taken since ``takeable`` is not matched; an unseen one another node
        created meanwhile is its): owner us, under the open session (the
        lease lasts as long as it), and the token up by one (the fencing
        token)."""

    async def ours(self, buckets: list[int], within: float) -> dict[int, int]:
        """bucket -> token, for those of ``buckets`` this node holds now."""

    async def tokens(self, buckets: list[int], within: float) -> dict[int, tuple[str | None, int]]:
        """bucket -> (owner, token) as stored, for those of ``buckets`` leased once."""

    async def release(self, buckets: list[int], within: float) -> None:
        """Give our leases of ``buckets`` back: free at once for the next owner
        (the token stays, so the next owner's is newer)."""

    async def all(self) -> list[dict[str, Any]]:
        """Every bucket's lease (owner and token), by bucket."""


class AttemptHistory(Protocol):
    """One record per delivery attempt (``Attempt``), for
    ``GET /v1/schedules/{id}/history``: capped per schedule (the record of
    run ``n`` takes the slot of run ``n - cap``), kept per life of an id,
    expired after HISTORY_RETENTION. Never on the delivery path: the poller
    hands records to ``node/delivery/history_writer.py``."""

    async def prepare(self) -> None:
        """Make what the reads and the expiry need; idempotent."""

    async def write(self, attempts: Sequence[Attempt]) -> int:
        """Store the records; returns how many were written. A run number
        seen twice (its claim lost in a crash and made again): the first
        record of it stays."""

    async def of(
        self, schedule_id: str, limit: int, since: datetime | None = None
    ) -> list[dict[str, Any]]:
        """A schedule's records, newest run first, at most ``limit``; those at
        or after ``since`` alone (the current life of the id)."""


@dataclass(frozen=True)
class RateWant:
    """Reserve ``count`` deliveries' starts in a tenant's key's rate slice."""

    tenant: str
    key: str
    slice: Slice
    count: int


@dataclass(frozen=True)
class SlotWant:
    """Hold what can be held of a tenant's key's parallelism slots."""

    tenant: str
    key: str
    slots: tuple[str, ...]


class FlowGates(Protocol):
    """The cluster-wide counts behind flow control (``flow.FlowStore``):
    rate slices reserved by every owner at once, and parallelism slots each
    held by one node at a time, until it gives them back or they expire by
    the store's clock. Each call is one round trip however many keys."""

    async def prepare(self) -> None:
        """Make what the expiry needs; idempotent."""

    async def reserve(self, wants: Sequence[RateWant]) -> list[int]:
        """Reserve each want's count in its slice; returns how many each
        was granted (0 to its count; never more than the slice's capacity
        across every caller)."""

    async def hold(self, wants: Sequence[SlotWant]) -> set[str]:
        """Take the slots that are free, expired or this node's own
        (renewed); returns the ids held now."""

    async def release(self, slots: Sequence[str]) -> None:
        """Give back these slots, where this node still holds them."""


def kept_changing(schedule_id: str) -> ScheduleConflict:
    """What ``change`` raises when every try lost to a concurrent write."""
    return ScheduleConflict(
        f"schedule {public_id(schedule_id)!r} kept changing under this request; try again",
        retry_after=1,
    )
