"""Group commit for inserts: concurrent POSTs share one ``insert_many``.

A store round trip has a fixed cost that dwarfs the per-document work: the
embedded server inserts about 700 documents/s one ``insert_one`` at a time
and about 3,700/s in batches of 50 (measured on the development machine).
So inserts queue here, and one writer sends whatever has queued as a single
unordered ``insert_many`` while the previous one is in flight (the group
commit of database logs). An insert arriving at an idle node goes out at
once, so a lone request waits for nothing; under load each round trip
carries everything that arrived during the last one.

The queue is bounded: when the store answers so slowly that MAX_QUEUED
documents already wait, a new insert is refused at once (``StoreBusy``, a
503 with Retry-After) rather than join an unbounded queue.

Each caller gets its own outcome: ``None`` when its document was stored,
``DuplicateKeyError`` when its ``_id`` exists, or the error that failed the
whole batch (the outcome is then unknown to the caller, exactly as with a
failed ``insert_one``; the client retries with its idempotency key).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError, DuplicateKeyError, PyMongoError, WriteError

from node.errors import StoreBusy

DUPLICATE_KEY = 11000
# A cap on one batch; pymongo splits it further by the server's message size.
MAX_GROUP = 500
# Documents waiting for the store at most (a few groups): past it the store
# is too slow for more, and callers are told so at once.
MAX_QUEUED = 4 * MAX_GROUP


class GroupInserter:
    def __init__(
        self,
        collection: AsyncCollection[dict[str, Any]],
        max_group: int = MAX_GROUP,
        max_queued: int = MAX_QUEUED,
    ) -> None:
        self.collection = collection
        self.max_group = max_group
        self.max_queued = max_queued
        self._queue: list[tuple[dict[str, Any], asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None
        self.round_trips = 0

    async def insert(self, doc: dict[str, Any]) -> None:
        """Store ``doc``; raises ``DuplicateKeyError`` if its ``_id`` exists,
        ``StoreBusy`` if too many wait already."""
        if len(self._queue) >= self.max_queued:
            raise StoreBusy(
                f"{len(self._queue)} inserts are waiting for the store: retry in a moment",
                retry_after=1,
            )
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((doc, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_all())
        await future

    async def _write_all(self) -> None:
        group: list[tuple[dict[str, Any], asyncio.Future[None]]] = []
        try:
            while self._queue:
                group, self._queue = self._queue[: self.max_group], self._queue[self.max_group :]
                outcomes = await self._write(group)
                for (_, future), outcome in zip(group, outcomes, strict=True):
                    if future.done():  # the caller went away (request cancelled)
                        continue
                    if outcome is None:
                        future.set_result(None)
                    else:
                        future.set_exception(outcome)
        finally:
            # Cancelled (the node is stopping): nobody may wait forever.
            abandoned, self._queue = [*group, *self._queue], []
            for _, future in abandoned:
                if not future.done():
                    future.cancel()

    async def _write(
        self, group: list[tuple[dict[str, Any], asyncio.Future[None]]]
    ) -> list[BaseException | None]:
        self.round_trips += 1
        try:
            await self.collection.insert_many([doc for doc, _ in group], ordered=False)
        except BulkWriteError as exc:
            # Unordered: every document without an error of its own was stored.
            outcomes: list[BaseException | None] = [None] * len(group)
            for error in exc.details.get("writeErrors", []):
                index, code, message = error["index"], error["code"], error["errmsg"]
                kind = DuplicateKeyError if code == DUPLICATE_KEY else WriteError
                outcomes[index] = kind(message, code, error)
            return outcomes
        except PyMongoError as exc:
            return [exc] * len(group)
        return [None] * len(group)
