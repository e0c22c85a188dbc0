"""The ``buckets`` collection, one lease document per bucket,
``{_id: bucket, owner, holder, token, acquiredAt}``, and ``holders``, one
document per session of a node's process, ``{_id: holder, node,
expiresAt}`` (DESIGN.md "Leases with fencing tokens"). The book a node
keeps of its own leases (terms, deadlines, what may still be worked) is
``node/delivery/leases.py``; this module only asks and writes.

A node's leases last as long as its session, so a renew is one write of one
document however many buckets it holds: renewing 4,096 lease documents
every 2 s was the embedded store's whole idle CPU (0.5 to 1 s a second,
bench idle), and on a real MongoDB 2,000 writes a second for a cluster
doing nothing. Expiry is judged by the database server's clock (``$$NOW``
in an update pipeline), so nodes' wall clocks never decide who owns what,
and a session that has expired never renews again: a bucket held under an
ended session stays takeable until taken, whatever another node read
before. On MongoDB every call is one round trip for all the buckets it
names, one statement targeted by ``_id``. The embedded SecantusDB gets
other shapes (``chunked``), one round trip still: a write is a
``bulk_write`` of bounded statements, a read of many buckets reads every
lease; only the first take of a bucket ever costs it one more (``take``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import pymongo
from bson import ObjectId
from pymongo import UpdateMany, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError

from node.store import statements
from node.store.boundary import DUPLICATE_KEY, store_call
from ring import MAX_BUCKETS

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Beside ``buckets``: one document per session of a node's process.
HOLDERS = "holders"
# Buckets a statement names on the embedded SecantusDB (``chunked``). It
# matches ``_id: {$in: [...]}`` by scanning the list for every document the
# ids find, so one statement costs the square of its list: extending 4,096
# leases took 24.4 s as one statement, 0.8 s as 128 of 32 in one bulk_write
# (0.7.0b3, measured; 16 to 48 cost about the same, 8 and fewer more). A
# real MongoDB finds each id in the _id index: one statement is best there.
IDS_PER_STATEMENT = 32


class LeaseStore:
    """``contract.BucketLeases`` on MongoDB: the ``buckets`` and ``holders``
    collections (``holders`` beside ``buckets``, in its database)."""

    def __init__(
        self,
        collection: AsyncCollection[dict[str, Any]],
        node_id: str,
        *,
        chunked: bool = False,
        holders: AsyncCollection[dict[str, Any]] | None = None,
    ) -> None:
        self.collection = collection
        # As durable as the leases: a holder's expiry lost in a database
        # crash could end a session its node still works under.
        self.holders: AsyncCollection[dict[str, Any]] = (
            holders
            if holders is not None
            else collection.database.get_collection(HOLDERS, write_concern=collection.write_concern)
        )
        self.node_id = node_id
        # Whether the store is the embedded SecantusDB (the process sets it
        # from ``ScheduleStore.sliced``, learnt at start): writes in
        # statements of at most IDS_PER_STATEMENT buckets (``_parts``), reads
        # of many buckets whole (``_where``), a take with no query operator
        # at its top (``_take_embedded``). Never on a real MongoDB.
        self.chunked = chunked
        # This process's session, once opened; leases are taken under it.
        self.holder: str | None = None
        # Sessions found ended by the last ``takeable``: the take re-checks a
        # lease against them (an ended session stays ended, so the list can
        # only be short of the truth, never wrong).
        self._ended: list[str] = []

    @store_call
    async def open_session(self, term: float, within: float) -> None:
        """A new holder document, alive ``term`` seconds from the server's
        now; the node's ended sessions are removed first (nothing depends on
        an ended holder's document: a lease under a missing holder is as
        takeable as under an expired one), so ``holders`` keeps about one
        document per node."""
        holder = f"{self.node_id}/{ObjectId()}"
        with pymongo.timeout(within):
            await self.holders.delete_many({"node": self.node_id, "$expr": _ended_expr()})
            await self.holders.update_one(
                {"_id": holder},
                [{"$set": {"node": self.node_id, "expiresAt": _expires_at(term)}}],
                upsert=True,
            )
        self.holder = holder

    @store_call
    async def renew_session(self, term: float, within: float) -> bool:
        """One conditional write: the session goes on only if it has not
        ended by the server's clock."""
        if self.holder is None:
            return False
        # A filter of _id and an expression: targeted by _id on MongoDB; the
        # embedded store scans ``holders`` for it, a document a node.
        with pymongo.timeout(within):
            result = await self.holders.update_one(
                {"_id": self.holder, "$expr": _alive_expr()},
                [{"$set": {"expiresAt": _expires_at(term)}}],
            )
        return result.matched_count == 1

    def _parts(self, buckets: Sequence[int]) -> list[list[int]]:
        """``buckets`` as the lists the write statements name: all of them in
        one, or, on the embedded store, IDS_PER_STATEMENT at a time."""
        if not self.chunked:
            return [list(buckets)]
        step = IDS_PER_STATEMENT
        return [list(buckets[i : i + step]) for i in range(0, len(buckets), step)]

    def _where(self, buckets: list[int]) -> tuple[dict[str, Any], int]:
        """How a read finds the leases of ``buckets``: a filter, and a batch
        one longer than it can match (the first batch then ends the cursor; a
        batch just as long leaves it open, and the getMore that learns it is
        done doubled a read's round trips). By ``_id``; on the embedded store,
        for more buckets than a statement names, every lease (one a bucket,
        MAX_BUCKETS at most), the caller keeping the named ones: one statement
        and round trip. 4,096 leases took 0.09 s to read whole, 11.7 s by one
        ``$in`` and 0.4 to 0.8 s by 128 of 32, one after the other; in the
        dev stack each of those waited its turn behind three nodes' work
        (0.18 s on average, by the store's profiler), and a node's 44 took
        some 8 s, past the term of the leases it had just taken (measured)."""
        if self.chunked and len(buckets) > IDS_PER_STATEMENT:
            return {}, MAX_BUCKETS + 1
        return {"_id": {"$in": buckets}}, len(buckets) + 1

    @store_call
    async def takeable(self, buckets: Iterable[int], within: float) -> tuple[list[int], list[int]]:
        """Of ``buckets``: those free, held under an ended session or already
        ours; and those never leased (no document yet). Two reads: the live
        sessions (by the server's clock; a handful of documents), then the
        leases. Every call here takes ``within``, the seconds it may take: a
        lease answer later than the lease's term is worth nothing."""
        wanted = sorted(buckets)
        where, batch = self._where(wanted)
        with pymongo.timeout(within):
            sessions = await (
                await self.holders.aggregate([{"$project": {"alive": _alive_expr()}}])
            ).to_list()
            found = await (
                await self.collection.aggregate(
                    [
                        {"$match": where},
                        # The server's now beside each lease: a format 1
                        # lease (no holder) lasts to its own expiry.
                        {"$project": {"owner": 1, "holder": 1, "expiresAt": 1, "now": "$$NOW"}},
                    ],
                    batchSize=batch,
                )
            ).to_list()
        live = {str(d["_id"]) for d in sessions if d["alive"]}
        named = set(wanted)
        existing = [d for d in found if d["_id"] in named]
        takeable = [
            d
            for d in map(_aware, existing)
            if statements.lease_takeable(d, self.node_id, live, d["now"])
        ]
        self._ended = sorted(
            {str(d["holder"]) for d in takeable if d.get("holder") and d["holder"] not in live}
        )
        unseen = sorted(named - {d["_id"] for d in existing})
        return sorted(d["_id"] for d in takeable), unseen

    @store_call
    async def take(self, takeable: list[int], unseen: list[int], within: float) -> None:
        """Take each bucket that is still takeable: one conditional update for
        those with a document (each re-checked atomically: one taken since
        ``takeable`` is simply not matched), an upsert each for the unseen (a
        duplicate-key error there means another node won it). The token goes
        up by one for every bucket taken. On the embedded store the unseen
        get a free lease first, and then all are taken alike
        (``_take_embedded``)."""
        if self.holder is None:
            raise RuntimeError("take before open_session: a lease must have a session")
        with pymongo.timeout(within):
            if not self.chunked:
                await _unless_made_elsewhere(self._take_targeted(takeable, unseen))
                return
            if unseen:
                free = [{"_id": b, "owner": None, "token": 0} for b in unseen]
                await _unless_made_elsewhere(self.collection.insert_many(free, ordered=False))
            await self._take_embedded(sorted([*takeable, *unseen]))

    async def _take_targeted(self, takeable: list[int], unseen: list[int]) -> None:
        """The take on MongoDB: the filter re-checks takeability."""
        take = [{"$set": self._taken()}]
        ops: list[UpdateMany | UpdateOne] = []
        if takeable:
            ops.append(UpdateMany({"_id": {"$in": takeable}, **self._takeable_query()}, take))
        ops.extend(UpdateOne({"_id": b, "owner": None}, take, upsert=True) for b in unseen)
        if ops:
            await self.collection.bulk_write(ops, ordered=False)

    async def _take_embedded(self, buckets: list[int]) -> None:
        """The take on the embedded SecantusDB, once each unseen bucket has a
        free lease (made just before, as a release leaves it, token 0; one
        another node made first is its own). Filters by ``_id`` alone, in
        statements of IDS_PER_STATEMENT, and the update re-checks
        takeability, leaving a lease as it is unless it holds (as atomic per
        document as the filter's check). That server plans no index for a
        filter with an operator at its top (``$or``, ``$expr``) and scans the
        whole collection for every statement: 4,096 upserts of ``{_id: b,
        $expr}`` into an empty collection took 97 s. And every statement
        wakes every change stream (the nodes' due feeds): beside three, 4,096
        upserts of ``{_id: b}``, a statement each, took 4.7 to 5.7 s and drew
        2,900 to 4,700 getMores; one insert of free leases and 128 statements
        taking them, 1.7 s and 350 (measured)."""
        keep_unless_takeable = [
            {
                "$replaceWith": {
                    "$cond": [
                        self._takeable_expr(),
                        {"$mergeObjects": ["$$ROOT", self._taken()]},
                        "$$ROOT",
                    ]
                }
            }
        ]
        await self._update(buckets, lambda part: {"_id": {"$in": part}}, keep_unless_takeable)

    def _taken(self) -> dict[str, Any]:
        """The fields of a lease this node takes: the token one up."""
        return {
            "owner": self.node_id,
            "holder": self.holder,
            "token": {"$add": [{"$ifNull": ["$token", 0]}, 1]},
            "acquiredAt": "$$NOW",
        }

    @store_call
    async def ours(self, buckets: list[int], within: float) -> dict[int, int]:
        """bucket -> token, for those of ``buckets`` this node holds now."""
        won = await self._read(buckets, {"owner": self.node_id}, within)
        return {int(d["_id"]): int(d["token"]) for d in won}

    @store_call
    async def tokens(self, buckets: list[int], within: float) -> dict[int, tuple[str | None, int]]:
        """bucket -> (owner, token) as stored, for ``buckets``."""
        current = await self._read(buckets, {}, within)
        return {int(d["_id"]): (d.get("owner"), int(d.get("token", 0))) for d in current}

    @store_call
    async def release(self, buckets: list[int], within: float) -> None:
        """Give our leases of ``buckets`` back: free at once for the next owner."""
        with pymongo.timeout(within):
            await self._update(
                buckets,
                lambda part: {"_id": {"$in": part}, "owner": self.node_id},
                {"$set": {"owner": None, "holder": None}},
            )

    @store_call
    async def all(self) -> list[dict[str, Any]]:
        """Every bucket's lease (owner and token), by bucket."""
        return await self.collection.find({}, {"owner": 1, "token": 1}).sort("_id", 1).to_list()

    async def _read(
        self, buckets: list[int], query: dict[str, Any], within: float
    ) -> list[dict[str, Any]]:
        """Owner and token of the leases of ``buckets`` that ``query`` matches."""
        where, batch = self._where(buckets)
        with pymongo.timeout(within):
            found = await self.collection.find(
                {**where, **query}, {"owner": 1, "token": 1}, batch_size=batch
            ).to_list()
        named = set(buckets)
        return [d for d in found if d["_id"] in named]

    async def _update(
        self,
        buckets: list[int],
        query: Callable[[list[int]], dict[str, Any]],
        update: dict[str, Any] | list[dict[str, Any]],
    ) -> int:
        """One ``update_many``, or on the embedded store one ``bulk_write`` of
        one per part: a round trip either way. Returns how many matched."""
        parts = self._parts(buckets)
        if not parts:
            return 0
        if len(parts) == 1:
            result = await self.collection.update_many(query(parts[0]), update)
            return result.matched_count
        written = await self.collection.bulk_write(
            [UpdateMany(query(part), update) for part in parts], ordered=False
        )
        return written.matched_count

    def _takeable_query(self) -> dict[str, Any]:
        """``statements.lease_takeable`` as a filter, against the sessions the
        last ``takeable`` found ended."""
        return {
            "$or": [
                {"owner": None},
                {"owner": self.node_id},
                {"holder": {"$in": self._ended}},
                {"holder": {"$exists": False}, "$expr": _legacy_expired_expr()},
            ]
        }

    def _takeable_expr(self) -> dict[str, Any]:
        """``statements.lease_takeable`` as an expression (the embedded take)."""
        return {
            "$or": [
                {"$eq": [{"$ifNull": ["$owner", None]}, None]},
                {"$eq": ["$owner", self.node_id]},
                {"$in": [{"$ifNull": ["$holder", None]}, self._ended]},
                {
                    "$and": [
                        {"$eq": [{"$type": "$holder"}, "missing"]},
                        _legacy_expired_expr(),
                    ]
                },
            ]
        }


async def held_now(database: AsyncDatabase[dict[str, Any]]) -> int:
    """How many buckets have a lease held now: an owner and a live session
    (or, format 1, an unexpired lease), by the server's clock. For
    benchmarks and tests, that wait on a cluster taking its leases."""
    sessions = await (
        await database[HOLDERS].aggregate([{"$project": {"alive": _alive_expr()}}])
    ).to_list()
    live = [d["_id"] for d in sessions if d["alive"]]
    return await database["buckets"].count_documents(
        {
            "owner": {"$ne": None},
            "$or": [
                {"holder": {"$in": live}},
                {"holder": {"$exists": False}, "$expr": {"$not": [_legacy_expired_expr()]}},
            ],
        }
    )


# Expiry against the server's now, as epoch milliseconds: the embedded
# SecantusDB (0.7.0b3) answers false for any date-vs-$$NOW comparison in an
# expression; $toLong keeps the same order on MongoDB 4.0+.
_NOW_MS = {"$toLong": "$$NOW"}


def _expiry_ms(*, missing: int | None = None) -> dict[str, Any]:
    """A document's ``expiresAt`` in epoch milliseconds (``missing`` where
    it has none)."""
    expiry = {"$toLong": "$expiresAt"}
    return expiry if missing is None else {"$ifNull": [expiry, missing]}


def _alive_expr() -> dict[str, Any]:
    """A holder's session is alive: its expiry ahead of the server's now."""
    return {"$gt": [_expiry_ms(), _NOW_MS]}


def _ended_expr() -> dict[str, Any]:
    return {"$not": [_alive_expr()]}


def _legacy_expired_expr() -> dict[str, Any]:
    """A format 1 lease (no holder, its own ``expiresAt``) has expired by the
    server's clock; a missing expiry counts as expired."""
    return {"$lt": [_expiry_ms(missing=0), _NOW_MS]}


def _aware(lease: dict[str, Any]) -> dict[str, Any]:
    """A lease as read, its dates timezone-aware (the driver returns naive
    UTC unless asked), for the pure rule."""
    return {
        k: v.replace(tzinfo=UTC) if isinstance(v, datetime) and v.tzinfo is None else v
        for k, v in lease.items()
    }


async def _unless_made_elsewhere(write: Awaitable[Any]) -> None:
    """Await ``write``; a duplicate key means another node made that lease
    first, which is no error here: the lease is that node's."""
    try:
        await write
    except BulkWriteError as exc:
        others = [e for e in exc.details.get("writeErrors", []) if e["code"] != DUPLICATE_KEY]
        if others:
            raise


def _expires_at(term: float) -> dict[str, Any]:
    return {"$add": ["$$NOW", int(term * 1000)]}
