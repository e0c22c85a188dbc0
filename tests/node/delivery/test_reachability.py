"""Whether a node can work its buckets (node/delivery/reachability.py), in
virtual time: out of the placement after a while without the store or the
broker, back after a while with it, never on a blip, and unhealthy after a
long store outage; whom the placement takes, and how an outage of a server
for everyone moves nothing, at its start or at its end."""

from __future__ import annotations

from node.delivery.reachability import Reachability, Workers, advertised


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def health(clock: Clock) -> Reachability:
    return Reachability(cut_after=6.0, back_after=4.0, dead_after=300.0, monotonic=clock)


def test_a_blip_moves_nothing() -> None:
    clock = Clock()
    h = health(clock)
    clock.now = 2.0
    assert not h.failed()
    clock.now = 3.0
    assert not h.succeeded()
    assert h.placeable


def test_out_after_cut_after_without_a_success_back_after_back_after_of_successes() -> None:
    clock = Clock()
    h = health(clock)
    clock.now = 1.0
    h.succeeded()
    for t in (3.0, 5.0, 6.9):
        clock.now = t
        assert not h.failed()
    clock.now = 7.0  # 6 s since the last success
    assert h.failed() and not h.placeable
    clock.now = 20.0
    assert not h.succeeded()  # one success is not steady yet
    clock.now = 22.0
    assert not h.failed()  # and a failure restarts the count
    clock.now = 23.0
    assert not h.succeeded()
    clock.now = 26.9
    assert not h.succeeded()
    clock.now = 27.0
    assert h.tick() and h.placeable


def test_a_long_outage_is_unhealthy() -> None:
    clock = Clock()
    h = health(clock)
    clock.now = 299.0
    h.failed()
    assert h.healthy and h.unreachable_for == 299.0
    clock.now = 300.0
    assert not h.healthy
    h.succeeded()
    assert h.healthy


def workers(alive: dict[str, dict[str, str]]) -> list[str]:
    """Whom the placement takes at once (no grace)."""
    return Workers(grace=0.0, monotonic=Clock())(alive)


def test_workers_are_the_alive_members_not_advertising_a_cut() -> None:
    alive = {
        "a": {"http": "x"},
        "b": advertised(store=False, broker=True),
        "c": advertised(store=True, broker=True),
        "d": advertised(store=True, broker=False),
    }
    assert workers(alive) == ["a", "c"]


def test_when_nobody_can_work_everybody_stays_placed() -> None:
    # The store is down for all: moving buckets would help nobody.
    alive = {"a": advertised(store=False, broker=True), "b": advertised(store=False, broker=False)}
    assert workers(alive) == ["a", "b"]


def test_a_broker_down_for_everyone_moves_nothing_but_a_store_cut_still_does() -> None:
    # Nobody reaches the broker: the buckets stay with whoever can lease
    # them, and a node also cut from the store is still left out.
    alive = {
        "a": advertised(store=True, broker=False),
        "b": advertised(store=True, broker=False),
        "c": advertised(store=False, broker=False),
    }
    assert workers(alive) == ["a", "b"]
    assert advertised(store=True, broker=True) == {}
    assert advertised(store=False, broker=False) == {"store": "cut", "broker": "cut"}


def test_answering_follows_the_last_call() -> None:
    clock = Clock()
    h = health(clock)
    assert h.answering  # nothing failed yet
    h.failed()
    assert not h.answering and h.placeable  # one failure: not ready, still placed
    h.succeeded()
    assert h.answering


CUT_BROKER = advertised(store=True, broker=False)
CUT_STORE = advertised(store=False, broker=True)


def test_a_node_cut_on_its_own_is_left_out_after_the_grace_and_back_at_once() -> None:
    clock = Clock()
    judge = Workers(grace=4.0, monotonic=clock)
    assert judge({"a": {}, "b": {}, "c": {}}) == ["a", "b", "c"]
    clock.now = 10.0
    assert judge({"a": CUT_BROKER, "b": {}, "c": {}}) == ["a", "b", "c"]
    assert judge.pending()  # ask again: the grace is running
    clock.now = 13.9
    assert judge({"a": CUT_BROKER, "b": {}, "c": {}}) == ["a", "b", "c"]
    clock.now = 15.0
    # Past the grace with nobody asking in between: still worth asking.
    assert judge.pending()
    assert judge({"a": CUT_BROKER, "b": {}, "c": {}}) == ["b", "c"]
    assert not judge.pending()  # acted on
    clock.now = 30.0
    assert judge({"a": {}, "b": {}, "c": {}}) == ["a", "b", "c"]  # back: no wait


def test_an_outage_for_everyone_moves_nothing_as_the_nodes_notice_it_one_by_one() -> None:
    """Before, the first node to notice the broker gone handed its buckets
    to the others, which noticed a second later, and everything came back;
    at the end, the first node to reach the broker again was handed every
    bucket until the others came back."""
    clock = Clock()
    judge = Workers(grace=4.0, monotonic=clock)
    nodes = ["a", "b", "c", "d", "e"]
    cut: set[str] = set()

    def view() -> list[str]:
        return judge({n: CUT_BROKER if n in cut else {} for n in nodes})

    assert view() == nodes
    for n in nodes:  # they notice within three seconds of each other
        clock.now += 0.7
        cut.add(n)
        assert view() == nodes
    for _ in range(20):  # the outage lasts: everybody keeps its buckets
        clock.now += 1.0
        assert view() == nodes
        assert not judge.pending()
    for n in nodes:  # and they reach it again one by one
        clock.now += 0.7
        cut.discard(n)
        assert view() == nodes


def test_the_grace_counts_from_when_others_could_do_the_work() -> None:
    # The broker comes back for a and b only: c, cut since long ago, gets
    # the grace from then before the others take its buckets.
    clock = Clock()
    judge = Workers(grace=4.0, monotonic=clock)
    assert judge({"a": CUT_BROKER, "b": CUT_BROKER, "c": CUT_BROKER}) == ["a", "b", "c"]
    clock.now = 60.0
    assert judge({"a": {}, "b": {}, "c": CUT_BROKER}) == ["a", "b", "c"]
    clock.now = 63.9
    assert judge({"a": {}, "b": {}, "c": CUT_BROKER}) == ["a", "b", "c"]
    clock.now = 64.0
    assert judge({"a": {}, "b": {}, "c": CUT_BROKER}) == ["a", "b"]


def test_with_the_broker_gone_for_all_a_store_cut_still_counts_after_its_grace() -> None:
    clock = Clock()
    judge = Workers(grace=4.0, monotonic=clock)
    both = advertised(store=False, broker=False)
    alive = {"a": CUT_BROKER, "b": CUT_BROKER, "c": both}
    assert judge(alive) == ["a", "b", "c"]
    clock.now = 4.0
    assert judge(alive) == ["a", "b"]
    # A member gone from the view and back is judged afresh.
    clock.now = 5.0
    assert judge({"a": CUT_BROKER, "b": CUT_BROKER}) == ["a", "b"]
    assert judge(alive) == ["a", "b", "c"]
