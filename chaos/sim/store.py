"""Between one simulated node and the shared in-memory store: a gate that
can be cut, slowed, or lose answers after the write applied.

The store itself is ``node/store/memory.py``'s twin (one ``Documents`` and
one lease table shared by every node, as one database is); each node
reaches it through its own ``Gated`` view, so a fault can be one node's
(a partition from the store) or everyone's (a latency spike).
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from node.errors import StoreUnavailable


@dataclass
class Gate:
    """The faults in force on one node's path to the store."""

    rng: random.Random
    cut: bool = False
    latency: float = 0.0  # seconds added to every call
    lose_answers: float = 0.0  # share of calls whose answer is lost after they applied
    # Cleared while the node is paused: its calls wait here, then go on.
    running: asyncio.Event = field(default_factory=asyncio.Event)


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


def _gated(name: str, method: Callable[..., Any], gate: Gate) -> Callable[..., Any]:
    async def call(*args: Any, **kwargs: Any) -> Any:
        await gate.running.wait()
        if gate.latency:
            await asyncio.sleep(gate.latency)
        if gate.cut:
            raise StoreUnavailable(f"simulated: {name} did not reach the store")
        result = await method(*args, **kwargs)
        if gate.lose_answers and gate.rng.random() < gate.lose_answers:
            raise StoreUnavailable(f"simulated: the answer of {name} was lost")
        return result

    return call
