"""Execution history: one record per delivery attempt (when, which node, which
lease token, the outcome and the error), for ``GET /v1/schedules/{id}/history``.

* Capped per schedule: a record's ``_id`` is ``<schedule>@<life>#<run mod
  cap>``, where ``run`` counts the schedule's attempts over its whole life
  (the claim increments it), so a long-lived recurring schedule overwrites
  its oldest record instead of growing without bound.
* Per life of an id: ``life`` is when the schedule was created (its
  ``createdAt``, in milliseconds). An id used again once its schedule has
  ended and been removed (past RETENTION) starts a new life: its records
  neither collide with the old one's nor show them (``of`` reads only the
  records made since the schedule's creation).
* Expired after ``HISTORY_RETENTION`` by a TTL index on the record's time.
* Never on the delivery path: the poller hands records to
  ``node/delivery/history_writer.py``, which writes them in batches from its
  own task; the schedule's own document stays the record of truth for its
  status.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from pymongo import ASCENDING, DESCENDING, InsertOne, ReplaceOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError

from node.store.boundary import store_call
from node.store.contract import Attempt

__all__ = ["Attempt", "HistoryStore"]

TTL_INDEX = "expire"


class HistoryStore:
    """``contract.AttemptHistory`` on MongoDB: the ``history`` collection."""

    def __init__(
        self, collection: AsyncCollection[dict[str, Any]], *, retention: timedelta, cap: int
    ) -> None:
        self.collection = collection
        self.retention = retention
        self.cap = cap

    @store_call
    async def prepare(self) -> None:
        await self.collection.create_index(
            [("scheduleId", ASCENDING), ("run", DESCENDING)], name="by_schedule"
        )
        seconds = int(self.retention.total_seconds())
        existing = (await self.collection.index_information()).get(TTL_INDEX)
        if existing is not None and existing.get("expireAfterSeconds") != seconds:
            # The retention changed: a TTL index keeps its first value unless rebuilt.
            await self.collection.drop_index(TTL_INDEX)
        await self.collection.create_index("at", name=TTL_INDEX, expireAfterSeconds=seconds)

    @store_call
    async def write(self, attempts: Sequence[Attempt]) -> int:
        """Store the records; returns how many were written.

        A schedule's first ``cap`` runs fill empty slots: plain inserts, the
        cheapest write (an upsert cost the embedded store twice as much, and
        almost every schedule ends within its cap). Only later runs replace
        the slot of the run ``cap`` before them.
        """
        ops: list[InsertOne[dict[str, Any]] | ReplaceOne[dict[str, Any]]] = []
        for attempt in attempts:
            doc = attempt.to_document(self.cap)
            if attempt.run <= self.cap:
                ops.append(InsertOne(doc))
            else:
                ops.append(ReplaceOne({"_id": doc["_id"]}, doc, upsert=True))
        if not ops:
            return 0
        try:
            result = await self.collection.bulk_write(ops, ordered=False)
        except BulkWriteError as exc:
            # A run number seen twice (its claim was lost in a database crash
            # and made again): the first record of it stays.
            details = exc.details
            return (
                int(details.get("nInserted", 0))
                + int(details.get("nUpserted", 0))
                + int(details.get("nModified", 0))
            )
        return result.inserted_count + result.upserted_count + result.modified_count

    @store_call
    async def of(
        self, schedule_id: str, limit: int, since: datetime | None = None
    ) -> list[dict[str, Any]]:
        """A schedule's records, newest first; those made ``since`` alone (the
        current life of the id, see the module docstring)."""
        query: dict[str, Any] = {"scheduleId": schedule_id}
        if since is not None:
            query["at"] = {"$gte": since}
        return await self.collection.find(query).sort("run", DESCENDING).limit(limit).to_list()
