"""The Kafka sink: the aiokafka adapter (the records themselves are built
in ``node/schedule/record.py``).

The producer waits for the full ISR (``acks="all"``): a schedule is marked
DELIVERED only after Kafka has durably accepted it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    InvalidTopicError,
    KafkaConnectionError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordTooLargeError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)
from aiokafka.protocol.metadata import MetadataRequest

from node.delivery.sink import Failed, Trouble
from node.errors import BrokerUnavailable, IdempotenceRefused
from node.schedule.record import Record
from node.tracing import OFF, Tracing

log = structlog.get_logger(__name__)


def _broker(error: str) -> Failed:
    """The broker's trouble: no attempt spent, the claim put back as it was."""
    return Failed(error, Trouble.DESTINATION)


def _record(error: str) -> Failed:
    """The record's own fault: an attempt spent, toward the dead letter."""
    return Failed(error, Trouble.RETRY)


# A metadata request that says whether the broker is there, or a topic is.
PROBE_TIMEOUT = 1.0
# How long one record may wait for its topic's metadata before it is judged
# (the producer's own wait is its whole request timeout, 10 s, for every
# record of the batch).
METADATA_DEADLINE = 2.0
# A record's own faults: sending it again as it is cannot succeed.
RECORD_FAULTS = (
    MessageSizeTooLargeError,
    RecordTooLargeError,
    InvalidTopicError,
    TopicAuthorizationFailedError,
)


class _Refused(Exception):
    """The broker answered, and refused an idempotent producer."""


def _not_a_refusal(record: logging.LogRecord) -> bool:
    """aiokafka logs a refused InitProducerId at error level, then raises
    it; the publisher says what the refusal means (a warning under ``auto``,
    the reason the node will not start under ``on``), so aiokafka's line,
    which names the same error, is dropped."""
    return not record.getMessage().startswith("Unexpected error during InitProducerIdRequest")


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
        clock: Callable[[], datetime] | None = None,
        tracing: Tracing = OFF,
    ) -> None:
        self.tracing = tracing
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
        # Stamps each record's timestamp (the store's clock, as delivery's
        # due decisions use), rather than this host's wall clock.
        self.clock = clock
        self.idempotent = False
        # Why the broker refused an idempotent producer (auto only), for /readyz.
        self.refusal: str | None = None
        self._producer: AIOKafkaProducer | None = None
        if idempotence != "off":
            logging.getLogger("aiokafka.producer.sender").addFilter(_not_a_refusal)

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
        # A warning, not an error: KAFKA_IDEMPOTENCE=auto asked for exactly
        # this (the embedded broker always refuses). Once, however often the
        # start is tried again while the broker cannot be reached.
        if reason != self.refusal:
            log.warning(
                "the broker refused an idempotent producer: running without idempotence, so "
                "a producer retry during a broker stall can publish a record twice under one "
                "claim",
                reason=reason,
                kafka_idempotence=self.idempotence,
            )
        self.idempotent, self.refusal = False, reason
        self._producer = await self._connect(idempotent=False)

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
        """Whether a broker answers now: a metadata request for no topic (the
        brokers alone: a cluster with thousands of topics answers it as
        cheaply as one with none), bounded in time (the producer's cached
        metadata says nothing about a broker that has since gone away)."""
        return await self._metadata(MetadataRequest([])) is not None

    async def topic_known(self, topic: str) -> bool | None:
        """Whether the broker has ``topic`` or creates it on first use: a
        metadata request for it, allowing automatic creation as a producer
        does. False only when the broker answered that it does not exist (a
        broker without automatic creation); None when it could not be asked."""
        producer = self._producer
        if producer is not None and producer.client.cluster.partitions_for_topic(topic):
            return True
        answer = await self._metadata(MetadataRequest([topic], allow_auto_topic_creation=True))
        if answer is None:
            return None
        codes = [t[0] for t in answer.topics if t[1] == topic]
        return not codes or codes[0] != UnknownTopicOrPartitionError.errno

    async def _metadata(self, request: Any) -> Any | None:
        """A broker's answer to ``request``, within PROBE_TIMEOUT; None when
        no broker could be asked or none answered in time."""
        producer = self._producer
        if producer is None:
            return None
        client = producer.client
        try:
            node = client.get_random_node()
            if node is None:
                return None
            return await asyncio.wait_for(client.send(node, request), PROBE_TIMEOUT)
        except (KafkaError, TimeoutError, OSError):
            return None

    async def publish(self, records: Sequence[Record]) -> list[Failed | None]:
        """Send all records, wait for every ack; one result per record, in order.

        Records are handed to the producer together so they share request
        batches; a failure of one never fails the others, and each has its
        own deadline: a record for a topic the broker does not know waits
        METADATA_DEADLINE for it, not the producer's whole request timeout,
        before the others are complete.
        """

        producer = self._producer
        if producer is None:
            raise RuntimeError("publisher not started")

        stamp = int(self.clock().timestamp() * 1000) if self.clock is not None else None

        async def send(record: Record) -> None:
            with self.tracing.publishing(record.topic, record.headers) as outgoing:
                future = await asyncio.wait_for(
                    producer.send(
                        record.topic,
                        record.value,
                        key=record.key,
                        headers=outgoing.headers,
                        timestamp_ms=stamp,
                    ),
                    METADATA_DEADLINE,
                )
                await future

        results = await asyncio.gather(*(send(r) for r in records), return_exceptions=True)
        failed: list[Failed | None] = []
        # What the broker said of each topic, asked once per topic of the batch.
        topics: dict[str, bool | None] = {}
        for record, result in zip(records, results, strict=True):
            if isinstance(result, BaseException):
                failed.append(await self._judge(record, result, topics))
            else:
                failed.append(None)
        return failed

    async def _judge(
        self, record: Record, error: BaseException, topics: dict[str, bool | None]
    ) -> Failed:
        """Whose fault a failed send is: the record's (too large, a topic the
        broker refuses) spends an attempt; the broker's (unreachable, timed
        out, not enough replicas, no leader) does not. ``topics``: what the
        broker said of each topic this batch asked about."""
        text = f"{type(error).__name__}: {error}"
        if isinstance(error, RECORD_FAULTS):
            return _record(text)
        if isinstance(error, (TimeoutError, UnknownTopicOrPartitionError)):
            # No metadata for the topic in time: the topic's fault if the
            # broker answers that it does not have it, else the broker's.
            if record.topic not in topics:
                topics[record.topic] = await self.topic_known(record.topic)
            return _record(text) if topics[record.topic] is False else _broker(text)
        retriable = isinstance(error, OSError) or getattr(error, "retriable", False)
        return _broker(text) if retriable or isinstance(error, KafkaError) else _record(text)
