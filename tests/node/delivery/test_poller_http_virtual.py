"""HTTP targets through the bucket poller in virtual time, on the memory
store: a call settled on its own when it answers, a destination's wait
that spends no attempt (up to the outage bound), a refusal that ends at
once with its dead letter, one host's hung calls never holding another's,
and the broker's outage never holding HTTP calls."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from node.delivery.sink import Failed, Trouble
from node.store.memory import MemoryLeases, MemorySchedules
from tests.virtual import Owner, VirtualTime, header, schedule

A = "https://a.example/hook"
B = "https://b.example/hook"


async def owner(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases, **options: Any
) -> Owner:
    node = Owner("a", time, schedules, leases, **options)
    await node.take([0])
    return node


async def add(
    schedules: MemorySchedules, time: VirtualTime, schedule_id: str, in_s: float, url: str = A
) -> None:
    due = time.at(time.elapsed + in_s)
    new = schedule(schedule_id, due, time.wall(), http={"url": url})
    await schedules.insert(new, time.wall())


async def stored(schedules: MemorySchedules, schedule_id: str) -> dict[str, Any]:
    doc = await schedules.get(schedule_id)
    assert doc is not None
    return doc


async def settle_calls() -> None:
    """Let the calls a round started run to their answers (they are tasks)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_call_goes_once_at_its_time_under_the_lease_token(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    a = await owner(time, schedules, leases)
    await add(schedules, time, "s1", 10)
    await a.run(9.5)
    assert a.receiver.calls == []
    await a.run_until(lambda: a.receiver.ids() == ["s1"], within=5)
    await a.run(3)
    call = a.receiver.delivered[0]
    assert time.wall() >= time.at(10)
    assert call.header("fence-token") == str(a.leases.usable()[0])
    assert call.header("attempt") == "1"
    assert (await stored(schedules, "s1"))["status"] == "DELIVERED"
    assert len(a.receiver.calls) == 1


async def test_a_retry_keeps_the_webhook_id_and_spends_an_attempt(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    a = await owner(time, schedules, leases)
    a.receiver.answers["a.example"] = [Failed("HTTP 500: boom", Trouble.RETRY)]
    await add(schedules, time, "s1", 0)
    await a.run_until(lambda: a.receiver.ids() == ["s1"], within=30)
    first, second = a.receiver.calls
    assert first.webhook_id == second.webhook_id
    assert [first.header("attempt"), second.header("attempt")] == ["1", "2"]


async def test_waiting_on_retry_after_spends_no_attempt_however_often(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    """Ten 503s with Retry-After: 30 s against a limit of five attempts:
    each waits 30 s, none counts, and the eleventh call is delivered."""
    a = await owner(time, schedules, leases)
    wait = Failed("HTTP 503: busy", Trouble.DESTINATION, wait=30.0)
    a.receiver.answers["a.example"] = [wait] * 10
    await add(schedules, time, "s1", 0)
    await a.run(1)
    doc = await stored(schedules, "s1")
    assert doc["status"] == "PENDING" and doc["attempts"] == 0
    assert doc["dueAt"] >= time.at(30)
    await a.run_until(lambda: a.receiver.ids() == ["s1"], within=400)
    await a.run(2)
    doc = await stored(schedules, "s1")
    assert doc["status"] == "DELIVERED" and doc["attempts"] == 1
    assert len(a.receiver.calls) == 11
    assert a.count("deferred") == 10 and a.count("failed") == 0


async def test_past_the_outage_bound_a_wait_spends_attempts_and_ends(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    a = await owner(time, schedules, leases, outage_bound=timedelta(seconds=60))
    wait = Failed("HTTP 503: down for days", Trouble.DESTINATION, wait=30.0)
    a.receiver.answers["a.example"] = [wait] * 100
    await add(schedules, time, "s1", 0)

    async def failed() -> bool:
        return (await stored(schedules, "s1"))["status"] == "DELIVERY_FAILED"

    for _ in range(100):
        await a.run(10)
        if await failed():
            break
    doc = await stored(schedules, "s1")
    assert doc["status"] == "DELIVERY_FAILED", doc
    assert doc["attempts"] == 5  # RETRY's limit, spent only past the bound
    assert "503" in doc["lastError"]


async def test_a_4xx_fails_at_once_and_goes_to_the_dead_letter_url(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    a = await owner(time, schedules, leases, dead_letter_url="https://dlq.example/in")
    a.receiver.answers["a.example"] = [Failed("HTTP 400: bad order", Trouble.REFUSED)]
    await add(schedules, time, "s1", 0)
    await a.run(3)
    doc = await stored(schedules, "s1")
    assert doc["status"] == "DELIVERY_FAILED" and doc["attempts"] == 1
    assert doc["lastError"] == "HTTP 400: bad order"
    [dead] = a.receiver.delivered
    assert dead.url == "https://dlq.example/in" and dead.trusted
    assert dead.header("original-url") == A and dead.header("error") == "HTTP 400: bad order"
    assert dead.header("schedule-id") == "s1"


async def test_a_refused_http_call_dead_letters_to_the_topic_too(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    a = await owner(time, schedules, leases, dead_letter_topic="dlq")
    a.receiver.answers["a.example"] = [Failed("HTTP 404: gone", Trouble.REFUSED)]
    await add(schedules, time, "s1", 0)
    await a.run(3)
    [record] = a.publisher.records
    assert record.topic == "dlq" and header(record, "original-url") == A
    assert (await stored(schedules, "s1"))["status"] == "DELIVERY_FAILED"


async def test_a_hung_host_holds_no_other_host_and_no_more_than_its_bound(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    """Host a never answers: two calls (its bound) are out, its other
    schedules stay PENDING unclaimed, and host b's are all delivered
    meanwhile, in the rounds they fall due."""
    a = await owner(time, schedules, leases, http_per_host=2)
    a.receiver.hang["a.example"] = asyncio.Event()
    for n in range(5):
        await add(schedules, time, f"a{n}", 0)
    for n in range(3):
        await add(schedules, time, f"b{n}", 1 + n, url=B)
    await a.run(6)
    assert sorted(a.receiver.ids()) == ["b0", "b1", "b2"]
    assert a.receiver.waiting["a.example"] == 2
    statuses = sorted([(await stored(schedules, f"a{n}"))["status"] for n in range(5)])
    assert statuses == ["IN_FLIGHT", "IN_FLIGHT", "PENDING", "PENDING", "PENDING"]

    a.receiver.release("a.example")
    await a.run_until(lambda: len(a.receiver.ids()) == 8, within=30)
    await a.run(2)
    for n in range(5):
        assert (await stored(schedules, f"a{n}"))["status"] == "DELIVERED"


async def test_the_broker_down_holds_records_but_not_calls(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    a = await owner(time, schedules, leases)
    a.publisher.down = True
    await schedules.insert(schedule("k1", time.at(0), time.wall()), time.wall())
    await a.run(1)  # the broker is found down: records wait
    await add(schedules, time, "h1", 1)  # no hint: found by a whole read
    await a.run_until(lambda: a.receiver.ids() == ["h1"], within=30)
    await add(schedules, time, "h2", 1)
    a.poller.hint(0, time.at(time.elapsed + 1))  # as the API tells the owner
    await a.run_until(lambda: a.receiver.ids() == ["h1", "h2"], within=3)
    k1 = await stored(schedules, "k1")
    assert k1["status"] == "PENDING" and k1["attempts"] == 0
    a.publisher.down = False
    await a.run_until(lambda: a.publisher.ids() == ["k1"], within=30)


async def test_records_and_calls_of_one_batch_each_settle(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    a = await owner(time, schedules, leases)
    await schedules.insert(schedule("k1", time.at(1), time.wall()), time.wall())
    await add(schedules, time, "h1", 1)
    await a.run(3)
    assert a.publisher.ids() == ["k1"] and a.receiver.ids() == ["h1"]
    for name in ("k1", "h1"):
        assert (await stored(schedules, name))["status"] == "DELIVERED"


async def test_a_call_still_out_at_stop_is_left_for_the_next_owner(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    """Stopping waits a grace for calls in flight; one that never answers
    stays IN_FLIGHT under the old token, and the next owner re-delivers it."""
    a = await owner(time, schedules, leases, ttl=30.0)
    a.receiver.hang["a.example"] = asyncio.Event()
    await add(schedules, time, "s1", 0)
    await a.run(1)
    assert (await stored(schedules, "s1"))["status"] == "IN_FLIGHT"
    await a.poller._finish_calls(grace=0)
    await a.poller.quiesce({0})  # returns: nothing of ours is out any more
    await a.leases.release([0])
    b = Owner("b", time, schedules, leases)
    await b.take([0])
    await b.run_until(lambda: b.receiver.ids() == ["s1"], within=10)
    assert int(b.receiver.delivered[0].header("fence-token") or 0) > 1


async def test_calls_are_written_while_their_bucket_is_handed_over(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    """Losing every bucket (a scale-out), the owner waits for its calls out
    there to answer and be written before it releases the leases: the rounds
    that write them run with no usable lease left."""
    a = await owner(time, schedules, leases)
    a.receiver.hang["a.example"] = asyncio.Event()
    await add(schedules, time, "s1", 0)
    await a.run(1)
    a.leases.suspend({0})  # as Ownership._release does, before quiesce
    handed_over = asyncio.create_task(a.poller.quiesce({0}))
    await a.run(1)
    assert not handed_over.done()
    a.receiver.release("a.example")
    await a.run(1)
    await asyncio.wait_for(handed_over, timeout=5)  # a hang guard
    assert (await stored(schedules, "s1"))["status"] == "DELIVERED"


async def test_work_held_back_is_not_read_again_every_refresh(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    """Host a hangs with its bound taken and 20 schedules due: for 30 s the
    bucket is read for what lies past its view (b's, found in time), and
    whole only every WHOLE_READ_EVERY refreshes, not every second (which
    read a's 20 again each time: 600 documents)."""
    a = await owner(time, schedules, leases, http_per_host=2, batch_size=25)
    a.receiver.hang["a.example"] = asyncio.Event()
    for n in range(22):
        await add(schedules, time, f"a{n}", 0)
    for n in range(30):
        await add(schedules, time, f"b{n}", 1 + n, url=B)
    await a.run(31)
    assert sorted(a.receiver.ids()) == sorted(f"b{n}" for n in range(30))
    read = schedules.documents_read["due"]
    assert read < 200, read


async def test_a_tenant_whose_due_work_is_held_back_is_not_asked_for_it_again(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    """Host a hangs and its held-back calls fill the view: the tenant is
    present there, so no round asks the store for that tenant's oldest due
    work (which is the held work again, at the cost of a read of every
    hiding bucket a round); another tenant behind the backlog still is."""

    async def tenants() -> list[str]:
        return ["default", "other"]

    a = await owner(time, schedules, leases, http_per_host=2, batch_size=5, tenant_names=tenants)
    a.receiver.hang["a.example"] = asyncio.Event()
    for n in range(60):
        await add(schedules, time, f"a{n}", 0)
    await a.run(10)
    assert schedules.documents_read["fair"] == 0
    new = schedule("o0", time.at(time.elapsed), time.wall(), tenant="other", http={"url": B})
    await schedules.insert(new, time.wall())
    await a.run_until(lambda: "o0" in a.receiver.ids(), within=5)
    assert schedules.documents_read["fair"] > 0


async def test_a_call_answered_frees_its_hosts_slot_before_it_is_written(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    """Host b takes one call at a time. Its call answers while a round is
    reading the store (after that round wrote the answers it had): the same
    round claims b's next call, the answer written by the next round; the
    bound is the host's, and an answered call is off it (counted until
    written, a host's calls went one bound per round or two, as slow as the
    store)."""
    a = await owner(time, schedules, leases, http_per_host=1)
    hung = a.receiver.hang["b.example"] = asyncio.Event()
    await add(schedules, time, "b0", 0, url=B)
    await add(schedules, time, "b1", 0, url=B)
    await a.round()
    assert a.receiver.waiting["b.example"] == 1
    reading, go_on = asyncio.Event(), asyncio.Event()
    find_due = schedules.find_due

    async def slow_read(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        reading.set()
        await go_on.wait()
        return await find_due(*args, **kwargs)

    schedules.find_due = slow_read  # type: ignore[method-assign]
    a.poller.book.stale([0])
    second = asyncio.create_task(a.poller.run_once())
    await asyncio.wait_for(reading.wait(), timeout=5)  # a hang guard
    del a.receiver.hang["b.example"]
    hung.set()  # b0 answers mid-round
    await settle_calls()
    go_on.set()
    await asyncio.wait_for(second, timeout=5)
    await settle_calls()
    assert a.receiver.ids() == ["b0", "b1"]
    assert (await stored(schedules, "b0"))["status"] == "IN_FLIGHT"  # written next round
    await a.round()
    assert (await stored(schedules, "b0"))["status"] == "DELIVERED"


async def test_an_open_circuit_leaves_its_schedules_unclaimed_until_it_may_probe(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    """While a host's circuit is open its due schedules are not claimed
    (no store write, no attempt, no later due time), others go; once it
    may be probed they go in the next round."""
    a = await owner(time, schedules, leases)
    a.receiver.open_circuits.add("a.example")
    for n in range(5):
        await add(schedules, time, f"a{n}", 0)
    await add(schedules, time, "b0", 1, url=B)
    before = {n: (await stored(schedules, f"a{n}"))["version"] for n in range(5)}
    await a.run(5)
    assert a.receiver.ids() == ["b0"]
    for n in range(5):
        doc = await stored(schedules, f"a{n}")
        assert (doc["status"], doc["version"], doc["dueAt"]) == ("PENDING", before[n], time.at(0))
    a.receiver.open_circuits.clear()
    took = await a.run_until(lambda: len(a.receiver.ids()) == 6, within=5)
    assert took <= 1.0  # the next round, a poll interval at most: not a wait of its own


async def test_a_full_view_held_back_hides_no_other_host_or_topic(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    """Host a hangs with its bound taken and more of its calls due than a
    view holds: the records and host b's calls due behind that backlog in
    the same bucket are read past it (skipping a's lane) and delivered in
    time, not once a's backlog has drained (which here is never)."""
    a = await owner(time, schedules, leases, http_per_host=2, batch_size=5)
    a.receiver.hang["a.example"] = asyncio.Event()
    for n in range(60):
        await add(schedules, time, f"a{n:02}", 0)
    for n in range(30):
        await schedules.insert(schedule(f"k{n:02}", time.at(1), time.wall()), time.wall())
        await add(schedules, time, f"b{n:02}", 1, url=B)
    await a.run_until(
        lambda: len(a.publisher.ids()) == 30 and len(a.receiver.ids()) == 30, within=10
    )
    assert sorted(a.receiver.ids()) == [f"b{n:02}" for n in range(30)]
    assert a.receiver.waiting["a.example"] == 2
    # a's backlog is read whole once, not again for every read past it.
    assert schedules.documents_read["due"] < 60 + 2 * 60, schedules.documents_read


async def test_a_fast_hosts_calls_behind_a_hung_hosts_backlog_are_found_all_along(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    """Host a hangs with its bound taken and a backlog filling the view; host
    b answers at once, a call due each second for 40 s behind a's backlog.
    Each of b's calls is due in the view (read ahead) in the round that takes
    it: b is not a slow lane for that (it goes at once), so later reads past
    a still look for b's calls, and every one goes within a poll interval of
    its time, well past the first read's look-ahead (once b was skipped
    whenever one of its calls was due in the view: those past the first
    read's reach waited ten intervals and more)."""
    a = await owner(time, schedules, leases, http_per_host=2, batch_size=5)
    a.receiver.hang["a.example"] = asyncio.Event()
    for n in range(60):
        await add(schedules, time, f"a{n:02}", 0)
    for n in range(40):
        await add(schedules, time, f"b{n:02}", 1 + n, url=B)
    late: dict[str, float] = {}
    for tick in range(90):
        await a.run(0.5)
        for got in a.receiver.ids():
            if got.startswith("b"):
                late.setdefault(got, (tick + 1) * 0.5 - (1 + int(got[1:])))
    assert sorted(late) == [f"b{n:02}" for n in range(40)]
    assert max(late.values()) <= 1.0, late
    assert a.receiver.waiting["a.example"] == 2


async def test_a_read_past_the_slow_lanes_that_hangs_holds_up_no_round(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    """Host a hangs with a backlog filling the view; the first read past its
    lane finds b's calls due over the next seconds, and every later read
    hangs (a store slow for that statement). The rounds do not wait on it:
    b's calls go at their times, and one read is out at a time."""
    a = await owner(time, schedules, leases, http_per_host=2, batch_size=5)
    a.receiver.hang["a.example"] = asyncio.Event()
    read_past = schedules.find_due_past
    stuck = asyncio.Event()
    reads: list[int] = []

    async def slow_after_the_first(*args: Any) -> list[dict[str, Any]]:
        reads.append(len(reads))
        if len(reads) > 1:
            await stuck.wait()
        return await read_past(*args)

    schedules.find_due_past = slow_after_the_first  # type: ignore[method-assign]
    for n in range(60):
        await add(schedules, time, f"a{n:02}", 0)
    for n in range(8):
        await add(schedules, time, f"b{n}", 3 + n, url=B)
    late: dict[str, float] = {}
    for tick in range(24):
        # A hang guard (real seconds): a round waiting on the read never ends.
        await asyncio.wait_for(a.run(0.5), timeout=10)
        for got in a.receiver.ids():
            if got.startswith("b"):
                late.setdefault(got, (tick + 1) * 0.5 - (3 + int(got[1:])))
    assert sorted(late) == [f"b{n}" for n in range(8)]
    assert max(late.values()) <= 0.5, late
    assert len(reads) == 2  # the second is still out: no third beside it
    stuck.set()
    await a.run(1)


async def test_a_read_past_the_slow_lanes_that_fails_is_made_again_and_holds_nothing(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    """The store fails the first reads past a hung host's lane (and loses
    the answer of one): the rounds go on (the records in hand go), the read
    is made again a refresh later, and the calls and records behind the
    backlog are delivered once each."""
    a = await owner(time, schedules, leases, http_per_host=2, batch_size=5)
    a.receiver.hang["a.example"] = asyncio.Event()
    schedules.fail("find_due_past", times=2)
    for n in range(60):
        await add(schedules, time, f"a{n:02}", 0)
    for n in range(10):
        await schedules.insert(schedule(f"k{n}", time.at(2 + n), time.wall()), time.wall())
        await add(schedules, time, f"b{n}", 2 + n, url=B)
    await a.run(3)
    assert schedules.calls["find_due_past"] >= 2
    schedules.fail("find_due_past", applied=True)
    await a.run_until(
        lambda: len(a.publisher.ids()) == 10 and len(a.receiver.ids()) == 10, within=20
    )
    assert sorted(a.publisher.ids()) == [f"k{n}" for n in range(10)]
    assert sorted(a.receiver.ids()) == [f"b{n}" for n in range(10)]
    assert schedules.calls["find_due_past"] >= 4


async def test_the_broker_down_with_a_full_view_of_records_hides_no_call(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases
) -> None:
    a = await owner(time, schedules, leases, batch_size=5)
    a.publisher.down = True
    for n in range(60):
        await schedules.insert(schedule(f"k{n:02}", time.at(0), time.wall()), time.wall())
    await a.run(1)  # the broker is found down: records wait
    for n in range(10):
        await add(schedules, time, f"h{n}", 1)
    await a.run_until(lambda: len(a.receiver.ids()) == 10, within=5)
    assert a.publisher.ids() == []
    a.publisher.down = False
    await a.run_until(lambda: len(a.publisher.ids()) == 60, within=60)


@pytest.mark.parametrize("batch_size", [5, 25], ids=["full-view", "view-holds-all"])
async def test_a_host_draining_a_backlog_holds_up_no_record_behind_it(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases, batch_size: int
) -> None:
    """Host a answers a call every half second, two out at a time (its
    bound), with 60 due: a round mostly finds one of its calls in hand,
    yet the records due behind its backlog in the same bucket go within a
    poll interval or two of their time, long before a's backlog has
    drained: read past a's lane when its backlog fills the view (a batch of
    5: reads of 20), and refreshed after the view's bound when the view
    holds all of it (a batch of 25: reads of 100)."""
    a = await owner(time, schedules, leases, http_per_host=2, batch_size=batch_size)
    pace = a.receiver.paced["a.example"] = asyncio.Semaphore(0)
    for n in range(60):
        await add(schedules, time, f"a{n:02}", 0)
    for n in range(10):
        await schedules.insert(schedule(f"k{n}", time.at(2 + n), time.wall()), time.wall())
    late: dict[str, float] = {}
    for tick in range(28):
        await a.run(0.5)
        pace.release()  # one of a's calls answers
        for k in a.publisher.ids():
            late.setdefault(k, (tick + 1) * 0.5 - (2 + int(k[1:])))
    assert sorted(late) == [f"k{n}" for n in range(10)]
    assert max(late.values()) <= 2, late
    assert len(a.receiver.ids()) < 40  # a's backlog is still draining
