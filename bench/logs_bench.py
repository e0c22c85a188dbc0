"""``python -m bench logs``: what the log stream, the access log and request
ids cost, against the same node with them quiet, in one run.

Two systems, runs alternated (on, off, on, off, ...) so a drift of the
machine falls on both:

* **on**, production's defaults: ``LOG_FORMAT=json``, ``LOG_LEVEL=info``
  (a "schedule delivered" line per delivery), ``ACCESS_LOG=on``, and every
  schedule carrying a request id and a traceparent, as the API stores them
  (so each record carries both headers);
* **off**: ``LOG_LEVEL=warning``, ``ACCESS_LOG=off``, no request ids stored.

Measured: the delivery bench's burst (1 node, every schedule due at once:
records/s), and ingest through the API (single POSTs from 16 clients, each
with an ``X-Request-ID``: requests/s). Reported: each run, and on's median
over off's (the aim: at least 0.95).
"""

from __future__ import annotations

import secrets
import statistics
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from bench import ingest_bench, workloads
from bench.delivery_bench import Runner
from bench.destinations import Kafka
from bench.stack import embedded_servers, iso, store_operations
from bench.systems import Scheduler

AIM = 0.95
ON = {"LOG_FORMAT": "json", "LOG_LEVEL": "info", "ACCESS_LOG": "on"}
OFF = {"LOG_LEVEL": "warning", "ACCESS_LOG": "off"}


@dataclass(frozen=True)
class Plan:
    burst: int  # schedules due at once
    rounds: int  # on/off pairs of each measurement
    posts: int  # single POSTs per ingest run
    clients: int


FULL = Plan(burst=20000, rounds=3, posts=3000, clients=16)
QUICK = Plan(burst=2000, rounds=1, posts=300, clients=16)


@dataclass(frozen=True)
class TracedKafka(Kafka):
    """The delivery bench's Kafka destination, each schedule stored as a
    create with a request id and a traceparent stores it."""

    def documents(self, run: str, count: int) -> list[dict[str, Any]]:
        docs = super().documents(run, count)
        for doc in docs:
            trace_id = secrets.token_hex(16)
            doc["requestId"] = trace_id
            doc["traceparent"] = f"00-{trace_id}-{secrets.token_hex(8)}-01"
        return docs


async def _ingest(servers: Any, env: dict[str, str], plan: Plan, name: str) -> dict[str, Any]:
    cluster = Scheduler(name=name, env=env)
    database = f"logs_ingest_{name}"
    await cluster.start(servers, database, 1)
    try:
        assert cluster.cluster is not None
        urls = [n.url for n in cluster.cluster.nodes.values()]
        bodies = ingest_bench.single_bodies(plan.posts, f"ingest.{database}", name)
        return await ingest_bench.drive(
            urls, "/v1/schedules", bodies, plan.clients, 1, headers={"X-Request-ID": "bench-1"}
        )
    finally:
        cluster.stop()
        async with servers.client() as client:
            await client.drop_database(database)


async def run(plan: Plan) -> dict[str, Any]:
    bursts: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    ingests: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    with embedded_servers("bench-logs-") as servers:
        runner = Runner(servers)
        async with servers.client() as client:
            await store_operations(client)
        for round_ in range(plan.rounds):
            for mode, env in (("on", ON), ("off", OFF)):
                name = f"logs-{mode}-{round_}"
                print(f"burst, {mode}:", flush=True)
                destination = TracedKafka(servers) if mode == "on" else Kafka(servers)
                bursts[mode].append(
                    await runner.measure(
                        Scheduler(name=name, env=env),
                        1,
                        workloads.burst(plan.burst),
                        300,
                        destination=destination,
                    )
                )
                print(f"ingest, {mode}:", flush=True)
                ingests[mode].append(await _ingest(servers, env, plan, name))
    burst_rate = {m: statistics.median(r["records_per_s"] for r in bursts[m]) for m in bursts}
    ingest_rate = {m: statistics.median(r["requests_per_s"] for r in ingests[m]) for m in ingests}
    ratios = {
        "burst": burst_rate["on"] / burst_rate["off"],
        "ingest": ingest_rate["on"] / ingest_rate["off"],
    }
    return {
        "suite": "logs",
        "when": iso(datetime.now(UTC)),
        "plan": asdict(plan),
        "bursts": bursts,
        "ingests": ingests,
        "burst_records_per_s": burst_rate,
        "ingest_requests_per_s": ingest_rate,
        "ratios": ratios,
        "aims": {"burst_at_least_0_95": ratios["burst"] >= AIM},
    }


def render(result: dict[str, Any]) -> str:
    lines = [f"{'run':<12} {'burst rec/s':>12} {'lateness p99 s':>15} {'ingest req/s':>13}"]
    for mode in ("on", "off"):
        for burst, ingest in zip(result["bursts"][mode], result["ingests"][mode], strict=True):
            lines.append(
                f"{mode:<12} {burst['records_per_s']:>12,.0f} "
                f"{burst['lateness_s']['p99']:>15.2f} {ingest['requests_per_s']:>13,.0f}"
            )
    ratios = result["ratios"]
    lines.append(
        f"on / off (medians): burst {ratios['burst']:.2f}x, ingest {ratios['ingest']:.2f}x "
        f"(aim: burst at least {AIM})"
    )
    return "\n".join(lines)
