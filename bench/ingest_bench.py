"""``python -m bench ingest``: how fast the API takes schedules in.

POST /v1/schedules and POST /v1/schedules:batch, with 16 and 64 concurrent
clients, against one node and against three (clients spread round-robin
over the nodes), on the embedded stack, each configuration on a fresh
database. Schedules are due a day later, so no delivery competes.

Per configuration: requests/s, schedules/s, latency p50/p99 per request,
errors, and the CPU the load generator itself used (one Python process on
the same machine: when it nears one core, it is the limit, not the nodes).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp

from bench.stack import Servers, cpu_seconds, embedded_servers, iso, summary
from bench.systems import Scheduler

BATCH_ITEMS = 100  # schedules per batch call


@dataclass(frozen=True)
class Plan:
    nodes: tuple[int, ...]
    clients: tuple[int, ...]
    posts: int  # single POSTs per configuration
    batches: int  # batch calls per configuration


FULL = Plan(nodes=(1, 3), clients=(16, 64), posts=4000, batches=200)
QUICK = Plan(nodes=(1,), clients=(16,), posts=400, batches=20)


def single_bodies(count: int, topic: str, prefix: str) -> Iterator[dict[str, Any]]:
    due = iso(datetime.now(UTC) + timedelta(days=1))
    for i in range(count):
        yield {"id": f"{prefix}-{i}", "topic": topic, "executeAt": due, "payload": {"n": i}}


def batch_bodies(count: int, topic: str, prefix: str) -> Iterator[dict[str, Any]]:
    due = iso(datetime.now(UTC) + timedelta(days=1))
    for b in range(count):
        yield {
            "schedules": [
                {"id": f"{prefix}-{b}-{i}", "topic": topic, "executeAt": due, "payload": {"n": i}}
                for i in range(BATCH_ITEMS)
            ]
        }


async def drive(
    urls: list[str],
    path: str,
    bodies: Iterator[dict[str, Any]],
    clients: int,
    per_body: int,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``clients`` concurrent clients, each sending the next body to its node
    until none are left (each call with ``headers``)."""
    latencies: list[float] = []
    errors: list[str] = []
    cpu_before = cpu_seconds(os.getpid())

    async def client(index: int, session: aiohttp.ClientSession) -> None:
        url = urls[index % len(urls)] + path
        for body in bodies:
            started = time.perf_counter()
            async with session.post(url, json=body, headers=headers) as response:
                answer = await response.json()
                ok = response.status == 201 or (
                    response.status == 200 and answer.get("created") == per_body
                )
            latencies.append(time.perf_counter() - started)
            if not ok:
                errors.append(f"{response.status}: {str(answer)[:200]}")

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(i, session) for i in range(clients)))
        elapsed = time.perf_counter() - started
    requests = len(latencies)
    return {
        "requests": requests,
        "schedules": (requests - len(errors)) * per_body,
        "seconds": elapsed,
        "requests_per_s": requests / elapsed,
        "schedules_per_s": (requests - len(errors)) * per_body / elapsed,
        "latency_s": summary(latencies),
        "errors": len(errors),
        "first_errors": errors[:3],
        "load_generator_cpu_share": (cpu_seconds(os.getpid()) - cpu_before) / elapsed,
    }


async def configuration(servers: Servers, nodes: int, clients: int, plan: Plan) -> dict[str, Any]:
    database = f"ingest_{nodes}_{clients}"
    print(f"  {nodes} node(s), {clients} clients ...", flush=True)
    cluster = Scheduler()
    await cluster.start(servers, database, nodes)
    try:
        assert cluster.cluster is not None
        urls = [n.url for n in cluster.cluster.nodes.values()]
        topic = f"ingest.{database}"
        single = await drive(
            urls, "/v1/schedules", single_bodies(plan.posts, topic, "one"), clients, 1
        )
        batch = await drive(
            urls,
            "/v1/schedules:batch",
            batch_bodies(plan.batches, topic, "many"),
            clients,
            BATCH_ITEMS,
        )
    finally:
        cluster.stop()
        async with servers.client() as client:
            await client.drop_database(database)
    return {"nodes": nodes, "clients": clients, "single": single, "batch": batch}


async def run(plan: Plan) -> dict[str, Any]:
    rows = []
    with embedded_servers("bench-ingest-") as servers:
        for nodes in plan.nodes:
            for clients in plan.clients:
                rows.append(await configuration(servers, nodes, clients, plan))
    return {
        "suite": "ingest",
        "when": iso(datetime.now(UTC)),
        "plan": asdict(plan),
        "batch_items": BATCH_ITEMS,
        "rows": rows,
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"{'nodes':>5} {'clients':>7} {'call':<7} {'req/s':>7} {'sched/s':>8} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'errors':>6} {'loadgen cpu':>11}"
    ]
    for row in result["rows"]:
        for call in ("single", "batch"):
            r = row[call]
            lines.append(
                f"{row['nodes']:>5} {row['clients']:>7} {call:<7} {r['requests_per_s']:>7,.0f} "
                f"{r['schedules_per_s']:>8,.0f} {r['latency_s']['p50'] * 1000:>7.1f} "
                f"{r['latency_s']['p99'] * 1000:>7.1f} {r['errors']:>6} "
                f"{r['load_generator_cpu_share'] * 100:>10.0f}%"
            )
    lines.append(
        f"batch = POST /v1/schedules:batch of {result['batch_items']} schedules; latency per "
        "request; loadgen cpu = the load generator's share of one core"
    )
    return "\n".join(lines)


__all__ = ["FULL", "QUICK", "render", "run"]
