"""The ``flow_slices`` and ``flow_slots`` collections: the cluster-wide
counts behind flow control (``node/schedule/flow.py`` says what a limit is).

Two kinds of document, each written by whichever node owns a limited
key's work, so a limit holds across buckets, owners and handovers:

- a rate *slice* (``r/<key>/<rate>/<period>/<index>``, in ``flow_slices``): ``n`` deliveries
  started in it. A node reserves ``k`` with one ``$inc`` and reads the
  count after it: the store orders the increments, so the ``k`` granted
  are ``capacity - (n - k)`` clipped to ``0..k``, and two owners can never
  both be granted the same share. What a node reserves and does not use
  (its claim lost a race, it crashed) is lost for that slice only: the
  limit errs low, never high;
- a parallelism *slot* (``p/<key>/<parallelism>/<i>``, in ``flow_slots``):
  held by one node
  (``holder``) until ``until`` by the store's clock, for one delivery in
  flight at a time. A node takes slots that are free, expired or its own
  in one unordered bulk write (a slot held by another fails with a
  duplicate key: not taken), renews them while it uses them, and gives
  them back when its work of the key runs out. A node that dies holds its
  slots until they expire (``SLOT_TERM``): its calls died with it.

Every statement names its documents by ``_id``: one shard each on a
sharded cluster (shard both on ``{_id: "hashed"}``). Spent documents
carry ``expireAt``, removed by the TTL monitor a minute after use. Two
collections and not one: the embedded SecantusDB plans no index for the
slots' take (an ``$expr`` beside the ``_id``) and scans its collection,
which then holds a key's few slots, not every slice of the last minute.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from pymongo import ASCENDING, ReturnDocument, UpdateOne
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, DuplicateKeyError

from node.store.boundary import DUPLICATE_KEY, DURABLE, store_call
from node.store.contract import RateWant, SlotWant

# How long a slot stays held without a renewal (seconds). A node renews
# the slots it uses every round past half of it; one that dies leaves them
# held this long at most.
SLOT_TERM = 10.0
# Statements a reservation may take when the first ones race to make its
# slice.
RESERVE_TRIES = 3
# How long a spent slice or a released slot stays before the TTL monitor
# may remove it.
KEEP_SPENT = timedelta(minutes=1)


# Times compared as epoch milliseconds: the embedded SecantusDB answers
# false for any date-vs-$$NOW comparison in an expression (as the leases
# say); $toLong keeps the same order on MongoDB 4.0+.
_NOW_MS = {"$toLong": "$$NOW"}
_UNTIL_MS = {"$toLong": "$until"}


def granted(capacity: int, count_after: int, asked: int) -> int:
    """Of ``asked`` reserved in a slice whose count is ``count_after`` once
    they are added, how many fit its ``capacity``."""
    return max(0, min(asked, capacity - (count_after - asked)))


class FlowStore:
    """``contract.FlowGates`` on MongoDB."""

    def __init__(
        self, database: AsyncDatabase[dict[str, Any]], holder: str, term: float = SLOT_TERM
    ) -> None:
        # As durable as the leases: a reservation lost in a database crash
        # would let a slice's share go out twice.
        self.slices = database.get_collection("flow_slices", write_concern=DURABLE)
        self.slots = database.get_collection("flow_slots", write_concern=DURABLE)
        self.term = term
        # On the embedded SecantusDB (set at start, as the leases' shapes):
        # there upserts racing to make one document answer no document to
        # all but one of them, though each applied its increment (measured:
        # 165 of 600 answers, three nodes racing each of 200 slices). So a
        # slice is made first by an insert, whose duplicate is no error,
        # and reserved in without upsert (no race: every answer comes). A
        # real MongoDB answers every upsert; one statement there.
        self.embedded = False
        # This process's name on the slots it holds (node id and a nonce:
        # a restarted node holds none of its former self's).
        self.holder = holder

    @store_call
    async def prepare(self) -> None:
        for collection in (self.slices, self.slots):
            await collection.create_index(
                [("expireAt", ASCENDING)], name="expire", expireAfterSeconds=0
            )

    @store_call
    async def reserve(self, wants: Sequence[RateWant]) -> list[int]:
        """Reserve ``want.count`` starts in each slice; how many each grants.
        One statement a slice, all at once (one round trip of the node's)."""
        return list(await asyncio.gather(*(self._reserve(want) for want in wants)))

    async def _reserve(self, want: RateWant) -> int:
        if self.embedded:
            with contextlib.suppress(DuplicateKeyError):
                await self.slices.insert_one({"_id": want.slice.id, "n": 0, **self._about(want)})
        for _attempt in range(RESERVE_TRIES):
            try:
                after = await self.slices.find_one_and_update(
                    {"_id": want.slice.id},
                    {
                        "$inc": {"n": want.count},
                        "$setOnInsert": self._about(want),
                    },
                    upsert=not self.embedded,
                    return_document=ReturnDocument.AFTER,
                    projection={"n": 1},
                )
            except DuplicateKeyError:
                # Two first reservations of a slice raced to insert it: the
                # loser's statement did nothing, and the slice exists now.
                continue
            if after is None:
                # Not made (the embedded server's insert above failed, or an
                # answer of its upsert race): grant nothing; the limit errs
                # low, never high.
                return 0
            return granted(want.slice.capacity, int(after["n"]), want.count)
        return 0

    @staticmethod
    def _about(want: RateWant) -> dict[str, Any]:
        return {"tenant": want.tenant, "key": want.key, "expireAt": want.slice.ends_at + KEEP_SPENT}

    @store_call
    async def hold(self, wants: Sequence[SlotWant]) -> set[str]:
        """Take every slot of ``wants`` that is free, expired or already
        ours (renewing ours); returns the ids of those held now. One bulk
        write for all keys."""
        ids = [slot for want in wants for slot in want.slots]
        if not ids:
            return set()
        about = {slot: want for want in wants for slot in want.slots}
        term_ms = int(self.term * 1000)
        ops = [
            UpdateOne(
                {
                    "_id": slot,
                    "$expr": {
                        "$or": [{"$lt": [_UNTIL_MS, _NOW_MS]}, {"$eq": ["$holder", self.holder]}]
                    },
                },
                [
                    {
                        "$set": {
                            "holder": self.holder,
                            "tenant": about[slot].tenant,
                            "key": about[slot].key,
                            "until": {"$add": ["$$NOW", term_ms]},
                            "expireAt": {
                                "$add": ["$$NOW", term_ms + int(KEEP_SPENT.total_seconds() * 1000)]
                            },
                        }
                    }
                ],
                upsert=True,
            )
            for slot in ids
        ]
        refused: set[int] = set()
        try:
            await self.slots.bulk_write(ops, ordered=False)
        except BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            if any(e["code"] != DUPLICATE_KEY for e in errors):
                raise
            # Held by another: the filter missed, and the upsert's insert
            # found the slot there.
            refused = {int(e["index"]) for e in errors}
        return {slot for index, slot in enumerate(ids) if index not in refused}

    @store_call
    async def release(self, slots: Sequence[str]) -> None:
        """Give back these slots, where this process still holds them."""
        if slots:
            await self.slots.delete_many({"_id": {"$in": list(slots)}, "holder": self.holder})


__all__ = ["KEEP_SPENT", "SLOT_TERM", "FlowStore", "granted"]
