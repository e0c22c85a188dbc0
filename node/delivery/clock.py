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
# How far two readings may disagree beyond their round trips before the
# earlier are dropped: a monotonic clock's drift against the store's (NTP
# slews at most 500 ppm), plus the millisecond the store's times are cut to.
DRIFT = 0.0005
STEP = 0.002


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
        self._best: Reading | None = None  # of those kept: changes only at a reading
        self._last: tuple[float, Reading, datetime] | None = None  # the last now() made

    def now(self) -> datetime:
        """The store's time now (this host's, before the first reading),
        at the millisecond, as BSON stores times."""
        best = self._best
        if best is None:
            return self.wall()
        monotonic = self.monotonic()
        if self._last is not None and self._last[0] == monotonic and self._last[1] is best:
            return self._last[2]  # asked again at the same instant (a loop in virtual time)
        now = best.server + timedelta(seconds=monotonic - best.at)
        now = now.replace(microsecond=now.microsecond // 1000 * 1000)
        self._last = (monotonic, best, now)
        return now

    @property
    def offset(self) -> float:
        """Seconds the store's clock is ahead of this host's (0 before a reading)."""
        if self._best is None:
            return 0.0
        return (self.now() - self.wall()).total_seconds()

    @property
    def uncertainty(self) -> float | None:
        """Half the round trip of the reading in use: the most ``now`` can be off."""
        best = self._best
        return None if best is None else best.round_trip / 2

    async def read(self) -> None:
        """Read the store's clock once."""
        sent = self.monotonic()
        server = aware(await self.read_server_time())
        back = self.monotonic()
        trip = back - sent
        reading = Reading(server, sent + trip / 2, trip)
        best = self._best
        if best is not None and _disagree(best, reading):
            # The monotonic clock did not keep time with the store's since
            # the readings kept: it stood still (a VM frozen with its
            # CLOCK_MONOTONIC, found by ``python -m chaos simulate``), or
            # the store's clock was stepped. Every earlier reading is off
            # by as much; kept, the fastest of them would hold this node's
            # idea of now that far back (everything due delivered that late)
            # until it aged out, READINGS readings later.
            log.warning(
                "the store's clock is not where the monotonic clock says: earlier readings dropped",
                off_s=round(reading.server.timestamp() - _expected_at(best, reading.at), 3),
            )
            self._readings.clear()
        self._readings.append(reading)
        # The fastest round trip bounds the error best; a reading ages only
        # by the drift of the monotonic clock, which is small (of equals,
        # the newest: it has aged least).
        self._best = min(reversed(self._readings), key=lambda r: r.round_trip)
        if abs(self.offset) >= WARN_OFFSET:
            log.warning(
                "this host's clock is off the store's: the store's decides what is due",
                offset_s=round(self.offset, 3),
            )


def _expected_at(reading: Reading, at: float) -> float:
    """The store's time (epoch seconds) at monotonic ``at``, by ``reading``."""
    return reading.server.timestamp() + (at - reading.at)


def _disagree(kept: Reading, new: Reading) -> bool:
    """Whether two readings cannot both be right: the new one's time is off
    what the kept one says by more than both uncertainties allow (and the
    drift of a monotonic clock, at most DRIFT of the time between)."""
    off = abs(_expected_at(kept, new.at) - new.server.timestamp())
    allowed = (kept.round_trip + new.round_trip) / 2 + DRIFT * abs(new.at - kept.at) + STEP
    return off > allowed
