"""The circuit breaker per host (node/delivery/sinks/breaker.py), in virtual
time: the clock is a number the test moves."""

from __future__ import annotations

import pytest

from node.delivery.sinks.breaker import (
    Blocked,
    Breaker,
    Breakers,
    BreakerSettings,
    Pass,
    State,
)

SETTINGS = BreakerSettings(failures=3, cooldown=5.0, cooldown_max=12.0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def probe_of(breaker: Breaker) -> Pass:
    """The call the breaker lets go as its probe (it must let one go)."""
    admission = breaker.admit()
    assert isinstance(admission, Pass) and admission.probe
    return admission


def opened(clock: Clock) -> Breaker:
    breaker = Breaker(SETTINGS, clock)
    for _ in range(SETTINGS.failures - 1):
        assert breaker.failed(Pass()) is None
    assert breaker.failed(Pass()) == SETTINGS.cooldown
    return breaker


def test_opens_after_the_failures_in_a_row() -> None:
    clock = Clock()
    breaker = Breaker(SETTINGS, clock)
    for _ in range(SETTINGS.failures - 1):
        assert breaker.failed(Pass()) is None
        assert breaker.admit() == Pass()
    # The failure that opens it is the host's outage: it spends no attempt
    # (a lone schedule's last attempt, were the attempts as many).
    assert breaker.failed(Pass()) == 5.0
    assert breaker.state is State.OPEN
    assert breaker.admit() == Blocked(5.0)
    clock.now += 2
    assert breaker.blocked() == Blocked(3.0)


def test_an_answer_resets_the_count() -> None:
    clock = Clock()
    breaker = Breaker(SETTINGS, clock)
    for _ in range(SETTINGS.failures - 1):
        breaker.failed(Pass())
    breaker.succeeded(Pass())
    for _ in range(SETTINGS.failures - 1):
        breaker.failed(Pass())
    assert breaker.state is State.CLOSED
    assert breaker.admit() == Pass()


def test_one_probe_after_the_cooldown_and_its_success_closes() -> None:
    clock = Clock()
    breaker = opened(clock)
    clock.now += 5
    probe = probe_of(breaker)
    assert breaker.state is State.HALF_OPEN
    # While the probe is out no other call goes.
    assert breaker.admit() == Blocked(5.0)
    breaker.succeeded(probe)
    assert breaker.state.value == "closed"
    assert breaker.admit() == Pass()
    assert breaker.pristine


def test_a_failed_probe_reopens_for_twice_as_long_up_to_the_max() -> None:
    clock = Clock()
    breaker = opened(clock)
    waits = []
    for _ in range(3):
        clock.now = breaker.until
        probe = probe_of(breaker)
        # The probe's failure is the known-down host's: the wait until the next probe.
        waits.append(breaker.failed(probe))
        assert breaker.state is State.OPEN
    assert waits == [10.0, 12.0, 12.0]
    # A success resets the cooldown to the first one.
    clock.now = breaker.until
    breaker.succeeded(probe_of(breaker))
    for _ in range(SETTINGS.failures):
        breaker.failed(Pass())
    assert breaker.blocked() == Blocked(5.0)


def test_a_straggler_failing_while_open_changes_nothing() -> None:
    clock = Clock()
    breaker = opened(clock)
    until = breaker.until
    # A call sent while the circuit was closed: a real attempt, a retry.
    assert breaker.failed(Pass()) is None
    assert breaker.until == until
    clock.now = until
    probe = probe_of(breaker)
    assert breaker.failed(Pass()) is None
    assert breaker.state is State.HALF_OPEN
    assert breaker.failed(probe) == 10.0


def test_a_straggler_answering_closes_the_circuit() -> None:
    clock = Clock()
    breaker = opened(clock)
    breaker.succeeded(Pass())
    assert breaker.state is State.CLOSED
    assert breaker.admit() == Pass()


def test_an_abandoned_probe_lets_the_next_call_probe() -> None:
    clock = Clock()
    breaker = opened(clock)
    clock.now += 5
    probe = probe_of(breaker)
    assert breaker.admit() == Blocked(5.0)
    breaker.abandoned(probe)
    probe_of(breaker)


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        BreakerSettings(failures=0)
    with pytest.raises(ValueError):
        BreakerSettings(cooldown=10.0, cooldown_max=5.0)


def test_breakers_are_per_host_and_keep_only_failing_hosts() -> None:
    clock = Clock()
    breakers = Breakers(SETTINGS, clock)
    for _ in range(SETTINGS.failures):
        breakers.failed("down:80", Pass())
    breakers.failed("flaky:80", Pass())
    breakers.succeeded("up:80", Pass())
    assert isinstance(breakers.admit("down:80"), Blocked)
    assert breakers.admit("flaky:80") == Pass()
    assert list(breakers.open_hosts()) == ["down:80"]
    assert len(breakers) == 2  # "up" holds nothing
    breakers.succeeded("flaky:80", Pass())
    assert len(breakers) == 1
    clock.now += 5
    probe = breakers.admit("down:80")
    assert isinstance(probe, Pass) and probe.probe
    breakers.succeeded("down:80", probe)
    assert len(breakers) == 0
    assert breakers.state("down:80") is State.CLOSED


def test_breakers_are_bounded() -> None:
    breakers = Breakers(SETTINGS, Clock(), limit=2)
    for host in ("a", "b", "c"):
        breakers.failed(host, Pass())
    assert len(breakers) == 2
