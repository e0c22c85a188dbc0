"""Delivery in virtual time: one clock that moves only when a test moves it,
the memory store (``node/store/memory.py``) judging by it, a publisher that
records what it is given, and owners (a lease book and a poller each) that
a test drives round by round. No real sleeping, no sockets: a test of many
virtual minutes runs in milliseconds (trio's MockClock; STYLE.md).

Its fixtures (``time``, ``schedules`` of ``buckets`` buckets, ``leases``)
are every test's (``tests/conftest.py``); a module overrides ``buckets``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest

from node.delivery.leases import LeaseManager
from node.delivery.outcomes import Rules
from node.delivery.poller import BucketPoller
from node.delivery.sink import Failed, Trouble
from node.metrics import NodeMetrics
from node.schedule.model import Limits, NewSchedule
from node.schedule.parse import parse_new_schedule
from node.schedule.record import Record
from node.schedule.retry import RetryPolicy
from node.schedule.webhook import HttpCall
from node.store.contract import DueChange
from node.store.memory import MemoryFlow, MemoryLeases, MemorySchedules

START = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
LIMITS = Limits(max_payload_bytes=64 * 1024, horizon=timedelta(days=30))
# Backoff of 1 s doubling to 8 s, five attempts: what the tests count on.
RETRY = RetryPolicy(max_attempts=5, backoff=timedelta(seconds=1), backoff_max=timedelta(seconds=8))


class VirtualTime:
    """The wall clock (the store's, aware UTC) and the monotonic clock of
    every owner, moving together and only when told."""

    def __init__(self, start: datetime = START) -> None:
        self.start = start
        self.elapsed = 0.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def wall(self) -> datetime:
        # To the millisecond, as the node's estimate of the store's clock is.
        return self.start + timedelta(milliseconds=round(self.elapsed * 1000))

    def monotonic(self) -> float:
        return 1000.0 + self.elapsed

    def advance(self, seconds: float) -> None:
        assert seconds >= 0
        self.elapsed += seconds
        for sleeper in [s for s in self._sleepers if s[0] <= self.elapsed]:
            self._sleepers.remove(sleeper)
            if not sleeper[1].done():
                sleeper[1].set_result(None)

    async def sleep(self, seconds: float) -> None:
        """Until ``seconds`` of virtual time have passed (``advance`` moves it)."""
        if seconds <= 0:
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.elapsed + seconds, woken))
        await woken

    def at(self, seconds: float) -> datetime:
        """The wall time ``seconds`` after the start."""
        return self.start + timedelta(seconds=seconds)


@pytest.fixture
def time() -> VirtualTime:
    return VirtualTime()


@pytest.fixture
def buckets() -> int:
    """One bucket unless a module says more: every schedule is in bucket 0."""
    return 1


@pytest.fixture
def schedules(time: VirtualTime, buckets: int) -> MemorySchedules:
    return MemorySchedules(buckets, time.wall)


@pytest.fixture
def leases(time: VirtualTime) -> MemoryLeases:
    return MemoryLeases("", time.wall)


class RecordingPublisher:
    """A broker that takes records into a list. ``refuse``: schedule id ->
    how many more of its records to refuse on their own account (spends an
    attempt); ``down``: the broker takes nothing (spends none);
    ``during``: called with each batch before it is taken (a test's moment
    "while the owner publishes")."""

    def __init__(self, time: VirtualTime) -> None:
        self.time = time
        self.records: list[Record] = []
        self.published_at: list[datetime] = []
        self.refuse: dict[str, int] = {}
        self.down = False
        self.raises: Exception | None = None
        self.during: Callable[[Sequence[Record]], Awaitable[None]] | None = None

    async def publish(self, records: Sequence[Record]) -> list[Failed | None]:
        if self.during is not None:
            during, self.during = self.during, None
            await during(records)
        if self.raises is not None:
            error, self.raises = self.raises, None
            raise error
        results: list[Failed | None] = []
        for record in records:
            schedule_id = header(record, "schedule-id")
            if self.down:
                results.append(
                    Failed("KafkaConnectionError: broker unreachable", Trouble.DESTINATION)
                )
            elif self.refuse.get(schedule_id, 0) > 0:
                self.refuse[schedule_id] -= 1
                results.append(Failed("MessageSizeTooLargeError", Trouble.RETRY))
            else:
                self.records.append(record)
                self.published_at.append(self.time.wall())
                results.append(None)
        return results

    async def reachable(self) -> bool:
        return not self.down

    def ids(self, topic: str | None = None) -> list[str]:
        return [header(r, "schedule-id") for r in self.records if topic is None or r.topic == topic]


class RecordingReceiver:
    """HTTP endpoints that take calls into a list (a twin of the HTTP sink:
    what it returns is what the sink would, ``outcomes.http_result``
    included). ``answers``: host -> what its next calls get (a Failed, or a
    callable of the call for one), taken in turn, then delivered; ``hang``:
    hosts whose calls wait until ``release`` (an endpoint that never answers)."""

    def __init__(self, time: VirtualTime) -> None:
        self.time = time
        self.calls: list[HttpCall] = []  # every call made
        self.delivered: list[HttpCall] = []
        self.answers: dict[str, list[Failed]] = {}
        self.hang: dict[str, asyncio.Event] = {}
        self.waiting: dict[str, int] = {}
        self.open_circuits: set[str] = set()  # hosts the sink's breakers keep closed off
        # Hosts that answer one call per permit (``Semaphore.release``): an
        # endpoint answering at the pace a test sets.
        self.paced: dict[str, asyncio.Semaphore] = {}

    def circuit_open(self, url: str) -> bool:
        return (urlsplit(url).hostname or "") in self.open_circuits

    async def publish(self, calls: Sequence[HttpCall]) -> list[Failed | None]:
        return [await self._one(call) for call in calls]

    async def _one(self, call: HttpCall) -> Failed | None:
        self.calls.append(call)
        host = urlsplit(call.url).hostname or ""
        if host in self.hang:
            self.waiting[host] = self.waiting.get(host, 0) + 1
            await self.hang[host].wait()
            self.waiting[host] -= 1
        if host in self.paced:
            await self.paced[host].acquire()
        queued = self.answers.get(host)
        if queued:
            return queued.pop(0)
        self.delivered.append(call)
        return None

    def release(self, host: str) -> None:
        self.hang.pop(host).set()

    def ids(self) -> list[str]:
        return [call.header("schedule-id") or "" for call in self.delivered]


def header(record: Record, name: str) -> str:
    return dict(record.headers)[name].decode()


def schedule(schedule_id: str, at: datetime, now: datetime, **fields: Any) -> NewSchedule:
    destination = {} if "http" in fields else {"topic": "t"}
    body: dict[str, Any] = {"id": schedule_id, **destination, "payload": schedule_id, **fields}
    if "recurrence" not in fields:
        body["executeAt"] = at.isoformat()
    return parse_new_schedule(json.dumps(body).encode(), LIMITS, now)


class KeptFeed:
    """An owner's change feed whose news is kept back until ``release``: a
    MongoDB change stream tells a write a getMore later (its pause after an
    empty one, ``due_changes.FEED_PAUSE``), after the owner's next round."""

    def __init__(self, poller: BucketPoller) -> None:
        self.poller = poller
        self.kept: list[DueChange] = []

    def feed_opened(self) -> None:
        self.poller.feed_opened()

    def feed_lost(self) -> None:
        self.poller.feed_lost()

    def changed(self, change: DueChange) -> None:
        self.kept.append(change)

    async def release(self) -> list[DueChange]:
        """Tell the owner what the feed has told so far; returns it."""
        for _ in range(3):
            await asyncio.sleep(0)  # the feed takes what the store wrote
        kept, self.kept = self.kept, []
        for change in kept:
            self.poller.changed(change)
        return kept


class Owner:
    """One node's owner side: its lease book and its poller, over the shared
    memory store, with its own recording publisher."""

    def __init__(
        self,
        name: str,
        time: VirtualTime,
        store: MemorySchedules,
        leases: MemoryLeases,
        *,
        ttl: float = 30.0,
        batch_size: int = 10,
        poll_interval: float = 1.0,
        retry: RetryPolicy = RETRY,
        dead_letter_topic: str = "",
        dead_letter_url: str = "",
        tenant_names: Callable[[], Awaitable[Sequence[str]]] | None = None,
        http_per_host: int = 16,
        outage_bound: timedelta = timedelta(days=1),
        watch_changes: bool = False,
        flow: MemoryFlow | None = None,
    ) -> None:
        self.name = name
        self.time = time
        self.leases = LeaseManager(leases.of(name), ttl, monotonic=time.monotonic)
        self.publisher = RecordingPublisher(time)
        self.receiver = RecordingReceiver(time)
        self.metrics = NodeMetrics()
        self.poller = BucketPoller(
            store,
            self.leases,
            self.publisher,  # type: ignore[arg-type]
            self.metrics,
            node_id=name,
            batch_size=batch_size,
            poll_interval=poll_interval,
            rules=Rules(retry, timedelta(seconds=60), random.Random(7), outage_bound),
            dead_letter_topic=dead_letter_topic,
            dead_letter_url=dead_letter_url,
            http=self.receiver,
            http_per_host=http_per_host,
            circuit_open=self.receiver.circuit_open,
            tenant_names=tenant_names,
            wall=time.wall,
            monotonic=time.monotonic,
            watch_changes=watch_changes,
            flow=None if flow is None else flow.of(name),
        )
        self._feed: asyncio.Task[None] | None = None

    async def open_feed(self) -> None:
        """Follow the store's change feed (as ``run`` would, beside the
        rounds), and let it open."""
        assert self.poller.feed is not None, "made with watch_changes=True"
        self.poller.feed.sleep = self.time.sleep  # its back-off before reopening
        self._feed = asyncio.create_task(self.poller.feed.run())
        for _ in range(3):
            await asyncio.sleep(0)
        assert self.poller.feed.open

    def keep_feed(self) -> KeptFeed:
        """From now on the open feed's news waits for ``KeptFeed.release``."""
        assert self.poller.feed is not None, "made with watch_changes=True"
        kept = KeptFeed(self.poller)
        self.poller.feed.watcher = kept
        return kept

    async def close_feed(self) -> None:
        if self._feed is not None:
            self._feed.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._feed

    def count(self, outcome: str) -> float:
        return float(self.metrics.deliveries.labels(outcome)._value.get())

    async def take(self, buckets: Sequence[int]) -> dict[int, int]:
        """Acquire ``buckets`` (as ownership would); returns the tokens held."""
        await self.leases.acquire(buckets)
        self._renewed_at = self.time.monotonic()
        return self.leases.usable()

    async def round(self) -> float:
        """One round, after the renew ownership would have made by now
        (every TTL/3 while any lease is held); returns the poller's delay,
        cut to the next renew."""
        renew_at = self._renewed_at + self.leases.renew_interval
        if self.leases.held and self.time.monotonic() >= renew_at:
            await self.leases.renew()
            self._renewed_at = renew_at = self.time.monotonic()
        delay = await self.poller.run_once()
        # The HTTP calls a round started answer at once here (tasks of the
        # loop); an answer wakes a real poller's sleep, so a round follows.
        for _ in range(3):
            await asyncio.sleep(0)
        if self.poller._answers or self.poller._wake.is_set():
            delay = 0.0  # woken (an answer, the change feed's news): a real sleep ends
        if self.leases.held:
            delay = min(delay, renew_at + self.leases.renew_interval - self.time.monotonic())
        return max(delay, 0.0)

    _renewed_at = float("-inf")

    async def run(self, seconds: float, *, max_rounds: int = 10_000) -> None:
        """Run rounds for ``seconds`` of virtual time, sleeping between them
        exactly as long as each round asks (a hint or lease change would cut
        a real sleep short; these tests make none while it runs)."""
        end = self.time.elapsed + seconds
        for _ in range(max_rounds):
            delay = await self.round()
            left = end - self.time.elapsed
            if left <= 0:
                return
            self.time.advance(min(delay, left))
        raise AssertionError(f"{max_rounds} rounds without {seconds} s passing: a busy loop")

    async def run_until(
        self, done: Callable[[], bool], within: float, *, max_rounds: int = 10_000
    ) -> float:
        """Run rounds until ``done()``; returns the virtual seconds it took.
        Fails if ``within`` virtual seconds pass first."""
        began = self.time.elapsed
        for _ in range(max_rounds):
            if done():
                return self.time.elapsed - began
            delay = await self.round()
            if self.time.elapsed - began >= within:
                break
            self.time.advance(delay)
        raise AssertionError(f"not done within {within} virtual seconds")
