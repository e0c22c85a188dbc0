"""Priority: a round takes the higher priority first, within each tenant's
turn, and a schedule above the default joins the work in hand at once,
ahead of a backlog that fills its bucket's view (``fairness.py``,
``DueBook.urgent``, ``BucketPoller._read_urgent``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from node.delivery.fairness import fair_order, fair_share
from node.delivery.urgent import Urgent, UrgentWatch
from node.schedule.model import DEFAULT_PRIORITY
from node.store.memory import MemoryLeases, MemorySchedules
from tests.virtual import START, Owner, VirtualTime, header, schedule

LOWS = 200


def doc(sid: str, tenant: str, seconds: float, priority: int = DEFAULT_PRIORITY) -> dict[str, Any]:
    due = START + timedelta(seconds=seconds)
    found: dict[str, Any] = {"_id": sid, "tenant": tenant, "dueAt": due}
    if priority != DEFAULT_PRIORITY:
        found["priority"] = priority
    return found


def test_within_a_tenant_the_higher_priority_goes_first_then_the_older() -> None:
    docs = [doc("a-old", "a", 0), doc("a-new-9", "a", 5, 9), doc("a-mid-7", "a", 3, 7),
            doc("b-old", "b", 1), doc("a-low-0", "a", -9, 0)]  # fmt: skip
    assert [d["_id"] for d in fair_order(docs)] == [
        "a-new-9", "b-old", "a-mid-7", "a-old", "a-low-0",
    ]  # fmt: skip
    # A tenant's urgent work never takes another tenant's turn.
    assert {d["_id"] for d in fair_share(docs, 2)} == {"a-new-9", "b-old"}


async def insert(
    schedules: MemorySchedules, time: VirtualTime, sid: str, at_s: float, priority: int
) -> dict[str, Any]:
    fields = {} if priority == DEFAULT_PRIORITY else {"priority": priority}
    new = schedule(sid, time.at(at_s), time.wall(), **fields)
    stored, _created = await schedules.insert(new, time.wall())
    return stored


@pytest.fixture
async def busy(time: VirtualTime, schedules: MemorySchedules) -> AsyncIterator[Owner]:
    """One node, one bucket, following the change feed; LOWS schedules of
    priority 0 due now (its view holds a few rounds of them) and one round
    taken."""
    for n in range(LOWS):
        await insert(schedules, time, f"low-{n:03}", 0.0, 0)
    node = Owner("a", time, schedules, MemoryLeases("", time.wall), watch_changes=True)
    await node.take([0])
    await node.open_feed()
    await node.round()
    assert len(node.publisher.records) >= 1
    yield node
    await node.close_feed()


def sent(node: Owner) -> list[str]:
    return [header(r, "schedule-id") for r in node.publisher.records]


async def test_one_stored_elsewhere_goes_in_the_next_round_ahead_of_the_backlog(
    busy: Owner, schedules: MemorySchedules, time: VirtualTime
) -> None:
    """Another node stored it: the change feed tells the owner, which reads
    it by id (its full view would hide it behind the backlog)."""
    time.advance(0.001)
    await insert(schedules, time, "urgent", 0.001, 9)
    for _ in range(3):
        await asyncio.sleep(0)  # the feed's news in
    before = len(sent(busy))
    await busy.round()
    assert "urgent" in sent(busy)[before:]
    assert schedules.calls["get"] == 1
    assert len([s for s in sent(busy) if s.startswith("low")]) < LOWS // 2


async def test_one_this_node_stored_goes_in_the_next_round_with_no_read(
    busy: Owner, schedules: MemorySchedules, time: VirtualTime
) -> None:
    time.advance(0.001)
    stored = await insert(schedules, time, "urgent", 0.001, 9)
    busy.poller.accepted(stored)
    before = len(sent(busy))
    await busy.round()
    assert "urgent" in sent(busy)[before:]
    assert schedules.calls["get"] == 0


async def test_at_the_default_priority_it_waits_its_turn(
    busy: Owner, schedules: MemorySchedules, time: VirtualTime
) -> None:
    time.advance(0.001)
    await insert(schedules, time, "normal", 0.001, DEFAULT_PRIORITY)
    for _ in range(3):
        await asyncio.sleep(0)
    await busy.round()
    assert "normal" not in sent(busy)
    assert schedules.calls["get"] == 0


@pytest.mark.parametrize("stored_here", [True, False], ids=["stored-here", "stored-elsewhere"])
async def test_one_stored_ahead_of_its_time_goes_ahead_of_the_backlog_due_with_it(
    time: VirtualTime, schedules: MemorySchedules, stored_here: bool
) -> None:
    """The common case: stored long before it is due, when no view was
    full; at its due time a backlog due a moment before fills the view."""
    node = Owner("a", time, schedules, MemoryLeases("", time.wall), watch_changes=True)
    await node.take([0])
    await node.open_feed()
    try:
        await node.round()
        for n in range(LOWS):
            await insert(schedules, time, f"low-{n:03}", 5.0, 0)
        stored = await insert(schedules, time, "urgent", 5.001, 9)
        if stored_here:
            node.poller.accepted(stored)
        for _ in range(3):
            await asyncio.sleep(0)  # the feed's news in
        await node.run_until(lambda: len(sent(node)) > 0, within=10.0)
        time.advance(0.01)
        await node.round()
        assert "urgent" in sent(node)
        assert len([s for s in sent(node) if s.startswith("low")]) < LOWS // 2
        assert schedules.calls["get"] == (0 if stored_here else 1)
    finally:
        await node.close_feed()


def test_the_watch_keeps_a_bounded_number_and_gives_each_once_when_due() -> None:
    watch = UrgentWatch(tracked=2)
    for n, at in enumerate((5.0, 1.0, 3.0)):
        watch.told(Urgent(f"u{n}", 0, START + timedelta(seconds=at)))
    assert len(watch) == 2  # the third goes in due order
    assert [u.schedule_id for u in watch.due(START + timedelta(seconds=2))] == ["u1"]
    assert watch.due(START + timedelta(seconds=2)) == []
    assert watch.next_due() == START + timedelta(seconds=5)


async def test_a_hosts_bound_takes_its_urgent_call_first(
    time: VirtualTime, schedules: MemorySchedules
) -> None:
    """A host at HTTP_MAX_PER_HOST takes a few calls a round: the urgent one
    among them, not the earliest low ones round after round."""
    node = Owner("a", time, schedules, MemoryLeases("", time.wall), http_per_host=4)
    await node.take([0])
    for n in range(30):  # the view holds them all (and the urgent one)
        new = schedule(f"low-{n:02}", time.at(0.0), time.wall(), http={"url": "https://a.example/x"},
                       priority=0)  # fmt: skip
        await schedules.insert(new, time.wall())
    urgent = schedule("urgent", time.at(0.001), time.wall(), http={"url": "https://a.example/x"},
                      priority=9)  # fmt: skip
    await schedules.insert(urgent, time.wall())
    time.advance(0.01)
    await node.round()
    first = [call.header("schedule-id") for call in node.receiver.calls]
    assert len(first) == 4 and "urgent" in first
