"""The per-bucket views of due work (node/delivery/due_book.py), in virtual
time: which buckets a round reads, and that nothing is ever missed."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from node.delivery.due_book import WHOLE_READ_EVERY, DueBook, Read

T0 = datetime(2030, 1, 1, tzinfo=UTC)
REFRESH = 1.0


def doc(schedule_id: str, bucket: int, due: float) -> dict[str, Any]:
    return {"_id": schedule_id, "bucket": bucket, "dueAt": T0 + timedelta(seconds=due)}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class Store:
    """PENDING schedules by bucket, answering reads as the store would."""

    def __init__(self) -> None:
        self.pending: dict[str, dict[str, Any]] = {}
        self.reads = 0

    def answer(self, read: Read) -> list[dict[str, Any]]:
        self.reads += 1
        found = sorted(
            (
                d
                for d in self.pending.values()
                if d["bucket"] == read.bucket and d["dueAt"] <= read.until
            ),
            key=lambda d: d["dueAt"],
        )
        return found[: read.limit]


def round_(book: DueBook, store: Store, now: float) -> list[Read]:
    reads = book.reads(at(now), now, lookahead=REFRESH)
    for read in reads:
        book.learned(read, store.answer(read), now)
    return reads


def test_gained_buckets_are_read_and_lost_ones_forgotten() -> None:
    book, store = DueBook(refresh=REFRESH, budget=100), Store()
    assert book.sync({1: 5, 2: 5}) == {1, 2}
    assert [r.bucket for r in round_(book, store, 0.0)] == [1, 2]
    assert book.sync({2: 5, 3: 7}) == {3}
    assert book.held() == {2: 5, 3: 7}
    assert [r.bucket for r in round_(book, store, 0.05)] == [3]
    assert book.sync({2: 6, 3: 7}) == {2}  # retaken under a new token: read again
    assert [r.bucket for r in round_(book, store, 0.1)] == [2]


def test_an_idle_bucket_is_read_once_a_refresh_interval_not_every_round() -> None:
    book, store = DueBook(refresh=REFRESH, budget=100), Store()
    book.sync({1: 1})
    round_(book, store, 0.0)
    assert round_(book, store, 0.3) == []
    assert round_(book, store, 0.9) == []
    assert [r.bucket for r in round_(book, store, 1.0)] == [1]
    assert book.next_read() == 2.0


def test_cached_due_work_is_served_without_a_read_and_a_full_read_reads_on() -> None:
    book, store = DueBook(refresh=REFRESH, budget=100, min_read=2), Store()
    book.sync({1: 1})
    for i in range(5):
        store.pending[f"s{i}"] = doc(f"s{i}", 1, 0.0)
    [read] = round_(book, store, 0.0)
    assert read.limit == 100
    assert [d["_id"] for d in book.due(at(0.0))] == [f"s{i}" for i in range(5)]
    assert round_(book, store, 0.1) == []  # work in hand


def test_a_full_read_is_followed_by_the_next_as_soon_as_its_work_is_taken() -> None:
    book, store = DueBook(refresh=REFRESH, budget=4, min_read=2), Store()
    book.sync({1: 1, 2: 1})
    for i in range(10):
        store.pending[f"s{i}"] = doc(f"s{i}", 1, 0.0)
    reads = round_(book, store, 0.0)
    assert [r.limit for r in reads] == [2, 2]  # the budget, shared
    assert book.hiding(at(0.0)) == [1]
    later = doc("later", 2, 0.5)
    assert book.in_order([doc("s0", 1, 0.0), later]) == [doc("s0", 1, 0.0)]  # s2... may be first
    first = book.due(at(0.0))
    assert len(first) == 2
    for d in first:
        del store.pending[d["_id"]]
    book.taken(first)
    assert [r.bucket for r in round_(book, store, 0.05)] == [1]  # bucket 2 was not full
    assert {d["_id"] for d in book.due(at(0.05))}.isdisjoint({d["_id"] for d in first})


def test_a_hint_inside_the_view_s_bound_reads_again_one_after_it_does_not() -> None:
    book, store = DueBook(refresh=REFRESH, budget=100), Store()
    book.sync({1: 1})
    round_(book, store, 0.0)  # bound: 1.0
    assert not book.hint(1, at(1.5))  # a refresh reads it in time
    assert round_(book, store, 0.2) == []
    assert book.hint(1, at(0.5))
    assert [r.bucket for r in round_(book, store, 0.2)] == [1]
    assert not book.hint(9, at(0.5))  # not ours


def test_this_node_s_own_insert_joins_the_view_without_a_read() -> None:
    book, store = DueBook(refresh=REFRESH, budget=100), Store()
    book.sync({1: 1})
    round_(book, store, 0.0)
    mine = doc("mine", 1, 0.4)
    assert book.accepted(mine)
    assert book.next_due() == at(0.4)
    assert round_(book, store, 0.4) == []
    assert book.accepted(mine)  # told twice (or read as well): held once
    assert book.due(at(0.4)) == [mine]
    assert not book.accepted(doc("other", 2, 0.4))


def test_a_read_for_a_bucket_retaken_meanwhile_is_not_used() -> None:
    book = DueBook(refresh=REFRESH, budget=100)
    book.sync({1: 1})
    [read] = book.reads(at(0.0), 0.0, REFRESH)
    book.sync({1: 2})
    book.learned(read, [doc("old", 1, 0.0)], 0.0)
    assert book.due(at(0.0)) == []


def test_nothing_is_missed_when_hints_are_lost() -> None:
    """Other nodes insert into our buckets at random times, due at random
    times, and half of their hints are lost; this node inserts some itself.
    Every schedule reaches the due pool no later than a refresh interval
    after it is due, and an idle bucket costs a read a refresh interval."""
    rng = random.Random(7)
    book, store = DueBook(refresh=REFRESH, budget=1000), Store()
    buckets = {b: 1 for b in range(8)}
    book.sync(buckets)
    inserted: dict[str, float] = {}  # id -> when it is owed: due, or inserted if later
    seen: dict[str, float] = {}
    step, now = 0.05, 0.0
    while now < 60.0:
        for _ in range(rng.randrange(3)):
            name = f"s{len(inserted)}"
            due = now + rng.choice([-1.0, 0.0, 0.2, 0.9, 1.5, 3.0, 10.0]) * rng.random()
            new = doc(name, rng.randrange(8), due)
            store.pending[name] = new
            inserted[name] = max(due, now)
            if rng.random() < 0.2:
                book.accepted(new)  # this node's own insert
            elif due - now <= REFRESH and rng.random() < 0.5:
                book.hint(new["bucket"], new["dueAt"])  # a hint that arrived
        round_(book, store, now)
        pool = book.due(at(now))
        for d in pool:
            seen.setdefault(d["_id"], now)
            store.pending.pop(d["_id"], None)
        book.taken(pool)
        now = round(now + step, 2)
    for name, owed in inserted.items():
        if owed < 58.0:
            assert name in seen, name
            assert seen[name] - owed <= REFRESH + step + 1e-9, (name, owed, seen[name])
    # Idle reads: about one per bucket per refresh interval, plus the hinted ones.
    assert store.reads < 8 * 60 / REFRESH * 2


def test_only_a_full_view_of_due_work_may_hide_other_due_work() -> None:
    book, store = DueBook(refresh=REFRESH, budget=4, min_read=2), Store()
    book.sync({1: 1, 2: 1, 3: 1})
    for i in range(3):
        store.pending[f"due{i}"] = doc(f"due{i}", 1, 0.0)  # more due than a read takes
    store.pending["soon0"] = doc("soon0", 2, 0.0)
    for i in range(3):
        store.pending[f"soon{i + 1}"] = doc(f"soon{i + 1}", 2, 0.5)  # full, read ahead
    store.pending["one"] = doc("one", 3, 0.0)  # all of it read
    reads = round_(book, store, 0.0)
    assert [r.limit for r in reads] == [2, 2, 2]
    # Bucket 2's view ends past now: everything of it due by now is in hand.
    assert book.hiding(at(0.0)) == [1]
    # Once its read-ahead work is due, it may hide more.
    assert book.hiding(at(0.5)) == [1, 2]
    book.taken(book.due(at(0.5)))
    assert book.hiding(at(0.5)) == []


def call(schedule_id: str, bucket: int, due: float, host: str) -> dict[str, Any]:
    return {**doc(schedule_id, bucket, due), "http": {"url": f"https://{host}/", "host": host}}


def test_views_full_of_a_slow_lane_are_read_past_it_in_one_read() -> None:
    """Buckets 1 and 2 are full of host a's calls, bucket 3 of records: one
    read for 1 and 2 past lane a (Kafka and other hosts), its finds kept
    behind each view; then a refresh later, doubling while reads find
    nothing; at once when a read was full and all it brought is taken."""
    book = DueBook(refresh=REFRESH, budget=12, min_read=2)
    book.sync({1: 5, 2: 5, 3: 5})
    reads = book.reads(at(10), 10.0, REFRESH)
    assert [r.limit for r in reads] == [4, 4, 4] and book.past.limit == 3
    book.learned(reads[0], [call(f"a{n}", 1, n, "a") for n in range(4)], 10.0)
    book.learned(reads[1], [call(f"a{n}", 2, n, "a") for n in range(4, 8)], 10.0)
    book.learned(reads[2], [doc(f"r{n}", 3, n + 0.5) for n in range(3)], 10.0)  # all of it
    assert book.next_read(at(10), None) == float("-inf")
    past = book.past_read(at(10), 10.0)
    assert past is not None
    assert past.tokens == {1: 5, 2: 5} and past.skipping == frozenset({"a"})
    assert past.until >= at(10 + WHOLE_READ_EVERY * REFRESH)
    behind = [doc("k0", 1, 9), call("b0", 2, 9.5, "b")]
    book.learned_past(past, behind, 10.0)
    assert [d["_id"] for d in book.due(at(10))][-3:] == ["a7", "k0", "b0"]
    assert book.past_read(at(10), 10.0) is None  # not again at once
    assert book.past_read(at(10.5), 10.5) is None
    # What the read past lane a found goes in order before a's unread backlog:
    # it holds every record and other host's call due up to its bound.
    assert book.in_order([*behind, call("a9", 1, 9, "a")]) == behind
    book.taken(behind)
    assert book.next_read(at(10.5), None) == 10.0 + REFRESH
    again = book.past_read(at(11), 11.0)
    assert again is not None
    book.learned_past(again, [], 11.0)
    assert book.next_read(at(11.5), None) == 11.0 + 2 * REFRESH  # found nothing: doubled
    third = book.past_read(at(13), 13.0)
    assert third is not None
    more = [doc(f"k{n}", 1, 13) for n in range(1, 4)]
    book.learned_past(third, more, 13.0)  # full: its limit
    assert book.past_read(at(13), 13.0) is None  # what it brought is in hand
    book.taken(more)
    assert book.next_read(at(13), None) == float("-inf")  # more may wait behind


def test_the_slow_lanes_are_hosts_and_what_is_held_back() -> None:
    """Kafka is skipped only while held back (the broker down); a hint into a
    full view brings the next read past its lanes to the next interval."""
    book = DueBook(refresh=REFRESH, budget=4, min_read=4)
    book.sync({2: 1})
    [whole] = book.reads(at(0), 0.0, REFRESH)
    front = [doc("k0", 2, -3), call("b0", 2, -2, "b"), doc("k1", 2, -1), call("b1", 2, 0, "b")]
    book.learned(whole, front, 0.0)
    kafka_down = lambda d: "http" not in d  # noqa: E731
    past = book.past_read(at(0), 0.0, kafka_down)
    assert past is not None and past.skipping == frozenset({None, "b"})
    past = book.past_read(at(0), 0.0)
    assert past is not None and past.skipping == frozenset({"b"})
    book.learned_past(past, [], 0.0)
    book.learned_past(past, [], 2.0)
    assert book.next_read(at(2.5), None) == 2.0 + 4 * REFRESH
    book.hint(2, at(3))
    assert book.next_read(at(2.5), None) == 2.0 + REFRESH


def test_a_view_with_only_calls_in_hand_is_refreshed_after_its_bound() -> None:
    """Calls go a host's bound at a time: a view whose due work in hand is
    calls may keep them a while, so it is refreshed each interval for what
    lies after its bound (a record due there would otherwise wait for the
    calls); one with a record in hand is not read until that is taken."""
    book = DueBook(refresh=REFRESH, budget=100, min_read=16)
    book.sync({1: 1})
    [whole] = book.reads(at(0), 0.0, REFRESH)
    book.learned(whole, [call(f"a{n}", 1, 0, "a") for n in range(5)], 0.0)
    assert book.reads(at(0.5), 0.5, REFRESH) == []
    assert book.next_read(at(0.5), None) == REFRESH
    [refresh] = book.reads(at(1), 1.0, REFRESH)
    assert refresh.after == whole.until  # only what lies past the view
    book.learned(refresh, [doc("k0", 1, 1.5)], 1.0)
    assert book.reads(at(2), 2.0, REFRESH) == []  # k0 in hand: take it first


def test_a_full_read_past_the_slow_lanes_does_not_back_off() -> None:
    """A read past the slow lanes that returned its limit holds only the
    earliest of what lies ahead: the next comes a poll interval later even
    when it finds nothing new (all read ahead before), or what lies past
    the limit would fall due unread, up to ten intervals late."""
    book = DueBook(refresh=REFRESH, budget=2, min_read=2)
    book.sync({1: 1})
    [whole] = book.reads(at(0), 0.0, REFRESH)
    book.learned(whole, [call(f"a{n}", 1, -1, "a") for n in range(2)], 0.0)
    ahead = [doc(f"k{n}", 1, 5 + n) for n in range(2)]  # the read's limit: 2
    for second in range(4):
        past = book.past_read(at(second), float(second))
        assert past is not None, second
        book.learned_past(past, ahead, float(second))  # the same two each time
        assert book.next_read(at(second + 0.5), None) == second + REFRESH
