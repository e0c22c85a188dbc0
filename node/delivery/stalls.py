"""How long this process could not run: SIGSTOP, a frozen VM or container,
a swap storm, or a callback that blocked the event loop.

A timer that should fire every ``tick`` seconds and fires much later shows
the gap. The lease manager subtracts these gaps from its round trips: a
renew whose reply waited out a pause in the socket buffer says nothing about
the store, and counting it would stretch the next leases (node/leases.py)
and slow the next failover for no reason.

Pure bookkeeping with an injected clock; ``run`` is the only part that sleeps.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

import structlog

log = structlog.get_logger(__name__)

TICK = 0.1
# Gaps shorter than this are scheduling jitter on a busy machine, not a stall:
# ignoring them keeps a saturated host's slow store counted as slow.
THRESHOLD = 1.0
# Stalls older than this are forgotten (longer than any lease round trip).
KEEP = 300.0


class StallMeter:
    def __init__(
        self,
        *,
        tick: float = TICK,
        threshold: float = THRESHOLD,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tick = tick
        self.threshold = threshold
        self.monotonic = monotonic
        self._last = monotonic()
        self._stalls: deque[tuple[float, float]] = deque()  # (began, ended)
        self.count = 0
        self.seconds = 0.0

    def ticked(self) -> float:
        """Record a timer firing; returns the stall it ended (0.0 if none)."""
        now = self.monotonic()
        stalled = self._frozen(now)
        if stalled:
            self._stalls.append((now - stalled, now))
            self.count += 1
            self.seconds += stalled
        self._last = now
        while self._stalls and self._stalls[0][1] < now - KEEP:
            self._stalls.popleft()
        return stalled

    def stalled_since(self, since: float) -> float:
        """Seconds since ``since`` (monotonic) during which the process stood
        still, including a stall the timer has not yet seen end."""
        now = self.monotonic()
        ongoing = self._frozen(now)
        stalls = [*self._stalls, (now - ongoing, now)] if ongoing else self._stalls
        return sum(max(0.0, ended - max(began, since)) for began, ended in stalls)

    def _frozen(self, now: float) -> float:
        """How much of the time since the last tick is a stall, if it is one."""
        late = now - self._last - self.tick
        return late if late >= self.threshold else 0.0

    async def run(self) -> None:
        self._last = self.monotonic()  # the time before it ran is no stall
        while True:
            await asyncio.sleep(self.tick)
            stalled = self.ticked()
            if stalled:
                log.warning(
                    "process stalled (paused, frozen or a blocked event loop)",
                    seconds=round(stalled, 2),
                )
