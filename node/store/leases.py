"""The ``buckets`` collection: one lease document per bucket,
``{_id: bucket, owner, token, expiresAt, acquiredAt}`` (DESIGN.md "Leases
with fencing tokens"). The book a node keeps of its own leases (terms,
deadlines, what may still be worked) is ``node/delivery/leases.py``; this
module only asks and writes.

Expiry is judged by the database server's clock (``$$NOW`` in an update
pipeline), so nodes' wall clocks never decide who owns what. On MongoDB every
call is one round trip for all the buckets it names, one statement targeted
by ``_id``. The embedded SecantusDB gets other shapes (``chunked``), one
round trip still: a write is a ``bulk_write`` of bounded statements, a read
of many buckets reads every lease; only the first take of a bucket ever
costs it one more (``take``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import pymongo
from pymongo import UpdateMany, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError

from node.store.boundary import DUPLICATE_KEY, store_call
from ring import MAX_BUCKETS

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Buckets a statement names on the embedded SecantusDB (``chunked``). It
# matches ``_id: {$in: [...]}`` by scanning the list for every document the
# ids find, so one statement costs the square of its list: extending 4,096
# leases took 24.4 s as one statement, 0.8 s as 128 of 32 in one bulk_write
# (0.7.0b3, measured; 16 to 48 cost about the same, 8 and fewer more). A
# real MongoDB finds each id in the _id index: one statement is best there.
IDS_PER_STATEMENT = 32


class LeaseStore:
    """``contract.BucketLeases`` on MongoDB: the ``buckets`` collection."""

    def __init__(
        self, collection: AsyncCollection[dict[str, Any]], node_id: str, *, chunked: bool = False
    ) -> None:
        self.collection = collection
        self.node_id = node_id
        # Whether the store is the embedded SecantusDB (the process sets it
        # from ``ScheduleStore.sliced``, learnt at start): writes in
        # statements of at most IDS_PER_STATEMENT buckets (``_parts``), reads
        # of many buckets whole (``_where``), a take with no ``$expr`` filter
        # (``_take_embedded``). Never on a real MongoDB.
        self.chunked = chunked

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
        """Of ``buckets``: those free, expired or already ours, by the
        server's clock; and those never leased (no document yet). Every
        call here takes ``within``, the seconds it may take: a lease answer
        later than the lease's term is worth nothing."""
        wanted = sorted(buckets)
        where, batch = self._where(wanted)
        with pymongo.timeout(within):
            found = await (
                await self.collection.aggregate(
                    [
                        {"$match": where},
                        {"$project": {"_id": 1, "takeable": self._takeable_expr()}},
                    ],
                    batchSize=batch,
                )
            ).to_list()
        named = set(wanted)
        existing = [d for d in found if d["_id"] in named]
        takeable = sorted(d["_id"] for d in existing if d["takeable"])
        unseen = sorted(named - {d["_id"] for d in existing})
        return takeable, unseen

    @store_call
    async def take(
        self, takeable: list[int], unseen: list[int], term: float, within: float
    ) -> None:
        """Take each bucket that is still takeable: one conditional update for
        those with a document (each re-checked atomically: one taken since
        ``takeable`` is simply not matched), an upsert each for the unseen (a
        duplicate-key error there means another node won it). The token goes
        up by one for every bucket taken. On the embedded store the unseen
        get a free lease first, and then all are taken alike
        (``_take_embedded``)."""
        with pymongo.timeout(within):
            if not self.chunked:
                await _unless_made_elsewhere(self._take_targeted(takeable, unseen, term))
                return
            if unseen:
                free = [{"_id": b, "owner": None, "token": 0, "expiresAt": EPOCH} for b in unseen]
                await _unless_made_elsewhere(self.collection.insert_many(free, ordered=False))
            await self._take_embedded(sorted([*takeable, *unseen]), term)

    async def _take_targeted(self, takeable: list[int], unseen: list[int], term: float) -> None:
        """The take on MongoDB: the filter re-checks takeability (``$expr``)."""
        take = [{"$set": self._taken(term)}]
        ops: list[UpdateMany | UpdateOne] = []
        if takeable:
            ops.append(UpdateMany({"_id": {"$in": takeable}, "$expr": self._takeable_expr()}, take))
        ops.extend(
            UpdateOne({"_id": b, "$expr": self._takeable_expr()}, take, upsert=True) for b in unseen
        )
        if ops:
            await self.collection.bulk_write(ops, ordered=False)

    async def _take_embedded(self, buckets: list[int], term: float) -> None:
        """The take on the embedded SecantusDB, once each unseen bucket has a
        free lease (made just before, as a release leaves it, token 0; one
        another node made first is its own). Filters by ``_id`` alone, in
        statements of IDS_PER_STATEMENT, and the update re-checks
        takeability, leaving a lease as it is unless it holds (as atomic per
        document as the filter's check). That server plans no index for a
        filter with an operator at its top (``$expr``) and scans the whole
        collection for every statement: 4,096 upserts of ``{_id: b, $expr}``
        into an empty collection took 97 s. And every statement wakes every
        change stream (the nodes' due feeds): beside three, 4,096 upserts of
        ``{_id: b}``, a statement each, took 4.7 to 5.7 s and drew 2,900 to
        4,700 getMores; one insert of free leases and 128 statements taking
        them, 1.7 s and 350 (measured)."""
        keep_unless_takeable = [
            {
                "$replaceWith": {
                    "$cond": [
                        self._takeable_expr(),
                        {"$mergeObjects": ["$$ROOT", self._taken(term)]},
                        "$$ROOT",
                    ]
                }
            }
        ]
        await self._update(buckets, lambda part: {"_id": {"$in": part}}, keep_unless_takeable)

    def _taken(self, term: float) -> dict[str, Any]:
        """The fields of a lease this node takes: the token one up."""
        return {
            "owner": self.node_id,
            "token": {"$add": [{"$ifNull": ["$token", 0]}, 1]},
            "expiresAt": _expires_at(term),
            "acquiredAt": "$$NOW",
        }

    @store_call
    async def ours(self, buckets: list[int], within: float) -> dict[int, int]:
        """bucket -> token, for those of ``buckets`` this node holds now."""
        won = await self._read(buckets, {"owner": self.node_id}, within)
        return {int(d["_id"]): int(d["token"]) for d in won}

    @store_call
    async def extend(self, buckets: list[int], term: float, within: float) -> int:
        """Extend our leases of ``buckets`` to ``term`` seconds from the
        server's now; returns how many matched. ``owner`` is our unique node
        id and only we set it, so it stands for (owner, token) here: when the
        count says something changed, ``tokens`` tells what."""
        with pymongo.timeout(within):
            return await self._update(
                sorted(buckets),
                lambda part: {"_id": {"$in": part}, "owner": self.node_id},
                [{"$set": {"expiresAt": _expires_at(term)}}],
            )

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
                {"$set": {"owner": None, "expiresAt": EPOCH}},
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

    def _takeable_expr(self) -> dict[str, Any]:
        # statements.lease_takeable, evaluated by the server at its $$NOW.
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
