"""Wake-up hints to other nodes (best effort, over their HTTP API).

A node that accepts a schedule due within a poll interval, in a bucket
another node owns, tells that node, so the owner wakes at the due time
instead of at its next poll. A lost hint costs lateness up to one poll
interval, never a delivery: the owner's own look-ahead still finds it.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime

import aiohttp
import structlog

from node.metrics import NodeMetrics
from node.schedule.times import format_time

log = structlog.get_logger("node.hints")

HINT_TIMEOUT = 1.0
MAX_IN_FLIGHT = 64  # beyond this, hints are dropped: the look-ahead covers them


class WakeHints:
    def __init__(self, node_id: str, metrics: NodeMetrics) -> None:
        self.node_id = node_id
        self.metrics = metrics
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def send(self, address: str, bucket: int, due_at: datetime) -> None:
        if len(self._tasks) >= MAX_IN_FLIGHT:
            self.metrics.hints.labels("dropped").inc()
            return
        task = asyncio.create_task(self._post(address, bucket, due_at))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, address: str, bucket: int, due_at: datetime) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HINT_TIMEOUT))
        body = {"bucket": bucket, "dueAt": format_time(due_at), "from": self.node_id}
        try:
            async with self._session.post(f"http://{address}/v1/internal/wake", json=body) as r:
                self.metrics.hints.labels("sent" if r.status < 300 else "refused").inc()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.metrics.hints.labels("failed").inc()
            log.debug("wake hint failed", address=address, error=str(exc))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()
