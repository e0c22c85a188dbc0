"""The change feed on MongoDB: a change stream of the ``schedules`` collection
that tells the bucket owners of every write that may make work due sooner
than they know (``contract.DueChange``), so that a bucket with nothing due
is not read again before its next due time (``node/delivery/due_book.py``).

Why a change stream and not hints alone or polling: hints between nodes
are best-effort (a node that stored a schedule may die before its hint is
sent), and polling every bucket once an interval costs the store one read
per bucket and interval whatever the work (B = 4,096 buckets: 4,096 reads a
second). A change stream is ordered and resumable (the driver resumes it
across a step-down or a lost connection from its resume token), costs one
``getMore`` per wait when nothing happens, and on a sharded cluster is
merged by mongos from every shard. Its cost is per write: the server
matches every write of the collection against the filter below, once per
open stream (one per node); the filter keeps only inserts and the writes
that set PENDING or move ``dueAt``, and the projection only what the owner
needs, so a claim or a mark (most of the writes) is never sent.

Change streams need a replica set or a sharded cluster (which a production
deployment is anyway, for durability): on a standalone server
``watch_due`` raises ``ChangesUnsupported`` and the owners poll instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.errors import PyMongoError

from node.errors import StoreUnavailable
from node.schedule.model import Status
from node.schedule.times import aware
from node.store.contract import DueChange
from node.store.documents import bucket_of

# MongoDB's error for $changeStream on a standalone server.
NOT_A_REPLICA_SET = 40573
# The wait after a getMore that brought nothing (seconds; see MongoChangeFeed).
FEED_PAUSE = 0.5

_PENDING = Status.PENDING.value
# The writes that may make work due sooner: a schedule stored PENDING, made
# PENDING again, or given a new due time. A claim (PENDING -> IN_FLIGHT) and
# a mark (-> DELIVERED ...) set neither, so the server drops them here.
PIPELINE: list[dict[str, Any]] = [
    {
        "$match": {
            "$or": [
                {"operationType": "insert", "fullDocument.status": _PENDING},
                {"operationType": "update", "updateDescription.updatedFields.status": _PENDING},
                {
                    "operationType": "update",
                    "updateDescription.updatedFields.dueAt": {"$exists": True},
                },
            ]
        }
    },
    # _id (the resume token) stays: without it the stream cannot resume.
    {
        "$project": {
            "operationType": 1,
            "documentKey": 1,
            "fullDocument.bucket": 1,
            "fullDocument.dueAt": 1,
            "fullDocument.priority": 1,
            "updateDescription.updatedFields.dueAt": 1,
        }
    },
]


def due_change(event: Mapping[str, Any], bucket_count: int) -> DueChange | None:
    """What a change event tells the owners (None: nothing, e.g. another kind
    of event the filter let through, such as an invalidate)."""
    kind = event.get("operationType")
    key = event.get("documentKey") or {}
    schedule_id = key.get("_id")
    if not isinstance(schedule_id, str):
        return None
    if kind == "insert":
        doc = event.get("fullDocument") or {}
        due = doc.get("dueAt")
        bucket = doc.get("bucket")
        return DueChange(
            bucket=int(bucket) if isinstance(bucket, int) else bucket_of(schedule_id, bucket_count),
            schedule_id=schedule_id,
            due_at=aware(due) if due is not None else None,
            inserted=True,
            priority=doc.get("priority") if isinstance(doc.get("priority"), int) else None,
        )
    if kind == "update":
        # An update names no bucket: it is the id's, by the placement's hash.
        due = (event.get("updateDescription") or {}).get("updatedFields", {}).get("dueAt")
        return DueChange(
            bucket=bucket_of(schedule_id, bucket_count),
            schedule_id=schedule_id,
            due_at=aware(due) if due is not None else None,
            inserted=False,
        )
    return None


class MongoChangeFeed:
    """``contract.ChangeFeed`` over a change stream.

    After a getMore that brought nothing, the next waits FEED_PAUSE: the
    embedded SecantusDB ends a getMore's wait at every write statement,
    matching or not (a lease renew, a claim), so a stream that asked again
    at once would cost the store a getMore per statement; a real MongoDB
    answers an empty getMore only at maxAwaitTimeMS. What was written in the
    pause comes in the next batch: the feed is the owners' safety net, at
    most the pause late, and hints stay the fast path."""

    def __init__(
        self,
        stream: AsyncChangeStream[dict[str, Any]],
        bucket_count: int,
        *,
        resumed: bool = False,
        pause: float = FEED_PAUSE,
    ) -> None:
        self.stream = stream
        self.bucket_count = bucket_count
        self.resumed = resumed
        self.pause = pause

    @property
    def resume_token(self) -> Any:
        return self.stream.resume_token

    def __aiter__(self) -> AsyncIterator[DueChange]:
        return self._changes()

    async def _changes(self) -> AsyncIterator[DueChange]:
        try:
            while self.stream.alive:
                event = await self.stream.try_next()
                _raise_if_cancelled()
                if event is None:
                    await asyncio.sleep(self.pause)
                    continue
                change = due_change(event, self.bucket_count)
                if change is not None:
                    yield change
        except PyMongoError as exc:
            # Past what the driver resumes by itself (a deadline missed on a
            # busy server, history lost after a restart, the server gone).
            raise StoreUnavailable("the schedules' change stream broke") from exc
        raise StoreUnavailable("the schedules' change stream ended")

    async def close(self) -> None:
        # Closing a stream on a server that is gone: nothing left to free.
        with contextlib.suppress(PyMongoError):
            await self.stream.close()


def _raise_if_cancelled() -> None:
    """Honour a cancel the driver swallowed. A cancel that lands while a
    getMore waits is taken by pymongo (4.20) as a cancelled operation: it
    drops the connection, answers None as for an empty batch, and the
    stream goes on, so the feed would never end and a stopping node would
    wait out its STOP_GRACE for it. The cancel is still asked of the task."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
