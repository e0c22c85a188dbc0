"""The store's contract (``node/store/contract.py``), method by method, over
both stores (the ``store`` fixture: the memory twin and MongoDB): what the
API's reads and writes do, what the owner's writes take and leave, and what
the history keeps. A test that passes on one and fails on the other is a
drift between them."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from node.delivery.outcomes import Rules
from node.errors import NotCancellable, ScheduleConflict, ScheduleInFlight, VersionMismatch
from node.schedule import changes
from node.schedule.model import RECENT_OCCURRENCES, Limits, NewSchedule, Status, storage_id
from node.schedule.parse import parse_new_schedule
from node.schedule.payload import INLINE, INLINE_PAYLOAD_BYTES, LARGE
from node.schedule.retry import DEFAULT_POLICY
from node.store.contract import Attempt, Claimed, Schedules
from node.store.listing import Cursor, Listing, Selector
from tests.stores import StoreKit

NOW = datetime.now(UTC).replace(microsecond=0)
LIMITS = Limits(max_payload_bytes=64 * 1024, horizon=timedelta(days=400))
RULES = Rules(DEFAULT_POLICY, timedelta(seconds=60))
BUCKETS = 4


def new(schedule_id: str | None = None, at: datetime = NOW, **fields: Any) -> NewSchedule:
    body: dict[str, Any] = {"topic": "t", "payload": {"n": schedule_id}, **fields}
    if "http" in fields:
        del body["topic"]  # one destination or the other
    if "recurrence" not in fields:
        body["executeAt"] = at.isoformat()
    if schedule_id is not None:
        body["id"] = schedule_id
    return parse_new_schedule(json.dumps(body).encode(), LIMITS, NOW - timedelta(days=1))


async def stored(schedules: Schedules, schedule_id: str) -> dict[str, Any]:
    doc = await schedules.get(schedule_id)
    assert doc is not None
    return doc


async def claim_one(
    schedules: Schedules, schedule_id: str, token: int = 1, at: datetime = NOW
) -> Claimed:
    doc = await stored(schedules, schedule_id)
    [claimed] = await schedules.claim([doc], {doc["bucket"]: token}, "me", at)
    return claimed


async def prepared(store: StoreKit, bucket_count: int) -> Schedules:
    schedules = store.schedules(bucket_count)
    await schedules.prepare(NOW)
    return schedules


# -- the API's reads and writes --------------------------------------------------


async def test_an_insert_is_idempotent_by_client_id_and_refuses_another_body(
    store: StoreKit,
) -> None:
    schedules = await prepared(store, BUCKETS)
    doc, created = await schedules.insert(new("a"), NOW)
    assert created and doc["status"] == "PENDING" and doc["version"] == 1
    again, created = await schedules.insert(new("a"), NOW)
    assert not created and again["_id"] == "a" and again["fingerprint"] == doc["fingerprint"]
    with pytest.raises(ScheduleConflict):
        await schedules.insert(new("a", payload={"other": 1}), NOW)
    assert await schedules.get("nothing") is None
    assert await schedules.count_pending("default") == 1


async def test_a_cancel_takes_pending_or_paused_only_and_checks_the_version(
    store: StoreKit,
) -> None:
    schedules = await prepared(store, BUCKETS)
    for schedule_id in ("p", "q", "f"):
        await schedules.insert(new(schedule_id), NOW)
    with pytest.raises(VersionMismatch):
        await schedules.cancel("p", NOW, if_match=7)
    cancelled = await schedules.cancel("p", NOW, if_match=1)
    assert cancelled is not None
    assert (cancelled["status"], cancelled["version"]) == ("CANCELLED", 2)
    assert cancelled["expireAt"] > NOW  # an ended schedule is kept for the retention only
    again = await schedules.cancel("p", NOW)  # already cancelled: as it is
    assert again is not None and again["version"] == 2
    # Paused: cancellable; in flight: too late.
    await schedules.change("q", lambda d: changes.pause(d, NOW), NOW)
    assert (await schedules.cancel("q", NOW) or {}).get("status") == "CANCELLED"
    await claim_one(schedules, "f")
    with pytest.raises(NotCancellable):
        await schedules.cancel("f", NOW)
    assert await schedules.cancel("none", NOW) is None
    assert await schedules.count_pending("default") == 0


async def test_a_change_writes_only_at_the_version_read_and_bumps_it(store: StoreKit) -> None:
    schedules = await prepared(store, BUCKETS)
    await schedules.insert(new("c"), NOW)
    result = await schedules.change("c", lambda d: changes.pause(d, NOW), NOW, if_match=1)
    assert result is not None
    after, change = result
    assert change is not None and (after["status"], after["version"]) == ("PAUSED", 2)
    # Nothing to change: nothing written, no new version.
    result = await schedules.change("c", lambda d: None, NOW)
    assert result is not None and result[0]["version"] == 2 and result[1] is None
    with pytest.raises(VersionMismatch):
        await schedules.change("c", lambda d: changes.resume(d, NOW), NOW, if_match=1)
    # The claim takes PENDING only: paused, it is not due.
    assert await schedules.find_due((await stored(schedules, "c"))["bucket"], NOW, 10) == []
    assert await schedules.change("none", lambda d: None, NOW) is None


async def test_a_verb_refuses_what_is_stored_in_flight(store: StoreKit) -> None:
    schedules = await prepared(store, BUCKETS)
    await schedules.insert(new("v"), NOW)
    await claim_one(schedules, "v")
    with pytest.raises(ScheduleInFlight):
        await schedules.change("v", lambda d: changes.pause(d, NOW), NOW)


CANCEL, PAUSE, RESUME, RETRY = (
    changes.BULK_VERBS[name] for name in ("cancel", "pause", "resume", "retry")
)


async def test_a_bulk_cancel_takes_the_tenants_live_matches_only(store: StoreKit) -> None:
    schedules = await prepared(store, BUCKETS)
    await schedules.insert(new("o-1", labels={"team": "a"}, key="k1"), NOW)
    await schedules.insert(new("o-2", NOW + timedelta(hours=2), labels={"team": "a"}), NOW)
    await schedules.insert(new("o-3", labels={"team": "b"}, key="k1"), NOW)
    await schedules.insert(new("x-1", labels={"team": "a"}), NOW)
    await schedules.insert(new("o-4", labels={"team": "a"}, tenant="other"), NOW)
    await claim_one(schedules, "x-1")  # in flight: delivered, not cancelled
    by_label = Selector(labels=("team=a",), due_before=NOW + timedelta(hours=1))
    done = await schedules.change_matching("default", by_label, CANCEL, NOW)
    # x-1 is in flight: not cancelled, and the call is not done while it is.
    assert (done.matched, done.changed, done.more) == (1, 1, True)
    assert (await stored(schedules, "o-1"))["status"] == "CANCELLED"
    assert (await stored(schedules, "o-1"))["expireAt"] > NOW
    assert (await stored(schedules, "o-2"))["status"] == "PENDING"  # due after the bound
    assert (await stored(schedules, "x-1"))["status"] == "IN_FLIGHT"
    assert (await stored(schedules, storage_id("other", "o-4")))["status"] == "PENDING"
    done = await schedules.change_matching("default", Selector(key="k1"), CANCEL, NOW)
    assert (done.matched, done.changed, done.more) == (1, 1, False)
    done = await schedules.change_matching("default", Selector(id_prefix="o-"), CANCEL, NOW)
    assert (done.changed, done.due) == (1, {})
    assert (await stored(schedules, "o-2"))["status"] == "CANCELLED"


async def test_bulk_pause_resume_and_retry_change_their_own_statuses_only(
    store: StoreKit,
) -> None:
    schedules = await prepared(store, BUCKETS)
    soon = NOW + timedelta(minutes=5)
    for n in range(4):
        await schedules.insert(new(f"p-{n}", soon, labels={"g": "1"}, key=f"k{n}"), NOW)
    await schedules.insert(
        new("h-1", soon, http={"url": "https://hooks.example/x"}, retry={"maxAttempts": 1}), NOW
    )
    await schedules.insert(new("o-1", soon, labels={"g": "1"}, tenant="other"), NOW)
    await claim_one(schedules, "p-3", at=soon)
    group = Selector(labels=("g=1",))
    paused = await schedules.change_matching("default", group, PAUSE, NOW)
    # p-3 is in flight: a pause is not done until it is delivered or back.
    assert (paused.matched, paused.changed, paused.more) == (3, 3, True)
    docs = [await stored(schedules, f"p-{n}") for n in range(3)]
    assert {(d["status"], d["version"]) for d in docs} == {("PAUSED", 2)}
    assert (await stored(schedules, storage_id("other", "o-1")))["status"] == "PENDING"
    again = await schedules.change_matching("default", group, PAUSE, NOW)
    assert (again.matched, again.changed) == (0, 0)  # safe to repeat
    assert await schedules.count_matching("default", group, PAUSE.statuses, 10) == 0
    assert await schedules.count_matching("default", group, RESUME.statuses, 10) == 3
    assert await schedules.count_matching("default", group, RESUME.statuses, 2) == 2
    resumed = await schedules.change_matching("default", Selector(key="k1"), RESUME, NOW)
    assert (resumed.matched, resumed.changed, resumed.more) == (1, 1, False)
    p1 = await stored(schedules, "p-1")
    assert (p1["status"], p1["version"]) == ("PENDING", 3)
    assert resumed.due == {p1["bucket"]: soon}  # its owner is woken for it
    # Retry takes DELIVERY_FAILED only: due now, attempts afresh, kept.
    failing = await claim_one(schedules, "h-1", at=soon)
    assert await schedules.complete([RULES.failed(failing, "503", NOW)]) == 1
    assert (await stored(schedules, "h-1"))["status"] == "DELIVERY_FAILED"
    by_host = Selector(host="hooks.example")
    assert (await schedules.change_matching("default", by_host, PAUSE, NOW)).matched == 0
    later = NOW + timedelta(minutes=1)
    retried = await schedules.change_matching("default", by_host, RETRY, later)
    assert (retried.matched, retried.changed, retried.more) == (1, 1, False)
    h1 = await stored(schedules, "h-1")
    assert (h1["status"], h1["attempts"], h1["dueAt"]) == ("PENDING", 0, later)
    assert "expireAt" not in h1 and retried.due == {h1["bucket"]: later}


async def test_a_selector_narrows_by_destination_status_and_topic(store: StoreKit) -> None:
    schedules = await prepared(store, BUCKETS)
    await schedules.insert(new("k-1", labels={"g": "1"}), NOW)
    await schedules.insert(new("k-2", labels={"g": "1"}, topic="other"), NOW)
    await schedules.insert(new("h-1", labels={"g": "1"}, http={"url": "https://a.example/"}), NOW)
    await schedules.change("k-2", lambda d: changes.pause(d, NOW), NOW)
    count = schedules.count_matching
    statuses = CANCEL.statuses
    assert await count("default", Selector(labels=("g=1",)), statuses, 10) == 3
    assert await count("default", Selector(labels=("g=1",), destination="http"), statuses, 10) == 1
    assert await count("default", Selector(labels=("g=1",), destination="kafka"), statuses, 10) == 2
    assert await count("default", Selector(topic="other"), statuses, 10) == 1
    only_paused = Selector(labels=("g=1",), statuses=("PAUSED",))
    assert await count("default", only_paused, statuses, 10) == 1
    done = await schedules.change_matching("default", only_paused, CANCEL, NOW)
    assert (done.changed, (await stored(schedules, "k-2"))["status"]) == (1, "CANCELLED")
    assert (await stored(schedules, "k-1"))["status"] == "PENDING"
    with pytest.raises(ValueError, match="selector needs"):
        Selector(destination="http", due_before=NOW)


async def test_a_listing_pages_in_its_order_and_counts_by_status(store: StoreKit) -> None:
    schedules = await prepared(store, BUCKETS)
    at = {f"l{i}": NOW + timedelta(minutes=10 - i) for i in range(6)}
    for schedule_id, when in at.items():
        await schedules.insert(new(schedule_id, when, labels={"set": "one"}), NOW)
    await claim_one(schedules, "l5", at=NOW + timedelta(hours=1))
    by_id = await schedules.list_page(Listing(tenant="default", limit=4))
    assert [d["_id"] for d in by_id.docs] == ["l0", "l1", "l2", "l3"] and by_id.more
    assert all(INLINE not in d for d in by_id.docs)  # no payloads unless asked
    rest = await schedules.list_page(Listing(tenant="default", limit=4, after=Cursor(after="l3")))
    assert [d["_id"] for d in rest.docs] == ["l4", "l5"] and not rest.more
    # By status: in due order, the cursor holding (dueAt, _id).
    pending = Listing(tenant="default", limit=2, status="PENDING")
    first = await schedules.list_page(pending)
    assert [d["_id"] for d in first.docs] == ["l4", "l3"]
    last = first.docs[-1]
    cursor = Cursor(after=last["_id"], due=last["dueAt"])
    second = await schedules.list_page(
        Listing(tenant="default", limit=2, status="PENDING", after=cursor)
    )
    assert [d["_id"] for d in second.docs] == ["l2", "l1"] and second.more
    labelled = await schedules.list_page(
        Listing(tenant="default", limit=10, labels=("set=one",)), payloads=True, max_bytes=1
    )
    assert len(labelled.docs) == 1 and labelled.more  # at least one, then the budget
    assert INLINE in labelled.docs[0]
    counts = await schedules.count_by_status(Listing(tenant="default", limit=1))
    assert (counts["PENDING"], counts["IN_FLIGHT"], counts["DELIVERED"]) == (5, 1, 0)
    capped = await schedules.count_by_status(Listing(tenant="default", limit=1), limit=3)
    assert capped["PENDING"] == 3
    assert (await schedules.count_by_status(Listing(tenant="nobody", limit=1)))["PENDING"] == 0


# -- the bucket owner's reads and writes -------------------------------------------


async def test_due_work_is_read_earliest_first_without_large_payloads(store: StoreKit) -> None:
    schedules = await prepared(store, 1)
    big = "x" * (INLINE_PAYLOAD_BYTES + 10)
    await schedules.insert(new("late", NOW - timedelta(seconds=1)), NOW)
    await schedules.insert(new("early", NOW - timedelta(seconds=5), payload=big), NOW)
    await schedules.insert(new("future", NOW + timedelta(seconds=5)), NOW)
    due = await schedules.find_due(0, NOW, 10)
    assert [d["_id"] for d in due] == ["early", "late"]
    assert LARGE not in due[0] and due[0]["payloadBytes"] > INLINE_PAYLOAD_BYTES
    assert [d["_id"] for d in await schedules.find_due(0, NOW, 1)] == ["early"]
    claimed = await schedules.claim(due, {0: 1}, "me", NOW)
    payloads = await schedules.large_payloads(claimed)
    assert list(payloads) == ["early"] and payloads["early"] == json.dumps(big).encode()
    assert await schedules.find_due(0, NOW, 10) == []


async def test_due_work_after_a_bound_is_read_alone(store: StoreKit) -> None:
    """What a view that holds everything up to a bound lacks: what is due
    after it (exclusive), up to the read's own bound."""
    schedules = await prepared(store, 1)
    for name, offset in (("held", -5), ("at-bound", -2), ("new", -1), ("later", 5)):
        await schedules.insert(new(name, NOW + timedelta(seconds=offset)), NOW)
    after = await schedules.find_due(0, NOW, 10, after=NOW - timedelta(seconds=2))
    assert [d["_id"] for d in after] == ["new"]
    assert [d["_id"] for d in await schedules.find_due(0, NOW, 10)] == ["held", "at-bound", "new"]


def call(schedule_id: str, at: datetime, url: str) -> NewSchedule:
    """An HTTP schedule: no topic, a target."""
    body = {"id": schedule_id, "http": {"url": url}, "payload": {}, "executeAt": at.isoformat()}
    return parse_new_schedule(json.dumps(body).encode(), LIMITS, NOW - timedelta(days=1))


async def test_due_work_past_the_slow_lanes_is_read_alone(store: StoreKit) -> None:
    """A read skipping lanes (hosts, None for Kafka) returns the other
    lanes' due work of the buckets asked, earliest first, however much of
    the skipped waits."""
    schedules = await prepared(store, 1)
    for n in range(5):
        await schedules.insert(
            call(f"a{n}", NOW - timedelta(seconds=9), "https://a.example/h"), NOW
        )
    await schedules.insert(call("b0", NOW - timedelta(seconds=2), "https://b.example:8443/h"), NOW)
    await schedules.insert(new("k0", NOW - timedelta(seconds=3)), NOW)
    await schedules.insert(new("k1", NOW + timedelta(seconds=3)), NOW)

    async def past(limit: int, *skipping: str | None, until: datetime = NOW) -> list[str]:
        return [d["_id"] for d in await schedules.find_due_past([0], until, limit, set(skipping))]

    assert [d["_id"] for d in await schedules.find_due(0, NOW, 3)] == ["a0", "a1", "a2"]
    assert await past(3, "a.example") == ["k0", "b0"]
    assert await past(1, "a.example") == ["k0"]
    assert await past(9, "a.example", until=NOW + timedelta(seconds=5)) == ["k0", "b0", "k1"]
    assert await past(9, None, "a.example") == ["b0"]  # the broker down too
    assert await past(9, None) == [*(f"a{n}" for n in range(5)), "b0"]
    assert await past(9, None, "a.example", "b.example") == []
    assert await schedules.find_due_past([1, 2], NOW, 9, {"a.example"}) == []  # other buckets
    several = await schedules.find_due_past([2, 0, 1], NOW, 2, {"a.example"})
    assert [d["_id"] for d in several] == ["k0", "b0"]


async def test_each_tenants_oldest_due_work_is_read_for_it(store: StoreKit) -> None:
    schedules = await prepared(store, BUCKETS)
    for i in range(3):
        await schedules.insert(new(f"a{i}", NOW - timedelta(seconds=10 - i), tenant="a"), NOW)
    await schedules.insert(new("b0", NOW - timedelta(seconds=1), tenant="b"), NOW)
    await schedules.insert(new("b1", NOW + timedelta(seconds=30), tenant="b"), NOW)
    found = await schedules.oldest_due_of(["a", "b"], NOW, range(BUCKETS), 2)
    assert [d["_id"] for d in found] == ["a/a0", "a/a1", "b/b0"]


async def test_a_claim_takes_a_schedule_only_at_the_version_read(store: StoreKit) -> None:
    schedules = await prepared(store, 1)
    await schedules.insert(new("v1"), NOW)
    [read] = await schedules.find_due(0, NOW, 10)
    await schedules.change("v1", lambda d: changes.pause(d, NOW), NOW)
    await schedules.change("v1", lambda d: changes.resume(d, NOW), NOW)
    assert await schedules.claim([read], {0: 1}, "me", NOW) == []  # PENDING again, but changed
    [fresh] = await schedules.find_due(0, NOW, 10)
    [claimed] = await schedules.claim([fresh, fresh], {0: 1}, "me", NOW)  # each once
    doc = await stored(schedules, "v1")
    assert (doc["status"], doc["token"], doc["owner"], doc["attempts"], doc["runs"]) == (
        "IN_FLIGHT", 1, "me", 1, 1,
    )  # fmt: skip
    assert doc["version"] == fresh["version"] + 1 and claimed.attempt == 1
    # Not yet due by the claim's now: not taken.
    await schedules.insert(new("soon", NOW + timedelta(seconds=5)), NOW)
    soon = await stored(schedules, "soon")
    assert await schedules.claim([soon], {0: 1}, "me", NOW) == []


async def test_a_put_back_undoes_the_claim_under_its_own_token_only(store: StoreKit) -> None:
    schedules = await prepared(store, 1)
    await schedules.insert(new("u1"), NOW)
    await schedules.insert(new("u2"), NOW)
    first = await claim_one(schedules, "u1", token=3)
    second = await claim_one(schedules, "u2", token=3)
    await store.overwrite({"_id": "u2"}, {"token": 4})  # a newer owner's
    assert await schedules.unclaim([first, second]) == 1
    doc = await stored(schedules, "u1")
    assert (doc["status"], doc["attempts"], doc["runs"], doc["token"]) == ("PENDING", 0, 0, 3)
    assert (await stored(schedules, "u2"))["status"] == "IN_FLIGHT"


async def test_recovery_takes_older_tokens_and_our_own_stranded_claims(store: StoreKit) -> None:
    schedules = await prepared(store, 1)
    long_ago = NOW - timedelta(minutes=10)
    for schedule_id in ("old", "mine-stale", "mine-fresh"):
        await schedules.insert(new(schedule_id, long_ago - timedelta(minutes=1)), NOW)
    await claim_one(schedules, "old", token=2)
    await claim_one(schedules, "mine-stale", token=3, at=long_ago - timedelta(seconds=1))
    await claim_one(schedules, "mine-fresh", token=3)
    assert await schedules.recover_in_flight({0: 3}) == ["old"]
    assert sorted(await schedules.recover_in_flight({0: 3}, long_ago)) == ["mine-stale"]
    for schedule_id in ("old", "mine-stale"):
        doc = await stored(schedules, schedule_id)
        assert (doc["status"], doc["token"], doc["recovered"]) == ("PENDING", 3, True)
    assert (await stored(schedules, "mine-fresh"))["status"] == "IN_FLIGHT"


async def test_completions_write_the_outcome_and_end_a_schedule_with_its_expiry(
    store: StoreKit,
) -> None:
    schedules = await prepared(store, 1)
    await schedules.insert(new("d"), NOW)
    await schedules.insert(new("r", retry={"maxAttempts": 3}), NOW)
    done, retried = await claim_one(schedules, "d"), await claim_one(schedules, "r")
    later = NOW + timedelta(seconds=1)
    retry = RULES.failed(retried, "refused", later)
    assert await schedules.complete([RULES.delivered(done, later), retry]) == 2
    delivered = await stored(schedules, "d")
    assert (delivered["status"], delivered["deliveredAt"]) == ("DELIVERED", later)
    assert delivered["expireAt"] > later
    pending = await stored(schedules, "r")
    assert (pending["status"], pending["lastError"]) == ("PENDING", "refused")
    assert retry.due_at is not None and "expireAt" not in pending
    assert abs(pending["dueAt"] - retry.due_at) < timedelta(milliseconds=1)  # as BSON keeps it
    # Written once: the same completion again matches nothing.
    assert await schedules.complete([RULES.delivered(done, later)]) == 0


async def test_a_recurring_schedule_keeps_its_recent_occurrences_bounded(
    store: StoreKit,
) -> None:
    schedules = await prepared(store, 1)
    start = NOW - timedelta(minutes=30)
    await schedules.insert(
        new("tick", recurrence={"every": "PT1M", "start": start.isoformat()}), NOW
    )
    for n in range(RECENT_OCCURRENCES + 2):
        claimed = await claim_one(schedules, "tick", at=NOW + timedelta(days=1))
        on_time = RULES.delivered(claimed, claimed.execute_at)
        assert await schedules.complete([on_time]) == 1, n
    doc = await stored(schedules, "tick")
    assert doc["status"] == "PENDING" and doc["occurrences"] == RECENT_OCCURRENCES + 2
    assert len(doc["recent"]) == RECENT_OCCURRENCES
    assert doc["recent"][-1]["executeAt"] == start + timedelta(minutes=RECENT_OCCURRENCES + 1)
    assert doc["executeAt"] == doc["dueAt"] == start + timedelta(minutes=RECENT_OCCURRENCES + 2)


async def test_status_counts_name_every_status_of_the_nodes_buckets(store: StoreKit) -> None:
    schedules = await prepared(store, 1)
    await schedules.insert(new("s1"), NOW)
    await schedules.insert(new("s2"), NOW)
    await claim_one(schedules, "s2")
    counts = await schedules.status_counts([0])
    assert counts == {s.value: {"PENDING": 1, "IN_FLIGHT": 1}.get(s.value, 0) for s in Status}
    assert set((await schedules.status_counts([])).values()) == {0}


# -- history -------------------------------------------------------------------------


def attempt(run: int, at: datetime, **fields: Any) -> Attempt:
    values: dict[str, Any] = {
        "schedule_id": "h", "tenant": "default", "run": run, "execute_at": at, "attempt": run,
        "at": at, "node": "n", "token": 1, "outcome": "retrying", "error": None,
        "life": NOW - timedelta(hours=1),
    }  # fmt: skip
    values.update(fields)
    return Attempt(**values)


async def test_history_keeps_a_capped_newest_first_record_per_life(store: StoreKit) -> None:
    history = store.history(cap=3, retention=timedelta(days=1))
    await history.prepare()
    runs = [attempt(n, NOW + timedelta(seconds=n)) for n in range(1, 5)]
    assert await history.write(runs[:3]) == 3
    assert await history.write([attempt(2, NOW, node="again")]) == 0  # a run seen twice
    assert await history.write(runs[3:]) == 1  # run 4 takes run 1's slot
    records = await history.of("h", 10)
    assert [r["run"] for r in records] == [4, 3, 2]
    assert {r["node"] for r in records} == {"n"}
    assert [r["run"] for r in await history.of("h", 2)] == [4, 3]
    # Another life of the id: its own slots, and only its records read.
    reborn = attempt(1, NOW + timedelta(minutes=5), life=NOW + timedelta(minutes=4))
    assert await history.write([reborn]) == 1
    since = await history.of("h", 10, since=NOW + timedelta(minutes=4))
    assert [r["at"] for r in since] == [NOW + timedelta(minutes=5)]


async def test_the_next_due_time_after_a_bound_is_the_earliest_pending_one(
    store: StoreKit,
) -> None:
    schedules = await prepared(store, 1)
    empty = await schedules.next_due(0, NOW)
    assert empty is None or empty >= NOW + timedelta(minutes=1)  # none, or none before it
    for name, offset in (("before", -5), ("at", 0), ("third", 30), ("second", 20)):
        await schedules.insert(new(name, NOW + timedelta(seconds=offset)), NOW)
    assert await schedules.next_due(0, NOW) == NOW + timedelta(seconds=20)
    await schedules.change("second", lambda d: changes.pause(d, NOW), NOW)
    assert await schedules.next_due(0, NOW) == NOW + timedelta(seconds=30)  # PENDING only
    # After the last: none, or (the embedded server) a bound past it that
    # says nothing sooner is due; after is exclusive.
    nothing = await schedules.next_due(0, NOW + timedelta(seconds=30))
    assert nothing is None or nothing >= NOW + timedelta(minutes=1)


async def test_the_change_feed_tells_every_write_that_makes_work_due_sooner(
    store: StoreKit,
) -> None:
    """Stored PENDING, made PENDING again, a new due time: told, in order,
    with the bucket and (when the write set it) the due time. A claim, a
    pause or a cancel makes nothing due: not told."""
    schedules = await prepared(store, 4)
    await schedules.insert(new("before"), NOW)  # before the feed: not told
    feed = await schedules.watch_due()
    try:
        later = NOW + timedelta(minutes=5)
        await schedules.insert(new("new", later), NOW)
        put_back = await claim_one(schedules, "before", token=1)
        await schedules.unclaim([put_back])
        await schedules.change("new", lambda d: changes.pause(d, NOW), NOW)
        await schedules.change("new", lambda d: changes.resume(d, NOW), NOW)
        await schedules.change("new", lambda d: changes.trigger(d, NOW), NOW)
        await schedules.cancel("new", NOW)
        await schedules.insert(new("last", later), NOW)
        told = []
        async with asyncio.timeout(30):  # a hang guard
            async for change in feed:
                told.append((change.schedule_id, change.inserted, change.due_at))
                bucket = (await stored(schedules, change.schedule_id))["bucket"]
                assert change.bucket == bucket
                if change.schedule_id == "last":
                    break
        assert told == [
            ("new", True, later),
            ("before", False, None),  # the put-back: PENDING again
            ("new", False, None),  # resumed
            ("new", False, NOW),  # triggered: due now
            ("last", True, later),
        ]
    finally:
        await feed.close()


async def test_a_change_feed_resumes_where_the_last_one_ended(store: StoreKit) -> None:
    """From an earlier feed's resume token, what was written since it closed
    is told (MongoDB keeps that history); the memory twin keeps none, and
    says so (``resumed`` False: the owners read everything again)."""
    schedules = await prepared(store, 4)
    first = await schedules.watch_due()
    await schedules.insert(new("seen"), NOW)
    async with asyncio.timeout(30):  # a hang guard
        async for change in first:
            assert change.schedule_id == "seen"
            break
    token = first.resume_token
    await first.close()
    await schedules.insert(new("meanwhile"), NOW)
    again = await schedules.watch_due(token)
    try:
        await schedules.insert(new("after"), NOW)
        told = []
        async with asyncio.timeout(30):
            async for change in again:
                told.append(change.schedule_id)
                if change.schedule_id == "after":
                    break
        assert told == (["meanwhile", "after"] if again.resumed else ["after"])
        assert again.resumed == (store.kind == "secantus")
    finally:
        await again.close()
