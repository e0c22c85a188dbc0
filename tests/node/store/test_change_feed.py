"""The change stream under the owners' feed (``node/store/due_changes.py``),
where the driver's behaviour is not what asyncio promises."""

from __future__ import annotations

import asyncio
from typing import Any

from node.store.due_changes import MongoChangeFeed


class SwallowingStream:
    """A change stream whose ``try_next`` swallows a cancel that lands in
    its wait and answers None, as pymongo 4.20 does mid-getMore."""

    alive = True
    resume_token = None

    def __init__(self) -> None:
        self.waits = 0
        self.waiting = asyncio.Event()

    async def try_next(self) -> Any:
        self.waits += 1
        self.waiting.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            return None
        return None

    async def close(self) -> None:
        self.alive = False


async def test_a_cancel_the_driver_swallows_still_ends_the_feed() -> None:
    stream = SwallowingStream()
    feed = MongoChangeFeed(stream, bucket_count=16, pause=0.0)  # type: ignore[arg-type]

    async def follow() -> None:
        async for _change in feed:
            raise AssertionError("no change was written")

    task = asyncio.create_task(follow())
    await stream.waiting.wait()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=60)  # a hang guard, not a timing
    assert task in done and task.cancelled()
    assert stream.waits == 1  # not asked again after the cancel
