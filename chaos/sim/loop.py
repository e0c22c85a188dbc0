"""An asyncio event loop in virtual time: the simulation's only clock.

The loop is asyncio's own (its ready queue, its timer heap, its tasks), over
a selector that watches no file: where the real loop would block in
``select`` until the next timer, this one moves its clock to that timer at
once. A simulated hour of timers runs in the time its callbacks take; a
loop with nothing ready and no timer (every task waiting for something no
one will do) is a deadlock, raised rather than waited out.

Deterministic by construction: callbacks run in asyncio's order (ready
queue first in, first out; timers by due time, ties in the order they were
set), the clock moves only by the timers' own times, and there is no
socket, thread or real sleep to bring in the machine's timing. The loop's
self-pipe (asyncio's wake-up for other threads) is registered and never
read: nothing here runs in another thread.
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections.abc import Mapping
from typing import Any

# Where the clock starts (seconds): any fixed value; not zero, so that a
# time of 0 is never mistaken for "unset".
EPOCH = 1_000.0


# Callbacks in a row at one instant past which the loop is spinning: code
# that waits zero seconds in a loop would never let virtual time move.
SPIN_LIMIT = 200_000


class Deadlock(RuntimeError):
    """Nothing ready and no timer set: every task waits for nothing that can come."""


class Livelock(RuntimeError):
    """The clock stopped: callbacks keep running at one instant."""


class _VirtualSelector(selectors.BaseSelector):
    """Files registered, never ready; a wait advances the loop's clock."""

    def __init__(self) -> None:
        self._keys: dict[Any, selectors.SelectorKey] = {}
        self.now = EPOCH
        self.spins = 0  # loop iterations since the clock last moved
        self.ready: Any = ()  # the loop's ready callbacks, to name a spinning one

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, _fd(fileobj), events, data)
        self._keys[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise Deadlock("nothing is ready and no timer is set")
        # At least one step of the float each time round: a wait of a
        # hair (a deadline less the time now, both floats) that rounds to
        # no move at all would wake its waiter at the same instant, before
        # the deadline it waits for, over and over. A real clock moves
        # between two turns of the loop; this one moves by the least it can.
        self.now = max(self.now + max(timeout, 0.0), math.nextafter(self.now, math.inf))
        if timeout > 0:
            self.spins = 0
        else:
            self.spins += 1
            if self.spins > SPIN_LIMIT:
                ready = [repr(handle)[:300] for handle in list(self.ready)[:5]]
                raise Livelock(f"virtual time stopped at {self.now:.3f}; running: {ready}")
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


def _fd(fileobj: Any) -> int:
    return fileobj if isinstance(fileobj, int) else int(fileobj.fileno())


class VirtualLoop(asyncio.SelectorEventLoop):
    """``asyncio.SelectorEventLoop`` whose ``time()`` is virtual."""

    def __init__(self) -> None:
        self._virtual = _VirtualSelector()
        super().__init__(self._virtual)
        self._virtual.ready = self._ready  # type: ignore[attr-defined]  # asyncio's own queue
        # asyncio runs a timer this much before its due time (the real
        # clock's resolution). None early here: a waiter woken a hair before
        # its deadline finds it not yet come and waits a hair again, a
        # round of its loop for nothing each time.
        self._clock_resolution = 0.0

    def time(self) -> float:
        return self._virtual.now

    def elapsed(self) -> float:
        """Virtual seconds since the loop began."""
        return self._virtual.now - EPOCH


def run(main: Any) -> Any:
    """``asyncio.run`` on a fresh virtual loop."""
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()
