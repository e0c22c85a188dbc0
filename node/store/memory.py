"""The store in memory: ``contract.Schedules``, ``contract.BucketLeases``
and ``contract.AttemptHistory`` with no IO, for virtual-time tests and
benchmarks (APScheduler's ``MemoryDataStore``, dramatiq's ``StubBroker``).

A twin, not a mock: the same contract tests run over it and over MongoDB
(the ``store`` fixture of ``tests/conftest.py``), and every condition and
change it applies to a schedule is the Mongo store's own statement
(``statements.py``), applied by ``emulation.py``. Its clock is injected (a
callable returning an aware datetime): it judges lease expiry and is
``server_time``; nothing here reads a wall clock or sleeps.

What it leaves out, on purpose: durability (a "crash" of it is the test's
to model), the group commit of inserts and its StoreBusy, read deadlines
(ReadTimedOut), and the TTL monitor, which runs only when asked
(``MemorySchedules.expire``). Faults are injected by name (``Faults.fail``):
a call that fails raises ``StoreUnavailable``, before or after it applied,
as a store whose answer was lost.

One instance of each may be shared by several nodes in one process: the
schedules and history as they are, the leases through ``MemoryLeases.of``,
one view per node over one table.
"""

from __future__ import annotations

import asyncio
import functools
from collections import Counter, defaultdict
from collections.abc import (
    AsyncIterator,
    Callable,
    Collection,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from node.errors import ScheduleConflict, StoreUnavailable
from node.schedule.changes import BulkVerb, Change, version_of
from node.schedule.model import NewSchedule, Status
from node.schedule.payload import payload_size
from node.schedule.times import aware
from node.store import statements
from node.store.contract import (
    BULK_BATCH,
    BULK_FIELDS,
    BULK_LIMIT,
    CHANGE_ATTEMPTS,
    DEFAULT_RETENTION,
    MAX_TENANTS_PER_ROUND,
    Attempt,
    AttemptHistory,
    BucketLeases,
    Bulk,
    ChangeFeed,
    Claimed,
    Completion,
    DueChange,
    FlowGates,
    RateWant,
    Schedules,
    SlotWant,
    kept_changing,
)
from node.store.documents import schedule_document
from node.store.emulation import Document, apply, matches, project, sort, stored
from node.store.flow import SLOT_TERM, granted
from node.store.listing import Listing, Page, Selector
from node.store.statements import WITHOUT_LARGE_PAYLOAD, WITHOUT_PAYLOADS, ids_and_buckets

Clock = Callable[[], datetime]
P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class _Fault:
    times: int
    applied: bool  # the call takes effect, and then its answer is lost


class Faults:
    """Store calls made to fail on purpose, by method name."""

    def __init__(self) -> None:
        self._faults: dict[str, _Fault] = {}
        self.calls: Counter[str] = Counter()

    def fail(self, method: str, times: int = 1, *, applied: bool = False) -> None:
        """The next ``times`` calls of ``method`` raise ``StoreUnavailable``:
        without effect, or (``applied``) after taking effect."""
        if not callable(getattr(self, method, None)):
            raise ValueError(f"no store method {method!r}")
        self._faults[method] = _Fault(times, applied)

    def _take_fault(self, method: str) -> _Fault | None:
        self.calls[method] += 1
        fault = self._faults.get(method)
        if fault is None:
            return None
        fault.times -= 1
        if fault.times <= 0:
            del self._faults[method]
        return fault


def _store_call(
    method: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Coroutine[Any, Any, R]]:
    """A contract method of a memory store: counted, and failed when told."""

    @functools.wraps(method)
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        store = args[0]
        assert isinstance(store, Faults)
        fault = store._take_fault(method.__name__)
        if fault is not None and not fault.applied:
            raise StoreUnavailable(f"injected: {method.__name__} did not reach the store")
        result = await method(*args, **kwargs)
        if fault is not None:
            raise StoreUnavailable(f"injected: the answer of {method.__name__} was lost")
        return result

    return call


class MemoryChangeFeed:
    """``contract.ChangeFeed`` in memory: what ``Documents`` tells of its
    writes since the feed was opened, in order. ``broken`` ends it as a
    store's restart would (iterating raises ``StoreUnavailable``)."""

    # No history is kept: a feed always starts from its opening.
    resumed = False
    resume_token = None

    def __init__(self, documents: Documents) -> None:
        self._documents = documents
        self._queue: asyncio.Queue[DueChange | None] = asyncio.Queue()

    def told(self, change: DueChange) -> None:
        self._queue.put_nowait(change)

    def broken(self) -> None:
        self._queue.put_nowait(None)

    def __aiter__(self) -> AsyncIterator[DueChange]:
        return self._changes()

    async def _changes(self) -> AsyncIterator[DueChange]:
        while (change := await self._queue.get()) is not None:
            yield change
        raise StoreUnavailable("the change feed broke")

    async def close(self) -> None:
        self._documents.feeds.pop(self, None)


class Documents:
    """The schedule documents, by id, by bucket and by bucket and status (a
    bucket's reads touch its own documents only, and a due read its PENDING
    ones, as an index range would): what a database holds, which several
    stores (nodes, or views of one) may share; and the change feeds open on
    it."""

    def __init__(self) -> None:
        self.by_id: dict[str, Document] = {}
        self._by_bucket: dict[int, dict[str, Document]] = defaultdict(dict)
        self._by_status: dict[tuple[int, Any], dict[str, Document]] = defaultdict(dict)
        # A dict as an ordered set: feeds are told in the order they opened,
        # whatever their hashes (a simulation's replay depends on it).
        self.feeds: dict[MemoryChangeFeed, None] = {}

    def put(self, doc: Document) -> None:
        kept = stored(doc)
        self.by_id[kept["_id"]] = kept
        self._by_bucket[int(kept["bucket"])][kept["_id"]] = kept
        self._by_status[int(kept["bucket"]), kept.get("status")][kept["_id"]] = kept
        if kept.get("status") == Status.PENDING.value:
            self._tell(kept, inserted=True, due=aware(kept["dueAt"]))

    def break_feeds(self) -> None:
        """Every open feed ends (a store's restart, a failover)."""
        for feed in list(self.feeds):
            feed.broken()
        self.feeds.clear()

    def _tell(self, doc: Document, *, inserted: bool, due: datetime | None) -> None:
        # The change stream's filter and projection (``due_changes.PIPELINE``):
        # stored PENDING, made PENDING, or a new due time.
        priority = doc.get("priority") if inserted else None
        change = DueChange(int(doc["bucket"]), str(doc["_id"]), due, inserted, priority)
        for feed in self.feeds:
            feed.told(change)

    def restore(self, doc: Document) -> None:
        """Put ``doc`` back as it was (a write undone: a store's crash lost it)."""
        if doc["_id"] in self.by_id:
            self.remove(doc["_id"])
        self.put(doc)

    def remove(self, schedule_id: str) -> None:
        doc = self.by_id.pop(schedule_id)
        del self._by_bucket[int(doc["bucket"])][schedule_id]
        del self._by_status[int(doc["bucket"]), doc.get("status")][schedule_id]

    def _candidates(self, query: Mapping[str, Any]) -> Iterable[Document]:
        """The documents a query can match at most, narrowed by its id or
        bucket as an index would (the filter is still applied to each)."""
        ids = query.get("_id")
        if isinstance(ids, str):
            return [self.by_id[ids]] if ids in self.by_id else []
        if isinstance(ids, Mapping) and set(ids) == {"$in"}:
            return [self.by_id[i] for i in dict.fromkeys(ids["$in"]) if i in self.by_id]
        buckets = _values_of(query.get("bucket"))
        if buckets is None:
            return list(self.by_id.values())
        statuses = _values_of(query.get("status"))
        if statuses is None:
            return [d for b in buckets for d in self._by_bucket.get(b, {}).values()]
        return [
            d for b in buckets for s in statuses for d in self._by_status.get((b, s), {}).values()
        ]

    def find(
        self,
        query: Mapping[str, Any],
        *,
        order: Sequence[tuple[str, int]] = (),
        limit: int = 0,
        projection: Mapping[str, int] | None = None,
    ) -> list[Document]:
        """Copies of the documents ``query`` matches, in ``order`` (else as
        stored), at most ``limit`` (0: all), without the fields ``projection``
        excludes."""
        found = [d for d in self._candidates(query) if matches(d, query)]
        if order:
            found = sort(found, order)
        if limit:
            found = found[:limit]
        return [project(d, projection) for d in found]

    def count(self, query: Mapping[str, Any]) -> int:
        return sum(1 for d in self._candidates(query) if matches(d, query))

    def update(
        self, query: Mapping[str, Any], update: Mapping[str, Any], *, many: bool = False
    ) -> int:
        """Apply ``update`` to the first document ``query`` matches (or to
        all, ``many``); returns how many it changed."""
        written = 0
        for doc in self._candidates(query):
            if matches(doc, query):
                before = (doc.get("status"), doc.get("dueAt"))
                apply(doc, update)
                self._restatus(doc, before[0])
                self._told_of_update(doc, *before)
                written += 1
                if not many:
                    break
        return written

    def _restatus(self, doc: Document, status: Any) -> None:
        if doc.get("status") != status:
            bucket, schedule_id = int(doc["bucket"]), doc["_id"]
            del self._by_status[bucket, status][schedule_id]
            self._by_status[bucket, doc.get("status")][schedule_id] = doc

    def _told_of_update(self, doc: Document, status: Any, due_at: Any) -> None:
        if not self.feeds:
            return
        moved = doc.get("dueAt") != due_at
        if moved or (doc.get("status") == Status.PENDING.value != status):
            # As a change event: the due time only when the write set it.
            self._tell(doc, inserted=False, due=aware(doc["dueAt"]) if moved else None)


def _values_of(condition: Any) -> Sequence[Any] | None:
    """The values an equality or ``$in`` condition allows (None: any)."""
    if isinstance(condition, (int, str)):
        return (condition,)
    if isinstance(condition, Mapping) and set(condition) == {"$in"}:
        return list(dict.fromkeys(condition["$in"]))
    return None


class MemorySchedules(Faults):
    """``contract.Schedules`` in memory."""

    def __init__(
        self,
        bucket_count: int,
        clock: Clock,
        *,
        retention: timedelta = DEFAULT_RETENTION,
        unfenced: bool = False,
        documents: Documents | None = None,
    ) -> None:
        super().__init__()
        self.bucket_count = bucket_count
        self.clock = clock
        self.retention = retention
        self.unfenced = unfenced
        self.documents_read: Counter[str] = Counter()
        self.documents = Documents() if documents is None else documents

    # -- start-up -------------------------------------------------------------

    @_store_call
    async def prepare(self, now: datetime) -> None:
        """Nothing to make: the bucket count is this instance's own."""

    @_store_call
    async def server_time(self) -> datetime:
        return self.clock()

    def expire(self) -> int:
        """What MongoDB's TTL monitor does: remove the documents whose
        ``expireAt`` has passed by the clock. Returns how many."""
        now = self.clock()
        gone = [
            schedule_id
            for schedule_id, doc in self.documents.by_id.items()
            if doc.get("expireAt") and doc["expireAt"] <= now
        ]
        for schedule_id in gone:
            self.documents.remove(schedule_id)
        return len(gone)

    # -- the API's reads and writes -------------------------------------------

    @_store_call
    async def insert(self, new: NewSchedule, now: datetime) -> tuple[dict[str, Any], bool]:
        doc = schedule_document(new, self.bucket_count, now)
        existing = self.documents.by_id.get(doc["_id"])
        if existing is None:
            self.documents.put(doc)
            return doc, True
        if not new.client_id:  # a random 128-bit id collided (as the Mongo store: never overwrite)
            raise StoreUnavailable(f"schedule {new.id!r}: a generated id collided")
        if existing.get("fingerprint") != doc["fingerprint"]:
            raise ScheduleConflict(f"schedule {new.id!r} exists with a different body", "id")
        return stored(existing), False

    @_store_call
    async def get(self, schedule_id: str) -> dict[str, Any] | None:
        found = self.documents.find(statements.one(schedule_id, self.bucket_count), limit=1)
        return found[0] if found else None

    @_store_call
    async def count_pending(self, tenant: str) -> int:
        return self.documents.count(statements.live_of(tenant))

    @_store_call
    async def cancel(
        self, schedule_id: str, now: datetime, if_match: int | None = None
    ) -> dict[str, Any] | None:
        written = self.documents.update(
            statements.cancellable(schedule_id, self.bucket_count, if_match),
            statements.cancelled(now, self.retention),
        )
        found = self.documents.find(statements.one(schedule_id, self.bucket_count), limit=1)
        if not found:
            return None
        if not written:
            statements.check_cancel(found[0], if_match)
        return found[0]

    @_store_call
    async def change(
        self,
        schedule_id: str,
        decide: Callable[[dict[str, Any]], Change | None],
        now: datetime,
        if_match: int | None = None,
    ) -> tuple[dict[str, Any], Change | None] | None:
        for _ in range(CHANGE_ATTEMPTS):
            found = self.documents.find(statements.one(schedule_id, self.bucket_count), limit=1)
            if not found:
                return None
            doc = found[0]
            statements.check_version(doc, if_match)
            change = decide(doc)
            if change is None or not (change.set or change.unset):
                return doc, None
            condition = statements.unchanged(doc, self.bucket_count)
            if self.documents.update(
                condition, statements.change_update(change, now, self.retention)
            ):
                return stored(self.documents.by_id[schedule_id]), change
        raise kept_changing(schedule_id)

    @_store_call
    async def change_matching(
        self, tenant: str, selector: Selector, verb: BulkVerb, now: datetime
    ) -> Bulk:
        query = selector.filter(tenant, verb.statuses)
        matched = changed = 0
        due: dict[int, datetime] = {}
        while matched < BULK_LIMIT:
            found = self.documents.find(
                query, order=[("_id", 1)], limit=BULK_BATCH, projection=BULK_FIELDS
            )
            matched += len(found)
            writes = statements.bulk_changes(
                found, verb, now, self.bucket_count, self.retention, due
            )
            for condition, update in writes:
                changed += self.documents.update(condition, update)
            if len(found) < BULK_BATCH:
                break
        statuses = statements.bulk_left(verb, matched >= BULK_LIMIT)
        more = bool(statuses) and bool(
            self.documents.find(selector.filter(tenant, statuses), limit=1)
        )
        return Bulk(matched, changed, more, due)

    @_store_call
    async def count_matching(
        self, tenant: str, selector: Selector, statuses: Sequence[str], limit: int
    ) -> int:
        return min(limit, self.documents.count(selector.filter(tenant, statuses)))

    @_store_call
    async def list_page(
        self, listing: Listing, *, payloads: bool = False, max_bytes: int = 0
    ) -> Page:
        wanted = listing.limit + 1  # one more than the page: whether more follow
        docs = self.documents.find(
            listing.filter(),
            order=listing.order(),
            limit=wanted,
            projection=None if payloads else WITHOUT_PAYLOADS,
        )
        if not payloads:
            return Page(docs[: listing.limit], len(docs) > listing.limit)
        page: list[dict[str, Any]] = []
        held = 0
        for doc in docs:
            held += payload_size(doc)
            if len(page) == listing.limit or (page and held > max_bytes):
                return Page(page, True)
            page.append(doc)
        return Page(page, False)

    @_store_call
    async def count_by_status(self, listing: Listing, limit: int = 0) -> dict[str, int]:
        counts = {}
        for status in Status:
            found = self.documents.count(listing.filter(status=status.value, paged=False))
            counts[status.value] = min(found, limit) if limit else found
        return counts

    @_store_call
    async def due_backlog(
        self, buckets: Collection[int], now: datetime, limit: int = 0
    ) -> dict[int, int]:
        counts = {}
        for bucket in sorted(buckets):
            due = self.documents.count(statements.due(bucket, now))
            due = min(due, limit) if limit else due
            if due:
                counts[bucket] = due
        return counts

    @_store_call
    async def status_counts(self, buckets: Collection[int]) -> dict[str, int]:
        mine = sorted(buckets)
        return {
            status.value: self.documents.count({"bucket": {"$in": mine}, "status": status.value})
            if mine
            else 0
            for status in Status
        }

    # -- the bucket owner's reads and writes ----------------------------------

    def _oldest_due(self, query: dict[str, Any], limit: int, read_for: str) -> list[dict[str, Any]]:
        """Up to ``limit`` of the schedules ``query`` matches, oldest due first,
        without a large payload (counted as read ``read_for``)."""
        docs = self.documents.find(
            query, order=[("dueAt", 1)], limit=limit, projection=WITHOUT_LARGE_PAYLOAD
        )
        self.documents_read[read_for] += len(docs)
        return docs

    @_store_call
    async def find_due(
        self, bucket: int, until: datetime, limit: int, after: datetime | None = None
    ) -> list[dict[str, Any]]:
        return self._oldest_due(statements.due(bucket, until, after), limit, "due")

    @_store_call
    async def next_due(self, bucket: int, after: datetime) -> datetime | None:
        found = self.documents.find(
            statements.due_after(bucket, after), order=[("dueAt", 1)], limit=1
        )
        return aware(found[0]["dueAt"]) if found else None

    @_store_call
    async def watch_due(self, resume_after: Any = None) -> ChangeFeed:
        feed = MemoryChangeFeed(self.documents)
        self.documents.feeds[feed] = None
        return feed

    @_store_call
    async def find_due_past(
        self,
        buckets: Collection[int],
        until: datetime,
        limit: int,
        skipping: Collection[str | None],
    ) -> list[dict[str, Any]]:
        return self._oldest_due(statements.due_past(buckets, until, skipping), limit, "past")

    @_store_call
    async def oldest_due_of(
        self, tenants: Sequence[str], until: datetime, buckets: Collection[int], limit: int
    ) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for tenant in tenants[:MAX_TENANTS_PER_ROUND]:
            docs = self._oldest_due(statements.pending_of(tenant, buckets), limit, "fair")
            found += [d for d in docs if aware(d["dueAt"]) <= until]
        return found

    @_store_call
    async def large_payloads(self, claims: Sequence[Claimed]) -> dict[str, bytes]:
        if not claims:
            return {}
        return statements.large_payloads_of(
            self.documents.find(ids_and_buckets([c.doc for c in claims]))
        )

    @_store_call
    async def claim(
        self, docs: Sequence[dict[str, Any]], tokens: Mapping[int, int], owner: str, now: datetime
    ) -> list[Claimed]:
        claimed = []
        for doc in {d["_id"]: d for d in docs}.values():  # each once
            token = tokens[doc["bucket"]]
            condition = statements.claimable(
                [doc], version_of(doc), token, now, unfenced=self.unfenced
            )
            if self.documents.update(condition, statements.claim_update(token, owner, now)):
                claimed.append(Claimed(doc, token))
        return claimed

    @_store_call
    async def complete(self, completions: Sequence[Completion]) -> int:
        return sum(
            self.documents.update(
                statements.owned(c.claimed, unfenced=self.unfenced),
                statements.completion_update(c, self.retention),
            )
            for c in completions
        )

    @_store_call
    async def unclaim(self, claims: Sequence[Claimed]) -> int:
        return sum(
            self.documents.update(
                statements.held_by([c.doc], c.token, unfenced=self.unfenced), statements.UNCLAIM
            )
            for c in claims
        )

    @_store_call
    async def recover_in_flight(
        self, tokens: Mapping[int, int], stranded_before: datetime | None = None
    ) -> list[str]:
        stale: list[dict[str, Any]] = []
        for bucket, token in sorted(tokens.items()):
            in_flight = self.documents.find(statements.in_flight(bucket))
            self.documents_read["recover"] += len(in_flight)
            stale += [s for s in in_flight if statements.left_behind(s, token, stranded_before)]
        for doc in stale:
            self.documents.update(
                statements.still_left(doc), statements.recovered(tokens[doc["bucket"]])
            )
        return [str(s["_id"]) for s in stale]


class MemoryLeases(Faults):
    """``contract.BucketLeases`` in memory: ``table`` holds the lease
    documents, ``holders`` the sessions, both shared by every node's view
    (``of``) as one database holds them."""

    def __init__(
        self,
        node_id: str,
        clock: Clock,
        table: dict[int, dict[str, Any]] | None = None,
        holders: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        self.node_id = node_id
        self.clock = clock
        self.table: dict[int, dict[str, Any]] = {} if table is None else table
        self.holders: dict[str, dict[str, Any]] = {} if holders is None else holders
        self.holder: str | None = None

    def of(self, node_id: str) -> MemoryLeases:
        """Another node's view of the same leases."""
        return MemoryLeases(node_id, self.clock, self.table, self.holders)

    @_store_call
    async def open_session(self, term: float, within: float) -> None:
        # Numbered, not random: a simulation replays the same holders.
        self.holder = f"{self.node_id}/{len(self.holders) + 1}"
        self.holders[self.holder] = {
            "_id": self.holder,
            "node": self.node_id,
            "expiresAt": _expires_at(self.clock(), term),
        }

    @_store_call
    async def renew_session(self, term: float, within: float) -> bool:
        now = self.clock()
        holder = self.holders.get(self.holder or "")
        if holder is None or not statements.holder_alive(holder, now):
            return False
        holder["expiresAt"] = _expires_at(now, term)
        return True

    def _live(self, now: datetime) -> set[str]:
        return {h for h, doc in self.holders.items() if statements.holder_alive(doc, now)}

    @_store_call
    async def takeable(self, buckets: Iterable[int], within: float) -> tuple[list[int], list[int]]:
        now = self.clock()
        live = self._live(now)
        wanted = sorted(buckets)
        takeable = [
            b
            for b in wanted
            if b in self.table and statements.lease_takeable(self.table[b], self.node_id, live, now)
        ]
        return takeable, [b for b in wanted if b not in self.table]

    @_store_call
    async def take(self, takeable: list[int], unseen: list[int], within: float) -> None:
        now = self.clock()
        live = self._live(now)
        for bucket in [*takeable, *unseen]:
            lease = self.table.get(bucket)
            if lease is None and bucket not in unseen:
                continue  # an update without upsert: nothing to match
            if lease is not None and not statements.lease_takeable(lease, self.node_id, live, now):
                continue  # taken since (the upsert's duplicate key: another node won)
            self.table[bucket] = {
                "_id": bucket,
                "owner": self.node_id,
                "holder": self.holder,
                "token": int((lease or {}).get("token", 0)) + 1,
                "acquiredAt": now,
            }

    @_store_call
    async def ours(self, buckets: list[int], within: float) -> dict[int, int]:
        return {b: int(self.table[b]["token"]) for b in buckets if self._mine(b)}

    @_store_call
    async def tokens(self, buckets: list[int], within: float) -> dict[int, tuple[str | None, int]]:
        return {
            b: (self.table[b].get("owner"), int(self.table[b].get("token", 0)))
            for b in buckets
            if b in self.table
        }

    @_store_call
    async def release(self, buckets: list[int], within: float) -> None:
        for bucket in buckets:
            if self._mine(bucket):
                self.table[bucket].update(owner=None, holder=None)

    @_store_call
    async def all(self) -> list[dict[str, Any]]:
        return [
            {"_id": b, "owner": lease.get("owner"), "token": lease.get("token", 0)}
            for b, lease in sorted(self.table.items())
        ]

    def _mine(self, bucket: int) -> bool:
        lease = self.table.get(bucket)
        return lease is not None and lease.get("owner") == self.node_id


def _expires_at(now: datetime, term: float) -> datetime:
    # As $$NOW + term in whole milliseconds (leases.py).
    start: datetime = stored(now)
    return start + timedelta(milliseconds=int(term * 1000))


class MemoryHistory(Faults):
    """``contract.AttemptHistory`` in memory. Records past ``retention`` by
    the clock are gone at once (MongoDB's TTL monitor takes up to a minute)."""

    def __init__(self, clock: Clock, *, cap: int, retention: timedelta) -> None:
        super().__init__()
        self.clock = clock
        self.cap = cap
        self.retention = retention
        self.records: dict[str, Document] = {}

    @_store_call
    async def prepare(self) -> None:
        """Nothing to make."""

    @_store_call
    async def write(self, attempts: Sequence[Attempt]) -> int:
        written = 0
        for attempt in attempts:
            doc = attempt.to_document(self.cap)
            # The first ``cap`` runs fill empty slots (a run seen twice: the
            # first record stays); later ones replace the slot's older run.
            if attempt.run <= self.cap and doc["_id"] in self.records:
                continue
            self.records[doc["_id"]] = stored(doc)
            written += 1
        return written

    @_store_call
    async def of(
        self, schedule_id: str, limit: int, since: datetime | None = None
    ) -> list[dict[str, Any]]:
        kept_after = self.clock() - self.retention
        found = [
            r
            for r in self.records.values()
            if r["scheduleId"] == schedule_id
            and r["at"] > kept_after
            and (since is None or r["at"] >= since)
        ]
        return [stored(r) for r in sort(found, [("run", -1)])[:limit]]


class MemoryFlow(Faults):
    """``contract.FlowGates`` in memory: ``slices`` and ``slots`` shared by
    every node's view (``of``) as one collection holds them."""

    def __init__(
        self,
        holder: str,
        clock: Clock,
        slices: dict[str, int] | None = None,
        slots: dict[str, tuple[str, datetime]] | None = None,
        term: float = SLOT_TERM,
    ) -> None:
        super().__init__()
        self.holder = holder
        self.term = term
        self.clock = clock
        self.slices: dict[str, int] = {} if slices is None else slices
        self.slots: dict[str, tuple[str, datetime]] = {} if slots is None else slots

    def of(self, holder: str, term: float = SLOT_TERM) -> MemoryFlow:
        """Another node's view of the same counts."""
        return MemoryFlow(holder, self.clock, self.slices, self.slots, term)

    @_store_call
    async def prepare(self) -> None:
        return None

    @_store_call
    async def reserve(self, wants: Sequence[RateWant]) -> list[int]:
        grants = []
        for want in wants:
            after = self.slices.get(want.slice.id, 0) + want.count
            self.slices[want.slice.id] = after
            grants.append(granted(want.slice.capacity, after, want.count))
        return grants

    @_store_call
    async def hold(self, wants: Sequence[SlotWant]) -> set[str]:
        now = self.clock()
        held: set[str] = set()
        for slot in (slot for want in wants for slot in want.slots):
            holder, until = self.slots.get(slot, (self.holder, now))
            if holder == self.holder or until < now or slot not in self.slots:
                self.slots[slot] = (self.holder, now + timedelta(seconds=self.term))
                held.add(slot)
        return held

    @_store_call
    async def release(self, slots: Sequence[str]) -> None:
        for slot in slots:
            if slot in self.slots and self.slots[slot][0] == self.holder:
                del self.slots[slot]


def _implements_the_contract(
    schedules: MemorySchedules, leases: MemoryLeases, history: MemoryHistory, flow: MemoryFlow
) -> tuple[Schedules, BucketLeases, AttemptHistory, FlowGates]:
    """Never called: mypy checks here that the twins fit the Protocols."""
    return schedules, leases, history, flow
