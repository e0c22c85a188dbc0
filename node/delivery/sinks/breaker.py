"""A circuit breaker per destination host: whether a call to it goes now.

A host that fails every call (down, timing out, answering 5xx) costs each
schedule aimed at it an attempt, and holds a connection slot for a whole
timeout per call. After ``failures`` consecutive failures its circuit opens
(Nygard, "Release It!", Circuit Breaker): calls are not sent, and come back
as the destination's trouble (no attempt spent) with the time until the
next probe. The states:

* CLOSED: calls go. Failures in a row are counted; an answer of any other
  kind (2xx, a 4xx, a Retry-After) shows the host is up and resets the count.
* OPEN: no call goes until ``until``. Opened for ``cooldown`` seconds,
  doubled after each failed probe up to ``cooldown_max`` (a host down for
  an hour is probed about once a minute, not every five seconds).
* HALF_OPEN: the cooldown is over and one call, the probe, is out. Its
  success closes the circuit; its failure reopens it, longer.

A result comes back to the breaker with the ``Pass`` its call was sent
under, so a probe's failure is told from a straggler's (a call sent while
closed that fails after the circuit opened changes nothing).

Pure: no IO; time is the injected ``monotonic`` clock, so the tests run in
virtual time.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass


class State(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@dataclass(frozen=True)
class BreakerSettings:
    failures: int = 5  # consecutive failures that open a circuit
    cooldown: float = 2.0  # seconds open before the first probe
    cooldown_max: float = 10.0  # the longest a cooldown grows to

    def __post_init__(self) -> None:
        if self.failures < 1:
            raise ValueError("a circuit opens after at least one failure")
        if not 0 < self.cooldown <= self.cooldown_max:
            raise ValueError("0 < cooldown <= cooldown_max")


@dataclass(frozen=True)
class Pass:
    """A call may go. ``probe``: the one call let through to a host whose
    circuit is open, to see whether it is back."""

    probe: bool = False


@dataclass(frozen=True)
class Blocked:
    """A call may not go: the host's circuit is open. ``wait``: seconds
    until the next probe may go (while a probe is out, the cooldown)."""

    wait: float


class Breaker:
    """One host's circuit."""

    def __init__(self, settings: BreakerSettings, monotonic: Callable[[], float]) -> None:
        self.settings = settings
        self.monotonic = monotonic
        self.state = State.CLOSED
        self.failures = 0  # in a row, while closed
        self.cooldown = settings.cooldown
        self.until = 0.0  # OPEN: when the next probe may go

    @property
    def pristine(self) -> bool:
        """Closed with no failure counted: it holds nothing worth keeping."""
        return self.state is State.CLOSED and self.failures == 0

    def blocked(self) -> Blocked | None:
        """Whether a call would be refused now (without letting a probe go)."""
        if self.state is State.CLOSED:
            return None
        if self.state is State.HALF_OPEN:
            return Blocked(self.cooldown)
        left = self.until - self.monotonic()
        return Blocked(left) if left > 0 else None

    def admit(self) -> Pass | Blocked:
        """Let a call go, as the probe when the cooldown is over, or not."""
        blocked = self.blocked()
        if blocked is not None:
            return blocked
        if self.state is State.OPEN:
            self.state = State.HALF_OPEN
            return Pass(probe=True)
        return Pass()

    def succeeded(self, sent: Pass) -> None:
        """The host answered (any answer but a retryable failure): whatever
        call it was, the host is up."""
        self.state = State.CLOSED
        self.failures = 0
        self.cooldown = self.settings.cooldown

    def failed(self, sent: Pass) -> float | None:
        """A call sent under ``sent`` failed (5xx, 408, 425, 429 without
        Retry-After, no connection, a timeout). Returns, for the failure
        that opens the circuit and for the probe of a host already known
        down, the seconds until the next probe: that failure is the
        destination's outage, not the schedule's, and spends no attempt.
        (Counted against its call, the opening failure of a lone schedule's
        host was its last attempt whenever the attempts were as many as the
        failures that open a circuit, five and five by default: found by
        ``python -m chaos simulate``.) None: the failure counts against the
        call as usual."""
        now = self.monotonic()
        if self.state is State.CLOSED:
            self.failures += 1
            if self.failures >= self.settings.failures:
                self._open(now)
                return self.until - now
            return None
        if sent.probe and self.state is State.HALF_OPEN:
            self.cooldown = min(self.cooldown * 2, self.settings.cooldown_max)
            self._open(now)
        # A straggler sent while closed was a real attempt; a probe is not.
        return max(self.until - now, 0.0) if sent.probe else None

    def abandoned(self, sent: Pass) -> None:
        """A call under ``sent`` came back with nothing said about the host
        (cancelled, or refused before it was sent): a probe's turn goes to
        the next call."""
        if sent.probe and self.state is State.HALF_OPEN:
            self.state = State.OPEN
            self.until = self.monotonic()

    def _open(self, now: float) -> None:
        self.state = State.OPEN
        self.until = now + self.cooldown
        self.failures = 0


# Breakers kept at most; beyond it the oldest is forgotten (a tenant chooses
# its hosts, so their number is not ours to bound otherwise).
MAX_BREAKERS = 4096


class Breakers:
    """A breaker per host, made on first use. A pristine one (closed, no
    failure counted) is dropped, so only hosts that failed lately take
    room. Results are recorded by host, never on a breaker object kept from
    before the call: the one kept may have been dropped meanwhile."""

    def __init__(
        self,
        settings: BreakerSettings,
        monotonic: Callable[[], float],
        limit: int = MAX_BREAKERS,
    ) -> None:
        self.settings = settings
        self.monotonic = monotonic
        self.limit = limit
        self._breakers: dict[str, Breaker] = {}

    def blocked(self, host: str) -> Blocked | None:
        breaker = self._breakers.get(host)
        return None if breaker is None else breaker.blocked()

    def admit(self, host: str) -> Pass | Blocked:
        breaker = self._breakers.get(host)
        return Pass() if breaker is None else breaker.admit()

    def succeeded(self, host: str, sent: Pass) -> None:
        breaker = self._breakers.get(host)
        if breaker is not None:
            breaker.succeeded(sent)
            self._drop_if_pristine(host)

    def failed(self, host: str, sent: Pass) -> float | None:
        breaker = self._breakers.get(host)
        if breaker is None:
            breaker = self._breakers[host] = Breaker(self.settings, self.monotonic)
            while len(self._breakers) > self.limit:
                del self._breakers[next(iter(self._breakers))]
        return breaker.failed(sent)

    def abandoned(self, host: str, sent: Pass) -> None:
        breaker = self._breakers.get(host)
        if breaker is not None:
            breaker.abandoned(sent)

    def state(self, host: str) -> State:
        breaker = self._breakers.get(host)
        return State.CLOSED if breaker is None else breaker.state

    def open_hosts(self) -> Iterator[str]:
        """Hosts whose circuit is not closed (open, or its probe out)."""
        return (host for host, b in self._breakers.items() if b.state is not State.CLOSED)

    def __len__(self) -> int:
        return len(self._breakers)

    def _drop_if_pristine(self, host: str) -> None:
        if self._breakers[host].pristine:
            del self._breakers[host]
