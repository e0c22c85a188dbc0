"""Bucket leases and fencing over both stores (the ``store`` fixture: memory
and MongoDB); a store slow or lost mid-write against MongoDB itself."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo.errors import AutoReconnect

from node.delivery.leases import MAX_STRETCH, RECENT_ROUND_TRIPS, VERIFY_EVERY, LeaseManager
from node.delivery.outcomes import Rules
from node.delivery.stalls import StallMeter
from node.errors import StoreUnavailable
from node.schedule.model import Limits
from node.schedule.parse import parse_new_schedule
from node.schedule.retry import DEFAULT_POLICY
from node.store.contract import BucketLeases
from node.store.leases import IDS_PER_STATEMENT, LeaseStore
from node.store.memory import MemoryLeases
from tests.conftest import NodeFactory, wait_until
from tests.stores import StoreKit

BUCKETS = 8
RULES = Rules(DEFAULT_POLICY, timedelta(seconds=60))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Slowness:
    """How slow the store is, shared by every collection a SlowStore wraps."""

    delay: float = 0.0
    paused: bool = False
    lose_next_reply: bool = False


class SlowStore:
    """A lease collection whose writes take ``delay`` seconds of the fake
    clock (a store saturated by a backlog, made deterministic), and
    optionally a reply lost after the server applied the write. With a stall
    meter, the node's timer ticks through the delay unless ``paused`` (the
    process stopped while the reply waited). ``of`` wraps another collection
    (the holders beside the buckets) with the same settings."""

    def __init__(
        self,
        collection: Any,
        clock: FakeClock,
        meter: StallMeter | None = None,
        slowness: Slowness | None = None,
    ) -> None:
        self.collection, self.clock, self.meter = collection, clock, meter
        self.slowness = slowness or Slowness()

    def of(self, collection: Any) -> SlowStore:
        return SlowStore(collection, self.clock, self.meter, self.slowness)

    def _elapse(self) -> None:
        delay = self.slowness.delay
        if self.meter is None or self.slowness.paused:
            self.clock.now += delay
            return
        end = self.clock.now + delay
        while self.clock.now < end:
            self.clock.now = min(end, self.clock.now + self.meter.tick)
            self.meter.ticked()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.collection, name)

    async def _written(self, result: Any) -> Any:
        self._elapse()
        if self.slowness.lose_next_reply:
            self.slowness.lose_next_reply = False
            raise AutoReconnect("reply lost after the write")
        return result

    async def update_many(self, *args: Any, **kwargs: Any) -> Any:
        return await self._written(await self.collection.update_many(*args, **kwargs))

    async def update_one(self, *args: Any, **kwargs: Any) -> Any:
        return await self._written(await self.collection.update_one(*args, **kwargs))

    async def find_one_and_update(self, *args: Any, **kwargs: Any) -> Any:
        return await self._written(await self.collection.find_one_and_update(*args, **kwargs))

    async def bulk_write(self, *args: Any, **kwargs: Any) -> Any:
        return await self._written(await self.collection.bulk_write(*args, **kwargs))


def slow_lease_store(
    mongo: Any, clock: FakeClock, meter: StallMeter | None = None
) -> tuple[Slowness, LeaseStore]:
    """A lease store whose lease and session writes are slowed alike."""
    buckets = SlowStore(mongo.buckets, clock, meter)
    store = LeaseStore(buckets, "a", holders=buckets.of(mongo.holders))  # type: ignore[arg-type]
    return buckets.slowness, store


async def seconds_left_on_server(mongo: Any, bucket: int) -> float:
    """Seconds until the session ``bucket``'s lease is held under ends, by
    this host's clock (the server's)."""
    lease = await mongo.buckets.find_one({"_id": bucket})
    holder = await mongo.holders.find_one({"_id": lease["holder"]})
    return float((holder["expiresAt"] - datetime.now(UTC)).total_seconds())


def manager(
    store: StoreKit, node: str, ttl: float = 30.0, clock: FakeClock | None = None
) -> LeaseManager:
    return LeaseManager(store.leases(node), ttl, monotonic=clock or FakeClock())


async def test_one_owner_per_bucket_and_release_hands_over(store: StoreKit) -> None:
    a, b = manager(store, "a"), manager(store, "b")
    assert await a.acquire(range(BUCKETS)) == list(range(BUCKETS))
    assert await b.acquire(range(BUCKETS)) == []
    tokens_a = a.usable()

    assert await a.release([2, 5]) == [2, 5]
    assert await b.acquire(range(BUCKETS)) == [2, 5]
    # Every change of owner increments the token.
    assert b.usable() == {2: tokens_a[2] + 1, 5: tokens_a[5] + 1}
    docs = await store.lease_docs()
    assert {k: d["owner"] for k, d in docs.items()} == {
        i: ("b" if i in (2, 5) else "a") for i in range(BUCKETS)
    }


async def test_renew_keeps_leases_and_a_verify_reports_one_taken(store: StoreKit) -> None:
    a = manager(store, "a")
    await a.acquire(range(BUCKETS))
    before = await store.lease_docs()
    assert await a.renew() == []
    # A renew writes the session, not the leases: not one lease document moved.
    assert await store.lease_docs() == before
    # Another process took bucket 3 under a live session of a (a second
    # process under a's node id, say): the periodic read of the leases finds it.
    await store.steal_lease(3, "z")
    found = [await a.renew() for _ in range(VERIFY_EVERY)]
    assert sorted(found) == [[]] * (VERIFY_EVERY - 1) + [[3]]
    assert 3 not in a.usable()
    assert a.losses == 1
    assert await a.verify() == []


async def test_a_session_ended_loses_every_lease_at_once_and_never_renews_again(
    store: StoreKit,
) -> None:
    clock = FakeClock()
    a = manager(store, "a", ttl=1.0, clock=clock)
    b = manager(store, "b", ttl=1.0)
    assert await a.acquire(range(BUCKETS)) == list(range(BUCKETS))
    tokens = a.usable()

    async def all_taken_by_b() -> bool:
        await store.pass_time(0.25)
        return await b.acquire(range(BUCKETS)) == list(range(BUCKETS))

    # a stops renewing (a pause); its session ends by the store's clock, and
    # b takes every bucket in one acquire.
    await wait_until(all_taken_by_b, within=30, what="the ended session's leases to be taken")
    assert b.usable() == {x: tokens[x] + 1 for x in range(BUCKETS)}
    # a wakes up: its renew finds the session over (it is not revived) and
    # every lease lost, though its local deadline may not have passed yet.
    assert await a.renew() == list(range(BUCKETS))
    assert a.usable() == {}
    assert await a.renew() == []  # nothing held: nothing renewed
    # Its next acquire opens a new session; b's leases are b's.
    assert await a.acquire(range(BUCKETS)) == []


async def test_a_lease_written_before_sessions_lasts_to_its_own_expiry(store: StoreKit) -> None:
    """A format 1 lease (no holder, its own expiresAt: a node of an earlier
    release still running) is not taken from it before it expires."""
    a = manager(store, "a", ttl=1.0)
    await store.put_legacy_lease(0, "old", seconds=1.0)
    assert await a.acquire([0]) == []

    async def taken() -> bool:
        await store.pass_time(0.25)
        return await a.acquire([0]) == [0]

    await wait_until(taken, within=30, what="the old lease to expire")


async def test_expired_lease_is_taken_by_the_database_clock(store: StoreKit) -> None:
    a, b = manager(store, "a", ttl=1.0), manager(store, "b", ttl=1.0)
    await a.acquire([0])
    first = a.usable()[0]
    assert await b.acquire([0]) == []  # not before it expires

    async def taken_by_b() -> bool:
        await store.pass_time(0.25)
        return await b.acquire([0]) == [0]

    # a stops renewing; once the server's clock passes expiresAt, b wins.
    await wait_until(taken_by_b, within=30, what="the expired lease to be taken")
    assert b.usable() == {0: first + 1}
    assert await a.renew() == [0]


async def test_local_deadline_stops_work_without_the_database(store: StoreKit) -> None:
    clock = FakeClock()
    a = manager(store, "a", ttl=10.0, clock=clock)
    await a.acquire([0, 1])
    token = a.usable()[0]
    assert a.is_usable(0, token)
    clock.now += 10.0 - a.margin(10.0) - 0.01
    assert set(a.usable()) == {0, 1}
    clock.now += 0.02
    # No renew reached the store: the node must stop before the server-side
    # expiry could let another owner in.
    assert a.usable() == {}
    assert not a.is_usable(0, token)


async def test_a_freeze_the_monotonic_clock_missed_ends_the_leases_by_the_wall_clock(
    store: StoreKit,
) -> None:
    # A suspended VM: its CLOCK_MONOTONIC stands still while the world's
    # clock runs on; on resume its leases must be over, as the store's are
    # (found by the simulation, python -m chaos simulate: a resumed owner
    # claimed new work under a token another owner had superseded).
    monotonic, wall = FakeClock(), FakeClock()
    a = LeaseManager(store.leases("a"), 10.0, monotonic=monotonic, wall=wall)
    await a.acquire([0, 1])
    token = a.usable()[0]
    wall.now += 10.0  # frozen for the whole term: the monotonic clock did not move
    assert a.usable() == {} and not a.is_usable(0, token)
    # A wall clock stepped back (an NTP correction) shortens nothing: the
    # monotonic deadline still holds.
    b = LeaseManager(store.leases("b"), 10.0, monotonic=monotonic, wall=wall)
    await b.acquire([2])
    wall.now -= 3600
    monotonic.now += 10.0 - b.margin(10.0) - 0.01
    assert set(b.usable()) == {2}
    monotonic.now += 0.02
    assert b.usable() == {}


async def test_a_freeze_is_not_forgotten_when_the_session_after_it_fails_to_open() -> None:
    # Found by the simulation: a node resumed from a freeze its monotonic
    # clock missed while the store was down. Its session could not be
    # opened; that failed call moved the wall clock's anchor to itself, so
    # the next try saw the old session as alive again and took leases under
    # it, an ended session in the store: another node took them too.
    monotonic, wall = FakeClock(), FakeClock()
    kit = MemoryLeases("a", lambda: datetime.now(UTC))
    a = LeaseManager(kit, 10.0, monotonic=monotonic, wall=wall)
    await a.acquire([0])
    wall.now += 16.0  # frozen: the monotonic clock did not move
    kit.fail("open_session")
    with pytest.raises(StoreUnavailable):
        await a.acquire([1])
    wall.now += 2.0
    monotonic.now += 2.0
    opened = kit.calls["open_session"]
    await a.acquire([1])
    assert kit.calls["open_session"] == opened + 1  # a new session, not the old one


async def test_a_take_or_release_whose_answer_was_lost_strands_no_bucket() -> None:
    # A lease written for a node that never learnt it (a take's answer lost)
    # or kept after a release that failed: not held there, so never renewed,
    # used or released, yet no other node could take it while that node's
    # session lived (found by the simulation: a bucket stranded for good
    # after a hand-over under lost store answers).
    leases = MemoryLeases("", lambda: datetime.now(UTC))
    a_store, b_store = leases.of("a"), leases.of("b")
    a, b = LeaseManager(a_store, 30.0), LeaseManager(b_store, 30.0)
    a_store.fail("take", applied=True)
    with pytest.raises(StoreUnavailable):
        await a.acquire([0])
    assert a.held == {} and leases.table[0]["owner"] == "a"
    assert await b.acquire([0]) == []  # a's session lives: b cannot take it
    await a.renew()  # a's next round gives back what it never knew it held
    assert await b.acquire([0]) == [0]
    assert await a.acquire([1]) == [1]
    a_store.fail("release")  # fails before it reaches the store
    with pytest.raises(StoreUnavailable):
        await a.release([1])
    assert a.held == {} and leases.table[1]["owner"] == "a"
    await a.acquire([])  # or its next acquire
    assert await b.acquire([1]) == [1]


async def test_restarted_node_readopts_its_own_buckets_with_a_new_token(store: StoreKit) -> None:
    old = manager(store, "a")
    await old.acquire([0])
    again = manager(store, "a")  # same node id, new process
    assert await again.acquire([0]) == [0]
    assert again.usable()[0] == old.usable()[0] + 1


async def test_four_thousand_buckets_are_held_renewed_and_handed_over_at_once(
    store: StoreKit,
) -> None:
    """B = 4,096: one acquire takes every bucket, one token each; one renew
    keeps them all; half are handed over. On the embedded store every call
    names them in bounded statements: none is missed or taken twice at a
    statement's edge, and a lease lost in any statement is found by a
    verify."""
    many = 4096
    a, b = manager(store, "a"), manager(store, "b")
    assert await a.acquire(range(many)) == list(range(many))
    assert a.usable() == dict.fromkeys(range(many), 1)
    assert await a.renew() == []
    assert len(a.usable()) == many

    half = list(range(0, many, 2))
    assert await a.release(half) == half
    assert await b.acquire(range(many)) == half
    assert b.usable() == dict.fromkeys(half, 2)
    # Lost in the first statement, at the edge of two, and in the last.
    stolen = [1, 2 * IDS_PER_STATEMENT - 1, many - 1]
    for bucket in stolen:
        await store.steal_lease(bucket, "z")
    assert await a.renew() == []  # one write of a's session: it keeps the rest
    assert await a.verify() == stolen
    assert await b.renew() == []

    docs = await store.lease_docs()
    assert Counter((d["owner"], d["token"]) for d in docs.values()) == {
        ("a", 1): many // 2 - len(stolen),
        ("b", 2): many // 2,
        ("z", 2): len(stolen),
    }


async def take_rechecks_every_bucket(a: BucketLeases, b: BucketLeases) -> None:
    """take() checks each bucket again as it writes it: one another node
    created since takeable() found it unseen, or took since it found it
    free, stays that node's; the rest are taken, the token one up. Over
    more buckets than one statement of the embedded store names."""
    n = 3 * IDS_PER_STATEMENT + 5
    everything = list(range(n))
    await a.open_session(30.0, within=30)
    await b.open_session(30.0, within=30)
    assert await a.takeable(everything, within=30) == ([], everything)
    first_b = [0, IDS_PER_STATEMENT - 1, IDS_PER_STATEMENT, n - 1]
    await b.take([], first_b, within=30)
    await a.take([], everything, within=30)
    assert await a.ours(everything, within=30) == {x: 1 for x in everything if x not in first_b}

    await a.release(everything, within=30)
    assert await b.takeable(everything, within=30) == (everything, [])
    # a takes some back before b writes what it found free.
    back_to_a = [1, IDS_PER_STATEMENT + 1, n - 2]
    await a.take(back_to_a, [], within=30)
    await b.take(everything, [], within=30)
    expected = {x: ("a" if x in back_to_a else "b", 2) for x in everything}
    assert await a.tokens(everything, within=30) == expected


async def test_take_rechecks_every_bucket_as_it_writes(store: StoreKit) -> None:
    await take_rechecks_every_bucket(store.leases("a"), store.leases("b"))


@pytest.mark.parametrize("chunked", [False, True], ids=["one-statement", "bounded"])
async def test_both_lease_shapes_agree_on_mongodb(mongo: Any, chunked: bool) -> None:
    """The one statement per call a real MongoDB gets, and the bounded ones
    of the embedded store, on the same server: the same outcome."""
    await take_rechecks_every_bucket(
        LeaseStore(mongo.buckets, "a", chunked=chunked),
        LeaseStore(mongo.buckets, "b", chunked=chunked),
    )


async def test_a_node_on_the_embedded_store_names_leases_in_bounded_statements(
    start_node: NodeFactory,
) -> None:
    node = await start_node()
    assert isinstance(node.node.lease_store, LeaseStore)
    assert node.node.lease_store.chunked


def new_doc(schedule_id: str) -> Any:
    now = datetime.now(UTC)
    raw = (
        f'{{"id":"{schedule_id}","topic":"t","executeAt":"2000-01-01T00:00:00Z","payload":1}}'
    ).encode()
    return parse_new_schedule(raw, Limits(max_payload_bytes=100, horizon=timedelta(days=1)), now)


async def test_fencing_rejects_a_former_owner_after_a_newer_token_acted(store: StoreKit) -> None:
    """Two owners of one bucket: the old one freezes mid-batch, the new one
    takes over, then the old one resumes. Every write of the old token after
    the new token acted is rejected by the store's filter."""
    schedules = store.schedules(1)
    now = datetime.now(UTC)
    for i in range(4):
        await schedules.insert(new_doc(f"s{i}"), now)
    old, new = 1, 2

    due = await schedules.find_due(0, now, 10)
    claimed_by_old = await schedules.claim(due[:2], {0: old}, "old", now)
    assert [c.id for c in claimed_by_old] == ["s0", "s1"]

    # The old owner freezes. The new owner acquires token 2 and recovers.
    recovered = await schedules.recover_in_flight({0: new})
    assert sorted(recovered) == ["s0", "s1"]
    due_new = await schedules.find_due(0, now, 10)
    claimed_by_new = await schedules.claim(due_new, {0: new}, "new", now)
    assert sorted(c.id for c in claimed_by_new) == ["s0", "s1", "s2", "s3"]

    # The old owner resumes: its completion and its next claim match nothing.
    assert await schedules.complete([RULES.delivered(c, now) for c in claimed_by_old]) == 0
    assert await schedules.claim(due[2:], {0: old}, "old", now) == []
    docs = await store.stored()
    assert {d["token"] for d in docs.values()} == {new}
    assert {d["status"] for d in docs.values()} == {"IN_FLIGHT"}

    assert await schedules.complete([RULES.delivered(c, now) for c in claimed_by_new]) == 4


async def test_claim_skips_cancelled_and_newer_tokens(store: StoreKit) -> None:
    schedules = store.schedules(1)
    now = datetime.now(UTC)
    for i in range(3):
        await schedules.insert(new_doc(f"s{i}"), now)
    due = await schedules.find_due(0, now, 10)
    await schedules.cancel("s1", now)
    claimed = await schedules.claim(due, {0: 5}, "me", now)
    assert sorted(c.id for c in claimed) == ["s0", "s2"]
    # A token below the one that last wrote claims nothing.
    await schedules.recover_in_flight({0: 6})
    assert await schedules.claim(await schedules.find_due(0, now, 10), {0: 5}, "me", now) == []


async def test_an_unfenced_manager_trusts_its_leases_past_deadline_and_loss(
    store: StoreKit,
) -> None:
    # CHAOS_MODE=unfenced exists to prove the chaos checker catches a true
    # zombie: it must really keep working on leases it no longer holds.
    clock = FakeClock()
    zombie = LeaseManager(store.leases("a"), 10.0, monotonic=clock, unfenced=True)
    await zombie.acquire([0, 1])
    tokens = zombie.usable()
    clock.now += 60.0
    await store.steal_lease(1, "z")
    assert await zombie.renew() == []
    assert zombie.usable() == tokens
    assert zombie.is_usable(1, tokens[1])


def slow_manager(mongo: Any) -> tuple[FakeClock, Slowness, LeaseManager]:
    """A manager with a 6 s TTL whose lease writes go through a SlowStore."""
    clock = FakeClock()
    slowness, store = slow_lease_store(mongo, clock)
    return clock, slowness, LeaseManager(store, 6.0, monotonic=clock)


async def renew_when_due(a: LeaseManager, clock: FakeClock, last_sent: float) -> float:
    """As the ownership loop does: a renew interval after the last one was
    sent, or at once if that has passed. Returns when this one was sent."""
    clock.now = max(clock.now, last_sent + a.renew_interval)
    sent = clock.now
    await a.renew()
    if not a.held:
        await a.acquire([0])
    return sent


async def test_a_slow_store_stretches_the_lease_term_and_a_recovered_one_restores_it(
    mongo: Any,
) -> None:
    clock, store, a = slow_manager(mongo)
    sent = clock.now
    assert await a.acquire([0]) == [0]
    # The store slows to 5 s a lease write, more than a 6 s term leaves
    # (6 - 20% margin): the first slow renew comes back too late and the lease
    # is lost once; retaken with a stretched term, it then holds. At a fixed
    # term every retake would be lost again: the livelock.
    store.delay = 5.0
    for _ in range(6):
        sent = await renew_when_due(a, clock, sent)
    assert a.losses == 1
    assert a.term == 15.0
    assert set(a.usable()) == {0}
    assert 9.0 < await seconds_left_on_server(mongo, 0) <= 15.0

    store.delay = 0.0
    for _ in range(RECENT_ROUND_TRIPS):
        sent = await renew_when_due(a, clock, sent)
    assert a.term == 6.0
    sent = await renew_when_due(a, clock, sent)  # the first renew at the restored term
    assert await seconds_left_on_server(mongo, 0) <= 6.0
    assert a.losses == 1

    # However slow the store, a dead owner's buckets wait a bounded time.
    store.delay = 1000.0
    await renew_when_due(a, clock, sent)
    assert a.term == MAX_STRETCH * 6.0


async def test_a_shorter_term_cuts_the_local_deadline_even_when_the_reply_is_lost(
    mongo: Any,
) -> None:
    clock, store, a = slow_manager(mongo)
    store.delay = 10.0
    await a.acquire([0])  # back after its 6 s term: lost, retaken at 30 s
    sent = await renew_when_due(a, clock, clock.now)
    assert a.term == 30.0 and set(a.usable()) == {0}
    store.delay = 0.0
    for _ in range(RECENT_ROUND_TRIPS):
        sent = await renew_when_due(a, clock, sent)
    assert a.term == 6.0
    # The last renew was sent at the stretched term: locally good for 24 s.
    # The next sets the server's expiry 6 s ahead, then its reply is lost: the
    # 24 s must not stand, or the node would work past the server's expiry.
    store.lose_next_reply = True
    clock.now = sent + a.renew_interval
    sent = clock.now
    try:
        await a.renew()
    except StoreUnavailable as exc:
        assert isinstance(exc.__cause__, AutoReconnect)
    else:
        raise AssertionError("the lost reply was not raised")
    assert set(a.usable()) == {0}
    clock.now = sent + 6.0 - a.margin(6.0) + 0.01
    assert a.usable() == {}


async def test_a_pause_of_the_process_does_not_stretch_the_term(mongo: Any) -> None:
    # A renew in flight when the node is SIGSTOPped gets its reply 20 s
    # later. The store answered at once: the term must stay the TTL, or the
    # buckets this node takes back would wait 30 s on its next crash.
    clock = FakeClock()
    stalls = StallMeter(monotonic=clock)
    store, leases = slow_lease_store(mongo, clock, stalls)
    a = LeaseManager(leases, 6.0, monotonic=clock, stalled_since=stalls.stalled_since)
    assert await a.acquire([0]) == [0]
    store.delay, store.paused = 20.0, True  # the reply waits in the socket buffer
    await a.renew()
    assert a.term == 6.0
    assert a.usable() == {}  # the pause still costs the lease: its deadline passed
    # A slow store, the node's timer ticking on time meanwhile, still stretches it.
    assert stalls.ticked() > 19.0  # the node's timer fires after SIGCONT
    store.delay, store.paused = 5.0, False
    assert await a.acquire([0]) == [0]
    assert a.term == 15.0
