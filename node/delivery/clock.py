"""The store's time, as this node estimates it: what decides that a schedule
is due (DESIGN.md: "a schedule is due by the store's clock, as a lease
expires by it").

A node whose wall clock runs 30 s fast would otherwise deliver everything
30 s early, and nothing would notice. So the node reads the store's clock
(the server's ``localTime``) every few seconds and takes as now the server's
time at the reading with the fastest round trip among the last few, plus
the half round trip, plus the monotonic time elapsed since: this host's
wall clock, however wrong or however it jumps, never decides what is due.
The error is at most half that round trip.

Pure bookkeeping with injected clocks; the node reads it (node/process.py,
``_watch_servers``) every READ_EVERY seconds, or a third of a lease term if shorter.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import structlog

from node.schedule.times import aware, utcnow

log = structlog.get_logger(__name__)

# How often the store's clock is read (at least), and how many readings are weighed.
READ_EVERY = 5.0
READINGS = 6
# An offset from this host's clock worth a warning (seconds).
WARN_OFFSET = 1.0


@dataclass(frozen=True)
class Reading:
    server: datetime  # the store's time, at the middle of the round trip
    at: float  # monotonic, at the middle of the round trip
    round_trip: float


class StoreClock:
    def __init__(
        self,
        read_server_time: Callable[[], Awaitable[datetime]],
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = utcnow,
    ) -> None:
        self.read_server_time = read_server_time
        self.monotonic = monotonic
        self.wall = wall
        self._readings: deque[Reading] = deque(maxlen=READINGS)

    def now(self) -> datetime:
        """The store's time now (this host's, before the first reading),
        at the millisecond, as BSON stores times."""
        best = self._best()
        if best is None:
            return self.wall()
        now = best.server + timedelta(seconds=self.monotonic() - best.at)
        return now.replace(microsecond=now.microsecond // 1000 * 1000)

    @property
    def offset(self) -> float:
        """Seconds the store's clock is ahead of this host's (0 before a reading)."""
        if self._best() is None:
            return 0.0
        return (self.now() - self.wall()).total_seconds()

    @property
    def uncertainty(self) -> float | None:
        """Half the round trip of the reading in use: the most ``now`` can be off."""
        best = self._best()
        return None if best is None else best.round_trip / 2

    async def read(self) -> None:
        """Read the store's clock once."""
        sent = self.monotonic()
        server = aware(await self.read_server_time())
        back = self.monotonic()
        trip = back - sent
        self._readings.append(Reading(server, sent + trip / 2, trip))
        if abs(self.offset) >= WARN_OFFSET:
            log.warning(
                "this host's clock is off the store's: the store's decides what is due",
                offset_s=round(self.offset, 3),
            )

    def _best(self) -> Reading | None:
        # The fastest round trip bounds the error best; a reading ages only
        # by the drift of the monotonic clock, which is small.
        return min(self._readings, key=lambda r: r.round_trip, default=None)
