"""Whether a node can work its buckets (node/delivery/reachability.py), in
virtual time: out of the placement after a while without the store or the
broker, back after a while with it, never on a blip, and unhealthy after a
long store outage."""

from __future__ import annotations

from node.delivery.reachability import Reachability, advertised, workers


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
