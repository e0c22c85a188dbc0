"""``python -m bench flow``: flow control across a cluster, as the endpoint
sees it.

Three node processes on the embedded stack call an HTTP receiver (in the
bench's process: what is measured is what it saw, and when). One flow key,
``crm``, is limited to ``rate`` calls a second and ``parallelism`` at once;
each of its calls takes the receiver ``service_ms``. Three waves, one
cluster:

* alone: ``free`` schedules of no key due at once (the baseline of their
  lateness);
* beside: ``count`` of the limited key and ``free`` others (to another
  host: a host's own bound is shared by whatever calls it), all due at
  once in the same buckets: the limited key's calls at most
  ``parallelism`` at once and ``rate`` x 1.1 in every one-second window
  (however the window falls), all delivered in ``count / rate`` to 1.2 x
  that, none failed; the free ones' lateness p99 within 1.2 x the alone
  wave's;
* a crash: ``count`` of the limited key due at once, and halfway the node
  that owns the most of them SIGKILLed: both bounds still hold, and every
  one is delivered.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from bench.bulk_bench import Api, http_cluster, serving, twice, until
from bench.stack import HOST, iso
from bench.systems import Scheduler
from ring import bucket_for


@dataclass(frozen=True)
class Plan:
    count: int
    rate: int
    parallelism: int
    free: int
    nodes: int
    service_ms: int = 20
    buckets: int = 256


FULL = Plan(count=600, rate=20, parallelism=3, free=600, nodes=3)
QUICK = Plan(count=40, rate=20, parallelism=3, free=40, nodes=2)
# The host the calls of no key go to (loopback, as HOST).
OTHER_HOST = "127.0.0.2"
# Seconds from the creation of a wave to its due time (the batches stored first).
LEAD = 4.0


@dataclass
class Receiver:
    """Notes each call (schedule id, arrival) and, for the limited key, how
    many are in its hands at once."""

    service: float
    calls: list[tuple[str, float]] = field(default_factory=list)
    limited: list[float] = field(default_factory=list)
    busy: int = 0
    most_busy: int = 0

    async def handle(self, request: web.Request) -> web.Response:
        sid = request.headers.get("schedule-id", "")
        now = time.time()
        self.calls.append((sid, now))
        if request.path.endswith("/limited"):
            self.limited.append(now)
            self.busy += 1
            self.most_busy = max(self.most_busy, self.busy)
            try:
                await asyncio.sleep(self.service)
            finally:
                self.busy -= 1
        return web.Response(status=204)

    def of(self, prefix: str) -> list[tuple[str, float]]:
        return [(s, at) for s, at in self.calls if s.startswith(prefix)]


def most_in_a_window(moments: list[float], width: float) -> int:
    """The most of ``moments`` in any window ``width`` long, wherever it falls."""
    moments, most, start = sorted(moments), 0, 0
    for end, at in enumerate(moments):
        while at - moments[start] >= width:
            start += 1
        most = max(most, end - start + 1)
    return most


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0.0


class Wave:
    def __init__(self, api: Api, receiver: Receiver, bases: tuple[str, str], plan: Plan) -> None:
        self.api, self.receiver, self.bases, self.plan = api, receiver, bases, plan
        self.limit = {"key": "crm", "rate": plan.rate, "parallelism": plan.parallelism}

    async def create(
        self, prefix: str, count: int, *, limited: bool, due: datetime | None = None
    ) -> datetime:
        due = due or datetime.now(UTC) + timedelta(seconds=LEAD + count / 500)
        extra = {"flowControl": self.limit} if limited else {}
        url = f"{self.bases[0]}/limited" if limited else f"{self.bases[1]}/free"
        await self.api.create(prefix, count, url, due, **extra)
        return due

    async def all_in(self, prefix: str, count: int) -> float:
        async def done() -> bool:
            return len({s for s, _ in self.receiver.of(prefix)}) >= count

        return await until(done, f"every {prefix} schedule delivered")

    def limited_figures(self, prefix: str, due: datetime) -> dict[str, Any]:
        arrivals = [at for _, at in self.receiver.of(prefix)]
        return {
            "most_in_a_second": most_in_a_window(arrivals, 1.0),
            "delivered_in_s": round(max(arrivals) - due.timestamp(), 2),
            "first_after_s": round(min(arrivals) - due.timestamp(), 2),
            "twice": twice([s for s, _ in self.receiver.of(prefix)]),
        }

    def lateness(self, prefix: str, due: datetime) -> dict[str, float]:
        late = [at - due.timestamp() for _, at in self.receiver.of(prefix)]
        return {"p50": round(sorted(late)[len(late) // 2], 3), "p99": round(p99(late), 3)}


async def alone(wave: Wave) -> dict[str, Any]:
    due = await wave.create("a", wave.plan.free, limited=False)
    await wave.all_in("a", wave.plan.free)
    return {"free_lateness": wave.lateness("a", due)}


async def beside(wave: Wave) -> dict[str, Any]:
    wave.receiver.most_busy = 0
    due = datetime.now(UTC) + timedelta(seconds=LEAD + (wave.plan.count + wave.plan.free) / 500)
    await wave.create("l", wave.plan.count, limited=True, due=due)
    free_due = await wave.create("f", wave.plan.free, limited=False, due=due)
    await wave.all_in("f", wave.plan.free)
    await wave.all_in("l", wave.plan.count)
    failed = await wave.api.count("l", "DELIVERY_FAILED")
    return {
        **wave.limited_figures("l", due),
        "most_at_once": wave.receiver.most_busy,
        "failed": failed,
        "free_lateness": wave.lateness("f", free_due),
    }


async def crash(wave: Wave, system: Scheduler) -> dict[str, Any]:
    cluster = system.cluster
    assert cluster is not None
    wave.receiver.most_busy = 0
    due = await wave.create("c", wave.plan.count, limited=True)
    _, view = await wave.api.call("GET", "/v1/cluster")
    owner_of = {o["bucket"]: o["owner"] for o in view["buckets"]["owners"]}
    load = Counter(
        owner_of.get(bucket_for(f"c{n}", wave.plan.buckets)) for n in range(wave.plan.count)
    )
    victim = max(cluster.nodes, key=lambda name: load[name])

    async def halfway() -> bool:
        return len(wave.receiver.of("c")) >= wave.plan.count // 2

    await until(halfway, "half of the crash wave delivered")
    killed_at = time.time()
    cluster.kill(victim)
    wave.api.urls = [n.url for name, n in cluster.nodes.items() if name != victim]
    await wave.all_in("c", wave.plan.count)
    return {
        **wave.limited_figures("c", due),
        "most_at_once": wave.receiver.most_busy,
        "victim_share": round(load[victim] / wave.plan.count, 2),
        "killed_after_s": round(killed_at - due.timestamp(), 2),
    }


async def run(plan: Plan) -> dict[str, Any]:
    receiver = Receiver(service=plan.service_ms / 1000)
    # The limited key's service and the others' on two hosts (two loopback
    # addresses): a host's own bound (HTTP_MAX_PER_HOST calls at once) is
    # shared by whatever calls it, which is not what flow control is about.
    async with (
        serving(receiver.handle, (HOST, OTHER_HOST)) as [limited_base, free_base],
        http_cluster("flow", plan.nodes, {"BUCKETS": str(plan.buckets)}) as (api, system),
    ):
        wave = Wave(api, receiver, (limited_base, free_base), plan)
        print(f"  {plan.free} of no key alone ...", flush=True)
        baseline = await alone(wave)
        print(f"  {plan.count} limited beside {plan.free} free ...", flush=True)
        mixed = await beside(wave)
        print(f"  {plan.count} limited, a node killed halfway ...", flush=True)
        crashed = await crash(wave, system)
    return {
        "suite": "flow",
        "when": iso(datetime.now(UTC)),
        "plan": plan.__dict__,
        "alone": baseline,
        "beside": mixed,
        "crash": crashed,
        "aims": aims(plan, baseline, mixed, crashed),
    }


def aims(
    plan: Plan, baseline: dict[str, Any], mixed: dict[str, Any], crashed: dict[str, Any]
) -> dict[str, bool]:
    """Whether each outcome is the one flow control promises."""
    window = plan.rate * 1.1
    least, most = plan.count / plan.rate, plan.count / plan.rate * 1.2
    return {
        f"at most {plan.parallelism} at once, beside and through the crash": mixed["most_at_once"]
        <= plan.parallelism
        and crashed["most_at_once"] <= plan.parallelism,
        f"at most {window:g} in any second, beside and through the crash": mixed["most_in_a_second"]
        <= window
        and crashed["most_in_a_second"] <= window,
        f"all delivered in {least:g}-{most:g} s, none failed, none twice": least
        <= mixed["delivered_in_s"]
        <= most
        and mixed["failed"] == 0
        and mixed["twice"] == 0,
        "the free key's lateness p99 within 1.2x of its own alone": mixed["free_lateness"]["p99"]
        <= 1.2 * max(baseline["free_lateness"]["p99"], 0.001),
    }


def render(result: dict[str, Any]) -> str:
    plan, a, m, c = result["plan"], result["alone"], result["beside"], result["crash"]
    lines = [
        f"{plan['nodes']} nodes, key crm at {plan['rate']}/s and {plan['parallelism']} at once "
        f"({plan['service_ms']} ms a call), {plan['count']} due at once; {plan['free']} of no key",
        f"alone: free lateness p50 {a['free_lateness']['p50']} s, "
        f"p99 {a['free_lateness']['p99']} s",
        f"beside: limited at most {m['most_at_once']} at once, {m['most_in_a_second']} in a "
        f"second, all in {m['delivered_in_s']} s (first {m['first_after_s']} s), "
        f"{m['failed']} failed, {m['twice']} twice; free lateness p50 "
        f"{m['free_lateness']['p50']} s, p99 {m['free_lateness']['p99']} s",
        f"crash: {c['victim_share']:.0%} on the killed node at {c['killed_after_s']} s; at most "
        f"{c['most_at_once']} at once, {c['most_in_a_second']} in a second, all in "
        f"{c['delivered_in_s']} s, {c['twice']} twice",
    ]
    lines += [f"  {'met   ' if ok else 'MISSED'} {aim}" for aim, ok in result["aims"].items()]
    return "\n".join(lines)


__all__ = ["FULL", "QUICK", "render", "run"]
