"""The bucket poller (``node/delivery/poller.py``) in virtual time, on the
memory store: when a schedule goes out, what a lost or late lease stops,
what a failed publish or a store error leaves, and for whom a backlog
waits. Every test runs its virtual minutes in milliseconds; nothing sleeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from node.errors import StoreUnavailable
from node.schedule import changes
from node.schedule.record import Record
from node.store.contract import Claimed
from node.store.memory import MemoryLeases, MemorySchedules
from tests.virtual import Owner, VirtualTime, header, schedule


@pytest.fixture
async def a(time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases) -> Owner:
    """Node "a", owner of bucket 0 (where every schedule here lands)."""
    owner = Owner("a", time, schedules, leases)
    await owner.take([0])
    return owner


async def add(
    schedules: MemorySchedules, time: VirtualTime, schedule_id: str, in_s: float, **fields: Any
) -> None:
    """Store a schedule due ``in_s`` seconds from now (virtual)."""
    due = time.at(time.elapsed + in_s)
    await schedules.insert(schedule(schedule_id, due, time.wall(), **fields), time.wall())


async def status(schedules: MemorySchedules, schedule_id: str) -> dict[str, Any]:
    doc = await schedules.get(schedule_id)
    assert doc is not None
    return doc


async def test_a_due_schedule_is_delivered_at_its_time_and_not_before(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    owner = Owner("a", time, schedules, leases)
    await owner.take([0])
    await add(schedules, time, "s1", 5.0)
    await owner.run(4.999)
    assert owner.publisher.records == []  # not a millisecond early
    took = await owner.run_until(lambda: bool(owner.publisher.records), within=2.0)
    assert owner.publisher.published_at == [time.at(5.0)]  # and not late: it slept until then
    assert took <= 0.001
    doc = await status(schedules, "s1")
    assert (doc["status"], doc["deliveredAt"], doc["attempts"]) == ("DELIVERED", time.at(5.0), 1)


async def test_a_claim_lost_to_a_newer_token_publishes_nothing(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    """A newer owner (a view change ``a`` has not seen) claimed these and put
    them back: PENDING, at a newer token. ``a``'s lease still looks good to
    it, it reads them and claims: the token fence alone refuses it."""
    a = Owner("a", time, schedules, leases)
    await a.take([0])
    for i in range(3):
        await add(schedules, time, f"s{i}", 0.0)
    newer = a.leases.usable()[0] + 1
    due = await schedules.find_due(0, time.wall(), 10)
    assert await schedules.unclaim(await schedules.claim(due, {0: newer}, "b", time.wall())) == 3
    await a.poller.run_once()
    assert a.publisher.records == []
    docs = [await status(schedules, f"s{i}") for i in range(3)]
    assert {(d["status"], d["token"]) for d in docs} == {("PENDING", newer)}


async def test_a_completion_after_a_newer_owners_claim_writes_nothing(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    a = Owner("a", time, schedules, leases)
    [token] = (await a.take([0])).values()
    for i in range(2):
        await add(schedules, time, f"s{i}", 0.0)
    newer: list[Claimed] = []

    async def overtaken(records: Sequence[Record]) -> None:
        # While a publishes, the newer owner recovers the batch and claims it.
        await schedules.recover_in_flight({0: token + 1})
        due = await schedules.find_due(0, time.wall(), 10)
        newer.extend(await schedules.claim(due, {0: token + 1}, "b", time.wall()))

    a.publisher.during = overtaken
    await a.poller.run_once()
    assert len(newer) == 2 and a.count("fenced") == 2
    docs = [await status(schedules, f"s{i}") for i in range(2)]
    assert {(d["status"], d["token"], d["owner"]) for d in docs} == {("IN_FLIGHT", token + 1, "b")}


async def test_a_lease_taken_over_mid_batch_gets_no_completion_written(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    """``a`` freezes while publishing; ``b`` takes the bucket over, recovers
    ``a``'s batch and delivers it. ``a``'s completions then match nothing:
    its records are the only duplicates, each explained by a token change."""
    a, b = (
        Owner("a", time, schedules, leases, ttl=6.0),
        Owner("b", time, schedules, leases, ttl=6.0),
    )
    [token_a] = (await a.take([0])).values()
    for i in range(4):
        await add(schedules, time, f"s{i}", 0.0)

    async def frozen(records: Sequence[Record]) -> None:
        time.advance(10.0)  # past a's lease, on the schedules's clock too
        assert await b.take([0])
        await b.run_until(lambda: len(b.publisher.records) == 4, within=5.0)

    a.publisher.during = frozen
    await a.poller.run_once()
    docs = [await status(schedules, f"s{i}") for i in range(4)]
    assert {(d["status"], d["token"], d["owner"]) for d in docs} == {
        ("DELIVERED", token_a + 1, "b")
    }
    assert a.count("fenced") == 4 and a.count("delivered") == 0
    assert b.metrics.recovered._value.get() == 4
    assert {header(r, "fence-token") for r in a.publisher.records} == {str(token_a)}
    assert {header(r, "fence-token") for r in b.publisher.records} == {str(token_a + 1)}


async def test_a_claim_outliving_the_local_deadline_publishes_nothing_and_puts_back(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    """The claim's answer comes back after the lease's local deadline: the
    batch is not published (another owner may hold it now), and it is put
    back under its token so that nothing stays IN_FLIGHT."""
    a = Owner("a", time, schedules, leases, ttl=6.0)
    await a.take([0])
    await add(schedules, time, "s1", 0.0)
    claim = schedules.claim

    async def slow(*args: Any) -> list[Claimed]:
        claimed = await claim(*args)
        time.advance(6.0)  # the schedules answered after the whole term
        return claimed

    schedules.claim = slow  # type: ignore[method-assign]
    await a.poller.run_once()
    assert a.publisher.records == [] and a.count("abandoned") == 1
    schedules.claim = claim  # type: ignore[method-assign]
    await a.take([0])  # ownership takes the bucket again, under a new token
    await a.run_until(lambda: bool(a.publisher.records), within=5.0)
    doc = await status(schedules, "s1")
    assert (doc["status"], doc["attempts"]) == ("DELIVERED", 1)  # the lost claim undone


async def test_a_late_renew_stops_work_until_the_bucket_is_taken_again(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    a = Owner("a", time, schedules, leases, ttl=6.0)
    [token] = (await a.take([0])).values()
    time.advance(6.0 - a.leases.margin(6.0))  # no renew reached the schedules meanwhile
    await add(schedules, time, "s1", 0.0)
    await a.poller.run_once()
    assert a.publisher.records == []  # the local deadline passed: no work
    assert await a.leases.renew() == []  # too late: the lease counts as lost here
    assert a.leases.losses == 1
    assert await a.take([0]) == {0: token + 1}
    await a.run_until(lambda: bool(a.publisher.records), within=2.0)
    assert header(a.publisher.records[0], "fence-token") == str(token + 1)


async def test_in_flight_work_of_a_dead_owner_and_our_own_stranded_claims_are_recovered(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    for i in range(3):
        await add(schedules, time, f"s{i}", 0.0)
    dead = Owner("dead", time, schedules, leases, ttl=6.0)
    await dead.take([0])
    due = await schedules.find_due(0, time.wall(), 10)
    assert len(await schedules.claim(due[:2], dead.leases.usable(), "dead", time.wall())) == 2
    time.advance(7.0)  # dead never renews: its lease expires by the schedules's clock
    a = Owner("a", time, schedules, leases)
    await a.take([0])
    await a.run_until(lambda: len(a.publisher.records) == 3, within=5.0)
    assert a.metrics.recovered._value.get() == 2
    assert [(await status(schedules, f"s{i}")).get("recovered") for i in range(3)] == [
        True, True, None,
    ]  # fmt: skip
    # A claim of our own that no round holds (its answer lost, applied late):
    # the sweep takes it once it is older than the longest round.
    await add(schedules, time, "mine", 0.0)
    [doc] = await schedules.find_due(0, time.wall(), 10)
    await schedules.claim([doc], a.leases.usable(), "a", time.wall())
    await a.run(a.poller.stranded_after.total_seconds() - 1)
    assert (await status(schedules, "mine"))["status"] == "IN_FLIGHT"  # a round's, for all we know
    await a.run_until(lambda: len(a.publisher.records) == 4, within=60.0)
    assert a.publisher.ids()[-1] == "mine"


async def test_a_refused_record_is_retried_after_its_backoff_then_delivered(
    time: VirtualTime, schedules: MemorySchedules, a: Owner
) -> None:
    await add(schedules, time, "flaky", 0.0)
    a.publisher.refuse["flaky"] = 2
    await a.poller.run_once()
    first = await status(schedules, "flaky")
    assert (first["status"], first["attempts"], first["lastError"]) == (
        "PENDING", 1, "MessageSizeTooLargeError",
    )  # fmt: skip
    # Backoff 1 s, jittered down to half at most: not before, and then it goes.
    retry_at = first["dueAt"]
    assert time.at(0.5) <= retry_at <= time.at(1.0)
    await a.run((retry_at - time.wall()).total_seconds() - 0.001)
    assert (await status(schedules, "flaky"))["attempts"] == 1
    await a.run_until(lambda: bool(a.publisher.records), within=10.0)
    done = await status(schedules, "flaky")
    assert (done["status"], done["attempts"]) == ("DELIVERED", 3)
    assert header(a.publisher.records[0], "attempt") == "3"
    assert a.count("retried") == 2


async def test_exhausted_retries_fail_the_schedule_and_dead_letter_it(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    a = Owner("a", time, schedules, leases, dead_letter_topic="dlq")
    await a.take([0])
    await add(schedules, time, "doomed", 0.0, retry={"maxAttempts": 2})
    a.publisher.refuse["doomed"] = 2  # both attempts on the topic; the dead letter goes
    await a.run(10.0)
    doc = await status(schedules, "doomed")
    assert (doc["status"], doc["attempts"]) == ("DELIVERY_FAILED", 2)
    assert doc["expireAt"] > time.wall()
    assert [r.topic for r in a.publisher.records] == ["dlq"]
    assert header(a.publisher.records[0], "original-topic") == "t"


async def test_a_recurring_schedule_is_delivered_at_every_occurrence(
    time: VirtualTime, schedules: MemorySchedules, a: Owner
) -> None:
    start = time.at(10.0)
    await add(
        schedules, time, "tick", 0.0, recurrence={"every": "PT10S", "start": start.isoformat()}
    )
    await a.run(40.5)
    assert a.publisher.published_at == [time.at(s) for s in (10.0, 20.0, 30.0, 40.0)]
    doc = await status(schedules, "tick")
    assert (doc["status"], doc["occurrences"], doc["dueAt"]) == ("PENDING", 4, time.at(50.0))


async def test_a_small_tenant_is_not_stuck_behind_a_big_ones_backlog(
    time: VirtualTime, leases: MemoryLeases
) -> None:
    schedules = MemorySchedules(8, time.wall)  # eight buckets: the views fill

    async def tenants() -> list[str]:
        return ["big", "small"]

    async def backlog(store: MemorySchedules) -> None:
        for i in range(200):  # due first, all of them
            await add(store, time, f"b{i}", -60.0, tenant="big")
        for i in range(3):
            await add(store, time, f"s{i}", -1.0, tenant="small")

    a = Owner("a", time, schedules, leases, batch_size=10, tenant_names=tenants)
    await a.take(range(8))
    await backlog(schedules)
    await a.poller.run_once()
    first = list(a.publisher.records)
    assert len(first) == 10
    assert sum(header(r, "tenant") == "small" for r in first) == 3  # served in the first batch
    # Without fairness the same backlog is plain oldest first.
    alone = MemorySchedules(8, time.wall)
    plain = Owner("p", time, alone, MemoryLeases("", time.wall))
    await plain.take(range(8))
    await backlog(alone)
    await plain.poller.run_once()
    assert all(header(r, "tenant") == "big" for r in plain.publisher.records)


async def test_paused_and_cancelled_schedules_are_never_delivered(
    time: VirtualTime, schedules: MemorySchedules, a: Owner
) -> None:
    for schedule_id in ("kept", "paused", "cancelled"):
        await add(schedules, time, schedule_id, 2.0)
    await schedules.change("paused", lambda d: changes.pause(d, time.wall()), time.wall())
    await schedules.cancel("cancelled", time.wall())
    await a.run(60.0)
    assert a.publisher.ids() == ["kept"]
    await schedules.change("paused", lambda d: changes.resume(d, time.wall()), time.wall())
    a.poller.hint(0, time.wall())  # as the API wakes the owner
    await a.run(1.0)
    assert a.publisher.ids() == ["kept", "paused"]
    assert (await status(schedules, "cancelled"))["status"] == "CANCELLED"


async def test_a_broker_outage_delays_delivery_and_spends_no_attempt(
    time: VirtualTime, schedules: MemorySchedules, a: Owner
) -> None:
    await add(schedules, time, "s1", 0.0)
    a.publisher.down = True
    await a.run(30.0)
    doc = await status(schedules, "s1")
    assert (doc["status"], doc["attempts"]) == ("PENDING", 0)
    claims = schedules.calls["claim"]
    await a.run(5.0)
    assert schedules.calls["claim"] == claims  # claiming paused while it is down
    a.publisher.down = False
    await a.run_until(lambda: bool(a.publisher.records), within=11.0)  # the longest backoff
    assert header(a.publisher.records[0], "attempt") == "1"


async def test_a_publish_that_raises_puts_the_batch_back_to_go_again(
    time: VirtualTime, schedules: MemorySchedules, a: Owner
) -> None:
    await add(schedules, time, "s1", 0.0)
    a.publisher.raises = RuntimeError("producer gone")
    with pytest.raises(RuntimeError):
        await a.poller.run_once()
    await a.run_until(lambda: bool(a.publisher.records), within=2.0)
    doc = await status(schedules, "s1")
    assert (doc["status"], doc["attempts"]) == ("DELIVERED", 1)


@pytest.mark.parametrize("applied", [False, True], ids=["refused", "answer-lost"])
async def test_a_store_error_after_publishing_is_settled_next_round_without_a_repeat(
    time: VirtualTime, schedules: MemorySchedules, applied: bool, a: Owner
) -> None:
    for i in range(3):
        await add(schedules, time, f"s{i}", 0.0)
    schedules.fail("complete", applied=applied)
    with pytest.raises(StoreUnavailable):
        await a.poller.run_once()
    assert len(a.publisher.records) == 3
    await a.run(5.0)
    assert sorted(a.publisher.ids()) == ["s0", "s1", "s2"]  # published once each
    assert {(await status(schedules, f"s{i}"))["status"] for i in range(3)} == {"DELIVERED"}


async def test_a_claim_whose_answer_was_lost_is_put_back_and_delivered_once(
    time: VirtualTime, schedules: MemorySchedules, a: Owner
) -> None:
    await add(schedules, time, "s1", 0.0)
    schedules.fail("claim", applied=True)
    with pytest.raises(StoreUnavailable):
        await a.poller.run_once()
    assert (await status(schedules, "s1"))["status"] == "IN_FLIGHT"
    await a.run(2.0)
    assert a.publisher.ids() == ["s1"]
    doc = await status(schedules, "s1")
    assert (doc["status"], doc["attempts"]) == ("DELIVERED", 1)


async def test_a_one_shot_past_its_deadline_expires_unpublished(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    a = Owner("a", time, schedules, leases)
    await add(schedules, time, "brief", 1.0, expireAfter="PT5S")
    await add(schedules, time, "patient", 1.0)
    time.advance(10.0)  # nobody held the bucket until after the deadline
    await a.take([0])
    await a.run(2.0)
    assert a.publisher.ids() == ["patient"]
    doc = await status(schedules, "brief")
    assert (doc["status"], doc["expiredAt"]) == ("EXPIRED", time.at(10.0))
