"""Flow control: a key's limit as parsed, its rate slices, its counts in
the store (over both stores), and the gate a node's rounds pass through
(``node/schedule/flow.py``, ``node/store/flow.py``,
``node/delivery/flow_gate.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.delivery.flow_gate import SHUT_FIRST, FlowGate
from node.errors import StoreUnavailable, ValidationFailed
from node.schedule.flow import (
    MAX_KEY_LENGTH,
    FlowControl,
    parse_flow_control,
    rate_slice,
    slot_ids,
)
from node.store.contract import RateWant, SlotWant
from node.store.flow import FlowStore
from node.store.memory import MemoryFlow, MemoryLeases, MemorySchedules
from tests.stores import StoreKit
from tests.virtual import Owner, VirtualTime, header, schedule

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NOW = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)


# -- the limit as a tenant writes it ----------------------------------------------


def test_a_full_limit_parses_and_round_trips_through_its_document() -> None:
    flow = parse_flow_control({"key": "crm", "rate": 20, "period": "PT1S", "parallelism": 3})
    assert flow == FlowControl("crm", 20, timedelta(seconds=1), 3)
    assert FlowControl.from_document(flow.to_document()) == flow
    assert flow.to_view() == {"key": "crm", "rate": 20, "period": "PT1S", "parallelism": 3}


def test_rate_or_parallelism_alone_is_a_limit() -> None:
    assert parse_flow_control({"key": "k", "parallelism": 1}).rate is None
    assert parse_flow_control({"key": "k", "rate": 5}).parallelism is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"key": "k" * (MAX_KEY_LENGTH + 1), "rate": 1}, "flowControl.key"),
        ({"key": "k" * 10_000, "rate": 1}, "flowControl.key"),
        ({"key": "", "rate": 1}, "flowControl.key"),
        ({"key": "a\x00b", "rate": 1}, "flowControl.key"),
        ({"rate": 1}, "flowControl.key"),
        ({"key": "k", "rate": 0}, "flowControl.rate"),
        ({"key": "k", "rate": 10**12}, "flowControl.rate"),
        ({"key": "k", "rate": True}, "flowControl.rate"),
        ({"key": "k", "rate": 1.5}, "flowControl.rate"),
        ({"key": "k", "parallelism": 0}, "flowControl.parallelism"),
        ({"key": "k", "parallelism": 10**6}, "flowControl.parallelism"),
        ({"key": "k", "rate": 1, "period": "P100Y"}, "flowControl.period"),
        ({"key": "k", "rate": 1, "period": "P2D"}, "flowControl.period"),
        ({"key": "k", "rate": 1, "period": "PT0.01S"}, "flowControl.period"),
        ({"key": "k", "parallelism": 2, "period": "PT1S"}, "flowControl.period"),
        ({"key": "k"}, "flowControl.rate"),
        ({"key": "k", "rate": 1, "burst": 3}, "flowControl.burst"),
    ],
)
def test_a_hostile_limit_is_refused_by_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationFailed) as refused:
        parse_flow_control(body)
    assert refused.value.field == field


# -- rate slices --------------------------------------------------------------


@given(
    rate=st.integers(1, 1000),
    period_ms=st.integers(100, 86_400_000),
    start_ms=st.integers(0, 10**13),
)
def test_a_period_of_slices_holds_the_rate_exactly(
    rate: int, period_ms: int, start_ms: int
) -> None:
    """Walking the slices of one whole period from any instant: their
    capacities add up to the rate, each slice ends where the next begins,
    and no slice holds more than its share rounded up."""
    flow = FlowControl("k", rate, timedelta(milliseconds=period_ms))
    at = EPOCH + timedelta(milliseconds=start_ms)
    first = rate_slice("t", flow, at)
    seen, total, moment = [first.id], first.capacity, first.ends_at
    while True:
        part = rate_slice("t", flow, moment)
        if part.id.rsplit("/", 1)[1] == str(int(first.id.rsplit("/", 1)[1]) + min(10, rate)):
            break
        assert part.id not in seen
        assert part.ends_at > moment
        assert part.capacity <= -(-rate // min(10, rate))
        seen.append(part.id)
        total += part.capacity
        moment = part.ends_at
    assert total == rate
    assert len(seen) == min(10, rate)


def test_two_tenants_keys_of_one_name_never_share_a_slice_or_a_slot() -> None:
    flow = FlowControl("crm", 10, parallelism=2)
    assert rate_slice("a", flow, NOW).id != rate_slice("b", flow, NOW).id
    assert not set(slot_ids("a", flow)) & set(slot_ids("b", flow))


# -- the counts in the store (both stores) -------------------------------------------


async def test_reservations_of_one_slice_never_grant_more_than_its_capacity(
    store: StoreKit,
) -> None:
    """Three nodes ask for more than a slice holds, all at once: the grants
    add up to its capacity exactly, whoever asked first."""
    nodes = [store.flow(f"n{i}") for i in range(3)]
    await nodes[0].prepare()
    part = rate_slice("t", FlowControl("k", 20), NOW)
    assert part.capacity == 2
    want = RateWant("t", "k", part, 2)
    grants = await asyncio.gather(*(n.reserve([want]) for n in nodes))
    assert sorted(g[0] for g in grants) == [0, 0, 2]
    assert await nodes[0].reserve([want]) == [0]
    following = rate_slice("t", FlowControl("k", 20), part.ends_at)
    assert await nodes[1].reserve([RateWant("t", "k", following, 1)]) == [1]


async def test_one_call_reserves_for_every_key_and_grants_a_part(store: StoreKit) -> None:
    node = store.flow("n")
    await node.prepare()
    a = rate_slice("t", FlowControl("a", 50), NOW)  # 5 a slice
    b = rate_slice("t", FlowControl("b", 10), NOW)  # 1 a slice
    assert await node.reserve([RateWant("t", "a", a, 3), RateWant("t", "b", b, 3)]) == [3, 1]
    assert await node.reserve([RateWant("t", "a", a, 3)]) == [2]


async def test_the_one_statement_shape_of_a_real_mongodb_grants_the_same(mongo: Any) -> None:
    """A real MongoDB reserves with one upsert (the embedded server makes
    the slice first: its racing upserts lose answers). One at a time, the
    embedded server answers it as MongoDB does."""
    node = FlowStore(mongo, "n")
    part = rate_slice("t", FlowControl("k", 30), NOW)  # 3 a slice
    grants = [await node.reserve([RateWant("t", "k", part, 2)]) for _ in range(3)]
    assert grants == [[2], [1], [0]]


async def test_a_slot_is_held_by_one_node_until_given_back(store: StoreKit) -> None:
    flow = FlowControl("k", parallelism=2)
    slots = tuple(slot_ids("t", flow))
    want = SlotWant("t", "k", slots)
    first, second = store.flow("n1"), store.flow("n2")
    await first.prepare()
    assert await first.hold([SlotWant("t", "k", slots[:1])]) == {slots[0]}
    assert await second.hold([want]) == {slots[1]}
    assert await first.hold([want]) == {slots[0]}  # its own, renewed; not the other's
    await second.release([slots[0], slots[1]])  # gives back its own only
    assert await first.hold([want]) == set(slots)
    assert await second.hold([want]) == set()


async def test_a_slot_not_renewed_expires_for_the_next_node(store: StoreKit) -> None:
    """A node that dies holds its slots for their term, not for ever."""
    slots = tuple(slot_ids("t", FlowControl("k", parallelism=1)))
    gone, survivor = store.flow("gone", term=1.0), store.flow("survivor", term=1.0)
    await gone.prepare()
    assert await gone.hold([SlotWant("t", "k", slots)]) == set(slots)
    assert await survivor.hold([SlotWant("t", "k", slots)]) == set()
    await store.pass_time(1.2)
    assert await survivor.hold([SlotWant("t", "k", slots)]) == set(slots)
    assert await gone.hold([SlotWant("t", "k", slots)]) == set()


# -- the gate (pure) ------------------------------------------------------------------


def doc(sid: str, key: str = "k", at: datetime = NOW, **flow: Any) -> dict[str, Any]:
    return {
        "_id": sid,
        "tenant": "t",
        "bucket": 0,
        "dueAt": at,
        "flow": FlowControl(key, **flow).to_document(),
    }


def test_the_gate_admits_the_earliest_up_to_the_grants_and_shuts_a_spent_slice() -> None:
    gate = FlowGate(slot_term=30.0)
    batch = [doc(f"s{i}", at=NOW + timedelta(milliseconds=10 - i), rate=20) for i in range(5)]
    asks = gate.asks(batch, monotonic=0.0)
    assert asks.slots == []
    names, wants = gate.rate_wants(asks, NOW)
    assert [w.count for w in wants] == [5]
    admitted, refused = gate.admit(asks, names, [2], wants, 0.0, NOW)
    assert [d["_id"] for d in admitted] == ["s4", "s3"]  # the earliest due
    assert refused == {"t": 3}
    assert gate.shut(batch[0], 0.0)
    opens = gate.next_open(0.0)
    spent = (wants[0].slice.ends_at - NOW).total_seconds()
    assert opens is not None and opens == pytest.approx(spent)
    assert not gate.shut(batch[0], opens)


def test_a_start_held_up_past_its_slice_may_not_go() -> None:
    """A node paused between its reservation and its call: the call would
    count in a window the slice's share was not made for."""
    gate = FlowGate(slot_term=30.0)
    batch = [doc("s0", rate=20)]
    asks = gate.asks(batch, 0.0)
    names, wants = gate.rate_wants(asks, NOW)
    gate.admit(asks, names, [1], wants, 0.0, NOW)
    part = wants[0].slice
    assert not gate.too_late("s0", part.ends_at)
    assert gate.too_late("s0", part.ends_at + timedelta(milliseconds=1))
    assert not gate.too_late("unlimited", NOW + timedelta(days=1))
    gate.settle(out=set())
    assert not gate.too_late("s0", NOW + timedelta(days=1))  # settled: forgotten


def test_slots_in_use_bound_a_batch_until_their_deliveries_settle() -> None:
    gate = FlowGate(slot_term=30.0)
    batch = [doc(f"s{i}", parallelism=2) for i in range(3)]
    asks = gate.asks(batch, 0.0)
    [want] = asks.slots
    gate.held(asks, set(want.slots), 0.0)
    admitted, refused = gate.admit(asks, *gate.rate_wants(asks, NOW)[:1], [], [], 0.0, NOW)
    assert len(admitted) == 2 and refused == {"t": 1}
    assert not gate.shut(batch[2], 0.0)  # its own calls hold the slots: an answer wakes it
    assert gate.room(batch[2], NOW) == 0
    gate.settle(out={admitted[0]["_id"]})
    assert gate.room(batch[2], NOW) == 1
    # No work of the key due and nothing out: the slots go back.
    gate.settle(out=set())
    assert sorted(gate.idle(due_keys=set(), monotonic=0.0)) == sorted(want.slots)


def test_slots_held_elsewhere_shut_the_key_with_a_doubling_backoff() -> None:
    gate = FlowGate(slot_term=30.0)
    batch = [doc("s0", parallelism=1)]
    for expected in (SHUT_FIRST, 2 * SHUT_FIRST):
        asks = gate.asks(batch, 0.0)
        gate.held(asks, set(), 0.0)
        admitted, _refused = gate.admit(asks, [], [], [], 0.0, NOW)
        assert admitted == []
        assert gate.next_open(0.0) == pytest.approx(expected)


def test_held_slots_are_renewed_past_half_their_term_with_no_work_asked() -> None:
    gate = FlowGate(slot_term=30.0)
    batch = [doc("s0", parallelism=1)]
    asks = gate.asks(batch, 0.0)
    gate.held(asks, set(asks.slots[0].slots), 0.0)
    gate.admit(asks, [], [], [], 0.0, NOW)
    assert gate.asks([], 10.0).slots == []
    assert [w.key for w in gate.asks([], 16.0).slots] == ["k"]


# -- owners in virtual time: the limit across nodes -------------------------------------


@pytest.fixture
def buckets() -> int:
    return 6


async def _three_owners(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases, buckets: int
) -> list[Owner]:
    flow = MemoryFlow("", time.wall)
    owners = [Owner(name, time, schedules, leases, batch_size=50, flow=flow) for name in "abc"]
    for index, node in enumerate(owners):
        await node.take([b for b in range(buckets) if b % 3 == index])
    return owners


async def _run_all(
    owners: list[Owner],
    time: VirtualTime,
    done: Callable[[], bool],
    within: float,
    each: Callable[[], None] = lambda: None,
) -> None:
    """Rounds of every owner in turn, virtual time moving to the first one's
    next wake (at least a millisecond), until ``done()``."""
    began = time.elapsed
    while not done():
        assert time.elapsed - began < within, f"not done within {within} virtual seconds"
        delays = []
        for node in owners:
            delays.append(await node.round())
            each()
        time.advance(max(0.001, min(delays)))


def _most_in_any_window(moments: list[float], width: float) -> int:
    moments = sorted(moments)
    most, start = 0, 0
    for end, at in enumerate(moments):
        while at - moments[start] >= width:
            start += 1
        most = max(most, end - start + 1)
    return most


async def test_three_owners_keep_a_keys_rate_and_let_other_work_pass(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases, buckets: int
) -> None:
    """60 records of one key due at once, 10 a second, over three owners:
    never more than 11 in any second, all out in about 6 s; records of no
    key in the same buckets go in the first round."""
    owners = await _three_owners(time, schedules, leases, buckets)
    for i in range(60):
        limit = {"key": "crm", "rate": 10}
        await schedules.insert(
            schedule(f"k{i:02}", time.wall(), time.wall(), flowControl=limit), time.wall()
        )
    for i in range(6):
        await schedules.insert(schedule(f"free{i}", time.wall(), time.wall()), time.wall())
    sent: dict[str, float] = {}

    def seen() -> None:
        for node in owners:
            for record, at in zip(node.publisher.records, node.publisher.published_at, strict=True):
                sid = header(record, "schedule-id")
                sent.setdefault(sid, (at - time.start).total_seconds())

    await _run_all(owners, time, lambda: len(sent) == 66, within=60.0, each=seen)
    keyed = [at for sid, at in sent.items() if sid.startswith("k")]
    assert _most_in_any_window(keyed, 1.0) <= 11
    assert 5.0 <= max(keyed) <= 8.0
    assert all(at == 0.0 for sid, at in sent.items() if sid.startswith("free"))
    assert sum(node.metrics.flow_held_back.labels("default")._value.get() for node in owners) > 0


async def test_three_owners_never_have_more_calls_out_than_a_keys_parallelism(
    time: VirtualTime, schedules: MemorySchedules, leases: MemoryLeases, buckets: int
) -> None:
    """30 calls of one key with parallelism 2 to an endpoint answering one
    call per step: at no moment more than 2 are out across the owners, and
    every one goes."""
    owners = await _three_owners(time, schedules, leases, buckets)
    for node in owners:
        node.receiver.paced["a.example"] = asyncio.Semaphore(0)
    for i in range(30):
        limit = {"key": "crm", "parallelism": 2}
        new = schedule(
            f"k{i:02}", time.wall(), time.wall(), http={"url": "https://a.example/x"},
            flowControl=limit,
        )  # fmt: skip
        await schedules.insert(new, time.wall())
    most = 0

    def out() -> int:
        return sum(len(n.receiver.calls) - len(n.receiver.delivered) for n in owners)

    def step() -> None:
        nonlocal most
        most = max(most, out())
        for node in owners:  # the endpoint answers the oldest call of each owner
            if len(node.receiver.calls) > len(node.receiver.delivered):
                node.receiver.paced["a.example"].release()

    delivered = lambda: sum(len(n.receiver.delivered) for n in owners)  # noqa: E731
    await _run_all(owners, time, lambda: delivered() == 30, within=120.0, each=step)
    assert most == 2
    assert sorted(c.header("schedule-id") for n in owners for c in n.receiver.delivered) == [
        f"k{i:02}" for i in range(30)
    ]


async def test_a_start_whose_slice_passed_while_other_work_went_is_not_claimed(
    time: VirtualTime, schedules: MemorySchedules, buckets: int
) -> None:
    """A batch of work of no key and a key's work: the key's admission runs
    beside the other's claim and publish; if those outlast its slice, its
    work is not claimed at all (a claim and a put-back would be two writes
    for nothing) and stays due for a later slice."""
    flow = MemoryFlow("", time.wall)
    node = Owner("a", time, schedules, MemoryLeases("", time.wall), batch_size=50, flow=flow)
    await node.take(range(buckets))
    for i in range(3):
        await schedules.insert(schedule(f"free{i}", time.wall(), time.wall()), time.wall())
    await schedules.insert(
        schedule("k0", time.wall(), time.wall(), flowControl={"key": "k", "rate": 10}), time.wall()
    )

    async def slow_broker(_records: Any) -> None:
        time.advance(0.5)  # the publish of the free ones outlasts a 100 ms slice

    node.publisher.during = slow_broker
    await node.round()
    assert {header(r, "schedule-id") for r in node.publisher.records} == {"free0", "free1", "free2"}
    assert node.count("abandoned") == 0
    assert (await schedules.get("k0") or {})["status"] == "PENDING"
    await node.run(1.0)
    assert "k0" in {header(r, "schedule-id") for r in node.publisher.records}


@pytest.mark.parametrize("method", ["hold", "reserve"])
async def test_a_flow_store_failing_mid_round_claims_nothing_and_the_next_round_goes(
    time: VirtualTime, schedules: MemorySchedules, buckets: int, method: str
) -> None:
    """The store fails (or its answer is lost) while a round asks for a
    key's slots or rate: nothing of the key is claimed then, nothing is
    lost, and a later round delivers it within the limit."""
    flow = MemoryFlow("", time.wall)
    node = Owner("a", time, schedules, MemoryLeases("", time.wall), flow=flow)
    await node.take(range(buckets))
    limit = {"key": "k", "rate": 10, "parallelism": 1}
    await schedules.insert(schedule("k0", time.wall(), time.wall(), flowControl=limit), time.wall())
    node.poller.flow.fail(method, applied=True)  # type: ignore[union-attr]
    with pytest.raises(StoreUnavailable):
        await node.round()
    assert node.publisher.records == []
    assert (await schedules.get("k0") or {})["status"] == "PENDING"
    await node.run(1.0)
    assert [header(r, "schedule-id") for r in node.publisher.records] == ["k0"]
