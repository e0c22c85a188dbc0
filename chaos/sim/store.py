"""Between one simulated node and the shared in-memory store: a gate that
can be cut, slowed, or lose answers after the write applied; and the
store's server, which can crash and lose what it had not journaled.

The store itself is ``node/store/memory.py``'s twin (one ``Documents`` and
one lease table shared by every node, as one database is); each node
reaches it through its own ``Gated`` view, so a fault can be one node's
(a partition from the store) or everyone's (a latency spike, a crash).

What a crash loses is what the Mongo store writes without waiting for the
journal on a majority: since seed 325 nothing of the owners' and the API's
(``node/store/schedules.py``: every write is DURABLE), so only a mutant's
(``unjournaled-marks``) is. A durable write commits every write before it,
as the oplog's order does, so what is lost is what was written since the
last one, and a crash comes as it does on a replica set: its secondaries
fall behind for REPLICATION_LAG (durable writes wait for them, and are
rolled back with the rest when the primary dies; unjournaled ones are
answered at once), then the primary dies.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from node.errors import StoreUnavailable
from node.store.memory import Documents

# How long the secondaries lag before the primary dies: the durable writes
# of that time wait, then fail; the unjournaled ones are lost.
REPLICATION_LAG = 2.0
# The store calls that write durably (journaled on a majority): each
# commits every write before it.
DURABLE = frozenset({
    "insert", "claim", "cancel", "change", "change_matching", "complete", "unclaim",
    "recover_in_flight", "open_session", "renew_session", "take", "release",
})  # fmt: skip


@dataclass
class Server:
    """The store's server: up, lagging (durable writes wait) or down; and
    the writes it has not journaled on a majority yet, each with the
    documents as they were before it."""

    documents: Documents
    unjournaled: frozenset[str] = frozenset()
    down: bool = False
    _lagging: asyncio.Event | None = None  # set when the lag ends in the crash
    _pending: list[list[dict[str, Any]]] = field(default_factory=list)

    def durable(self, name: str) -> bool:
        return name in DURABLE and name not in self.unjournaled

    async def commit(self, name: str) -> None:
        """Before a durable write: while the secondaries lag, wait for the
        crash, which rolls it back (it never applied)."""
        if self._lagging is not None and self.durable(name):
            await self._lagging.wait()
            raise StoreUnavailable(f"simulated: {name} rolled back in the store's failover")

    def before(self, name: str, args: tuple[Any, ...]) -> list[dict[str, Any]] | None:
        """Copies of what an unjournaled write may change (None: journaled)."""
        if name not in self.unjournaled or not args:
            return None
        ids = [_id_of(item) for item in args[0]]
        return [_image(self.documents.by_id[i]) for i in ids if i in self.documents.by_id]

    def wrote(self, name: str, before: list[dict[str, Any]] | None) -> None:
        if before is not None:
            self._pending.append(before)
        elif self.durable(name):
            self._pending.clear()  # committed with it

    def lag(self) -> None:
        self._lagging = asyncio.Event()

    def crash(self) -> int:
        """Down, its unjournaled writes undone (newest first), the durable
        writes waiting on the lag failed; how many writes were lost."""
        self.down = True
        self.documents.break_feeds()  # every change stream ends with its server
        lost, self._pending = self._pending, []
        for images in reversed(lost):
            for doc in images:
                self.documents.restore(doc)
        if self._lagging is not None:
            self._lagging.set()
            self._lagging = None
        return len(lost)


def _image(doc: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``doc`` that a write cannot change: a write replaces the
    fields it sets (``emulation.apply``: a push makes a new list), so one
    level is enough."""
    return dict(doc)


def _id_of(item: Any) -> str:
    """A claim's schedule (a document) or a completion's (``claimed.id``)."""
    if isinstance(item, dict):
        return str(item["_id"])
    claimed = getattr(item, "claimed", item)
    return str(claimed.id)


@dataclass
class Gate:
    """The faults in force on one node's path to the store."""

    rng: random.Random
    cut: bool = False
    latency: float = 0.0  # seconds added to every call's round trip
    lose_answers: float = 0.0  # share of calls whose answer is lost after they applied
    server: Server | None = None  # the store's server, shared by every gate


class Gated:
    """``target``'s async methods, through ``gate``; the rest as they are."""

    def __init__(self, target: Any, gate: Gate) -> None:
        self._target = target
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        # Asked only for what this object lacks: the first use of a method
        # makes its gated copy, kept for every later call.
        attribute = getattr(self._target, name)
        if not inspect.iscoroutinefunction(attribute):
            return attribute
        gated = _gated(name, attribute, self._gate)
        setattr(self, name, gated)
        return gated


class GatedFeed:
    """A change feed through the gate: it breaks at its next news once the
    node is cut from the store or the store is down (a change stream's
    cursor fails then)."""

    def __init__(self, feed: Any, gate: Gate) -> None:
        self._feed = feed
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._feed, name)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._changes()

    async def _changes(self) -> AsyncIterator[Any]:
        async for change in self._feed:
            server = self._gate.server
            if self._gate.cut or (server is not None and server.down):
                raise StoreUnavailable("simulated: the change stream broke")
            yield change


def _gated(name: str, method: Callable[..., Any], gate: Gate) -> Callable[..., Any]:
    async def call(*args: Any, **kwargs: Any) -> Any:
        # Half the latency on the way there, half on the way back: the call
        # applies (and the store's clock is read) in the middle.
        latency = gate.latency / 2
        if latency:
            await asyncio.sleep(latency)
        server = gate.server
        if gate.cut or (server is not None and server.down):
            raise StoreUnavailable(f"simulated: {name} did not reach the store")
        before = None
        if server is not None:
            await server.commit(name)
            before = server.before(name, args)
        result = await method(*args, **kwargs)
        if server is not None:
            server.wrote(name, before)
        if hasattr(result, "__aiter__"):  # a change feed: its news through the gate too
            result = GatedFeed(result, gate)
        if latency:
            await asyncio.sleep(latency)
        if gate.lose_answers and gate.rng.random() < gate.lose_answers:
            raise StoreUnavailable(f"simulated: the answer of {name} was lost")
        return result

    return call
