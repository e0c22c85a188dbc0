"""Writes execution history in the background (``node/store/history.py``
says what is kept and for how long).

Never on the delivery path: the poller hands records over and moves on; a
task writes them in batches. A full queue drops records (counted) rather
than slow delivery down; the schedule's own document stays the record of
truth for its status.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import structlog

from node.errors import StoreUnavailable
from node.metrics import NodeMetrics
from node.store.contract import Attempt, AttemptHistory

log = structlog.get_logger(__name__)

QUEUE_LIMIT = 100_000  # records waiting to be written; past it, new ones are dropped
WRITE_BATCH = 1000


class HistoryWriter:
    """Writes history records in the background, in batches."""

    def __init__(self, store: AttemptHistory, metrics: NodeMetrics) -> None:
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
                except StoreUnavailable as exc:
                    # History is not worth a retry loop against a store in
                    # trouble; the schedules themselves are what must survive.
                    self.metrics.history_dropped.inc(len(batch))
                    log.warning("history write failed", records=len(batch), error=str(exc))
            if self._closing:
                return
