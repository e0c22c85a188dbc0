"""Following the store's change feed, so that a bucket with nothing due
costs the store nothing: the owner is told of every write that may make
work due sooner than its views know (``contract.DueChange``: a schedule
stored, made PENDING again, or given a new due time, by any node), and a
view that knows its bucket's next due time is not read again before then
(``due_book.py``, quiet views).

Hints between nodes (``hints.py``) stay the fast path; the feed is what
makes their loss harmless. A feed that breaks is resumed from where it
ended (nothing lost); while there is none (not yet open, the store
unreachable or its history gone, a store without change streams) every
view is refreshed once a poll interval, as it would be without one; when a
feed opens afresh every view is read once, since what was written in
between was not told.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import structlog

from node.errors import ChangesUnsupported, SchedulerError
from node.store.contract import DueChange, Schedules

log = structlog.get_logger(__name__)

# After the feed fails to open or breaks: the wait before opening it again,
# doubling from the first to the last (seconds). Meanwhile the owners poll.
REOPEN_AFTER = 1.0
REOPEN_AFTER_MAX = 30.0


class Watcher(Protocol):
    """What the feed tells (the poller, ``poller.py``)."""

    def feed_opened(self) -> None: ...

    def feed_lost(self) -> None: ...

    def changed(self, change: DueChange) -> None: ...


class DueFeed:
    def __init__(
        self,
        store: Schedules,
        watcher: Watcher,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.watcher = watcher
        self.sleep = sleep
        self.monotonic = monotonic
        self.open = False

    async def run(self) -> None:
        """Keep the feed open until cancelled (or the store has none). A
        feed that breaks is resumed where it ended while the store still has
        that history: nothing was lost, the views stay as they are. One that
        cannot be resumed is opened afresh, and every view read again."""
        wait = REOPEN_AFTER
        token: Any = None
        while True:
            try:
                feed = await self.store.watch_due(token)
            except ChangesUnsupported as exc:
                log.warning("no change feed: buckets are polled", error=str(exc))
                self._lost()
                return
            except SchedulerError as exc:
                log.warning("could not open the change feed", error=str(exc), retry_in=wait)
                self._lost()
                await self.sleep(wait)
                wait = min(2 * wait, REOPEN_AFTER_MAX)
                continue
            if not (self.open and feed.resumed):
                self.open = True
                self.watcher.feed_opened()  # what came before it was not told
            opened = self.monotonic()
            try:
                async for change in feed:
                    self.watcher.changed(change)
            except SchedulerError as exc:
                log.warning("the change feed broke; resuming it", error=str(exc))
            finally:
                token = feed.resume_token if feed.resume_token is not None else token
                await feed.close()
            if self.monotonic() - opened < wait:
                await self.sleep(wait)  # it breaks as soon as it opens: not at once again
                wait = min(2 * wait, REOPEN_AFTER_MAX)
            else:
                wait = REOPEN_AFTER

    def _lost(self) -> None:
        if self.open:
            self.open = False
            self.watcher.feed_lost()
