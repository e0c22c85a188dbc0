"""What every chaos run uses: a reader that records each delivered record,
a timestamp format, waiting on a condition with a deadline, and waiting
until the broker stores a record."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Container
from datetime import datetime

from aiokafka import AIOKafkaProducer, ConsumerRecord
from aiokafka.errors import KafkaError

from chaos.history import Delivery, occurrence
from node.ops.tail import topic_consumer


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


class Recorder:
    """Every record of the topic, from the beginning, named by the unit the
    checker judges: the schedule id, or for the ids in ``recurring`` one
    occurrence (``chaos.history.occurrence``)."""

    def __init__(self, bootstrap: str, topic: str, recurring: Container[str] = ()) -> None:
        self.consumer = topic_consumer(bootstrap, topic)
        self.recurring = recurring
        # Each record with the evidence the checker weighs a duplicate by
        # (value digest, partition, offset) ...
        self.deliveries: list[Delivery] = []
        # ... and as the plain tuple chaos/rebalance.py unpacks.
        self.records: list[tuple[str, int, int, float]] = []  # unit, token, attempt, at
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self._task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        while True:
            batch = await self.consumer.getmany(timeout_ms=200, max_records=5000)
            received = time.time()
            for part in batch.values():
                for record in part:
                    delivery = self._delivery(record, received)
                    self.deliveries.append(delivery)
                    self.records.append(
                        (delivery.schedule_id, delivery.token, delivery.attempt, delivery.at)
                    )

    def _delivery(self, record: ConsumerRecord[bytes, bytes], received: float) -> Delivery:
        headers = dict(record.headers)
        unit = headers["schedule-id"].decode()
        if unit in self.recurring:
            unit = occurrence(unit, headers["execute-at"].decode())
        return Delivery(
            unit,
            int(headers["fence-token"]),
            int(headers["attempt"]),
            record.timestamp / 1000,
            # Equal for a producer's resend of one batch: the bytes it sent twice.
            digest=hashlib.blake2b(record.value or b"", digest_size=8).hexdigest(),
            partition=record.partition,
            offset=record.offset,
            received=received,
            # The time it was published for: a rescheduled schedule had others.
            execute_at=epoch(headers.get("execute-at", b"").decode()),
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.consumer.stop()


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
