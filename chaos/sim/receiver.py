"""The simulated webhook receiver: every HTTP target of the simulation's
schedules, and the faults a real endpoint has.

Each node calls it through its own HTTP sink (``node/delivery/sinks/http.py``:
the signing, the circuits per host, the slots per host, what an answer
means), whose session is replaced by ``Session``: a request is answered
here, at the loop's time, instead of over a socket. What it takes (a 200)
goes into the same log as the broker's records, as a delivery at the HTTP
sink (``chaos/receipts.py`` reads a real receiver's the same way), so the
checker reads one stream.

Faults (named as the real harness's receiver faults, ``chaos/faults/kinds.py``):
``receiver-down`` (connections refused), ``receiver-503`` (a 503 with a
Retry-After), ``receiver-slow`` (no answer within any call's timeout).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any

import aiohttp
from aiohttp.client_reqrep import ConnectionKey

from chaos.lab.receiver import digest
from chaos.receipts import receipt
from chaos.sim.broker import Broker

HOST = "receiver.sim"
URL = f"https://{HOST}/hook"
UP, DOWN, UNAVAILABLE, SLOW = "up", "receiver-down", "receiver-503", "receiver-slow"
FAULTS = (DOWN, UNAVAILABLE, SLOW)
RETRY_AFTER = 2  # seconds a 503 asks for
LATENCY = (0.02, 0.5)  # seconds an answer takes, drawn between


@dataclass
class Receiver:
    broker: Broker  # its log is where what the receiver takes goes too
    wall: Callable[[], datetime]  # the receiver's clock
    rng: random.Random  # how long each answer takes
    mode: str = UP
    answered: dict[int, int] = field(default_factory=dict)  # status -> count

    def latency(self) -> float:
        """How long an answer takes: an endpoint's own work, LATENCY apart."""
        return self.rng.uniform(*LATENCY)

    def take(self, headers: dict[str, str], body: bytes) -> None:
        """A request it answers 200: a delivery at the HTTP sink, made from
        the line a real receiver would log for it (``chaos/receipts.py``)."""
        line = {
            "status": 200,
            "schedule_id": headers["schedule-id"],
            "execute_at": headers["execute-at"],
            "fence_token": headers["fence-token"],
            "attempt": headers["attempt"],
            "at": self.wall().timestamp(),
            "digest": digest(body),
        }
        taken = receipt(line, self.broker.recurring).delivery
        assert taken is not None  # a 200 with the scheduler's headers
        self.broker.log.append(taken)


class Session:
    """What the HTTP sink's ``aiohttp.ClientSession`` is asked for
    (``request``, ``close``), answered by the receiver (a node paused holds
    its calls as it holds the rest: ``loop.Freeze``)."""

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def request(
        self,
        method: str,
        url: Any,
        *,
        headers: Any,
        data: bytes,
        allow_redirects: bool,
        timeout: aiohttp.ClientTimeout,
    ) -> _Exchange:
        return _Exchange(self, list(headers), data, float(timeout.total or 0))

    async def close(self) -> None:
        pass


class _Exchange:
    def __init__(
        self, session: Session, headers: list[tuple[str, str]], body: bytes, timeout: float
    ) -> None:
        self.session = session
        self.headers = {name.lower(): value for name, value in headers}
        self.body = body
        self.timeout = timeout

    async def __aenter__(self) -> _Response:
        receiver = self.session.receiver
        if receiver.mode == DOWN:
            raise aiohttp.ClientConnectorError(
                ConnectionKey(HOST, 443, True, True, None, None, None, HOST),
                ConnectionRefusedError(111, "simulated: connection refused"),
            )
        if receiver.mode == SLOW:
            await asyncio.sleep(self.timeout)
            raise TimeoutError
        if receiver.mode == UNAVAILABLE:
            await asyncio.sleep(receiver.latency())
            return _answered(receiver, 503, {"Retry-After": str(RETRY_AFTER)})
        # Taken when its head is read, as the real receiver notes it
        # (``chaos/receipts.py``); answered once the endpoint's work is done.
        receiver.take(self.headers, self.body)
        await asyncio.sleep(receiver.latency())
        return _answered(receiver, 200, {})

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        pass


def _answered(receiver: Receiver, status: int, headers: dict[str, str]) -> _Response:
    receiver.answered[status] = receiver.answered.get(status, 0) + 1
    return _Response(status, headers)


class _Response:
    def __init__(self, status: int, headers: dict[str, str]) -> None:
        self.status = status
        self.headers = headers
        self.content = _Body()


class _Body:
    async def read(self, size: int = -1) -> bytes:
        return b""
