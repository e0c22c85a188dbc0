"""Where a delivery run's schedules go, and how the bench sees them arrive:
a Kafka topic read by ``stack.TopicReader``, or HTTP receivers
(``bench/receiver.py``) read by ``ReceiverReader``. The delivery suite's
``Runner`` measures every run the same way through this one shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Protocol

from bench.receiver import Receiver, ReceiverReader
from bench.stack import BUCKETS, Delivery, Servers, TopicReader, documents, http_documents


class Reader(Protocol):
    """What reached a destination during one run, kept up to date while it lasts."""

    deliveries: list[Delivery]
    ids: set[str]

    async def __aenter__(self) -> Reader: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...

    async def wait_for(self, count: int, deadline: float) -> bool: ...


class Destination(Protocol):
    # What a row says it measured: "kafka" or "http".
    @property
    def name(self) -> str: ...

    # The process that takes the deliveries, whose CPU a row counts beside
    # the store's: "broker" or "receiver".
    @property
    def role(self) -> str: ...

    def documents(self, run: str, count: int) -> list[dict[str, Any]]:
        """``count`` schedules for ``run`` (due now: the runner sets when)."""
        ...

    def judges(self, doc: dict[str, Any]) -> bool:
        """Whether a run is judged on this schedule (and waits for it)."""
        ...

    async def begin(self) -> None:
        """A run begins, before its system starts: forget what an earlier
        run left (a system that starts late delivers before the run's
        reader is entered: 16 calls of a node's first round were once lost
        to a reset made then)."""
        ...

    def reader(self, run: str) -> Reader: ...

    def pids(self) -> list[int]: ...


@dataclass(frozen=True)
class Kafka:
    """Every schedule to a topic of the run's own."""

    servers: Servers
    name: str = "kafka"
    role: str = "broker"
    buckets: int = BUCKETS  # the BUCKETS of the nodes the run starts

    @staticmethod
    def topic(run: str) -> str:
        return f"bench.{run}"

    def documents(self, run: str, count: int) -> list[dict[str, Any]]:
        return documents([datetime.now(UTC)] * count, self.topic(run), run, buckets=self.buckets)

    def judges(self, doc: dict[str, Any]) -> bool:
        return True

    async def begin(self) -> None:
        pass  # a topic of the run's own holds nothing earlier

    def reader(self, run: str) -> Reader:
        return TopicReader(self.servers.bootstrap, self.topic(run))

    def pids(self) -> list[int]:
        return [self.servers.kafka_pid]


@dataclass
class Http:
    """Every schedule POSTed to ``receiver``, except those ``aside`` marks
    (by index), which go to ``aside_to`` and are neither judged nor waited
    for: the isolation run's hung host. ``aside_buckets``: the buckets of
    those set aside, once built (how A's backlog lay in the store)."""

    receiver: Receiver
    timeout: str = "PT10S"  # each request's, as the API takes it
    aside_to: Receiver | None = None
    aside: tuple[bool, ...] = ()
    name: str = "http"
    role: str = "receiver"
    aside_buckets: list[int] = field(default_factory=list)

    def documents(self, run: str, count: int) -> list[dict[str, Any]]:
        urls = [self.receiver.url] * count
        if self.aside_to is not None:
            if len(self.aside) != count:
                raise ValueError("one mark per schedule")
            urls = [self.aside_to.url if a else u for u, a in zip(urls, self.aside, strict=True)]
        docs = http_documents([datetime.now(UTC)] * count, urls, run, timeout=self.timeout)
        self.aside_buckets = [int(d["bucket"]) for d in docs if not self.judges(d)]
        return docs

    def judges(self, doc: dict[str, Any]) -> bool:
        return bool(doc["http"]["url"] == self.receiver.url)

    async def begin(self) -> None:
        await self.receiver.reset()

    def reader(self, run: str) -> Reader:
        return ReceiverReader(self.receiver)

    def pids(self) -> list[int]:
        return [self.receiver.pid]
