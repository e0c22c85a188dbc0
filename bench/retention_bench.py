"""``python -m bench retention``: does the store stay bounded?

One node on the embedded stack takes a steady load through the API (each
schedule due a second or two later) for 20 minutes with RETENTION at
2 minutes. Every schedule that ends gets its expireAt, and the TTL index
removes it: the collection should grow for about the retention and then
level off at about rate x (retention + the TTL monitor's period), whatever
the run's length. Sampled every 30 s; the report compares the last part of
the run with the part after the first retention.

(SecantusDB's TTL monitor runs every 60 s, as MongoDB's does.)
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp

from bench.delivery_bench import machine
from bench.stack import embedded_servers, iso
from bench.systems import Scheduler


@dataclass(frozen=True)
class Plan:
    seconds: float
    rate: float
    retention: float
    sample_every: float


FULL = Plan(seconds=20 * 60, rate=40.0, retention=120.0, sample_every=30.0)
QUICK = Plan(seconds=150, rate=20.0, retention=20.0, sample_every=10.0)


async def load(url: str, plan: Plan, stop: asyncio.Event) -> int:
    """POST ``rate`` schedules a second, each due 1-2 s later; returns how many."""
    sent = 0
    started = time.monotonic()
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            wait = started + sent / plan.rate - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            due = iso(datetime.now(UTC) + timedelta(seconds=1 + (sent % 10) / 10))
            body = {"topic": "bench.retention", "executeAt": due, "payload": {"n": sent}}
            async with session.post(url + "/v1/schedules", json=body) as response:
                if response.status == 201:
                    sent += 1
    return sent


async def run(plan: Plan) -> dict[str, Any]:
    with embedded_servers("bench-retention-") as servers:
        database = "retention"
        system = Scheduler(env={"RETENTION": str(plan.retention)})
        await system.start(servers, database, 1)
        assert system.cluster is not None
        url = next(iter(system.cluster.nodes.values())).url
        stop = asyncio.Event()
        samples: list[dict[str, float]] = []
        try:
            loader = asyncio.create_task(load(url, plan, stop))
            started = time.monotonic()
            async with servers.client() as client:
                schedules = client[database]["schedules"]
                while time.monotonic() - started < plan.seconds:
                    await asyncio.sleep(plan.sample_every)
                    samples.append(
                        {
                            "at_s": round(time.monotonic() - started, 1),
                            "documents": await schedules.count_documents({}),
                            "pending": await schedules.count_documents({"status": "PENDING"}),
                        }
                    )
                    print(f"    {samples[-1]}", flush=True)
            stop.set()
            sent = await loader
        finally:
            stop.set()
            system.stop()
    settled = [s["documents"] for s in samples if s["at_s"] >= 2 * plan.retention + 60]
    last = [s["documents"] for s in samples if s["at_s"] >= plan.seconds * 0.75]
    expected = plan.rate * (plan.retention + 60)
    return {
        "suite": "retention",
        "machine": machine(),
        "plan": plan.__dict__,
        "accepted": sent,
        "samples": samples,
        "after_two_retentions": {"min": min(settled), "max": max(settled)} if settled else None,
        "last_quarter": {"min": min(last), "max": max(last)} if last else None,
        "bound_expected": expected,
        "levels_off": bool(settled) and max(last or settled) <= 1.5 * expected < sent,
    }


def render(result: dict[str, Any]) -> str:
    plan = result["plan"]
    lines = [
        f"{result['accepted']:,} accepted over {plan['seconds']:.0f} s at {plan['rate']:g}/s, "
        f"RETENTION {plan['retention']:g} s; documents in the collection:",
    ]
    lines += [f"  at {s['at_s']:>6.0f} s: {s['documents']:>6,}" for s in result["samples"]]
    settled, last = result["after_two_retentions"], result["last_quarter"]
    if settled and last:
        lines.append(
            f"after two retentions {settled['min']:,}-{settled['max']:,}, in the last quarter "
            f"{last['min']:,}-{last['max']:,}; rate x (retention + the TTL monitor's 60 s) = "
            f"{result['bound_expected']:,.0f}: "
            + ("levels off" if result["levels_off"] else "DOES NOT level off")
        )
    return "\n".join(lines)


__all__ = ["FULL", "QUICK", "render", "run"]
