"""The stall meter, on virtual time: what counts as the process standing still."""

from __future__ import annotations

import asyncio

import pytest

from node.delivery.stalls import StallMeter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ticking(meter: StallMeter, clock: Clock, seconds: float, every: float = 0.1) -> None:
    """The timer firing on time for ``seconds``."""
    end = clock.now + seconds
    while clock.now < end:
        clock.now += every
        assert meter.ticked() == 0.0


def test_a_timer_on_time_or_a_little_late_is_no_stall() -> None:
    clock = Clock()
    meter = StallMeter(tick=0.1, threshold=1.0, monotonic=clock)
    ticking(meter, clock, 5.0)
    ticking(meter, clock, 5.0, every=0.9)  # a busy machine's jitter
    assert meter.stalled_since(clock.now - 10.0) == 0.0
    assert (meter.count, meter.seconds) == (0, 0.0)


def test_a_pause_counts_once_the_timer_sees_it_and_before() -> None:
    clock = Clock()
    meter = StallMeter(tick=0.1, threshold=1.0, monotonic=clock)
    ticking(meter, clock, 1.0)
    sent = clock.now - 0.05  # a round trip began just before the pause
    clock.now += 20.1  # SIGSTOP for 20 s, then SIGCONT
    woke = clock.now
    # The reply is handled before the timer fires: the stall is still open.
    assert meter.stalled_since(sent) == pytest.approx(20.0)
    assert meter.ticked() == pytest.approx(20.0)
    # And after the timer has closed it.
    assert meter.stalled_since(sent) == pytest.approx(20.0)
    ticking(meter, clock, 3.0)
    assert meter.stalled_since(sent) == pytest.approx(20.0)
    # Only the part after ``since`` is counted, and none of it from after it.
    assert meter.stalled_since(woke - 10.0) == pytest.approx(10.0)
    assert meter.stalled_since(woke + 1.0) == 0.0
    assert (meter.count, meter.seconds) == (1, pytest.approx(20.0))


def test_stalls_add_up_and_old_ones_are_forgotten() -> None:
    clock = Clock()
    meter = StallMeter(tick=0.1, threshold=1.0, monotonic=clock)
    start = clock.now
    for _ in range(3):
        clock.now += 2.1
        assert meter.ticked() == pytest.approx(2.0)
        ticking(meter, clock, 1.0)
    assert meter.stalled_since(start) == pytest.approx(6.0)
    ticking(meter, clock, 400.0, every=1.0)
    assert meter.stalled_since(start) == 0.0  # beyond what any round trip lasts
    assert meter.count == 3  # the counters keep them


async def test_the_time_before_the_meter_runs_is_no_stall() -> None:
    clock = Clock()
    meter = StallMeter(monotonic=clock)
    clock.now += 60.0  # the node was built, then took a minute to start
    task = asyncio.create_task(meter.run())
    await asyncio.sleep(0)  # it starts, and sleeps until its first tick
    try:
        assert meter.stalled_since(clock.now - 60.0) == 0.0
    finally:
        task.cancel()
