"""Kafka publishing: the aiokafka adapter (the records themselves are built
in ``node/schedule/record.py``).

The producer waits for the full ISR (``acks="all"``): a schedule is marked
DELIVERED only after Kafka has durably accepted it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from node.errors import BrokerUnavailable
from node.schedule.record import Record


class KafkaPublisher:
    def __init__(
        self, bootstrap: Sequence[str], *, client_id: str, request_timeout: float = 10.0
    ) -> None:
        self._settings: dict[str, Any] = {
            "bootstrap_servers": list(bootstrap),
            "client_id": client_id,
            "acks": "all",
            # Batches form while the poller claims; a short linger fills them.
            "linger_ms": 2,
            "request_timeout_ms": int(request_timeout * 1000),
            "max_request_size": 16 * 1024 * 1024,
        }
        self._producer: AIOKafkaProducer | None = None

    @property
    def started(self) -> bool:
        return self._producer is not None

    async def start(self) -> None:
        # Built here, not in __init__: an aiokafka producer must be closed
        # once made, and a node that never reaches the broker never makes one.
        producer = AIOKafkaProducer(**self._settings)
        try:
            await producer.start()
        except (KafkaError, OSError) as exc:
            await producer.stop()
            raise BrokerUnavailable(f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            await producer.stop()
            raise
        self._producer = producer

    async def stop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()

    async def reachable(self) -> bool:
        """True when the producer has metadata from at least one broker."""
        if self._producer is None:
            return False
        return any(True for _ in self._producer.client.cluster.brokers())

    async def publish(self, records: Sequence[Record]) -> list[BaseException | None]:
        """Send all records, wait for every ack; one result per record, in order.

        Records are handed to the producer together so they share request
        batches; a failure of one never fails the others.
        """

        producer = self._producer
        if producer is None:
            raise RuntimeError("publisher not started")

        async def send(record: Record) -> None:
            future = await producer.send(
                record.topic, record.value, key=record.key, headers=record.headers
            )
            await future

        results = await asyncio.gather(*(send(r) for r in records), return_exceptions=True)
        return [r if isinstance(r, BaseException) else None for r in results]
