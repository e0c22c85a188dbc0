"""What is due in a node's buckets, for the metrics (node/delivery/due_outlook.py):
from the poller's views (node/delivery/due_book.py), and where a view is
truncated, from the store's count, bounded and cached. In virtual time, on
the memory store."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from node.delivery import due_outlook
from node.delivery.due_book import DueBook
from node.delivery.due_outlook import COUNT_BUCKETS, COUNT_EVERY, Counted, DueOutlook, figures
from node.errors import StoreUnavailable
from node.metrics import DueFigures
from node.schedule.record import Record
from node.store.memory import MemoryLeases, MemorySchedules
from tests.virtual import Owner, VirtualTime, schedule

T0 = datetime(2030, 1, 1, tzinfo=UTC)
REFRESH = 1.0


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def doc(schedule_id: str, bucket: int, due: float) -> dict[str, Any]:
    return {"_id": schedule_id, "bucket": bucket, "dueAt": at(due)}


class Pending:
    """PENDING schedules by bucket, answering the book's reads as the store would."""

    def __init__(self, docs: list[dict[str, Any]]) -> None:
        self.docs = docs

    def read(self, book: DueBook, now: float) -> None:
        for read in book.reads(at(now), now, lookahead=REFRESH):
            found = sorted(
                (d for d in self.docs if d["bucket"] == read.bucket and d["dueAt"] <= read.until),
                key=lambda d: d["dueAt"],
            )
            book.learned(read, found[: read.limit], now)


class Clock:
    def __init__(self) -> None:
        self.monotonic = 0.0

    def __call__(self) -> float:
        return self.monotonic


class Counts:
    """A store's ``due_backlog`` over fixed counts, recording what it was asked."""

    def __init__(self, counts: Mapping[int, int]) -> None:
        self.counts = dict(counts)
        self.asked: list[int] = []
        self.fail = False
        self.hang_after: int | None = None  # buckets answered before the store hangs

    async def __call__(
        self, buckets: Collection[int], now: datetime, limit: int = 0
    ) -> dict[int, int]:
        if self.fail:
            raise StoreUnavailable("injected")
        if self.hang_after is not None and len(self.asked) >= self.hang_after:
            await asyncio.Event().wait()
        self.asked.extend(buckets)
        return {b: min(self.counts[b], limit) for b in buckets if self.counts.get(b)}


# -- the figures, from the views ---------------------------------------------------


def test_the_backlog_and_its_oldest_age_are_what_the_views_hold_due() -> None:
    book = DueBook(refresh=REFRESH, budget=100)
    book.sync({0: 1, 1: 1})
    pending = Pending(
        [doc("a", 0, -5.0), doc("b", 0, -2.0), doc("c", 0, 0.5), doc("d", 1, -1.0), doc("e", 1, 30)]
    )
    pending.read(book, 0.0)
    tokens = {0: 1, 1: 1}
    now = figures(book.outlook(tokens, at(0.0)), {}, at(0.0))
    assert (now.backlog, now.oldest_age) == (3, 5.0)
    # Time passes, no read: c falls due, and the oldest waits longer.
    later = figures(book.outlook(tokens, at(0.6)), {}, at(0.6))
    assert (later.backlog, later.oldest_age) == (4, 5.6)
    book.taken([pending.docs[0], pending.docs[3]])  # a and d were claimed
    taken = figures(book.outlook(tokens, at(0.6)), {}, at(0.6))
    assert (taken.backlog, taken.oldest_age) == (2, 2.6)


def test_nothing_due_is_a_backlog_of_0_and_an_age_of_0() -> None:
    book = DueBook(refresh=REFRESH, budget=100)
    book.sync({0: 1})
    Pending([doc("a", 0, 0.5)]).read(book, 0.0)
    nothing = figures(book.outlook({0: 1}, at(0.0)), {}, at(0.0))
    assert (nothing.backlog, nothing.oldest_age, nothing.within[60]) == (0, 0.0, 1)
    assert figures({}, {}, at(0.0)) == DueFigures(0, 0.0, {60: 0, 300: 0, 3600: 0})


def test_a_truncated_view_counts_at_least_what_it_holds_and_the_stores_count_carried_forward() -> (
    None
):
    book = DueBook(refresh=REFRESH, budget=4, min_read=4)
    book.sync({0: 1})
    pending = Pending([doc(f"s{i}", 0, -10.0 + i) for i in range(10)])
    pending.read(book, 0.0)
    [outlook] = book.outlook({0: 1}, at(0.0)).values()
    assert outlook.truncated and len(outlook.due_times) == 4
    assert figures(book.outlook({0: 1}, at(0.0)), {}, at(0.0)).backlog == 4  # a lower bound
    counted = {0: Counted(token=1, count=10, taken=0, at=0.0)}
    exact = figures(book.outlook({0: 1}, at(0.0)), counted, at(0.0))
    assert (exact.backlog, exact.oldest_age) == (10, 10.0)  # the view holds the earliest
    book.taken(pending.docs[:3])  # three delivered since the count
    assert figures(book.outlook({0: 1}, at(0.0)), counted, at(0.0)).backlog == 7
    # A count under another token (the bucket lost and taken again since)
    # says nothing of this lease's bucket.
    stale = {0: Counted(token=0, count=10, taken=0, at=0.0)}
    assert figures(book.outlook({0: 1}, at(0.0)), stale, at(0.0)).backlog == 1


def test_a_full_view_whose_last_schedule_is_due_later_holds_all_that_is_due() -> None:
    book = DueBook(refresh=REFRESH, budget=4, min_read=4)
    book.sync({0: 1})
    Pending([doc(f"s{i}", 0, -0.45 + i * 0.3) for i in range(10)]).read(book, 0.0)
    outlooks = book.outlook({0: 1}, at(0.0))
    assert len(outlooks[0].due_times) == 4 and not outlooks[0].truncated
    counted = {0: Counted(token=1, count=99, taken=0, at=0.0)}  # not asked for: not used
    assert figures(outlooks, counted, at(0.0)).backlog == 2  # s2 and s3 are due later
    assert figures(book.outlook({0: 1}, at(0.5)), counted, at(0.5)).backlog == 99


def test_a_bucket_lost_or_taken_again_stops_counting_at_once() -> None:
    book = DueBook(refresh=REFRESH, budget=100)
    book.sync({0: 1, 1: 1})
    Pending([doc("a", 0, -5.0), doc("b", 1, -1.0)]).read(book, 0.0)
    # The leases say so before the poller's next round follows them.
    assert figures(book.outlook({1: 1}, at(0.0)), {}, at(0.0)).backlog == 1
    assert figures(book.outlook({0: 2, 1: 1}, at(0.0)), {}, at(0.0)).oldest_age == 1.0


def test_the_forecast_is_what_the_views_hold_falling_due_within_each_window() -> None:
    book = DueBook(refresh=REFRESH, budget=100)
    book.watch(True)  # the change feed open: a read looks a minute ahead
    book.sync({0: 1, 1: 1})
    held = [doc("due", 0, -1.0), doc("a", 0, 10.0), doc("b", 0, 59.0), doc("c", 1, 60.0)]
    unread = [doc("d", 1, 61.0), doc("e", 1, 250.0)]  # past the reads' bound
    Pending([*held, *unread]).read(book, 0.0)
    tokens = {0: 1, 1: 1}
    assert figures(book.outlook(tokens, at(0.0)), {}, at(0.0)).within == {
        60: 3,
        300: 3,  # a lower bound: d and e are not read yet
        3600: 3,
    }
    # Half a minute on, a and b are due: the backlog's, not the forecast's.
    later = figures(book.outlook(tokens, at(59.0)), {}, at(59.0))
    assert (later.backlog, later.within) == (3, {60: 1, 300: 1, 3600: 1})
    assert figures(book.outlook({1: 1}, at(0.0)), {}, at(0.0)).within[60] == 1  # 0 lost


def test_a_truncated_views_forecast_is_what_it_holds() -> None:
    book = DueBook(refresh=REFRESH, budget=4, min_read=4)
    book.sync({0: 1})
    Pending([doc(f"s{i}", 0, -10.0 + i) for i in range(10)] + [doc("soon", 0, 0.5)]).read(book, 0.0)
    counted = {0: Counted(token=1, count=10, taken=0, at=0.0)}
    assert figures(book.outlook({0: 1}, at(0.0)), counted, at(0.0)).within == {
        60: 0,  # "soon" waits unread behind the backlog: a lower bound
        300: 0,
        3600: 0,
    }


# -- the store's count: only for truncated views, bounded and cached --------------


def truncated_book(buckets: int) -> DueBook:
    """Every bucket's view full of due work, a backlog behind each."""
    book = DueBook(refresh=REFRESH, budget=4 * buckets, min_read=4)
    book.sync(dict.fromkeys(range(buckets), 1))
    Pending([doc(f"s{b}.{i}", b, -10.0 + i) for b in range(buckets) for i in range(6)]).read(
        book, 0.0
    )
    return book


async def test_views_holding_all_that_is_due_cost_the_store_no_count() -> None:
    book = DueBook(refresh=REFRESH, budget=100)
    book.sync({0: 1, 1: 1})
    Pending([doc("a", 0, -5.0), doc("b", 1, 3600.0)]).read(book, 0.0)
    clock, counts = Clock(), Counts({0: 1})
    due = DueOutlook(book, lambda: {0: 1, 1: 1}, lambda: at(0.0), counts, monotonic=clock)
    for _ in range(10):
        await due.refresh()
        clock.monotonic += COUNT_EVERY
    assert counts.asked == []
    assert due.figures().backlog == 1


async def test_truncated_buckets_are_counted_once_a_period_at_most_the_stalest_first() -> None:
    buckets = COUNT_BUCKETS + 8
    book = truncated_book(buckets)
    clock, counts = Clock(), Counts(dict.fromkeys(range(buckets), 50))
    tokens = dict.fromkeys(range(buckets), 1)
    due = DueOutlook(book, lambda: tokens, lambda: at(0.0), counts, monotonic=clock)
    assert due.figures().backlog == 4 * buckets  # the views: a lower bound
    await due.refresh()
    assert counts.asked == list(range(COUNT_BUCKETS))
    assert due.figures().backlog == 50 * COUNT_BUCKETS + 4 * 8
    # However often it is scraped, the store is asked once a period.
    clock.monotonic += COUNT_EVERY - 0.001
    await due.refresh()
    assert len(counts.asked) == COUNT_BUCKETS
    clock.monotonic += 0.001
    await due.refresh()
    assert counts.asked[COUNT_BUCKETS:] == [*range(COUNT_BUCKETS, buckets), *range(24)]
    assert due.figures().backlog == 50 * buckets


async def test_a_count_that_fails_leaves_the_views_figure() -> None:
    book = truncated_book(2)
    clock, counts = Clock(), Counts({0: 50, 1: 50})
    due = DueOutlook(book, lambda: {0: 1, 1: 1}, lambda: at(0.0), counts, monotonic=clock)
    counts.fail = True
    await due.refresh()  # the scrape goes on
    assert due.figures().backlog == 8


async def test_a_hung_store_holds_the_scrape_no_longer_than_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(due_outlook, "COUNT_DEADLINE", 0.01)
    book = truncated_book(3)
    counts = Counts({0: 50, 1: 50, 2: 50})
    counts.hang_after = 1
    due = DueOutlook(book, lambda: dict.fromkeys(range(3), 1), lambda: at(0.0), counts)
    await due.refresh()  # returns: the deadline passed
    assert due.figures().backlog == 50 + 4 + 4  # the count it made, the views for the rest


async def test_a_count_stops_at_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(due_outlook, "COUNT_LIMIT", 20)
    book = truncated_book(1)
    counts = Counts({0: 50})
    due = DueOutlook(book, lambda: {0: 1}, lambda: at(0.0), counts, monotonic=Clock())
    await due.refresh()
    assert due.figures().backlog == 20  # a lower bound past the limit


async def test_a_lost_buckets_count_is_dropped() -> None:
    book = truncated_book(2)
    clock, counts = Clock(), Counts({0: 50, 1: 60})
    tokens = {0: 1, 1: 1}
    due = DueOutlook(book, lambda: tokens, lambda: at(0.0), counts, monotonic=clock)
    await due.refresh()
    assert due.figures().backlog == 110
    del tokens[1]
    assert due.figures().backlog == 50  # at once, before any round or refresh
    clock.monotonic += COUNT_EVERY
    await due.refresh()
    assert set(due.counted) == {0}


# -- with a poller, on the memory store ---------------------------------------------


async def add_due(schedules: MemorySchedules, time: VirtualTime, count: int) -> None:
    for index in range(count):
        new = schedule(f"s{index}", time.wall(), time.wall())
        await schedules.insert(new, time.wall())


async def pending_due(schedules: MemorySchedules, time: VirtualTime) -> int:
    return sum((await schedules.due_backlog([0], time.wall())).values())


async def test_an_outage_backlog_past_the_view_is_counted_and_falls_to_0_as_it_drains(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    owner = Owner("a", time, schedules, leases, batch_size=4)
    await owner.take([0])
    counts: list[float] = []

    async def count(buckets: Collection[int], now: datetime, limit: int) -> dict[int, int]:
        counts.append(time.elapsed)
        return await schedules.due_backlog(buckets, now, limit)

    due = DueOutlook(
        owner.poller.book, owner.leases.usable, time.wall, count, monotonic=time.monotonic
    )
    owner.publisher.down = True
    await add_due(schedules, time, 60)
    await owner.run(30.0)
    views = due.figures()
    assert 0 < views.backlog < 60  # the view holds its share of the budget
    assert views.oldest_age == 30.0
    await due.refresh()
    assert due.figures().backlog == 60
    await owner.run(10.0)
    await due.refresh()
    assert (due.figures().backlog, due.figures().oldest_age) == (60, 40.0)

    owner.publisher.down = False
    began = time.elapsed
    for _ in range(1000):
        await owner.round()
        time.advance(0.1)
        await due.refresh()
        # Carried forward by what was delivered since its count: exact here
        # (nothing was stored since, nothing put back).
        assert due.figures().backlog == await pending_due(schedules, time)
        if not owner.publisher.down and len(owner.publisher.records) == 60:
            break
    assert (due.figures().backlog, due.figures().oldest_age) == (0, 0.0)
    # One count a period at most, while the view was truncated.
    assert counts[:2] == [30.0, 40.0]
    assert len(counts) <= 2 + (time.elapsed - began) / COUNT_EVERY + 1


async def test_claims_being_delivered_are_due_and_not_delivered_yet(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    owner = Owner("a", time, schedules, leases)
    await owner.take([0])
    due = DueOutlook(
        owner.poller.book, owner.leases.usable, time.wall, in_flight=owner.poller.in_flight
    )
    await add_due(schedules, time, 5)
    time.advance(2.0)
    seen: list[tuple[int, float]] = []

    async def during(records: Sequence[Record]) -> None:
        figures = due.figures()
        seen.append((figures.backlog, figures.oldest_age))

    owner.publisher.during = during
    await owner.run_until(lambda: len(owner.publisher.records) == 5, within=5.0)
    assert seen == [(5, 2.0)]  # claimed and being published: still waiting
    assert (due.figures().backlog, due.figures().oldest_age) == (0, 0.0)


async def test_a_quiet_owners_figures_cost_the_store_nothing(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    owner = Owner("a", time, schedules, leases, watch_changes=True)
    await owner.take([0])
    await owner.open_feed()
    try:
        new = schedule("later", time.at(3600.0), time.wall())
        await schedules.insert(new, time.wall())
        due = DueOutlook(
            owner.poller.book,
            owner.leases.usable,
            time.wall,
            schedules.due_backlog,
            monotonic=time.monotonic,
        )
        await owner.run(5.0)
        before = sum(schedules.calls.values())
        for _ in range(60):  # scraped every second for a minute
            await due.refresh()
            assert (due.figures().backlog, due.figures().oldest_age) == (0, 0.0)
            await owner.run(1.0)
        assert schedules.calls["due_backlog"] == 0
        # What the store was asked meanwhile is the owner's own: no more
        # than an unscraped minute of it.
        asked = sum(schedules.calls.values()) - before
        await owner.run(60.0)
        assert asked == sum(schedules.calls.values()) - before - asked
        # A quiet view is read just before its next due time: the forecast
        # sees the schedule from then (a lower bound before).
        assert due.figures().within == {60: 0, 300: 0, 3600: 0}
        await owner.run(3600.0 - 0.5 - time.elapsed)
        assert due.figures().within == {60: 1, 300: 1, 3600: 1}
    finally:
        await owner.close_feed()


async def test_a_lost_lease_stops_its_bucket_counting_before_the_next_round(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    owner = Owner("a", time, schedules, leases, batch_size=4)
    await owner.take([0])
    due = DueOutlook(owner.poller.book, owner.leases.usable, time.wall, schedules.due_backlog)
    owner.publisher.down = True
    await add_due(schedules, time, 30)
    await owner.run(5.0)
    await due.refresh()
    assert due.figures().backlog == 30
    owner.leases.suspend([0])  # handed over: no new work under it from now
    assert (due.figures().backlog, due.figures().oldest_age) == (0, 0.0)
