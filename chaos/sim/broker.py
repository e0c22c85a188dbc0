"""The simulated broker: an in-memory log with partitions and offsets, what
every node's publisher appends to, and the faults a real one has.

Each node publishes through its own ``Producer`` (the node's ``publish``
sink), so the broker can be cut from one node and not another. A record
goes to the partition of its key (a schedule's key, else its id), at the
next offset there; what the log holds is read as ``chaos.history``
deliveries, so the checker reads the simulation as it reads a real run.

Faults: ``cut`` (the node's publishes fail as an unreachable broker's:
the destination's trouble, no attempt spent), ``stall`` (every publish
waits until it ends), and ``lose_acks`` (a batch is appended, its answer
lost, and the producer sends it again: the same bytes twice, a producer's
retry, as without an idempotent producer).
"""

from __future__ import annotations

import asyncio
import hashlib
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from chaos.history import Delivery, occurrence
from chaos.lab.harness import epoch
from node.delivery.sink import Failed, Trouble
from node.schedule.record import Record

PARTITIONS = 3


@dataclass
class Broker:
    """The log, and the faults in force."""

    recurring: set[str] = field(default_factory=set)
    log: list[Delivery] = field(default_factory=list)
    offsets: list[int] = field(default_factory=lambda: [0] * PARTITIONS)
    cut: set[str] = field(default_factory=set)  # nodes it cannot be reached from
    lost_acks: dict[str, int] = field(default_factory=dict)  # node -> batches
    _running: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._running.set()

    def stall(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def producer(self, node: str, wall: Callable[[], datetime]) -> Producer:
        return Producer(self, node, wall)

    def append(self, record: Record, at: datetime) -> None:
        headers = {name: value.decode() for name, value in record.headers}
        unit = headers["schedule-id"]
        if unit in self.recurring:
            unit = occurrence(unit, headers["execute-at"])
        partition = zlib.crc32(record.key or unit.encode()) % PARTITIONS
        offset = self.offsets[partition]
        self.offsets[partition] += 1
        self.log.append(
            Delivery(
                unit,
                int(headers["fence-token"]),
                int(headers["attempt"]),
                at.timestamp(),
                digest=hashlib.blake2b(record.value, digest_size=8).hexdigest(),
                partition=partition,
                offset=offset,
                received=at.timestamp(),
                execute_at=epoch(headers["execute-at"]),
            )
        )


@dataclass
class Producer:
    """One node's sink into the broker (``node/delivery/sink.py``'s shape)."""

    broker: Broker
    node: str
    wall: Callable[[], datetime]
    request_timeout: float = 30.0

    async def reachable(self) -> bool:
        return self.node not in self.broker.cut

    async def publish(self, records: Sequence[Record]) -> list[Failed | None]:
        await self.broker._running.wait()
        if self.node in self.broker.cut:
            down = Failed("KafkaConnectionError: broker unreachable", Trouble.DESTINATION)
            return [down for _ in records]
        at = self.wall()
        for record in records:
            self.broker.append(record, at)
        if self.broker.lost_acks.get(self.node, 0) > 0:
            self.broker.lost_acks[self.node] -= 1
            for record in records:  # the ack lost: the producer sends the batch again
                self.broker.append(record, at)
        return [None for _ in records]
