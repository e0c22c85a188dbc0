"""The schedule store: every MongoDB read and write of the ``schedules`` and
``cluster`` collections (DESIGN.md "Mongo").

Two rules shape it:

* Batch every round trip. The bucket owner claims and completes a whole batch
  with one ``bulk_write`` holding an ``UpdateMany`` per distinct lease token,
  never one ``find_one_and_update`` per schedule (DESIGN.md "Bucket poller",
  step 2); concurrent API inserts share one ``insert_many``.
* Fence every owner write. A write made for a bucket carries that bucket's
  lease token, and its filter only matches documents no newer token has
  touched (``token <= mine`` to claim, ``token == mine`` to complete), so a
  paused or partitioned former owner cannot overwrite a newer owner's work.
* Name the bucket. Every read and write of one schedule, and every read of
  due work, carries the bucket (``documents.bucket_of``): on a sharded
  cluster (shard key ``{bucket: "hashed", _id: 1}``) it goes to the shard
  that holds it, and a node reads its own buckets' work only. Listing a
  tenant's schedules and counting its PENDING ones span every bucket by
  nature; they are the only queries that do.

Writes filter on ``_id`` first: the embedded SecantusDB serves a filter from
its first clause that an index can serve alone, and for ``_id`` that is a
point lookup.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import pymongo
from pymongo import ASCENDING, ReturnDocument, UpdateMany, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError, OperationFailure, PyMongoError

from node.errors import (
    BucketCountMismatch,
    ChangesUnsupported,
    FormatTooNew,
    ReadTimedOut,
    ScheduleConflict,
    StoreUnavailable,
)
from node.schedule.changes import BulkVerb, Change, version_of
from node.schedule.model import NewSchedule, Status
from node.schedule.payload import payload_size
from node.schedule.times import aware
from node.store import due_changes, statements
from node.store.boundary import DURABLE, store_call
from node.store.contract import (
    BULK_BATCH,
    BULK_FIELDS,
    BULK_LIMIT,
    CHANGE_ATTEMPTS,
    DEFAULT_RETENTION,
    MAX_TENANTS_PER_ROUND,
    Bulk,
    ChangeFeed,
    Claimed,
    Completion,
    kept_changing,
)
from node.store.documents import INDEXES, SUPERSEDED_INDEXES, schedule_document
from node.store.group_insert import GroupInserter
from node.store.listing import Listing, Page, Selector
from node.store.statements import WITHOUT_LARGE_PAYLOAD, WITHOUT_PAYLOADS, ids_and_buckets

FORMAT_VERSION = 1
# A bulk verb's conditional writes per round trip: each its own statement,
# so that one round trip stays well within the store's timeout on a slow
# server (500 in one took over 5 s on the embedded store while the pollers
# claimed a burst of the same schedules: the call failed 503).
BULK_WRITES_PER_TRIP = 100
CLUSTER_DOC_ID = "cluster"
# Ids per claim or mark statement. The embedded server matches "$in" by
# scanning the list for every candidate, so one statement costs the square of
# its length: claiming 500 took 0.83 s as one statement and 0.35 s as 25 of
# 20 (measured); a real MongoDB does not care either way.
IDS_PER_STATEMENT = 20
# A listing with payloads is read this many documents at a time.
FULL_PAGE_BATCH = 16
# Buckets read at once by a sliced read (embedded store only: ``sliced``).
SLICES = 8

# The embedded store's reads past the slow lanes, one bucket each: this many
# at once. The poller makes that read beside its rounds, and the embedded
# server answers one statement at a time: two keep it going without putting
# more than two statements ahead of each of the round's own (eight added
# 30-60 ms to every claim and write while a hung host filled every view).
PAST_READS_AT_ONCE = 2
# The longest a change stream's getMore waits for a write (ms): below any
# client deadline (STORE_TIMEOUT is at least 0.5 s), which bounds each one.
CHANGES_WAIT_MS = 400
# The embedded store's peeks at a bucket's next due time, each bounded to
# this far after the view's bound (``next_due``).
PEEK_WINDOWS = (timedelta(minutes=1), timedelta(hours=4))


__all__ = ["MAX_TENANTS_PER_ROUND", "ScheduleStore"]


class ScheduleStore:
    """``contract.Schedules`` on MongoDB: the ``schedules`` and ``cluster``
    collections."""

    def __init__(
        self,
        database: AsyncDatabase[dict[str, Any]],
        bucket_count: int,
        *,
        unfenced: bool = False,
        retention: timedelta = DEFAULT_RETENTION,
        read_timeout: float | None = None,
    ) -> None:
        self.database = database
        # The longest a read of many schedules (a listing page, its counts,
        # a bulk cancel's selection) may hold the store (READ_TIMEOUT; None:
        # the client's own deadline). A read that would take longer is
        # stopped by the server (maxTimeMS) and refused: it cannot starve
        # the owners' work, whatever the tenant's size.
        self.read_timeout = read_timeout
        # Whether a tenant's listings by status, and its counts, are read a
        # bucket at a time (``_page_by_bucket``, ``_count_by_bucket``). Only
        # on the embedded SecantusDB, which cannot stop a scan part way: it
        # reads every entry of an index prefix before it applies a limit, in
        # one uninterruptible step, so a listing of a tenant of 20,000 held
        # the whole server 0.5 to 2 s, and every owner's call waited behind
        # it. A bucket at a time, each read is a tenant's share of one
        # bucket, and the owners' calls go in between. A real MongoDB walks
        # one index range and stops at the page: one query is best there.
        self.sliced = False
        # How long a schedule is kept once it has ended (RETENTION).
        self.retention = retention
        # Documents returned by the owner's reads, by query: what each
        # delivered record costs the store in reads (a metric).
        self.documents_read: Counter[str] = Counter()
        # Chaos testing only (CHAOS_MODE=unfenced): owner writes carry no
        # token condition, so the chaos checker can prove it sees the result.
        self.unfenced = unfenced
        self.bucket_count = bucket_count
        self.schedules: AsyncCollection[dict[str, Any]] = database["schedules"]
        self.cluster: AsyncCollection[dict[str, Any]] = database["cluster"].with_options(
            write_concern=DURABLE
        )
        # What the API acknowledges must survive a crash of the database (and
        # a failover, on a replica set): journaled, on a majority. So must
        # every write that takes a schedule out of IN_FLIGHT (a mark, a put
        # back, a recovery): lost after its acknowledgement (w: 1 rolled
        # back in a failover, or not yet journaled when the server died), it
        # leaves the schedule IN_FLIGHT under a token its owner may hold for
        # good, and nothing would ever look at it again. And so must the
        # claim, though a lost one only puts its schedule back as it was:
        # the owner publishes once the claim is acknowledged, and a claim
        # rolled back after that leaves a schedule already out PENDING at
        # its first version, which a cancel then takes with a 200 ("it will
        # not be delivered") and a PATCH moves as if it had not fired (the
        # simulation's seed 325 of 1-1000). The cost is one wait for the
        # majority per claim statement, a batch each, before the publish.
        self._durable = self.schedules.with_options(write_concern=DURABLE)
        self._inserts = GroupInserter(self._durable)

    # -- start-up -------------------------------------------------------------

    @property
    def hints(self) -> bool:
        """Whether to name the index a query reads (``hint``): the cost is
        then the code's, not the planner's guess. Not on the embedded
        SecantusDB (``sliced``), whose hinted queries walk the whole index,
        every tenant's entries, before filtering: a listing of a tenant of
        50 in a collection of 20,000 took 0.7 s hinted and 4 ms not. A real
        MongoDB always gets the hints."""
        return not self.sliced

    @store_call
    async def prepare(self, now: datetime) -> None:
        """Pin the bucket count and create indexes; both idempotent."""
        await self.learn_server()
        await self._pin_bucket_count(now)
        existing = await self.schedules.index_information()
        for name in SUPERSEDED_INDEXES:
            if name in existing:
                await self.schedules.drop_index(name)
        for spec in INDEXES:
            await self.schedules.create_index(spec.keys, name=spec.name, **spec.options)

    async def _pin_bucket_count(self, now: datetime) -> None:
        try:
            await self.cluster.insert_one(
                {
                    "_id": CLUSTER_DOC_ID,
                    "buckets": self.bucket_count,
                    "formatVersion": FORMAT_VERSION,
                    "createdAt": now,
                }
            )
            return
        except DuplicateKeyError:
            pass
        existing = await self.cluster.find_one({"_id": CLUSTER_DOC_ID})
        assert existing is not None
        if existing["buckets"] != self.bucket_count:
            raise BucketCountMismatch(
                f"BUCKETS is {self.bucket_count} but database {self.database.name!r} was "
                f"created with {existing['buckets']} buckets; buckets cannot change once "
                f"schedules exist: set BUCKETS={existing['buckets']}"
            )
        if existing.get("formatVersion", FORMAT_VERSION) > FORMAT_VERSION:
            raise FormatTooNew(
                f"database {self.database.name!r} has format version "
                f"{existing['formatVersion']}, newer than this node's {FORMAT_VERSION}"
            )

    @store_call
    @store_call
    async def learn_server(self) -> None:
        """Learn which server this is (``sliced``): every instance must, the
        owner's as well as the API's, or the embedded server gets the
        statements it cannot bound."""
        self.sliced = await self.embedded()

    async def embedded(self) -> bool:
        """Whether the server is the embedded SecantusDB (its buildInfo says so)."""
        info = await self.database.client.admin.command("buildInfo")
        return "secantusVersion" in info

    @contextlib.contextmanager
    def _bounded_read(self) -> Iterator[None]:
        """A read of many schedules, held to READ_TIMEOUT."""
        if self.read_timeout is None:
            yield
            return
        try:
            with pymongo.timeout(self.read_timeout):
                yield
        except PyMongoError as exc:
            if not exc.timeout:
                raise
            raise ReadTimedOut(
                f"the store took longer than {self.read_timeout:g} s for this read; narrow it "
                "(a due window, a label, a key, a smaller page) or retry",
                retry_after=1,
            ) from exc

    def _write_filter(self, query: dict[str, Any]) -> dict[str, Any]:
        """The filter of an owner's write as this server plans it best
        (``typed``: the embedded store only)."""
        return typed(query) if self.sliced else query

    def _hint(self, index: str | None) -> dict[str, Any]:
        return {"hint": index} if index is not None and self.hints else {}

    @store_call
    async def server_time(self) -> datetime:
        """The store's clock now (``hello``'s localTime)."""
        answer = await self.database.command("hello")
        return aware(answer["localTime"])

    @store_call
    async def due_backlog(
        self, buckets: Collection[int], now: datetime, limit: int = 0
    ) -> dict[int, int]:
        """bucket -> PENDING schedules already due, for ``buckets`` (a node's
        own): one count each over its range of ``bucket_status_due``, so its
        cost is the backlog it counts, or ``limit`` index entries at most
        (0: no limit; a MongoDB server stops there, the embedded store reads
        the whole range first)."""
        bound: dict[str, Any] = {"limit": limit} if limit else {}
        counts = {}
        for bucket in sorted(buckets):
            due = await self.schedules.count_documents(statements.due(bucket, now), **bound)
            if due:
                counts[bucket] = due
        return counts

    @store_call
    async def status_counts(self, buckets: Collection[int]) -> dict[str, int]:
        """Schedules of ``buckets`` (a node's own) by status: one count per
        status, over one range of ``{bucket, status, dueAt}`` per bucket."""
        counts = {}
        for status in Status:
            counts[status.value] = (
                await self.schedules.count_documents(
                    {"bucket": {"$in": sorted(buckets)}, "status": status.value},
                    hint="bucket_status_due",
                )
                if buckets
                else 0
            )
        return counts

    # -- the API's reads and writes -------------------------------------------

    @store_call
    async def insert(self, new: NewSchedule, now: datetime) -> tuple[dict[str, Any], bool]:
        """Store a new schedule; returns (document, created).

        The same client id with the same body returns the stored schedule
        (created False); with another body it is a 409. One insert, so a
        schedule is either wholly stored or not at all.
        """
        doc = schedule_document(new, self.bucket_count, now)
        try:  # shares a round trip with concurrent inserts (node/group_insert.py)
            await self._inserts.insert(doc)
            return doc, True
        except DuplicateKeyError:
            if not new.client_id:
                raise  # a random 128-bit id collided: let it surface, never overwrite
        existing = await self.schedules.find_one({"_id": doc["_id"], "bucket": doc["bucket"]})
        if existing is None:  # deleted in between; not something the API does
            raise ScheduleConflict(f"schedule {new.id!r} changed concurrently", "id")
        if existing.get("fingerprint") != doc["fingerprint"]:
            raise ScheduleConflict(f"schedule {new.id!r} exists with a different body", "id")
        return existing, False

    @store_call
    async def count_pending(self, tenant: str) -> int:
        """A tenant's live schedules (PENDING or PAUSED), for its quota."""
        # A tenant's schedules lie in every bucket: this count spans them all
        # (on a sharded cluster, every shard), one bounded index range each.
        return await self.schedules.count_documents(statements.live_of(tenant))

    @store_call
    async def get(self, schedule_id: str) -> dict[str, Any] | None:
        return await self.schedules.find_one(self._one(schedule_id))

    @store_call
    async def cancel(
        self, schedule_id: str, now: datetime, if_match: int | None = None
    ) -> dict[str, Any] | None:
        """PENDING or PAUSED -> CANCELLED in one conditional write.

        The claim only takes PENDING schedules and this only cancels PENDING
        or PAUSED ones; the store applies one of the two first, so a 200 here
        means no owner holds it and none ever will. ``if_match``: only at
        that version (``VersionMismatch`` otherwise).
        """
        result = await self._durable.update_one(
            statements.cancellable(schedule_id, self.bucket_count, if_match),
            statements.cancelled(now, self.retention),
        )
        doc = await self.get(schedule_id)
        if doc is None:
            return None
        if result.modified_count == 0:
            statements.check_cancel(doc, if_match)
        return doc

    @store_call
    async def change(
        self,
        schedule_id: str,
        decide: Callable[[dict[str, Any]], Change | None],
        now: datetime,
        if_match: int | None = None,
    ) -> tuple[dict[str, Any], Change | None] | None:
        """Read the schedule, ``decide`` what a verb makes of it, and write
        that where the schedule is still at the status and version it was
        read at; returns (the schedule after, the change written), or None
        when there is no such schedule. Lost to a concurrent write (a claim,
        another verb), it reads and decides again: what ``decide`` refuses
        (in flight, ended) is refused on what is stored, never on a stale
        copy. ``if_match``: only at that version (``VersionMismatch``).
        """
        for _ in range(CHANGE_ATTEMPTS):
            doc = await self.schedules.find_one(self._one(schedule_id))
            if doc is None:
                return None
            statements.check_version(doc, if_match)
            change = decide(doc)
            if change is None or not (change.set or change.unset):
                return doc, None
            after = await self._durable.find_one_and_update(
                statements.unchanged(doc, self.bucket_count),
                statements.change_update(change, now, self.retention),
                return_document=ReturnDocument.AFTER,
            )
            if after is not None:
                return after, change
        raise kept_changing(schedule_id)

    @store_call
    async def change_matching(
        self, tenant: str, selector: Selector, verb: BulkVerb, now: datetime
    ) -> Bulk:
        """The verb on each match: read a batch from the index the selector
        names, then one ``bulk_write`` of an ``UpdateOne`` per match, each
        targeted by its bucket and written under the status and version
        read (``statements.bulk_changes``)."""
        query = selector.filter(tenant, verb.statuses)
        matched = changed = 0
        due: dict[int, datetime] = {}
        while matched < BULK_LIMIT:
            with self._bounded_read():
                found = await self.schedules.find(
                    query,
                    BULK_FIELDS,
                    limit=BULK_BATCH,
                    batch_size=BULK_BATCH,
                    **self._hint(selector.index),
                ).to_list()
            matched += len(found)
            writes = statements.bulk_changes(
                found, verb, now, self.bucket_count, self.retention, due
            )
            for start in range(0, len(writes), BULK_WRITES_PER_TRIP):
                chunk = writes[start : start + BULK_WRITES_PER_TRIP]
                result = await self._durable.bulk_write(
                    [UpdateOne(condition, update) for condition, update in chunk], ordered=False
                )
                changed += result.modified_count
            if len(found) < BULK_BATCH:
                break
        more = await self._more_to(tenant, selector, verb, stopped=matched >= BULK_LIMIT)
        return Bulk(matched, changed, more, due)

    async def _more_to(
        self, tenant: str, selector: Selector, verb: BulkVerb, *, stopped: bool
    ) -> bool:
        """Whether a bulk verb has more to do: matches past its limit, or
        one still in flight (``BulkVerb.unsettled``)."""
        statuses = statements.bulk_left(verb, stopped)
        if not statuses:
            return False
        with self._bounded_read():
            left = await self.schedules.find_one(
                selector.filter(tenant, statuses), {"_id": 1}, **self._hint(selector.index)
            )
        return left is not None

    @store_call
    async def count_matching(
        self, tenant: str, selector: Selector, statuses: Sequence[str], limit: int
    ) -> int:
        with self._bounded_read():
            return await self.schedules.count_documents(
                selector.filter(tenant, statuses), limit=limit, **self._hint(selector.index)
            )

    @store_call
    async def list_page(
        self, listing: Listing, *, payloads: bool = False, max_bytes: int = 0
    ) -> Page:
        """One page of a tenant's schedules (at most ``listing.limit``), read
        from the one index its filter names (``Listing.index``); without
        their payloads unless ``payloads``, and then only as many as fit in
        ``max_bytes`` of payload (at least one: a page always moves on).

        A listing spans every bucket by nature (a tenant's ids hash to all
        of them): on a sharded cluster it asks every shard, each for one
        bounded range of that index."""
        wanted = listing.limit + 1  # one more than the page: whether more follow
        if self.sliced and not payloads and listing.by_status:
            docs = await self._page_by_bucket(listing, wanted)
            return Page(docs[: listing.limit], len(docs) > listing.limit)
        cursor = self.schedules.find(
            listing.filter(),
            None if payloads else WITHOUT_PAYLOADS,
            sort=listing.order(),
            limit=wanted,
            **self._hint(listing.index),
        )
        with self._bounded_read():
            if not payloads:
                docs = await cursor.batch_size(wanted).to_list()
                return Page(docs[: listing.limit], len(docs) > listing.limit)
            # Read a few at a time and stop at the budget: the node never
            # holds more than the page it answers (and one batch of the server's).
            page: list[dict[str, Any]] = []
            held = 0
            more = False
            async for doc in cursor.batch_size(FULL_PAGE_BATCH):
                held += payload_size(doc)
                if len(page) == listing.limit or (page and held > max_bytes):
                    more = True
                    break
                page.append(doc)
            await cursor.close()
            return Page(page, more)

    @store_call
    async def count_by_status(self, listing: Listing, limit: int = 0) -> dict[str, int]:
        """How many of the tenant's schedules match ``listing``'s filter,
        by status (the page's own status filter aside): one count each, on
        the index the filter names, each stopping at ``limit`` (0: none)."""
        counts: dict[str, int] = {}
        bound: dict[str, Any] = {"limit": limit} if limit else {}
        bound.update(self._hint(listing.count_index))
        sliced = self.sliced and listing.count_index == "tenant_status_bucket_due"
        for status in Status:
            query = listing.filter(status=status.value, paged=False)
            if sliced:
                counts[status.value] = await self._count_by_bucket(query, limit)
                continue
            with self._bounded_read():
                counts[status.value] = await self.schedules.count_documents(query, **bound)
        return counts

    async def _page_by_bucket(self, listing: Listing, wanted: int) -> list[dict[str, Any]]:
        """A listing by status, read a bucket at a time (embedded store only,
        see ``sliced``; SLICES at once, each held to READ_TIMEOUT), merged,
        keeping the ``wanted`` earliest. Once the page is full, a bucket is
        asked only for what could still make it (due no later than its
        last), so most buckets return nothing and the node holds at most
        (SLICES + 1) x ``wanted`` documents. Each read is one range of
        ``{tenant, status, bucket, dueAt}``; the cursor's place is a bound
        on dueAt and then a filter here (an ``$or`` would cost the embedded
        server its index)."""
        after = listing.after
        low = None if after is None or after.due is None else (after.due, after.after)
        page: list[dict[str, Any]] = []

        async def one(bucket: int, high: tuple[datetime, str] | None) -> list[dict[str, Any]]:
            query = {**listing.filter(paged=False), "bucket": bucket}
            due = dict(query.get("dueAt") or {})
            if low is not None:
                due["$gte"] = max(due.get("$gte", low[0]), low[0])
            if high is not None:
                due["$lte"] = high[0]
            if due:
                query["dueAt"] = due
            with self._bounded_read():
                found = await self.schedules.find(
                    query, WITHOUT_PAYLOADS, sort=listing.order(), limit=wanted
                ).to_list()
            return [
                d
                for d in found
                if (low is None or _due_and_id(d) > low) and (high is None or _due_and_id(d) < high)
            ]

        for first in range(0, self.bucket_count, SLICES):
            high = _due_and_id(page[-1]) if len(page) == wanted else None
            parts = await asyncio.gather(
                *(one(b, high) for b in range(first, min(first + SLICES, self.bucket_count)))
            )
            page = heapq.nsmallest(wanted, [*page, *(d for p in parts for d in p)], key=_due_and_id)
        return page

    async def _count_by_bucket(self, query: dict[str, Any], limit: int) -> int:
        """``count_documents(query)`` a bucket at a time (embedded store
        only, see ``sliced``; SLICES at once, each held to READ_TIMEOUT),
        stopping once ``limit`` is reached (0: none)."""
        total = 0
        for first in range(0, self.bucket_count, SLICES):
            buckets = range(first, min(first + SLICES, self.bucket_count))
            with self._bounded_read():
                parts = await asyncio.gather(
                    *(self.schedules.count_documents({**query, "bucket": b}) for b in buckets)
                )
            total += sum(parts)
            if limit and total >= limit:
                return limit
        return total

    # -- the bucket owner's reads and writes ----------------------------------

    @store_call
    async def find_due(
        self, bucket: int, until: datetime, limit: int, after: datetime | None = None
    ) -> list[dict[str, Any]]:
        """``bucket``'s PENDING schedules due by ``until`` (and after
        ``after``), from the earliest, at most ``limit``: one range of the
        ``{bucket, status, dueAt}`` index, so its cost is what it returns,
        whatever waits in the future or in other buckets."""
        docs = await (
            self.schedules.find(
                statements.due(bucket, until, after),
                # A large payload stays behind: the poller fetches it at publish time.
                WITHOUT_LARGE_PAYLOAD,
            )
            .sort("dueAt", ASCENDING)
            .limit(limit)
            .batch_size(limit)  # one round trip: the default first batch is 101
            .to_list()
        )
        self.documents_read["due"] += len(docs)
        return docs

    @store_call
    async def next_due(self, bucket: int, after: datetime) -> datetime | None:
        """One key of the ``{bucket, status, dueAt}`` index: the projection
        holds index fields only, so a real MongoDB answers from the index
        (a covered query) without reading a document.

        The embedded SecantusDB reads every entry of the range before it
        applies the limit (7 ms a bucket for 390 schedules days ahead,
        against 0.3 ms for a due read): there the range is bounded, first
        to a minute ahead (where a busy bucket's next schedule is), then to
        PEEK_HORIZON, and finding none answers the horizon itself, a time
        before which there is none (the contract's lower bound: the view
        looks again then)."""
        if not self.sliced:
            return await self._next_due(statements.due_after(bucket, after))
        for window in PEEK_WINDOWS:
            bound = after + window
            found = await self._next_due(statements.due_after(bucket, after, bound))
            if found is not None:
                return found
        return bound

    async def _next_due(self, query: dict[str, Any]) -> datetime | None:
        found = await (
            self.schedules.find(query, {"_id": 0, "dueAt": 1}, **self._hint("bucket_status_due"))
            .sort("dueAt", ASCENDING)
            .limit(1)
            .to_list()
        )
        return aware(found[0]["dueAt"]) if found else None

    async def watch_due(self, resume_after: Any = None) -> ChangeFeed:
        """A change stream of the writes that may make work due sooner
        (``due_changes.py``), from ``resume_after`` (an earlier feed's
        ``resume_token``) while the server still has that history, else from
        now. Its waits are shorter than the client's deadline (timeoutMS),
        which bounds each ``getMore``."""
        if resume_after is not None:
            try:
                return await self._watch(resume_after)
            except (ChangesUnsupported, StoreUnavailable):
                pass  # history gone, or the token refused: from now, and every view read
        return await self._watch(None)

    async def _watch(self, resume_after: Any) -> ChangeFeed:
        try:
            stream = await self.schedules.watch(
                due_changes.PIPELINE,
                max_await_time_ms=CHANGES_WAIT_MS,
                start_after=resume_after,
            )
        except OperationFailure as exc:
            if exc.code == due_changes.NOT_A_REPLICA_SET:
                raise ChangesUnsupported(
                    "the store has no change streams (a standalone server): "
                    "owners poll their buckets"
                ) from exc
            raise StoreUnavailable("could not open the schedules' change stream") from exc
        except PyMongoError as exc:
            raise StoreUnavailable("could not open the schedules' change stream") from exc
        return due_changes.MongoChangeFeed(
            stream, self.bucket_count, resumed=resume_after is not None
        )

    @store_call
    async def find_due_past(
        self,
        buckets: Collection[int],
        until: datetime,
        limit: int,
        skipping: Collection[str | None],
    ) -> list[dict[str, Any]]:
        """``buckets``' PENDING schedules due by ``until`` but those of the
        lanes ``skipping``, earliest first, at most ``limit``: one statement
        for all of a node's buckets whose views a slow lane's backlog fills.

        On ``{bucket, status, http.host, dueAt}``: per bucket, one range per
        gap between the skipped hosts, each bounded by due time, merged in a
        sort of at most ``limit``. What it walks is the due work of the lanes
        not skipped (what the node takes next), never the backlogs skipped.
        (Hinted on a real MongoDB only: ``hints``.)

        The embedded SecantusDB gets one statement per bucket instead: it
        bounds ``bucket: {$in}`` beside two more operators by nothing, and
        took 600 ms for 85 buckets of a 20,000-schedule collection that it
        answers in 3 ms a bucket."""
        if self.sliced:
            return await self._due_past_by_bucket(buckets, until, limit, skipping)
        docs = await self._due_past(statements.due_past(buckets, until, skipping), limit)
        self.documents_read["past"] += len(docs)
        return docs

    async def _due_past_by_bucket(
        self,
        buckets: Collection[int],
        until: datetime,
        limit: int,
        skipping: Collection[str | None],
    ) -> list[dict[str, Any]]:
        gate = asyncio.Semaphore(PAST_READS_AT_ONCE)

        async def one(bucket: int) -> list[dict[str, Any]]:
            async with gate:
                return await self._due_past(statements.due_past([bucket], until, skipping), limit)

        parts = await asyncio.gather(*(one(bucket) for bucket in sorted(buckets)))
        found = [doc for part in parts for doc in part]
        docs = sorted(found, key=lambda d: aware(d["dueAt"]))[:limit]
        self.documents_read["past"] += len(found)
        return docs

    async def _due_past(self, query: dict[str, Any], limit: int) -> list[dict[str, Any]]:
        return await (
            self.schedules.find(
                query, WITHOUT_LARGE_PAYLOAD, **self._hint("bucket_status_host_due")
            )
            .sort("dueAt", ASCENDING)
            .limit(limit)
            .batch_size(limit)
            .to_list()
        )

    @store_call
    async def oldest_due_of(
        self, tenants: Sequence[str], until: datetime, buckets: Collection[int], limit: int
    ) -> list[dict[str, Any]]:
        """Each tenant's earliest PENDING schedules of ``buckets`` due by
        ``until`` (the first MAX_TENANTS_PER_ROUND tenants: callers rotate
        the list), at most ``limit`` each. Asked only for tenants absent from
        the due work read, that is with little of it, and only for the
        buckets whose views may hide some (``DueBook.hiding``).

        One range of ``{tenant, status, bucket, dueAt}`` per bucket, merged
        by due time: a real MongoDB reads ``limit`` entries at most. The due
        bound is applied here rather than in the filter: with a second
        range beside ``bucket: {$in}`` the embedded SecantusDB would use no
        bound at all and read every schedule the tenant ever had; without
        it, it reads the tenant's PENDING schedules in these buckets."""
        found: list[dict[str, Any]] = []
        for tenant in tenants[:MAX_TENANTS_PER_ROUND]:
            docs = await (
                self.schedules.find(
                    statements.pending_of(tenant, buckets),
                    WITHOUT_LARGE_PAYLOAD,
                )
                .sort("dueAt", ASCENDING)
                .limit(limit)
                .batch_size(limit)
                .to_list()
            )
            self.documents_read["fair"] += len(docs)
            found += [d for d in docs if aware(d["dueAt"]) <= until]
        return found

    @store_call
    async def large_payloads(self, claims: Sequence[Claimed]) -> dict[str, bytes]:
        """The large payloads of ``claims`` (read without them), by id: one
        read per IDS_PER_STATEMENT, each targeted by the buckets. The caller
        asks for a few megabytes at a time (``node/delivery/poller.py``)."""
        docs = [c.doc for c in claims]
        found: dict[str, bytes] = {}
        for chunk in _chunks(docs):
            found |= statements.large_payloads_of(
                await self.schedules.find(
                    ids_and_buckets(chunk), statements.ONLY_LARGE_PAYLOAD, batch_size=len(chunk)
                ).to_list()
            )
        return found

    @store_call
    async def claim(
        self, docs: Sequence[dict[str, Any]], tokens: Mapping[int, int], owner: str, now: datetime
    ) -> list[Claimed]:
        """PENDING -> IN_FLIGHT under each bucket's token, one round trip.

        The filter takes a schedule only if it is still PENDING, due by
        ``now``, no newer token has written it, and nothing has changed it
        since it was read (its ``version``): what is published is exactly
        the document read, never a copy a PATCH has replaced meanwhile.
        Usually every one matches; when some do not (cancelled, changed,
        taken by a newer owner) a second read finds which.
        """
        # Grouped by token value, not by bucket: each id's own bucket is in
        # the filter with it, so "these ids, token <= T" fences each by its
        # own bucket's token, and a batch spread over a hundred buckets costs
        # a statement per IDS_PER_STATEMENT schedules instead of a hundred.
        # Each once: a schedule listed twice would come back claimed twice.
        # By version too (a fresh one-shot's is 1, so most share one group).
        docs = list({d["_id"]: d for d in docs}.values())
        by_token: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
        for doc in docs:
            by_token[tokens[doc["bucket"]], version_of(doc)].append(doc)
        ops = [
            UpdateMany(
                self._write_filter(
                    statements.claimable(chunk, version, token, now, unfenced=self.unfenced)
                ),
                statements.claim_update(token, owner, now),
            )
            for (token, version), group in by_token.items()
            for chunk in _chunks(group)
        ]
        if not ops:
            return []
        result = await self._durable.bulk_write(ops, ordered=False)
        if result.modified_count == len(docs):
            return [Claimed(doc, tokens[doc["bucket"]]) for doc in docs]
        held = await self.schedules.find(
            {**ids_and_buckets(docs), "status": Status.IN_FLIGHT.value},
            {"token": 1, "bucket": 1},
            batch_size=len(docs),
        ).to_list()
        mine = {h["_id"] for h in held if h.get("token") == tokens[h["bucket"]]}
        return [Claimed(doc, tokens[doc["bucket"]]) for doc in docs if doc["_id"] in mine]

    @store_call
    async def complete(self, completions: Sequence[Completion]) -> int:
        """Write what delivery decided for each claimed schedule, only where its
        token still holds it (IN_FLIGHT, ``token == mine``); returns how many
        were written. A schedule that ends here gets its ``expireAt``.
        Completions whose update is the same (one-shot schedules delivered in
        one round) share an ``UpdateMany`` per token."""
        same: dict[tuple[int, str], tuple[dict[str, Any], list[dict[str, Any]]]] = {}
        ops: list[UpdateMany | UpdateOne] = []
        for completion in completions:
            update = statements.completion_update(completion, self.retention)
            if completion.occurrence is None and completion.due_at is None:
                key = (completion.claimed.token, repr(update))
                same.setdefault(key, (update, []))[1].append(completion.claimed.doc)
            else:
                ops.append(
                    UpdateOne(
                        self._write_filter(
                            statements.owned(completion.claimed, unfenced=self.unfenced)
                        ),
                        update,
                    )
                )
        ops.extend(
            UpdateMany(
                self._write_filter(statements.held_by(chunk, token, unfenced=self.unfenced)),
                update,
            )
            for (token, _), (update, docs) in same.items()
            for chunk in _chunks(docs)
        )
        if not ops:
            return 0
        result = await self._durable.bulk_write(ops, ordered=False)
        return result.modified_count

    @store_call
    async def unclaim(self, claims: Sequence[Claimed]) -> int:
        """IN_FLIGHT -> PENDING again for schedules this node may have claimed
        but never published (a claim whose answer was lost), undoing the
        claim's counters; only where its token still holds them. Returns how
        many were put back."""
        by_token: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for claimed in claims:
            by_token[claimed.token].append(claimed.doc)
        ops = [
            UpdateMany(
                self._write_filter(statements.held_by(chunk, token, unfenced=self.unfenced)),
                statements.UNCLAIM,
            )
            for token, docs in by_token.items()
            for chunk in _chunks(docs)
        ]
        if not ops:
            return 0
        return (await self._durable.bulk_write(ops, ordered=False)).modified_count

    @store_call
    async def recover_in_flight(
        self, tokens: Mapping[int, int], stranded_before: datetime | None = None
    ) -> list[str]:
        """Make schedules left IN_FLIGHT by an older owner of ``tokens``' buckets
        due again, under our token; and, given ``stranded_before``, those left
        under our own token by a claim made before then.

        Their former owner died or lost its lease mid-batch; it may or may not
        have published them, so re-delivering is at-least-once and each is a
        possible duplicate. Writing our token fences that former owner out.
        Under our own token, a claim older than the longest round this node
        can run belongs to no round any more (one whose answer was lost and
        which the server applied late, or a round that failed without
        keeping it): the safety net for what would otherwise stay IN_FLIGHT
        for good. One bounded read per bucket (usually empty), one write for all.
        """
        stale: list[dict[str, Any]] = []
        for bucket, token in sorted(tokens.items()):
            in_flight = await self.schedules.find(
                statements.in_flight(bucket),
                {"bucket": 1, "token": 1, "claimedAt": 1},
            ).to_list()
            self.documents_read["recover"] += len(in_flight)
            stale += [s for s in in_flight if statements.left_behind(s, token, stranded_before)]
        if not stale:
            return []
        ops = [
            UpdateOne(
                self._write_filter(statements.still_left(s)),
                statements.recovered(tokens[s["bucket"]]),
            )
            for s in stale
        ]
        await self._durable.bulk_write(ops, ordered=False)
        return [str(s["_id"]) for s in stale]

    def _one(self, schedule_id: str) -> dict[str, Any]:
        return statements.one(schedule_id, self.bucket_count)


def _due_and_id(doc: dict[str, Any]) -> tuple[datetime, str]:
    return aware(doc["dueAt"]), str(doc["_id"])


def _chunks(docs: Sequence[dict[str, Any]]) -> list[Sequence[dict[str, Any]]]:
    return [docs[i : i + IDS_PER_STATEMENT] for i in range(0, len(docs), IDS_PER_STATEMENT)]


# The BSON type each of these fields always holds in a schedule document.
FIELD_TYPES = {
    "bucket": "number",
    "status": "string",
    "dueAt": "date",
    "token": "number",
    "version": "number",
}


def typed(query: Mapping[str, Any]) -> dict[str, Any]:
    """``query`` with each condition on a field of FIELD_TYPES also naming
    that field's type: the same schedules match (the field always holds
    it), and the embedded SecantusDB plans the write by its ``_id`` list at
    once. It plans a write by trying every index for every equality or
    range condition, reading its index catalog anew each time; a condition
    with an operator beside those (``$type``) is not tried. A claim and a
    mark of two schedules cost it 22% less CPU so (6.1-6.5 against
    4.9-5.0 ms, measured). Not sent to a real MongoDB (``sliced``), which
    plans from its cached catalog. A null condition (``version: None``
    matches a document stored before versions) is left as it is."""
    shaped: dict[str, Any] = {}
    for name, condition in query.items():
        kind = FIELD_TYPES.get(name)
        operators = _operators(condition)
        if kind is None or operators is None or None in operators.values():
            shaped[name] = condition
        else:
            shaped[name] = {**operators, "$type": kind}
    return shaped


def _operators(condition: Any) -> dict[str, Any] | None:
    """A condition as its operators (a plain value is ``$eq``); None for a
    whole document to equal."""
    if not isinstance(condition, Mapping):
        return {"$eq": condition}
    if condition and all(str(key).startswith("$") for key in condition):
        return dict(condition)
    return None
