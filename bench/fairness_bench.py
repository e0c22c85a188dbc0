"""``python -m bench fairness``: one tenant's burst against another's trickle.

Tenant A has 50,000 schedules due at the same instant T0; tenant B has 100
spread evenly over the minute from T0. One node on the embedded stack
delivers them, once with fair polling (the default) and once with plain
oldest-first (``FAIR_TENANTS=off``), each on a fresh database, in one run.
Reported: B's lateness (Kafka timestamp - executeAt) p50/p99/max in each
mode, and how long A's burst took to drain (the store's pace, which neither
mode changes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import AsyncMongoClient

from bench.stack import (
    BUCKETS,
    NodeProcess,
    Servers,
    TopicReader,
    embedded_servers,
    insert,
    iso,
    summary,
)
from node.schedule.model import Limits
from node.schedule.parse import parse_schedule_object
from node.store.documents import schedule_document
from node.store.schedules import ScheduleStore
from node.store.tenants import TenantStore
from node.tenants.model import Tenant

LIMITS = Limits(max_payload_bytes=1 << 20, horizon=timedelta(days=400))


@dataclass(frozen=True)
class Sizes:
    burst: int
    trickle: int
    trickle_seconds: float


FULL = Sizes(burst=50_000, trickle=100, trickle_seconds=60)
QUICK = Sizes(burst=1_000, trickle=20, trickle_seconds=8)


def schedules(
    tenant: str, count: int, first: datetime, step: float, topic: str
) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    docs = []
    for i in range(count):
        body = {
            "id": f"{tenant}-{i}",
            "topic": topic,
            "executeAt": iso(first + timedelta(seconds=i * step)),
            "payload": {"n": i},
        }
        new = parse_schedule_object(body, LIMITS, now, lambda _: tenant)
        docs.append(schedule_document(new, BUCKETS, now))
    return docs


async def one_mode(servers: Servers, fair: bool, sizes: Sizes) -> dict[str, Any]:
    uri, bootstrap, logs = servers.mongo_uri, servers.bootstrap, servers.scratch / "node.log"
    database, topic = f"fair_{'on' if fair else 'off'}", f"fairness-{'on' if fair else 'off'}"
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, tz_aware=True)
    store = ScheduleStore(client[database], BUCKETS)
    await store.prepare(datetime.now(UTC))
    tenants = TenantStore(client[database])
    await tenants.prepare()
    for name in ("A", "B"):
        await tenants.add(Tenant(name=name), datetime.now(UTC))
    # Due once everything is stored and the node holds every bucket.
    t0 = datetime.now(UTC) + timedelta(seconds=8 + sizes.burst / 2500)
    burst = schedules("A", sizes.burst, t0, 0.0, topic)
    trickle = schedules("B", sizes.trickle, t0, sizes.trickle_seconds / sizes.trickle, topic)
    await insert(store.schedules, burst + trickle)
    stored_s_before_t0 = (t0 - datetime.now(UTC)).total_seconds()
    node = NodeProcess(uri, bootstrap, database, logs, ("--fair-tenants", "on" if fair else "off"))
    try:
        node.wait_ready()
        total = sizes.burst + sizes.trickle
        started = time.monotonic()
        async with TopicReader(bootstrap, topic) as reader:
            await reader.wait_for(total, time.monotonic() + 1800)
            deliveries = list(reader.deliveries)
        waited = time.monotonic() - started
    finally:
        node.stop()
    await client.close()
    # A connection of its own: the embedded server closes one idle for 5
    # minutes, and draining 50,000 schedules takes longer.
    async with servers.client() as fresh:
        await fresh.drop_database(database)
    lateness: dict[str, list[float]] = {"A": [], "B": []}
    for delivery in deliveries:
        # Ids are the tenant's name, a dash and a number (schedules() above).
        lateness[delivery.schedule_id.split("-")[0]].append(delivery.at - delivery.execute_at)
    return {
        "fair": fair,
        "stored_s_before_t0": stored_s_before_t0,
        "records": len(deliveries),
        "expected": total,
        "consumed_within_s": waited,
        "b_lateness_s": summary(lateness["B"]),
        "a_drain_s": max(lateness["A"]) if lateness["A"] else float("nan"),
        "a_lateness_s": summary(lateness["A"]),
    }


async def run(sizes: Sizes) -> dict[str, Any]:
    modes = {}
    with embedded_servers("bench-fair-") as servers:
        for fair in (True, False):
            print(f"fair polling {'on' if fair else 'off'} ...", flush=True)
            modes["on" if fair else "off"] = await one_mode(servers, fair, sizes)
    on, off = modes["on"], modes["off"]
    return {
        "suite": "fairness",
        "when": iso(datetime.now(UTC)),
        "sizes": sizes.__dict__,
        "modes": modes,
        "b_p99_off_over_on": off["b_lateness_s"]["p99"] / on["b_lateness_s"]["p99"],
    }


def render(result: dict[str, Any]) -> str:
    sizes = result["sizes"]
    lines = [
        f"tenant A: {sizes['burst']} due at T0; tenant B: {sizes['trickle']} over "
        f"{sizes['trickle_seconds']:g} s from T0; one node, lateness = Kafka timestamp - executeAt"
    ]
    for name, mode in result["modes"].items():
        b = mode["b_lateness_s"]
        lines.append(
            f"fair {name:3}  B p50 {b['p50']:.2f} s, p99 {b['p99']:.2f} s, max {b['max']:.2f} s; "
            f"A drained {mode['a_drain_s']:.1f} s after T0 "
            f"({mode['records']}/{mode['expected']} records)"
        )
    lines.append(f"ratio    B p99 oldest-first / fair = {result['b_p99_off_over_on']:.1f}")
    return "\n".join(lines)


__all__ = ["FULL", "QUICK", "render", "run"]
