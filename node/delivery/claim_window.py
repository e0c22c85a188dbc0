"""How many due schedules a delivery round claims: a slow start after idle.

A round's first record leaves only after its whole claim is written, and
the claim's cost grows with its size (one index range and one document
update per schedule). When a burst falls due, every owner claims at the
same instant on one store, so with the full ``BATCH_SIZE`` of 500 the first
record of 2,000 due at once at three nodes waited for 1,500 updates:
1.0 s on the embedded store, against 0.1 s when the first claim took 50
(``python -m bench scale``, docs/performance.md).

So, as TCP opens its window, a round after an idle one claims ``FIRST``
schedules, and each round that fills its window doubles it, up to the
ceiling (``BATCH_SIZE``): the first records of a burst go out in one small
round trip, and a long burst is still claimed ``BATCH_SIZE`` at a time after
four rounds. A round that finds nothing due starts it over.

Pure: the poller tells it what each round took.
"""

from __future__ import annotations

# The first claim after an idle round.
FIRST = 32


class ClaimWindow:
    def __init__(self, ceiling: int, first: int = FIRST) -> None:
        if ceiling < 1 or first < 1:
            raise ValueError("a claim window holds at least one schedule")
        self.ceiling = ceiling
        self.first = min(first, ceiling)
        self.size = self.first

    def took(self, count: int) -> None:
        """A round chose ``count`` schedules to claim (at most ``size``)."""
        if count == 0:
            self.size = self.first
        elif count >= self.size:
            self.size = min(self.size * 2, self.ceiling)
