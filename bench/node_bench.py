"""``python -m bench node``: one node process on the embedded stack.

Measures, in one run and on the same store and broker:

* ingest: POST /v1/schedules throughput and latency with 16 concurrent clients;
* store limit: the poller's exact store queries (find due, claim, mark
  delivered) driven in a tight loop with no Kafka and no node: what the
  store itself allows for this work;
* burst delivery: 10,000 schedules due in the same second, delivered by the
  node; records/s and the ratio to the store limit;
* lateness: 1,000 schedules spread over 20 s, posted through the API;
  deliveredAt - executeAt (store) and Kafka timestamp - executeAt (broker).

Figures vary with the machine; the ratios are what compare across runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from pymongo import AsyncMongoClient

from bench.report import publish
from chaos.stats import percentile
from node import embedded
from node.schedules import Limits, parse_new_schedule
from node.store import ScheduleStore
from node.tail import topic_consumer

HOST = "127.0.0.1"
BUCKETS = 256


@dataclass(frozen=True)
class Sizes:
    ingest: int
    burst: int
    spread: int
    spread_seconds: float
    clients: int = 16
    batch: int = 500


FULL = Sizes(ingest=4000, burst=10_000, spread=1000, spread_seconds=20)
QUICK = Sizes(ingest=500, burst=1000, spread=200, spread_seconds=5)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values) if values else float("nan"),
        "mean": statistics.fmean(values) if values else float("nan"),
    }


def iso(when: datetime) -> str:
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def documents(count: int, due: datetime, topic: str, prefix: str) -> list[dict[str, Any]]:
    """Schedules shaped exactly as the API stores them."""
    now = datetime.now(UTC)
    limits = Limits(max_payload_bytes=1 << 20, horizon=timedelta(days=400))
    docs = []
    for i in range(count):
        body = json.dumps(
            {"id": f"{prefix}-{i}", "topic": topic, "executeAt": iso(due), "payload": {"n": i}}
        ).encode()
        docs.append(parse_new_schedule(body, limits, now).to_document(BUCKETS, now))
    return docs


async def insert(collection: Any, docs: list[dict[str, Any]]) -> None:
    for start in range(0, len(docs), 2000):
        await collection.insert_many(docs[start : start + 2000], ordered=False)


async def store_limit(uri: str, sizes: Sizes) -> dict[str, Any]:
    """The poller's queries, back to back, against a fresh database."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, tz_aware=True)
    store = ScheduleStore(client["bench_store_limit"], BUCKETS)
    await store.prepare(datetime.now(UTC))
    due = datetime.now(UTC) - timedelta(seconds=1)
    await insert(store.schedules, documents(sizes.burst, due, "limit", "raw"))
    tokens = dict.fromkeys(range(BUCKETS), 1)
    buckets = list(range(BUCKETS))
    started = time.perf_counter()
    done = 0
    timings: dict[str, float] = {"find_due": 0.0, "claim": 0.0, "mark_delivered": 0.0}
    while True:
        t0 = time.perf_counter()
        batch = await store.find_due(buckets, datetime.now(UTC), sizes.batch)
        t1 = time.perf_counter()
        if not batch:
            break
        claimed = await store.claim(batch, tokens, "bench", datetime.now(UTC))
        t2 = time.perf_counter()
        done += await store.mark_delivered(claimed, datetime.now(UTC))
        t3 = time.perf_counter()
        timings["find_due"] += t1 - t0
        timings["claim"] += t2 - t1
        timings["mark_delivered"] += t3 - t2
    elapsed = time.perf_counter() - started
    await client.drop_database("bench_store_limit")
    await client.close()
    return {
        "records": done,
        "seconds": elapsed,
        "records_per_s": done / elapsed,
        "seconds_by_query": timings,
    }


class NodeProcess:
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
        self.process = embedded.spawn(
            [
                sys.executable,
                "-m",
                "node",
                "run",
                "--node-id",
                "bench-node",
                "--http-bind",
                f"{HOST}:{self.port}",
                "--gossip-bind",
                f"{HOST}:{embedded.free_port(HOST)}",
                "--advertise-host",
                HOST,
                "--mongo-uri",
                mongo_uri,
                "--mongo-database",
                database,
                "--kafka-bootstrap",
                bootstrap,
                "--buckets",
                str(BUCKETS),
                "--auth",
                "off",
                "--log-level",
                "warning",
                *extra,
            ],
            log=self.log,
        )
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


async def ingest(url: str, sizes: Sizes, topic: str) -> dict[str, Any]:
    far = iso(datetime.now(UTC) + timedelta(days=1))
    latencies: list[float] = []
    counter = iter(range(sizes.ingest))

    async def client(session: aiohttp.ClientSession) -> None:
        for i in counter:
            body = {"id": f"ingest-{i}", "topic": topic, "executeAt": far, "payload": {"n": i}}
            t0 = time.perf_counter()
            async with session.post(url + "/v1/schedules", json=body) as response:
                assert response.status == 201, await response.text()
            latencies.append(time.perf_counter() - t0)

    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(sizes.clients)))
        elapsed = time.perf_counter() - started
    return {
        "requests": sizes.ingest,
        "clients": sizes.clients,
        "requests_per_s": sizes.ingest / elapsed,
        "latency_s": summary(latencies),
    }


async def consume(bootstrap: str, topic: str, count: int, within: float) -> list[Any]:
    consumer = topic_consumer(bootstrap, topic)
    await consumer.start()
    records: list[Any] = []
    deadline = time.monotonic() + within
    try:
        while len(records) < count and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200, max_records=5000)
            for part in batch.values():
                records.extend(part)
    finally:
        await consumer.stop()
    return records


async def burst(
    uri: str, bootstrap: str, database: str, sizes: Sizes, topic: str = "bench-burst"
) -> dict[str, Any]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, tz_aware=True)
    collection = client[database]["schedules"]
    due = datetime.now(UTC) + timedelta(seconds=5 + sizes.burst / 5000)
    await insert(collection, documents(sizes.burst, due, topic, "burst"))
    records = await consume(bootstrap, topic, sizes.burst, within=600)
    # Kafka acks come before the DELIVERED mark; wait for the marks too.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        marked = await collection.count_documents({"topic": topic, "status": "DELIVERED"})
        if marked >= sizes.burst:
            break
        await asyncio.sleep(0.2)
    delivered = await collection.find(
        {"topic": topic, "status": "DELIVERED"}, {"deliveredAt": 1}
    ).to_list()
    await client.close()
    last = max(d["deliveredAt"] for d in delivered)
    elapsed = (last - due).total_seconds()
    ids = [dict(r.headers)["schedule-id"] for r in records]
    return {
        "records": sizes.burst,
        "delivered": len(delivered),
        "kafka_records": len(records),
        "duplicates": len(ids) - len(set(ids)),
        "seconds": elapsed,
        "records_per_s": len(delivered) / elapsed,
    }


async def spread(url: str, uri: str, bootstrap: str, database: str, sizes: Sizes) -> dict[str, Any]:
    topic = "bench-spread"
    # Every POST lands before the first is due (about 400 POSTs/s here), so
    # what is measured is delivery, not delivery competing with ingest.
    start = datetime.now(UTC) + timedelta(seconds=2 + sizes.spread / 200)
    step = sizes.spread_seconds / sizes.spread
    bodies = [
        {
            "id": f"spread-{i}",
            "topic": topic,
            "executeAt": iso(start + timedelta(seconds=i * step)),
            "payload": {"n": i},
        }
        for i in range(sizes.spread)
    ]
    queue = iter(bodies)

    async def client(session: aiohttp.ClientSession) -> None:
        for body in queue:
            async with session.post(url + "/v1/schedules", json=body) as response:
                assert response.status == 201, await response.text()

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(8)))
    posted_before_first_due = (start - datetime.now(UTC)).total_seconds()
    records = await consume(bootstrap, topic, sizes.spread, within=sizes.spread_seconds + 120)
    client_db: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, tz_aware=True)
    docs = (
        await client_db[database]["schedules"]
        .find({"topic": topic}, {"executeAt": 1, "deliveredAt": 1, "status": 1})
        .to_list()
    )
    await client_db.close()
    store_lateness = [
        (d["deliveredAt"] - d["executeAt"]).total_seconds() for d in docs if d.get("deliveredAt")
    ]
    kafka_lateness = []
    for record in records:
        headers = dict(record.headers)
        execute_at = datetime.fromisoformat(headers["execute-at"].decode().replace("Z", "+00:00"))
        kafka_lateness.append(record.timestamp / 1000 - execute_at.timestamp())
    return {
        "schedules": sizes.spread,
        "over_seconds": sizes.spread_seconds,
        "delivered": len(store_lateness),
        "posted_s_before_first_due": posted_before_first_due,
        "lateness_store_s": summary(store_lateness),
        "lateness_kafka_s": summary(kafka_lateness),
    }


@contextlib.contextmanager
def embedded_servers(prefix: str) -> Iterator[tuple[str, str, Path]]:
    """A fresh embedded MongoDB and Kafka: (mongo uri, bootstrap, scratch dir)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        tmp_path = Path(tmp)
        mongo_port, kafka_port = embedded.free_port(HOST), embedded.free_port(HOST)
        mongo = embedded.spawn(embedded.mongo_argv(HOST, mongo_port, tmp_path / "mongo"))
        kafka = embedded.spawn(embedded.kafka_argv(HOST, kafka_port))
        try:
            embedded.wait_for_port(HOST, mongo_port, 60, mongo)
            embedded.wait_for_port(HOST, kafka_port, 60, kafka)
            yield embedded.mongo_uri(HOST, mongo_port), f"{HOST}:{kafka_port}", tmp_path
        finally:
            embedded.stop(kafka)
            embedded.stop(mongo)


async def run(sizes: Sizes) -> dict[str, Any]:
    with embedded_servers("bench-") as (uri, bootstrap, tmp_path):
        node: NodeProcess | None = None
        try:
            print("store limit (the poller's queries, no node, no Kafka) ...", flush=True)
            limit = await store_limit(uri, sizes)
            node = NodeProcess(uri, bootstrap, "bench", tmp_path / "node.log")
            node.wait_ready()
            print("ingest ...", flush=True)
            ingested = await ingest(node.url, sizes, "bench-ingest")
            print("burst delivery ...", flush=True)
            delivered = await burst(uri, bootstrap, "bench", sizes)
            print("lateness of a spread load ...", flush=True)
            lateness = await spread(node.url, uri, bootstrap, "bench", sizes)
            node.stop()
            node = None
            # The same burst with no execution history: what writing it costs.
            node = NodeProcess(
                uri, bootstrap, "bench_nohist", tmp_path / "node.log", ("--history-retention", "0")
            )
            node.wait_ready()
            print("burst delivery without history ...", flush=True)
            bare = await burst(uri, bootstrap, "bench_nohist", sizes, "bench-burst-bare")
        finally:
            if node is not None:
                node.stop()
    return {
        "suite": "node",
        "when": iso(datetime.now(UTC)),
        "sizes": sizes.__dict__,
        "ingest": ingested,
        "store_limit": limit,
        "burst": delivered,
        "burst_to_store_limit": delivered["records_per_s"] / limit["records_per_s"],
        "burst_without_history": bare,
        "history_cost": 1 - delivered["records_per_s"] / bare["records_per_s"],
        "spread": lateness,
    }


def render(result: dict[str, Any]) -> str:
    i, s, b, sp = result["ingest"], result["store_limit"], result["burst"], result["spread"]
    ms = 1000
    lines = [
        f"ingest   POST /v1/schedules, {i['clients']} clients: {i['requests_per_s']:.0f} req/s, "
        f"latency p50 {i['latency_s']['p50'] * ms:.1f} ms, p99 {i['latency_s']['p99'] * ms:.1f} ms",
        f"store    poller queries alone (find+claim+mark), {s['records']} records: "
        f"{s['records_per_s']:.0f} records/s",
        f"burst    {b['records']} due at once, one node: {b['records_per_s']:.0f} records/s "
        f"({b['delivered']} delivered, {b['duplicates']} duplicates)",
        f"ratio    burst / store limit = {result['burst_to_store_limit']:.2f}",
        f"history  the same burst with HISTORY_RETENTION=0: "
        f"{result['burst_without_history']['records_per_s']:.0f} records/s; history costs "
        f"{result['history_cost'] * 100:.0f}% of delivery throughput",
        f"lateness {sp['schedules']} over {sp['over_seconds']:g} s (deliveredAt - executeAt): "
        f"p50 {sp['lateness_store_s']['p50'] * ms:.0f} ms, "
        f"p99 {sp['lateness_store_s']['p99'] * ms:.0f} ms, "
        f"max {sp['lateness_store_s']['max'] * ms:.0f} ms",
        f"         Kafka timestamp - executeAt: p50 {sp['lateness_kafka_s']['p50'] * ms:.0f} ms, "
        f"p99 {sp['lateness_kafka_s']['p99'] * ms:.0f} ms, "
        f"max {sp['lateness_kafka_s']['max'] * ms:.0f} ms",
    ]
    return "\n".join(lines)


def main(quick: bool, out: Path | None) -> int:
    result = asyncio.run(run(QUICK if quick else FULL))
    return publish(result, render(result), out)


__all__ = ["main"]
