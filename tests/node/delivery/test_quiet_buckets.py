"""Quiet buckets (``node/delivery/due_feed.py``, ``due_book.py``): with the
store's change feed open, a bucket with nothing due costs the store no read
until its next due time, and whatever makes work due sooner (a schedule
stored by another node, whose hint is lost; a retry; a resume) is still
delivered on time. Without the feed (broken, or a store without one) every
idle bucket is read once a poll interval, and a lost hint costs at most that.
In virtual time on the memory store, whose feed is the twin of MongoDB's
change stream (``tests/node/store/test_store_contract.py`` checks both)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from node.delivery.poller import RECOVERY_SWEEP, SWEEP_RATE, SWEEP_SLICE
from node.schedule import changes
from node.schedule.changes import Change
from node.store.memory import MemoryLeases, MemorySchedules
from tests.virtual import Owner, VirtualTime, header, schedule

BUCKETS = 64
DAY = 86400.0


@pytest.fixture
def buckets() -> int:
    return BUCKETS


async def add(schedules: MemorySchedules, time: VirtualTime, schedule_id: str, in_s: float) -> Any:
    """Store a schedule due ``in_s`` seconds from now, as another node's API
    would: no hint reaches the owner."""
    due = time.at(time.elapsed + in_s)
    doc, _ = await schedules.insert(schedule(schedule_id, due, time.wall()), time.wall())
    return doc


@pytest.fixture
async def owner(time: VirtualTime, schedules: MemorySchedules) -> AsyncIterator[Owner]:
    """One node holding every bucket, following the change feed; a year of
    work stored days ahead in every bucket."""
    for n in range(4 * BUCKETS):
        await add(schedules, time, f"later-{n}", DAY * (1 + n % 30))
    node = Owner("a", time, schedules, MemoryLeases("", time.wall), watch_changes=True)
    await node.take(range(BUCKETS))
    await node.open_feed()
    yield node
    await node.close_feed()


def reads(schedules: MemorySchedules) -> int:
    return schedules.calls["find_due"] + schedules.calls["next_due"]


def reads_by_bucket(schedules: MemorySchedules, monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """From now on, the store's reads (a due read, a peek) of each bucket."""
    counted: Counter[int] = Counter()
    for name in ("find_due", "next_due"):
        read = getattr(schedules, name)

        async def counting(bucket: int, *args: Any, _read: Any = read, **kwargs: Any) -> Any:
            counted[bucket] += 1
            return await _read(bucket, *args, **kwargs)

        monkeypatch.setattr(schedules, name, counting)
    return counted


def lateness(node: Owner, schedule_id: str, due: Any) -> float:
    [at] = [
        at
        for record, at in zip(node.publisher.records, node.publisher.published_at, strict=True)
        if header(record, "schedule-id") == schedule_id
    ]
    return (at - due).total_seconds()


async def test_a_bucket_with_nothing_due_is_not_read_again(
    time: VirtualTime, schedules: MemorySchedules, owner: Owner
) -> None:
    await owner.run(2.0)  # every bucket read once (gained, then the feed opened)
    first = reads(schedules)
    assert first > 0
    await owner.run(600.0)
    assert reads(schedules) == first
    # The same cluster polling (no feed) reads every bucket once a second.
    polling = Owner("p", time, schedules, MemoryLeases("", time.wall))
    await polling.take(range(BUCKETS))
    await polling.run(2.0)
    before = reads(schedules)
    await polling.run(60.0)
    assert reads(schedules) - before >= 59 * BUCKETS


async def test_the_in_flight_sweep_searches_every_bucket_in_turn_at_a_rate_fixed_per_node(
    schedules: MemorySchedules, owner: Owner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What an idle node still asks per bucket: the search for claims left
    in flight. It goes round the held buckets in turn at SWEEP_RATE a second
    at most, so its cost per node is the same at 64 buckets or 4,096."""
    await owner.run(2.0)  # the buckets gained were searched as gained
    searched: list[int] = []
    recover = schedules.recover_in_flight

    async def counted(tokens: Any, stranded_before: Any = None) -> list[str]:
        searched.extend(tokens)
        return await recover(tokens, stranded_before)

    monkeypatch.setattr(schedules, "recover_in_flight", counted)
    seconds = 300.0
    await owner.run(seconds)
    rate = min(SWEEP_RATE, BUCKETS / RECOVERY_SWEEP)
    assert len(searched) <= rate * seconds + SWEEP_SLICE
    # Round the buckets in turn: each as often as any other, give or take one.
    per_bucket = Counter(searched)
    assert set(per_bucket) == set(range(BUCKETS))
    assert max(per_bucket.values()) - min(per_bucket.values()) <= 1
    assert min(per_bucket.values()) >= int(rate * seconds / BUCKETS) - 1


async def test_a_schedule_stored_before_the_feed_opened_is_read_at_its_due_time(
    time: VirtualTime, schedules: MemorySchedules, owner: Owner
) -> None:
    """What was stored before is known from the read's peek: its next due
    time, the only time the view is read again. What is stored later, due
    within the view's bound (a minute ahead) but not soon, brings the bound
    down to it: read a refresh before it is due, not when told."""
    await owner.run(2.0)
    first = reads(schedules)
    doc = await add(schedules, time, "soon", 40.0)  # told by the feed: not a read
    await owner.run(30.0)
    assert reads(schedules) == first
    await owner.run(15.0)
    assert lateness(owner, "soon", doc["dueAt"]) == 0.0
    # Its bucket only: the read that found it, a refresh that found nothing
    # more, and the peek after that (quiet again).
    assert reads(schedules) - first <= 3


async def test_a_schedule_whose_hint_is_lost_is_delivered_on_time(
    time: VirtualTime, schedules: MemorySchedules, owner: Owner
) -> None:
    """Another node stored it due at once and its hint never came: the feed
    told."""
    await owner.run(5.0)
    doc = await add(schedules, time, "now", 0.0)
    await owner.run(1.0)
    assert lateness(owner, "now", doc["dueAt"]) == 0.0


async def test_without_the_feed_a_lost_hint_costs_at_most_a_poll_interval(
    time: VirtualTime, schedules: MemorySchedules, owner: Owner
) -> None:
    """The feed breaks (a store restart) and cannot be opened again for a
    while: every bucket is polled meanwhile. Once a feed opens afresh, every
    view is read once (what was written in between was not told), then
    quiet again."""
    await owner.run(5.0)
    schedules.fail("watch_due", times=3)
    schedules.documents.break_feeds()  # resumed after 1 s, and refused: lost
    await owner.run(1.5)
    assert owner.poller.feed is not None and not owner.poller.feed.open
    doc = await add(schedules, time, "lost", 0.0)
    await owner.run(2.0)
    assert 0.0 < lateness(owner, "lost", doc["dueAt"]) <= 1.0  # POLL_INTERVAL
    await owner.run(20.0)  # back-off 2, 4, 8 s, then a feed from now
    assert owner.poller.feed.open
    settled = reads(schedules)
    await owner.run(120.0)
    assert reads(schedules) == settled


async def test_a_retry_and_a_resume_go_out_on_time_from_a_quiet_bucket(
    time: VirtualTime, schedules: MemorySchedules, owner: Owner
) -> None:
    await owner.run(5.0)
    owner.publisher.refuse["flaky"] = 1
    flaky = await add(schedules, time, "flaky", 10.0)
    held = await add(schedules, time, "held", 10.0)
    await schedules.change("held", lambda d: changes.pause(d, time.wall()), time.wall())
    await owner.run(20.0)
    assert [header(r, "schedule-id") for r in owner.publisher.records] == ["flaky"]
    assert header(owner.publisher.records[0], "attempt") == "2"  # the retry, from the feed
    assert lateness(owner, "flaky", flaky["dueAt"]) > 0
    await schedules.change("held", lambda d: changes.resume(d, time.wall()), time.wall())
    await owner.run(1.0)  # no hint: the feed tells of the resume
    # Due 10 s before its resume: out at the resume, not a poll interval later.
    assert lateness(owner, "held", held["dueAt"]) == pytest.approx(10.0, abs=0.01)


async def test_the_owners_own_retry_is_read_once_though_the_feed_tells_it_too(
    time: VirtualTime, schedules: MemorySchedules, owner: Owner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner writes a retry back to PENDING and tells its book itself: its
    bucket is read once. The feed tells of the same write a getMore later,
    after that read: no news, no second read. A later write of it (the API
    moves it sooner) is news: read, and out at its new due time."""
    await owner.run(5.0)
    feed = owner.keep_feed()
    owner.publisher.refuse["flaky"] = 1
    doc = await add(schedules, time, "flaky", 5.0)
    bucket = int(doc["bucket"])
    await feed.release()  # its insert
    await owner.run_until(lambda: owner.count("retried") == 1, within=10.0)
    reads = reads_by_bucket(schedules, monkeypatch)
    await owner.run(0.1)  # the read the owner's own hint asked for
    assert reads[bucket] == 1
    echo = await feed.release()
    assert [(c.schedule_id, c.inserted) for c in echo] == [("flaky", False)]
    await owner.run(0.1)
    assert reads[bucket] == 1  # the echo cost no read
    retry = await schedules.get("flaky")
    assert retry is not None and retry["dueAt"] > time.at(time.elapsed + 0.2)
    sooner = time.at(time.elapsed + 0.1)  # the API moves it (a PATCH)
    moved = Change({"dueAt": sooner, "executeAt": sooner}, due_at=sooner)
    await schedules.change("flaky", lambda d: moved, time.wall())
    assert [c.due_at for c in await feed.release()] == [sooner]
    await owner.run(1.0)
    assert reads[bucket] == 2
    assert lateness(owner, "flaky", sooner) == 0.0
