"""The per-bucket views of due work (node/delivery/due_book.py), in virtual
time: which buckets a round reads, and that nothing is ever missed."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from node.delivery.due_book import READS_PER_ROUND, WHOLE_READ_EVERY, DueBook, Read
from node.schedule.destination import lane

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


def test_a_round_reads_at_most_its_share_never_read_first_then_least_lately() -> None:
    """4,096 buckets each with work due: a round reads READS_PER_ROUND of
    them, so the first claim does not wait for every read, and the book asks
    for the next round at once until each was read; then the least lately
    read go first, so none waits behind buckets read again and again."""
    book, store = DueBook(refresh=REFRESH, budget=100), Store()
    buckets = 2 * READS_PER_ROUND + 10
    for bucket in range(buckets):
        store.pending[f"s{bucket}"] = doc(f"s{bucket}", bucket, -1.0)
    book.sync(dict.fromkeys(range(buckets), 1))
    first = round_(book, store, 0.0)
    assert [r.bucket for r in first] == list(range(READS_PER_ROUND))
    assert book.next_read(at(0.0), None, None, 0.0) == float("-inf")  # the rest: now
    second = round_(book, store, 0.1)
    third = round_(book, store, 0.2)
    assert [r.bucket for r in [*second, *third]] == list(range(READS_PER_ROUND, buckets))
    assert store.reads == buckets  # each read once
    assert {d["_id"] for d in book.due(at(0.2))} == set(store.pending)
    # Bucket 3 was taken and marked stale meanwhile (its view missing): read
    # first; then, a refresh on, the least lately read first.
    book.taken(list(book.due(at(0.2))))
    store.pending.clear()
    book.sync({**dict.fromkeys(range(buckets), 1), 3: 2})
    later = book.reads(at(1.15), 1.15, REFRESH)
    assert [r.bucket for r in later] == [3, *(b for b in range(READS_PER_ROUND) if b != 3)]


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
    # What it found no earlier read should have: the next read doubles.
    assert book.next_read(at(10.5), None) == 10.0 + 2 * REFRESH
    again = book.past_read(at(12), 12.0)
    assert again is not None
    book.learned_past(again, [], 12.0)
    assert book.next_read(at(12.5), None) == 12.0 + 4 * REFRESH  # found nothing: doubled
    # A schedule the last read should have found (due by its bound in a
    # bucket it covered: a hint lost): reads go a refresh apart again.
    third = book.past_read(at(16), 16.0)
    assert third is not None
    book.learned_past(third, [doc("late", 1, 15)], 16.0)
    assert book.next_read(at(16), None) == 16.0 + REFRESH
    book.taken([doc("late", 1, 15)])
    fourth = book.past_read(at(17), 17.0)
    assert fourth is not None
    more = [doc(f"k{n}", 1, 17) for n in range(1, 4)]
    book.learned_past(fourth, more, 17.0)  # full: its limit
    assert book.past_read(at(17), 17.0) is None  # what it brought is in hand
    book.taken(more)
    assert book.next_read(at(17), None) == float("-inf")  # more may wait behind


def test_a_read_past_the_slow_lanes_is_one_at_a_time_and_drops_what_was_taken_meanwhile() -> None:
    """The poller makes the read beside its rounds: none other until its
    answer is in, and what the rounds took meanwhile (it may come back in
    that answer) is not put back behind the view. A failed read is made
    again a refresh later."""
    book = DueBook(refresh=REFRESH, budget=2, min_read=2)
    book.sync({1: 1})
    [whole] = book.reads(at(0), 0.0, REFRESH)
    book.learned(whole, [call("a0", 1, -1, "a"), call("a1", 1, -1, "a")], 0.0)
    past = book.past_read(at(0), 0.0)
    assert past is not None
    assert book.past_read(at(5), 5.0) is None and book.next_read(at(5), None) is None
    book.accepted(doc("k0", 1, 2))  # stored meanwhile: the read may see it
    book.learned_past(past, [doc("k0", 1, 2), doc("k1", 1, 3)], 0.5)
    assert [d["_id"] for d in book.due(at(3))] == ["a0", "a1", "k0", "k1"]
    again = book.past_read(at(2.5), 2.5)
    assert again is not None
    book.taken([doc("k0", 1, 2)])  # claimed by a round while the read is out
    book.learned_past(again, [doc("k0", 1, 2), doc("k1", 1, 3)], 3.0)
    assert [d["_id"] for d in book.due(at(3))] == ["a0", "a1", "k1"]
    failing = book.past_read(at(5), 5.0)
    assert failing is not None
    book.past_failed(5.5)
    assert book.past_read(at(5.5), 5.5) is None
    assert book.past_read(at(6.5), 6.5) is not None


def test_a_schedule_stored_behind_a_slow_lane_joins_what_the_read_past_it_found() -> None:
    """This node stores a schedule in a bucket whose view a slow lane fills:
    due by the last read past the lanes' bound, of a lane it did not skip,
    it goes behind the view with no read; past that bound it waits for the
    next read (which reads ahead that far); in a lane skipped it is with
    the backlog; before the view's last it joins the view itself."""
    book = DueBook(refresh=REFRESH, budget=2, min_read=2)
    book.sync({1: 1})
    [whole] = book.reads(at(0), 0.0, REFRESH)
    book.learned(whole, [call("a0", 1, -2, "a"), call("a1", 1, -1, "a")], 0.0)
    past = book.past_read(at(0), 0.0)
    assert past is not None
    book.learned_past(past, [], 0.0)
    assert book.next_read(at(0), None) == 2 * REFRESH
    book.accepted(doc("k0", 1, 1))
    book.accepted(call("b0", 1, 2, "b"))
    book.accepted(call("a2", 1, 2, "a"))  # a's lane: behind a's backlog
    book.accepted(call("a3", 1, -1.5, "a"))  # before the view's last
    book.accepted(doc("far", 1, 60))  # past the read's bound
    assert [d["_id"] for d in book.due(at(2))] == ["a0", "a3", "a1", "k0", "b0"]
    assert book.next_read(at(0), None) == 2 * REFRESH  # none of them asks for a read
    book.accepted(doc("k1", 2, 1))  # a bucket not held: nothing
    assert book.next_read(at(0), None) == 2 * REFRESH


def test_a_lane_is_slow_while_stalled_or_its_calls_crowd_a_full_view() -> None:
    """Slow lanes are a node's, not a view's: a host with its circuit open,
    Kafka while the broker is down, a host whose due calls make up more than
    half of a full view (hung, or draining a backlog a bound at a time). A
    host with a few calls due here and there is not skipped, however many
    views hold some: its later calls behind a full view may be due before
    anything of it in hand (a fast host hidden behind a hung one's backlog
    in every bucket). A hint into a full view, or a lane no longer slow,
    brings the next read past the slow lanes to the next interval."""
    book = DueBook(refresh=REFRESH, budget=4, min_read=4)
    book.sync({2: 1})
    [whole] = book.reads(at(0), 0.0, REFRESH)
    b0 = call("b0", 2, -0.5, "b")
    book.learned(whole, [doc("k0", 2, -0.5), doc("k1", 2, -0.4), b0, call("a0", 2, 0.5, "a")], 0.0)
    assert book.past_read(at(0), 0.0) is None  # nothing crowds it: the view goes as it is
    kafka_down = lambda d: "http" not in d  # noqa: E731
    past = book.past_read(at(0), 0.0, kafka_down)
    assert past is not None and past.skipping == frozenset({None})
    book.past_failed(0.0)  # the next a refresh later
    book.taken([b0])  # b's call went
    a_open = lambda d: lane(d) == "a"  # noqa: E731  (a's circuit open)
    past = book.past_read(at(1), 1.0, a_open)
    assert past is not None and past.skipping == frozenset({"a"})
    book.learned_past(past, [], 1.0)
    book.learned_past(past, [], 2.0)
    assert book.next_read(at(2.5), None, a_open) == 2.0 + 4 * REFRESH
    book.hint(2, at(60), now=at(2.5))  # due later (the change feed tells every insert)
    assert book.next_read(at(2.5), None, a_open) == 2.0 + 4 * REFRESH
    book.hint(2, at(3), now=at(2.5))
    assert book.next_read(at(2.5), None, a_open) == 2.0 + REFRESH
    # Host a hung, three of bucket 2's four; b fast, one call in each full
    # view: only a is skipped, and only bucket 2 holds it.
    other = DueBook(refresh=REFRESH, budget=8, min_read=4)
    other.sync({1: 1, 2: 1})
    first, second = other.reads(at(0), 0.0, REFRESH)
    other.learned(
        first, [call("b0", 1, -0.5, "b"), *(doc(f"k{n}", 1, -0.4) for n in range(3))], 0.0
    )
    other.learned(second, [*(call(f"a{n}", 2, n - 3, "a") for n in range(3)), b0], 0.0)
    past = other.past_read(at(0), 0.0)
    assert past is not None and past.skipping == frozenset({"a"}) and past.tokens == {2: 1}
    other.learned_past(past, [], 0.0)
    # b's circuit opens: skipped too, and bucket 1 is crowded now: read a
    # refresh after the last, not the two intervals the reads had backed
    # off to, and alone (bucket 2 is covered up to the last read's bound).
    b_open = lambda d: lane(d) == "b"  # noqa: E731
    late = other.past_read(at(1), 1.0, b_open)
    assert late is not None and late.skipping == frozenset({"a", "b"})
    assert late.tokens == {1: 1} and not late.whole
    other.learned_past(late, [], 1.0)
    assert other.past_read(at(1.5), 1.5, b_open) is None  # the whole read's turn is at 2
    whole_read = other.past_read(at(2), 2.0, b_open)
    assert whole_read is not None and whole_read.tokens == {1: 1, 2: 1}
    other.learned_past(whole_read, [], 2.0)
    assert other.past_read(at(3), 3.0, b_open) is None  # found nothing: the next at 6
    again = other.past_read(at(3), 3.0)  # b's circuit closed: its lane is read again
    assert again is not None and again.skipping == frozenset({"a"})


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


def test_a_full_read_past_the_slow_lanes_backs_off_no_later_than_its_last_schedule() -> None:
    """A read past the slow lanes that returned its limit holds only the
    earliest of what lies ahead: reads finding nothing new back off, but
    the next always comes a refresh before the full read's last schedule
    falls due, or what lies past its limit would fall due unread."""
    book = DueBook(refresh=REFRESH, budget=2, min_read=2)
    book.sync({1: 1})
    [whole] = book.reads(at(0), 0.0, REFRESH)
    book.learned(whole, [call(f"a{n}", 1, -1, "a") for n in range(2)], 0.0)
    ahead = [doc(f"k{n}", 1, 5 + n) for n in range(2)]  # the read's limit: 2
    second, reads = 0.0, []
    while second < 6:
        past = book.past_read(at(second), second)
        assert past is not None, second
        book.learned_past(past, ahead, second)  # the same two each time
        reads.append(second)
        next_read = book.next_read(at(second), None)
        assert next_read is not None
        second = next_read
    assert reads == [0.0, 2.0, 5.0]


def test_taken_plainly_oldest_first_a_round_waits_on_nothing_it_would_not_take() -> None:
    """Plain oldest first: a schedule found behind a full view, once the
    lane in front is no longer slow, waits for what the view has not read
    before it; the next due time a round sleeps to is not its (a round
    woken for it would take nothing, and wake again at once)."""
    book = DueBook(refresh=REFRESH, budget=4, min_read=4)
    book.sync({1: 1})
    [whole] = book.reads(at(0), 0.0, REFRESH)
    front = [*(call(f"a{n}", 1, n - 3, "a") for n in range(3)), call("b0", 1, -0.5, "b")]
    book.learned(whole, front, 0.0)
    past = book.past_read(at(0), 0.0)
    assert past is not None and past.skipping == frozenset({"a"})
    book.learned_past(past, [doc("k0", 1, 5)], 0.0)
    assert book.next_due(ordered=True) == at(-3)
    book.taken(front[:2])  # a has one of two: no longer slow
    assert book.past_read(at(1), 1.0) is None
    assert book.in_order(book.due(at(5))) == front[2:]
    calls = lambda d: "http" in d  # noqa: E731  (every call held back)
    assert book.next_due(calls, ordered=True) is None
    assert book.next_due(calls) == at(5)


def test_buckets_crowded_one_by_one_are_read_past_one_by_one() -> None:
    """A hung host's backlog fills the views one after another: after the
    first, a read past the slow lanes reads only the buckets newly crowded
    (the others are covered up to their bounds), a refresh after the last;
    the whole reads keep their own back-off. What this node stores in a
    bucket so covered joins its finds with no read."""
    book = DueBook(refresh=REFRESH, budget=6, min_read=2)
    book.sync({1: 1, 2: 1, 3: 1})
    for read in book.reads(at(0), 0.0, REFRESH):
        hung = [call("a0", 1, -1, "a"), call("a1", 1, -1, "a")] if read.bucket == 1 else []
        book.learned(read, hung, 0.0)
    first = book.past_read(at(0), 0.0)
    assert first is not None and first.whole and first.tokens == {1: 1}
    book.learned_past(first, [], 0.0)
    book.learned(Read(2, 1, at(1), 2), [call("a2", 2, -1, "a"), call("a3", 2, -1, "a")], 0.5)
    assert book.past_read(at(0.5), 0.5) is None  # a refresh after the last
    newly = book.past_read(at(1), 1.0)
    assert newly is not None and not newly.whole and newly.tokens == {2: 1}
    book.learned_past(newly, [doc("k0", 2, 3)], 1.0)
    book.accepted(doc("k1", 2, 2.5))
    assert [d["_id"] for d in book.due(at(3))] == ["a0", "a1", "a2", "a3", "k1", "k0"]
    assert book.past_read(at(1.5), 1.5) is None  # the whole read found nothing: at 2
    whole = book.past_read(at(2), 2.0)
    assert whole is not None and whole.whole and whole.tokens == {1: 1, 2: 1}


def test_the_feeds_news_of_a_write_the_node_told_itself_is_none_once() -> None:
    """What the node wrote back to PENDING and hinted itself, the change feed
    tells again: no news, once, and only at the due time written (to the
    millisecond, as stored). Another write of the id is news, as is any
    write after a failed one of ours, or after a feed opened afresh or the
    bucket changed hands (a write then may have matched nothing: no news of
    it is left to come)."""
    book = DueBook(refresh=REFRESH, budget=100)
    book.sync({1: 1})
    written = at(3) + timedelta(microseconds=1500)
    book.wrote(1, "r", written)
    assert not book.news(1, "r", at(3) + timedelta(milliseconds=1), inserted=False)
    assert book.news(1, "r", at(3) + timedelta(milliseconds=1), inserted=False)  # once
    book.wrote(1, "r", at(4))
    assert book.news(1, "r", at(5), inserted=False)  # a PATCH since (its news comes first)
    assert book.news(1, "r", at(4), inserted=False)  # and ours after it
    book.wrote(1, "p", None)  # a put-back: its due time as it was
    assert book.news(1, "p", at(0), inserted=False)
    book.wrote(1, "p", None)
    assert not book.news(1, "p", None, inserted=False)
    book.wrote(1, "f", at(6))
    book.unwritten(["f"])
    assert book.news(1, "f", at(6), inserted=False)
    book.wrote(1, "w", at(6))
    book.watch(True)
    assert book.news(1, "w", at(6), inserted=False)
    book.wrote(1, "s", at(6))
    book.sync({1: 2})
    assert book.news(1, "s", at(6), inserted=False)
    book.taken([doc("t", 1, 0)])  # an insert told after its claim
    assert not book.news(1, "t", at(0), inserted=True)
    assert book.news(1, "n", at(0), inserted=True)
