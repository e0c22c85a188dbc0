"""What a sink is (``node/delivery/sinks/`` holds the two):
``publish(items) -> results``, one result per item, in order; ``None`` when
the destination took it, else a ``Failed`` saying whose trouble it was.
What a failure makes of the schedule is decided in
``node/delivery/outcomes.py``, never here."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar


class Trouble(enum.StrEnum):
    """Whose trouble a failed delivery was."""

    # The destination's outage (the broker unreachable; an endpoint asking
    # to wait with Retry-After; a circuit open on its host): spends no
    # attempt, up to HTTP_OUTAGE_BOUND for an HTTP target.
    DESTINATION = "destination"
    # This delivery failed and may go later (a record too large for now, a
    # 5xx, a timeout, a refused connection): spends an attempt.
    RETRY = "retry"
    # Refused for good (a 4xx but 408/425/429, an address the egress
    # policy refuses, no signing secret): ends now, whatever attempts are left.
    REFUSED = "refused"


@dataclass(frozen=True)
class Failed:
    error: str  # for lastError and the history: bounded, one line
    trouble: Trouble
    # DESTINATION: how long the destination asked to wait (seconds), from
    # when the result was known; None: the caller's own backoff.
    wait: float | None = None


Item = TypeVar("Item", contravariant=True)


class Sink(Protocol[Item]):
    async def publish(self, items: Sequence[Item]) -> list[Failed | None]:
        """Send every item and wait for each answer; never raises for one
        item's failure (a result says it), and gives each item its own
        deadline, so one slow item never holds the others' results."""
