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
import contextvars
import math
import selectors
from collections.abc import Callable, Mapping
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


class Freeze:
    """One simulated process's switch: frozen, nothing of it runs (as under
    SIGSTOP, or a suspended VM) until it is thawed. Its tasks run in a
    context that names it (``FREEZE``), and so do theirs; every callback
    the loop would run in that context while it is frozen is held, and
    run, in order, when it thaws."""

    def __init__(self) -> None:
        self.frozen = False
        self._held: list[tuple[Callable[..., Any], tuple[Any, ...], contextvars.Context]] = []

    def thaw(self) -> None:
        self.frozen = False
        held, self._held = self._held, []
        loop = asyncio.get_running_loop()
        for callback, args, context in held:
            loop.call_soon(callback, *args, context=context)

    def hold(
        self, callback: Callable[..., Any], context: contextvars.Context
    ) -> Callable[..., Any]:
        def gated(*args: Any) -> None:
            if self.frozen:
                self._held.append((callback, args, context))
            else:
                callback(*args)

        return gated


# The process the running code belongs to (None: the simulation's own).
FREEZE: contextvars.ContextVar[Freeze | None] = contextvars.ContextVar("freeze", default=None)


class VirtualLoop(asyncio.SelectorEventLoop):
    """``asyncio.SelectorEventLoop`` whose ``time()`` is virtual, and which
    holds the callbacks of a frozen process (``Freeze``)."""

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

    # (typeshed types the callback's arguments with a TypeVarTuple; these
    # pass them through as they are.)
    def call_soon(  # type: ignore[override]
        self, callback: Any, *args: Any, context: Any = None
    ) -> asyncio.Handle:
        return super().call_soon(self._gated(callback, context), *args, context=context)

    def call_at(  # type: ignore[override]
        self, when: float, callback: Any, *args: Any, context: Any = None
    ) -> Any:
        return super().call_at(when, self._gated(callback, context), *args, context=context)

    @staticmethod
    def _gated(callback: Any, context: contextvars.Context | None) -> Any:
        freeze = FREEZE.get() if context is None else context.get(FREEZE)
        if freeze is None:
            return callback
        return freeze.hold(callback, context if context is not None else contextvars.copy_context())

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
