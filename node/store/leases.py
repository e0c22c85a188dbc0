"""The ``buckets`` collection: one lease document per bucket,
``{_id: bucket, owner, token, expiresAt, acquiredAt}`` (DESIGN.md "Leases
with fencing tokens"). The book a node keeps of its own leases (terms,
deadlines, what may still be worked) is ``node/delivery/leases.py``; this
module only asks and writes.

Expiry is judged by the database server's clock (``$$NOW`` in an update
pipeline), so nodes' wall clocks never decide who owns what. Every call is
one round trip for all the buckets it names.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import pymongo
from pymongo import UpdateMany, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError

from node.store.boundary import DUPLICATE_KEY, store_call

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class LeaseStore:
    """``contract.BucketLeases`` on MongoDB: the ``buckets`` collection."""

    def __init__(self, collection: AsyncCollection[dict[str, Any]], node_id: str) -> None:
        self.collection = collection
        self.node_id = node_id

    @store_call
    async def takeable(self, buckets: Iterable[int], within: float) -> tuple[list[int], list[int]]:
        """Of ``buckets``: those free, expired or already ours, by the
        server's clock; and those never leased (no document yet). Every
        call here takes ``within``, the seconds it may take: a lease answer
        later than the lease's term is worth nothing."""
        wanted = sorted(buckets)
        with pymongo.timeout(within):
            existing = await (
                await self.collection.aggregate(
                    [
                        {"$match": {"_id": {"$in": wanted}}},
                        {"$project": {"_id": 1, "takeable": self._takeable_expr()}},
                    ],
                    batchSize=len(wanted),
                )
            ).to_list()
        takeable = sorted(d["_id"] for d in existing if d["takeable"])
        unseen = sorted(set(wanted) - {d["_id"] for d in existing})
        return takeable, unseen

    @store_call
    async def take(
        self, takeable: list[int], unseen: list[int], term: float, within: float
    ) -> None:
        """Take each bucket that is still takeable: one conditional update for
        those with a document (each re-checked atomically: one taken since
        ``takeable`` is simply not matched), an upsert each for the unseen (a
        duplicate-key error there means another node won it). The token goes
        up by one for every bucket taken."""
        take = [
            {
                "$set": {
                    "owner": self.node_id,
                    "token": {"$add": [{"$ifNull": ["$token", 0]}, 1]},
                    "expiresAt": _expires_at(term),
                    "acquiredAt": "$$NOW",
                }
            }
        ]
        ops: list[UpdateMany | UpdateOne] = []
        if takeable:
            ops.append(UpdateMany({"_id": {"$in": takeable}, "$expr": self._takeable_expr()}, take))
        ops.extend(
            UpdateOne({"_id": b, "$expr": self._takeable_expr()}, take, upsert=True) for b in unseen
        )
        try:
            with pymongo.timeout(within):
                await self.collection.bulk_write(ops, ordered=False)
        except BulkWriteError as exc:
            others = [e for e in exc.details.get("writeErrors", []) if e["code"] != DUPLICATE_KEY]
            if others:
                raise

    @store_call
    async def ours(self, buckets: list[int], within: float) -> dict[int, int]:
        """bucket -> token, for those of ``buckets`` this node holds now."""
        with pymongo.timeout(within):
            won = await self.collection.find(
                {"_id": {"$in": buckets}, "owner": self.node_id},
                {"token": 1},
                batch_size=len(buckets),
            ).to_list()
        return {int(d["_id"]): int(d["token"]) for d in won}

    @store_call
    async def extend(self, buckets: list[int], term: float, within: float) -> int:
        """Extend our leases of ``buckets`` to ``term`` seconds from the
        server's now; returns how many matched. ``owner`` is our unique node
        id and only we set it, so it stands for (owner, token) here: when the
        count says something changed, ``tokens`` tells what."""
        with pymongo.timeout(within):
            result = await self.collection.update_many(
                {"_id": {"$in": sorted(buckets)}, "owner": self.node_id},
                [{"$set": {"expiresAt": _expires_at(term)}}],
            )
        return result.matched_count

    @store_call
    async def tokens(self, buckets: list[int], within: float) -> dict[int, tuple[str | None, int]]:
        """bucket -> (owner, token) as stored, for ``buckets``."""
        with pymongo.timeout(within):
            current = await self.collection.find(
                {"_id": {"$in": buckets}}, {"owner": 1, "token": 1}, batch_size=len(buckets)
            ).to_list()
        return {int(d["_id"]): (d.get("owner"), int(d.get("token", 0))) for d in current}

    @store_call
    async def release(self, buckets: list[int], within: float) -> None:
        """Give our leases of ``buckets`` back: free at once for the next owner."""
        with pymongo.timeout(within):
            await self.collection.update_many(
                {"_id": {"$in": buckets}, "owner": self.node_id},
                {"$set": {"owner": None, "expiresAt": EPOCH}},
            )

    @store_call
    async def all(self) -> list[dict[str, Any]]:
        """Every bucket's lease (owner and token), by bucket."""
        return await self.collection.find({}, {"owner": 1, "token": 1}).sort("_id", 1).to_list()

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


def _expires_at(term: float) -> dict[str, Any]:
    return {"$add": ["$$NOW", int(term * 1000)]}
