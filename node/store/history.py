"""Execution history: one record per delivery attempt (when, which node, which
lease token, the outcome and the error), for ``GET /v1/schedules/{id}/history``.

* Capped per schedule: a record's ``_id`` is ``<schedule>#<run mod cap>``,
  where ``run`` counts the schedule's attempts over its whole life (the claim
  increments it), so a long-lived recurring schedule overwrites its oldest
  record instead of growing without bound.
* Expired after ``HISTORY_RETENTION`` by a TTL index on the record's time.
* Never on the delivery path: the poller hands records to ``HistoryWriter``,
  which writes them in batches from its own task. A full queue drops records
  (counted) rather than slow delivery down; the schedule's own document stays
  the record of truth for its status.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import structlog
from pymongo import ASCENDING, DESCENDING, InsertOne, ReplaceOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError, PyMongoError

from node.metrics import NodeMetrics
from node.schedule.times import format_time

log = structlog.get_logger("node.history")

TTL_INDEX = "expire"
QUEUE_LIMIT = 100_000  # records waiting to be written; past it, new ones are dropped
WRITE_BATCH = 1000


@dataclass(frozen=True)
class Attempt:
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

    def to_document(self, cap: int) -> dict[str, Any]:
        return {
            "_id": f"{self.schedule_id}#{self.run % cap}",
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
        }


def public_record(doc: dict[str, Any]) -> dict[str, Any]:
    return {
        "at": format_time(doc["at"]),
        "executeAt": format_time(doc["executeAt"]),
        "attempt": doc["attempt"],
        "outcome": doc["outcome"],
        "node": doc["node"],
        "token": doc["token"],
        "error": doc.get("error"),
    }


class HistoryStore:
    def __init__(
        self, collection: AsyncCollection[dict[str, Any]], *, retention: timedelta, cap: int
    ) -> None:
        self.collection = collection
        self.retention = retention
        self.cap = cap

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

    async def of(self, schedule_id: str, limit: int) -> list[dict[str, Any]]:
        """A schedule's records, newest first."""
        return await (
            self.collection.find({"scheduleId": schedule_id})
            .sort("run", DESCENDING)
            .limit(limit)
            .to_list()
        )


class HistoryWriter:
    """Writes history records in the background, in batches."""

    def __init__(self, store: HistoryStore, metrics: NodeMetrics) -> None:
        self.store = store
        self.metrics = metrics
        self._queue: list[Attempt] = []
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def add(self, attempts: Sequence[Attempt]) -> None:
        room = QUEUE_LIMIT - len(self._queue)
        if room < len(attempts):
            self.metrics.history_dropped.inc(len(attempts) - max(room, 0))
            attempts = attempts[: max(room, 0)]
        self._queue.extend(attempts)
        if self._queue:
            self._ready.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="history")

    async def close(self) -> None:
        """Write what is queued (best effort), then stop."""
        self._closing = True
        self._ready.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout=5.0)
            except TimeoutError:
                self._task.cancel()

    async def _run(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._queue:
                batch, self._queue = self._queue[:WRITE_BATCH], self._queue[WRITE_BATCH:]
                try:
                    written = await self.store.write(batch)
                    self.metrics.history_written.inc(written)
                    self.metrics.history_dropped.inc(len(batch) - written)
                except PyMongoError as exc:
                    # History is not worth a retry loop against a store in
                    # trouble; the schedules themselves are what must survive.
                    self.metrics.history_dropped.inc(len(batch))
                    log.warning("history write failed", records=len(batch), error=str(exc))
            if self._closing:
                return
