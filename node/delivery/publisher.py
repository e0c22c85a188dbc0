"""Kafka publishing: the aiokafka adapter (the records themselves are built
in ``node/schedule/record.py``).

The producer waits for the full ISR (``acks="all"``): a schedule is marked
DELIVERED only after Kafka has durably accepted it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, KafkaError

from node.errors import BrokerUnavailable, IdempotenceRefused
from node.schedule.record import Record

log = structlog.get_logger("node.publisher")


class _Refused(Exception):
    """The broker answered, and refused an idempotent producer."""


class KafkaPublisher:
    """The node's producer. ``idempotence`` (KAFKA_IDEMPOTENCE): ``on`` runs
    only with an idempotent producer, ``off`` never, ``auto`` with one where
    the broker grants it; ``idempotent`` says which it got."""

    def __init__(
        self,
        bootstrap: Sequence[str],
        *,
        client_id: str,
        idempotence: str = "auto",
        request_timeout: float = 10.0,
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
        self.idempotence = idempotence
        self.request_timeout = request_timeout
        self.idempotent = False
        # Why the broker refused an idempotent producer (auto only), for /readyz.
        self.refusal: str | None = None
        self._producer: AIOKafkaProducer | None = None

    @property
    def started(self) -> bool:
        return self._producer is not None

    async def start(self) -> None:
        """Connect. Raises BrokerUnavailable (retriable) when the broker cannot
        be reached, IdempotenceRefused when ``on`` and the broker refuses."""
        if self.idempotence == "off":
            self._producer = await self._connect(idempotent=False)
            return
        try:
            self._producer = await self._connect(idempotent=True)
            self.idempotent, self.refusal = True, None
            return
        except _Refused as refused:
            reason = str(refused)
        if self.idempotence == "on":
            raise IdempotenceRefused(
                f"KAFKA_IDEMPOTENCE=on, but the broker at {','.join(self._bootstrap)} refused "
                f"an idempotent producer ({reason}). Use a broker that grants one (Kafka "
                "0.11 or later, IDEMPOTENT_WRITE allowed), or set KAFKA_IDEMPOTENCE=auto "
                "to run without it"
            )
        log.error(
            "the broker refused an idempotent producer: running without idempotence, so a "
            "producer retry during a broker stall can publish a record twice under one claim",
            reason=reason,
            kafka_idempotence=self.idempotence,
        )
        self._producer = await self._connect(idempotent=False)
        self.idempotent, self.refusal = False, reason

    @property
    def _bootstrap(self) -> list[str]:
        return list(self._settings["bootstrap_servers"])

    async def _connect(self, *, idempotent: bool) -> AIOKafkaProducer:
        # Built here, not in __init__: an aiokafka producer must be closed
        # once made, and a node that never reaches the broker never makes one.
        producer = AIOKafkaProducer(**self._settings, enable_idempotence=idempotent)
        try:
            # After the bootstrap, an idempotent producer asks for its id
            # (InitProducerId) and retries while the answer is retriable:
            # bounded, so a broker that stalls here is unreachable, not a hang.
            await asyncio.wait_for(producer.start(), timeout=self.request_timeout)
        except (TimeoutError, OSError) as exc:
            await producer.stop()
            raise BrokerUnavailable(f"{type(exc).__name__}: {exc}") from exc
        except KafkaError as exc:
            await producer.stop()
            if idempotent and not exc.retriable and not isinstance(exc, KafkaConnectionError):
                # Reached, and answered: no producer id for us.
                raise _Refused(f"InitProducerId answered {type(exc).__name__}") from exc
            raise BrokerUnavailable(f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            await producer.stop()
            raise
        return producer

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
