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
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from pymongo import ASCENDING, UpdateMany, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from node.errors import BucketCountMismatch, FormatTooNew, NotCancellable, ScheduleConflict
from node.schedule.model import RECENT_OCCURRENCES, NewSchedule, Status, public_id
from node.schedule.times import aware
from node.store.boundary import DURABLE, store_call
from node.store.contract import Claimed, Completion, Outcome
from node.store.documents import INDEXES, SUPERSEDED_INDEXES, schedule_document
from node.store.group_insert import GroupInserter

FORMAT_VERSION = 1
CLUSTER_DOC_ID = "cluster"
# Largest page of the due window read in one round trip.
MAX_WINDOW_PAGE = 5000
# Ids per claim or mark statement. The embedded server matches "$in" by
# scanning the list for every candidate, so one statement costs the square of
# its length: claiming 500 took 0.83 s as one statement and 0.35 s as 25 of
# 20 (measured); a real MongoDB does not care either way.
IDS_PER_STATEMENT = 20
# Tenants asked for their own due work in one round when a backlog fills the
# window (the poller rotates the list, so with more all are served in turn).
MAX_TENANTS_PER_ROUND = 32


class ScheduleStore:
    def __init__(
        self,
        database: AsyncDatabase[dict[str, Any]],
        bucket_count: int,
        *,
        unfenced: bool = False,
    ) -> None:
        self.database = database
        # Chaos testing only (CHAOS_MODE=unfenced): owner writes carry no
        # token condition, so the chaos checker can prove it sees the result.
        self.unfenced = unfenced
        self.bucket_count = bucket_count
        self.schedules: AsyncCollection[dict[str, Any]] = database["schedules"]
        self.cluster: AsyncCollection[dict[str, Any]] = database["cluster"].with_options(
            write_concern=DURABLE
        )
        # What the API acknowledges must survive a crash of the database (and
        # a failover, on a replica set): journaled, on a majority. Claims and
        # marks need not be: losing one only means delivering again.
        self._durable = self.schedules.with_options(write_concern=DURABLE)
        self._inserts = GroupInserter(self._durable)

    # -- start-up -------------------------------------------------------------

    @store_call
    async def prepare(self, now: datetime) -> None:
        """Pin the bucket count and create indexes; both idempotent."""
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
    async def ping(self) -> None:
        await self.database.command("ping")

    @store_call
    async def due_backlog(self, now: datetime) -> dict[int, int]:
        """bucket -> PENDING schedules already due: work not yet delivered.
        Served by the partial due index; its cost grows with the backlog."""
        groups = await (
            await self.schedules.aggregate(
                [
                    {"$match": {"status": Status.PENDING.value, "dueAt": {"$lte": now}}},
                    {"$group": {"_id": "$bucket", "due": {"$sum": 1}}},
                ]
            )
        ).to_list()
        return {int(g["_id"]): int(g["due"]) for g in groups}

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
        existing = await self.schedules.find_one({"_id": doc["_id"]})
        if existing is None:  # deleted in between; not something the API does
            raise ScheduleConflict(f"schedule {new.id!r} changed concurrently", "id")
        if existing.get("fingerprint") != doc["fingerprint"]:
            raise ScheduleConflict(f"schedule {new.id!r} exists with a different body", "id")
        return existing, False

    @store_call
    async def count_pending(self, tenant: str) -> int:
        return await self.schedules.count_documents(
            {"tenant": tenant, "status": Status.PENDING.value}
        )

    @store_call
    async def get(self, schedule_id: str) -> dict[str, Any] | None:
        return await self.schedules.find_one({"_id": schedule_id})

    @store_call
    async def cancel(self, schedule_id: str, now: datetime) -> dict[str, Any] | None:
        """PENDING -> CANCELLED in one conditional write.

        The claim only takes PENDING schedules and this only cancels PENDING
        ones; the store applies one of the two first, so a 200 here means no
        owner holds it and none ever will.
        """
        result = await self._durable.update_one(
            {"_id": schedule_id, "status": Status.PENDING.value},
            {"$set": {"status": Status.CANCELLED.value, "cancelledAt": now}},
        )
        doc = await self.get(schedule_id)
        if doc is None:
            return None
        if result.modified_count == 0 and doc["status"] != Status.CANCELLED.value:
            if doc.get("recurrence") and doc["status"] == Status.IN_FLIGHT.value:
                raise NotCancellable(
                    f"an occurrence of {public_id(schedule_id)!r} is being delivered; "
                    "cancel again in a moment to end the chain",
                    retry_after=1,
                )
            raise NotCancellable(
                f"schedule {public_id(schedule_id)!r} is {doc['status']} "
                "and can no longer be cancelled",
            )
        return doc

    @store_call
    async def list_page(
        self, *, tenant: str | None, status: str | None, after: str | None, limit: int
    ) -> list[dict[str, Any]]:
        query: dict[str, Any] = {}
        if tenant is not None:
            query["tenant"] = tenant
        if status is not None:
            query["status"] = status
        if after is not None:
            query["_id"] = {"$gt": after}
        cursor = self.schedules.find(query).sort("_id", ASCENDING).limit(limit).batch_size(limit)
        return await cursor.to_list()

    # -- the bucket owner's reads and writes ----------------------------------

    @store_call
    async def find_due(
        self,
        buckets: Collection[int],
        until: datetime,
        limit: int,
        tenants: Sequence[str] | None = (),
    ) -> list[dict[str, Any]]:
        """PENDING schedules of ``buckets`` due by ``until``, oldest first: about
        ``limit`` of them, and with ``tenants`` each tenant's oldest as well,
        for the poller to share fairly (node/delivery/fairness.py).

        Callers pass ``until`` a little past now, so the same query also tells
        them when the next schedule falls due.

        First the cluster-wide due window, sized so that this node's share of
        it is about ``limit``, filtered to our buckets here. That query costs
        what the window holds, whatever the collection size or the number of
        buckets we own (an ``$in`` over 256 buckets does not: the embedded
        server walks every entry of every listed bucket). When the window is
        full there is a backlog, and the window shows only its oldest part:
        each of ``tenants`` absent from it is asked for its own oldest
        schedules (the ``{tenant, dueAt}`` index: a tenant's few schedules
        cost a few index entries, however large another's backlog), and if
        our share is still short, a query restricted to our buckets finds the
        rest. ``tenants`` None: plain oldest first (for comparison only).
        """
        if not buckets:
            return []
        page = min(max(limit, limit * self.bucket_count // len(buckets)), MAX_WINDOW_PAGE)
        window = await self._due_page({}, until, page)
        mine = [d for d in window if d["bucket"] in buckets]
        if len(window) == page:
            if tenants:
                present = {d.get("tenant") for d in window}
                behind = [t for t in tenants if t not in present]
                mine += await self.oldest_due_of(behind, until, buckets, limit)
            if len(mine) < limit:
                seen = {d["_id"] for d in mine}
                rest = await self._due_page({"bucket": {"$in": sorted(buckets)}}, until, limit)
                mine += [d for d in rest if d["_id"] not in seen]
        if tenants is None:
            return mine[:limit]
        return sorted(mine, key=lambda d: aware(d["dueAt"]))

    @store_call
    async def oldest_due_of(
        self, tenants: Sequence[str], until: datetime, buckets: Collection[int], limit: int
    ) -> list[dict[str, Any]]:
        """Each tenant's oldest PENDING schedules of ``buckets`` due by ``until``
        (the first MAX_TENANTS_PER_ROUND tenants: callers rotate the list)."""
        found: list[dict[str, Any]] = []
        for tenant in tenants[:MAX_TENANTS_PER_ROUND]:
            # No dueAt bound: the embedded server uses the index for
            # {tenant, status} alone but scans the collection once a range
            # is added; the sort and limit keep it to the oldest.
            docs = await (
                self.schedules.find({"tenant": tenant, "status": Status.PENDING.value})
                .sort("dueAt", ASCENDING)
                .limit(limit)
                .batch_size(limit)
                .to_list()
            )
            found += [d for d in docs if aware(d["dueAt"]) <= until and d["bucket"] in buckets]
        return found

    async def _due_page(
        self, query: dict[str, Any], until: datetime, size: int
    ) -> list[dict[str, Any]]:
        return await (
            self.schedules.find({**query, "status": Status.PENDING.value, "dueAt": {"$lte": until}})
            .sort("dueAt", ASCENDING)
            .limit(size)
            .batch_size(size)  # one round trip: the default first batch is 101
            .to_list()
        )

    @store_call
    async def claim(
        self, docs: Sequence[dict[str, Any]], tokens: Mapping[int, int], owner: str, now: datetime
    ) -> list[Claimed]:
        """PENDING -> IN_FLIGHT under each bucket's token, one round trip.

        The filter takes a schedule only if it is still PENDING and no newer
        token has written it. Usually every one matches; when some do not
        (cancelled, or taken by a newer owner) a second read finds which.
        """
        # Grouped by token value, not by bucket: a schedule's bucket follows
        # from its id, so "these ids, token <= T" fences each of them by its
        # own bucket's token, and a batch spread over a hundred buckets costs
        # a statement per IDS_PER_STATEMENT schedules instead of a hundred.
        by_token: dict[int, list[str]] = defaultdict(list)
        for doc in docs:
            by_token[tokens[doc["bucket"]]].append(doc["_id"])
        ops = [
            UpdateMany(
                {
                    "_id": {"$in": chunk},
                    "status": Status.PENDING.value,
                    **self._fence("$lte", token),
                },
                {
                    "$set": {
                        "status": Status.IN_FLIGHT.value,
                        "token": token,
                        "owner": owner,
                        "claimedAt": now,
                    },
                    # attempts: of this occurrence; runs: of the schedule's
                    # whole life (its history records are numbered by it).
                    "$inc": {"attempts": 1, "runs": 1},
                },
            )
            for token, ids in by_token.items()
            for chunk in _chunks(ids)
        ]
        if not ops:
            return []
        result = await self.schedules.bulk_write(ops, ordered=False)
        if result.modified_count == len(docs):
            return [Claimed(doc, tokens[doc["bucket"]]) for doc in docs]
        held = await self.schedules.find(
            {"_id": {"$in": [d["_id"] for d in docs]}, "status": Status.IN_FLIGHT.value},
            {"token": 1, "bucket": 1},
            batch_size=len(docs),
        ).to_list()
        mine = {h["_id"] for h in held if h.get("token") == tokens[h["bucket"]]}
        return [Claimed(doc, tokens[doc["bucket"]]) for doc in docs if doc["_id"] in mine]

    @store_call
    async def complete(self, completions: Sequence[Completion]) -> int:
        """Write what delivery decided for each claimed schedule, only where its
        token still holds it (IN_FLIGHT, ``token == mine``); returns how many
        were written. Completions whose update is the same (one-shot
        schedules delivered in one round) share an ``UpdateMany`` per token."""
        same: dict[tuple[int, str], tuple[dict[str, Any], list[str]]] = {}
        ops: list[UpdateMany | UpdateOne] = []
        for completion in completions:
            update = _update_for(completion)
            if completion.occurrence is None and completion.due_at is None:
                key = (completion.claimed.token, repr(update))
                same.setdefault(key, (update, []))[1].append(completion.claimed.id)
            else:
                ops.append(UpdateOne(self._owned(completion.claimed), update))
        ops.extend(
            UpdateMany(
                {
                    "_id": {"$in": chunk},
                    "status": Status.IN_FLIGHT.value,
                    **self._fence("$eq", token),
                },
                update,
            )
            for (token, _), (update, ids) in same.items()
            for chunk in _chunks(ids)
        )
        if not ops:
            return 0
        result = await self.schedules.bulk_write(ops, ordered=False)
        return result.modified_count

    @store_call
    async def unclaim(self, claims: Sequence[tuple[str, int]]) -> int:
        """IN_FLIGHT -> PENDING again for (id, token) pairs this node may have
        claimed but never published (a claim whose answer was lost), undoing
        the claim's counters; only where that token still holds them. Returns
        how many were put back."""
        by_token: dict[int, list[str]] = defaultdict(list)
        for schedule_id, token in claims:
            by_token[token].append(schedule_id)
        ops = [
            UpdateMany(
                {
                    "_id": {"$in": chunk},
                    "status": Status.IN_FLIGHT.value,
                    **self._fence("$eq", token),
                },
                {"$set": {"status": Status.PENDING.value}, "$inc": {"attempts": -1, "runs": -1}},
            )
            for token, ids in by_token.items()
            for chunk in _chunks(ids)
        ]
        if not ops:
            return 0
        return (await self.schedules.bulk_write(ops, ordered=False)).modified_count

    def _owned(self, item: Claimed) -> dict[str, Any]:
        """The filter of a write completing one claimed schedule."""
        return {"_id": item.id, "status": Status.IN_FLIGHT.value, **self._fence("$eq", item.token)}

    def _fence(self, operator: str, token: int) -> dict[str, Any]:
        """The token condition of an owner write."""
        return {} if self.unfenced else {"token": {operator: token}}

    @store_call
    async def recover_in_flight(self, tokens: Mapping[int, int]) -> list[str]:
        """Make schedules left IN_FLIGHT by an older owner of our buckets due again.

        Their former owner died or lost its lease mid-batch; it may or may not
        have published them, so re-delivering is at-least-once and each is a
        possible duplicate. Writing our token fences that former owner out.
        """
        if not tokens:
            return []
        # Everything in flight cluster-wide is one batch per node at most, so
        # read it all from the status index and pick our buckets here.
        in_flight = await self.schedules.find(
            {"status": Status.IN_FLIGHT.value},
            {"bucket": 1, "token": 1},
            batch_size=MAX_WINDOW_PAGE,
        ).to_list()
        stale = [
            s
            for s in in_flight
            if s["bucket"] in tokens and s.get("token", 0) < tokens[s["bucket"]]
        ]
        if not stale:
            return []
        ops = [
            UpdateOne(
                {"_id": s["_id"], "status": Status.IN_FLIGHT.value, "token": s.get("token", 0)},
                {"$set": {"status": Status.PENDING.value, "token": tokens[s["bucket"]]}},
            )
            for s in stale
        ]
        await self.schedules.bulk_write(ops, ordered=False)
        return [str(s["_id"]) for s in stale]


def _chunks(ids: list[str]) -> list[list[str]]:
    return [ids[i : i + IDS_PER_STATEMENT] for i in range(0, len(ids), IDS_PER_STATEMENT)]


def _update_for(completion: Completion) -> dict[str, Any]:
    """The update that records a completion (its decisions are already made)."""
    occurrence = completion.occurrence
    if occurrence is None:
        fields: dict[str, Any] = {"status": completion.status.value}
        if completion.outcome == Outcome.DELIVERED:
            fields["deliveredAt"] = completion.at
        if completion.due_at is not None:
            fields["dueAt"] = completion.due_at
        fields["lastError"] = completion.error
        return {"$set": fields}
    # A recurring schedule: the record of this occurrence and the next one
    # (or the chain's end) in one write, so a crash can neither lose the chain
    # nor run an occurrence twice on purpose (only the at-least-once repeat of
    # an unmarked publish).
    claimed = completion.claimed
    record = {
        "executeAt": occurrence.execute_at,
        "outcome": completion.outcome.value,
        "at": completion.at,
        "attempts": claimed.attempt,
        "token": claimed.token,
        "error": completion.error,
    }
    fields = {"lastError": completion.error, "lateStreak": occurrence.late_streak}
    if completion.outcome == Outcome.DELIVERED:
        fields["deliveredAt"] = completion.at
    fields["status"] = completion.status.value
    if occurrence.next_at is not None:
        fields.update(executeAt=occurrence.next_at, dueAt=occurrence.next_at, attempts=0)
    return {
        "$set": fields,
        "$inc": {"occurrences": 1, "skippedOccurrences": occurrence.skipped},
        "$push": {"recent": {"$each": [record], "$slice": -RECENT_OCCURRENCES}},
    }
