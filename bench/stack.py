"""What the delivery benchmarks share, so that every system is measured the
same way on the same servers: the embedded servers, schedules shaped exactly
as the API stores them, the store's operation counters, the CPU time of
processes, and reading back what reached a topic.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pymongo import AsyncMongoClient

from chaos.lab.stats import percentile
from node.ops import embedded
from node.ops.tail import topic_consumer
from node.schedule.egress import EgressPolicy
from node.schedule.model import Limits
from node.schedule.parse import parse_new_schedule
from node.schedule.times import parse_time
from node.store.documents import schedule_document

HOST = "127.0.0.1"
BUCKETS = 256
# The bench's receivers listen on loopback: the nodes of an HTTP run are
# told the same (HTTP_TARGETS_ALLOW), or they would refuse to call them.
LOOPBACK = "127.0.0.0/8"
LIMITS = Limits(
    max_payload_bytes=1 << 20,
    horizon=timedelta(days=400),
    egress=EgressPolicy.parse(LOOPBACK),
)
# Documents per insert_many while loading a workload.
LOAD_CHUNK = 2000


def iso(when: datetime) -> str:
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values) if values else float("nan"),
        "mean": statistics.fmean(values) if values else float("nan"),
    }


@dataclass(frozen=True)
class Servers:
    """A running embedded MongoDB and Kafka."""

    mongo_uri: str
    bootstrap: str
    scratch: Path
    mongo_pid: int
    kafka_pid: int

    def client(self) -> AsyncMongoClient[dict[str, Any]]:
        return AsyncMongoClient(self.mongo_uri, tz_aware=True)


@contextlib.contextmanager
def embedded_servers(prefix: str, *, ttl_sweep: bool = True) -> Iterator[Servers]:
    """A fresh embedded MongoDB and Kafka for one benchmark run. Without
    ``ttl_sweep`` the store never runs its expiry sweep (SecantusDB walks every
    document of every collection with a TTL index once a minute: 100,000
    pending schedules cost it more than an idle cluster's whole work, in
    whichever window it falls; a MongoDB server's TTL monitor walks the
    index of expiry times only)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        scratch = Path(tmp)
        mongo_port, kafka_port = embedded.free_port(HOST), embedded.free_port(HOST)
        config = None
        if not ttl_sweep:
            config = scratch / "secantusd.toml"
            config.write_text("[storage]\nttl_sweep_seconds = 0\n")
        with (
            (scratch / "mongodb.log").open("ab") as mongo_log,
            (scratch / "kafka.log").open("ab") as kafka_log,
        ):
            mongo = embedded.spawn(
                embedded.mongo_argv(HOST, mongo_port, scratch / "mongo", config), log=mongo_log
            )
            kafka = embedded.spawn(embedded.kafka_argv(HOST, kafka_port), log=kafka_log)
            try:
                embedded.wait_for_port(HOST, mongo_port, 60, mongo)
                embedded.wait_for_port(HOST, kafka_port, 60, kafka)
                yield Servers(
                    embedded.mongo_uri(HOST, mongo_port),
                    f"{HOST}:{kafka_port}",
                    scratch,
                    mongo.pid,
                    kafka.pid,
                )
            except BaseException:
                # The scratch folder goes with the run: show why a server died.
                for name, process in (("mongodb", mongo), ("kafka", kafka)):
                    if process.poll() is not None:
                        tail = (scratch / f"{name}.log").read_text(errors="replace")[-3000:]
                        print(f"{name} exited with {process.returncode}:\n{tail}", file=sys.stderr)
                raise
            finally:
                embedded.discard(kafka)
                embedded.discard(mongo)


# -- schedules -------------------------------------------------------------------


def documents(
    due: Sequence[datetime],
    topic: str,
    prefix: str,
    tenant: str = "default",
    *,
    buckets: int = BUCKETS,
) -> list[dict[str, Any]]:
    """One schedule per due time to Kafka ``topic``, shaped exactly as POST
    /v1/schedules stores it in a database of ``buckets`` buckets."""
    return _documents(due, [{"topic": topic}] * len(due), prefix, tenant, buckets)


def http_documents(
    due: Sequence[datetime],
    urls: Sequence[str],
    prefix: str,
    *,
    timeout: str = "PT10S",
    tenant: str = "default",
) -> list[dict[str, Any]]:
    """One schedule per due time, the i-th POSTed to ``urls[i]`` with the
    request ``timeout`` (an ISO 8601 duration), shaped exactly as POST
    /v1/schedules stores it."""
    if len(urls) != len(due):
        raise ValueError("one URL per due time")
    targets = [{"http": {"url": url, "method": "POST", "timeout": timeout}} for url in urls]
    return _documents(due, targets, prefix, tenant)


def _documents(
    due: Sequence[datetime],
    destinations: Sequence[dict[str, Any]],
    prefix: str,
    tenant: str,
    buckets: int = BUCKETS,
) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    docs = []
    for i, (when, destination) in enumerate(zip(due, destinations, strict=True)):
        body = json.dumps(
            {
                "id": f"{prefix}-{i}",
                **destination,
                "executeAt": iso(when),
                "payload": {"n": i},
                "tenant": tenant,
            }
        ).encode()
        docs.append(schedule_document(parse_new_schedule(body, LIMITS, now), buckets, now))
    return docs


async def insert(collection: Any, docs: list[dict[str, Any]]) -> None:
    for start in range(0, len(docs), LOAD_CHUNK):
        await collection.insert_many(docs[start : start + LOAD_CHUNK], ordered=False)


# -- what the store did ----------------------------------------------------------

# serverStatus counts one operation per command (an insert_many of 2,000 is
# one insert), so these are round trips by kind, not documents.
OPERATION_KINDS = ("insert", "query", "update", "delete", "getmore", "command")


async def store_operations(client: AsyncMongoClient[dict[str, Any]]) -> dict[str, int]:
    """The server's operation counters since it started."""
    status = await client.admin.command("serverStatus")
    counters = {kind: int(status["opcounters"].get(kind, 0)) for kind in OPERATION_KINDS}
    counters["requests"] = int(status.get("network", {}).get("numRequests", 0))
    return counters


def operations_between(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Counter deltas, less the serverStatus command that read ``after``."""
    delta = {kind: after[kind] - before[kind] for kind in before}
    delta["command"] -= 1
    delta["requests"] -= 1
    return delta


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc); 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the command name: state is field 3, utime 14 and stime 15 (proc(5)).
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def cpu_of(pids: Iterable[int]) -> dict[int, float]:
    return {pid: cpu_seconds(pid) for pid in pids}


# -- what reached Kafka ----------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    """One record as a consumer sees it: which schedule, when it was due and
    when the publisher sent it (the record's CreateTime)."""

    schedule_id: str
    execute_at: float  # epoch seconds
    at: float  # epoch seconds


def delivery_of(record: Any) -> Delivery:
    headers = dict(record.headers)
    execute_at = parse_time(headers["execute-at"].decode(), "execute-at")
    schedule_id = headers["schedule-id"].decode()
    return Delivery(schedule_id, execute_at.timestamp(), record.timestamp / 1000)


class TopicReader:
    """Reads one topic from its start for as long as a run lasts.

    Started before the first schedule is due, so the run can end as soon as
    every schedule arrived rather than after a fixed wait.
    """

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = topic_consumer(bootstrap, topic)
        self.deliveries: list[Delivery] = []
        self.ids: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> TopicReader:
        await self.consumer.start()
        self._task = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self.consumer.stop()

    async def _read(self) -> None:
        while True:
            batch = await self.consumer.getmany(timeout_ms=500, max_records=10_000)
            for records in batch.values():
                for record in records:
                    delivery = delivery_of(record)
                    self.deliveries.append(delivery)
                    self.ids.add(delivery.schedule_id)

    async def wait_for(self, count: int, deadline: float) -> bool:
        """True once ``count`` distinct schedules arrived; False at the
        monotonic ``deadline``."""
        while len(self.ids) < count:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.1)
        return True


# -- one node process (the fairness suite) ----------------------------------------


class NodeProcess:
    """One scheduler node with every bucket, on given servers."""

    def __init__(
        self,
        mongo_uri: str,
        bootstrap: str,
        database: str,
        logs: Path,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.port = embedded.free_port(HOST)
        self.log = logs.open("ab")
        argv = [
                sys.executable, "-m", "node", "run",
                "--node-id", "bench-node",
                "--http-bind", f"{HOST}:{self.port}",
                "--gossip-bind", f"{HOST}:{embedded.free_port(HOST)}",
                "--advertise-host", HOST,
                "--mongo-uri", mongo_uri,
                "--mongo-database", database,
                "--kafka-bootstrap", bootstrap,
                "--buckets", str(BUCKETS),
                "--auth", "off",
                "--log-level", "warning",
                # Signed, as in production (and nodes refuse to gossip unsigned).
                "--cluster-keys", base64.b64encode(secrets.token_bytes(32)).decode(),
                *extra,
        ]  # fmt: skip
        self.process: subprocess.Popen[bytes] = embedded.spawn(argv, log=self.log)
        self.url = f"http://{HOST}:{self.port}"

    def wait_ready(self, within: float = 90) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"node exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(self.url + "/v1/cluster", timeout=2) as response:
                    if json.load(response)["buckets"]["held"] == BUCKETS:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("node not ready")

    def stop(self) -> None:
        embedded.stop(self.process)
        self.log.close()
