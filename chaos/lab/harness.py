"""What every chaos run uses: a timestamp format, waiting on a condition
with a deadline, and waiting until the broker stores a record."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError


def iso(when: datetime) -> str:
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def epoch(text: str) -> float | None:
    """An ``iso`` time (as the API and the record headers write them) as
    epoch seconds; None for anything else."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when.timestamp() if when.tzinfo is not None else None


async def until(
    condition: Callable[[], bool], within: float, what: str, *, strict: bool = True
) -> None:
    """Poll ``condition`` (run in a thread: it may do blocking IO) until true;
    after ``within`` seconds raise, or just return when not ``strict``."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await asyncio.to_thread(condition):
            return
        await asyncio.sleep(0.2)
    if strict:
        raise RuntimeError(f"timed out waiting for {what}")


async def broker_stores(bootstrap: str, within: float) -> None:
    """Wait until the broker acknowledges a record (acks=all). A listening
    broker is not yet a working one: over object storage it accepts
    connections before its storage answers."""
    deadline = time.monotonic() + within
    last: Exception | None = None
    while time.monotonic() < deadline:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        try:
            await producer.start()
            await asyncio.wait_for(producer.send_and_wait("chaos-ready", b"ok"), 10)
            return
        except (KafkaError, OSError, TimeoutError) as exc:
            last = exc
        finally:
            await producer.stop()
        await asyncio.sleep(0.5)
    raise RuntimeError(f"the broker stored nothing within {within:g} s: {last!r}")
