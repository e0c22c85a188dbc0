"""``python -m bench bulk``: the bulk verbs at an outage's scale.

Three node processes on the embedded stack deliver to an HTTP receiver (in
the bench's process: what is measured here is what the receiver saw and
when, not its CPU):

* redrive: ``count`` schedules due at once, each allowed one attempt, while
  the receiver refuses every call (400): all end DELIVERY_FAILED. The
  receiver comes back; a dry run of ``POST /v1/schedules:retry`` by their
  label counts them, then ``:retry`` is called until it answers ``more:
  false``. Reported: the calls, what they changed, how long they took, how
  long until the receiver had every one, and any schedule it got twice;
* pause race: ``count`` more due at once, and ``POST /v1/schedules:pause``
  by their label sent at their due time, while the pollers take them,
  called until ``more: false`` (again a moment later while a match is in
  flight). Reported: what each call matched and changed, how many of the
  group reached the receiver after that last answer (must be 0: a later
  schedule that did arrive shows the pollers went on), the store's PAUSED
  and DELIVERED counts, and a ``:resume`` by label that must deliver each
  of the paused once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
from aiohttp import web

from bench.stack import HOST, LOOPBACK, embedded_servers, iso
from bench.systems import Scheduler
from node.schedule.webhook import new_secret


@dataclass(frozen=True)
class Plan:
    count: int
    nodes: int


FULL = Plan(count=2_000, nodes=3)
QUICK = Plan(count=100, nodes=2)
# Longest wait for a state the run waits on (all failed, all delivered).
WITHIN = 600.0
BATCH = 1_000  # schedules per POST /v1/schedules:batch
# A 503 (the store busy past its timeout) or a match in flight: asked again this much later.
AGAIN = 0.5


@dataclass
class Receiver:
    """Answers ``status`` to every call and notes (schedule id, status, time)."""

    status: int = 400
    calls: list[tuple[str, int, float]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.calls.append((request.headers.get("schedule-id", ""), self.status, time.time()))
        return web.Response(status=self.status)

    def delivered(self, prefix: str) -> list[str]:
        return [s for s, status, _ in self.calls if status < 300 and s.startswith(prefix)]


class Api:
    """The nodes' API, a node picked in turn for each call."""

    def __init__(self, session: aiohttp.ClientSession, urls: list[str]) -> None:
        self.session, self.urls, self.turn = session, urls, 0

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        self.turn += 1
        url = self.urls[self.turn % len(self.urls)] + path
        async with self.session.request(method, url, json=body) as response:
            return response.status, await response.json()

    async def create(self, prefix: str, count: int, url: str, due: datetime, **extra: Any) -> None:
        items = [
            {"id": f"{prefix}{n}", "http": {"url": url}, "executeAt": iso(due), "payload": n,
             "labels": {"wave": prefix}, **extra}
            for n in range(count)
        ]  # fmt: skip
        for start in range(0, count, BATCH):
            status, answer = await self.call(
                "POST", "/v1/schedules:batch", {"schedules": items[start : start + BATCH]}
            )
            if status != 200 or answer["created"] != len(items[start : start + BATCH]):
                raise RuntimeError(f"the batch was not stored: {status} {answer}")

    async def count(self, wave: str, status: str) -> int:
        """The wave's schedules at ``status``, page by page."""
        found, after = 0, ""
        while True:
            query = f"/v1/schedules?label=wave={wave}&status={status}&limit=1000{after}"
            _, page = await self.call("GET", query)
            found += len(page["schedules"])
            if not page["next"]:
                return found
            after = f"&after={page['next']}"

    async def until_done(self, verb: str, wave: str) -> list[dict[str, Any]]:
        """``verb`` by the wave's label, called until it answers more: false."""
        answers = []
        while True:
            started = time.monotonic()
            status, answer = await self.call(
                "POST", f"/v1/schedules:{verb}", {"labels": {"wave": wave}}
            )
            answers.append({"status": status, **answer, "s": round(time.monotonic() - started, 2)})
            if status == 200 and not answer["more"]:
                return answers
            if status != 200 or not answer["changed"]:
                await asyncio.sleep(AGAIN)  # busy, or what is left is in flight


@contextlib.asynccontextmanager
async def serving(
    handler: Callable[[web.Request], Awaitable[web.Response]], hosts: tuple[str, ...] = (HOST,)
) -> AsyncIterator[list[str]]:
    """``handler`` answering every path in this process, on a free port of
    each of ``hosts``; yields their base URLs, in that order."""
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        for host in hosts:
            await web.TCPSite(runner, host, 0).start()
        ports = [address[1] for address in runner.addresses]
        yield [f"http://{host}:{port}" for host, port in zip(hosts, ports, strict=True)]
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def http_cluster(
    prefix: str, nodes: int, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[Api, Scheduler]]:
    """``nodes`` node processes on the embedded stack that may call the
    loopback (their signing secret a fresh one), settled; yields their API
    and the system (to kill a node)."""
    system = Scheduler(
        env={"HTTP_TARGETS_ALLOW": LOOPBACK, "HTTP_SIGNING_SECRET": new_secret(), **(env or {})}
    )
    with embedded_servers(f"bench-{prefix}-") as servers:
        await system.start(servers, prefix, nodes)
        try:
            assert system.cluster is not None
            urls = [node.url for node in system.cluster.nodes.values()]
            async with aiohttp.ClientSession() as session:
                yield Api(session, urls), system
        finally:
            system.stop()


async def until(check: Callable[[], Awaitable[bool]], what: str) -> float:
    """Seconds until ``check`` holds (WITHIN at most)."""
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > WITHIN:
            raise RuntimeError(f"not within {WITHIN:g} s: {what}")
        await asyncio.sleep(0.2)
    return time.monotonic() - started


def twice(ids: list[str]) -> int:
    return sum(n - 1 for n in Counter(ids).values())


async def redrive(api: Api, receiver: Receiver, url: str, count: int) -> dict[str, Any]:
    await api.create("r", count, url, datetime.now(UTC) + timedelta(seconds=2),
                     retry={"maxAttempts": 1})  # fmt: skip

    async def all_failed() -> bool:
        return await api.count("r", "DELIVERY_FAILED") == count

    failed_s = await until(all_failed, "every schedule DELIVERY_FAILED")
    receiver.status = 204
    _, dry = await api.call(
        "POST", "/v1/schedules:retry", {"labels": {"wave": "r"}, "dryRun": True}
    )
    started = time.monotonic()
    answers = await api.until_done("retry", "r")
    calls_s = time.monotonic() - started

    async def all_delivered() -> bool:
        return len(set(receiver.delivered("r"))) == count

    await until(all_delivered, "every redriven schedule delivered")
    return {
        "failed_after_s": round(failed_s, 1),
        "refused_calls": sum(
            1 for s, status, _ in receiver.calls if s.startswith("r") and status >= 400
        ),
        "dry_run": dry,
        "answers": answers,
        "changed": sum(a.get("changed", 0) for a in answers),
        "calls_s": round(calls_s, 2),
        "all_delivered_s": round(time.monotonic() - started, 2),
        "delivered_twice": twice(receiver.delivered("r")),
    }


async def pause_race(api: Api, receiver: Receiver, url: str, count: int) -> dict[str, Any]:
    due = datetime.now(UTC) + timedelta(seconds=max(3.0, count / BATCH * 2))
    await api.create("p", count, url, due)
    await asyncio.sleep(max(0.0, due.timestamp() - time.time()))  # sent at their due time
    answers = await api.until_done("pause", "p")
    answered = time.time()
    await api.create("later", 1, url, datetime.now(UTC))

    async def later_arrived() -> bool:
        return bool(receiver.delivered("later"))

    await until(later_arrived, "a schedule made after the pause")
    after = [s for s, status, at in receiver.calls if s.startswith("p") and at > answered]
    paused, delivered = await api.count("p", "PAUSED"), await api.count("p", "DELIVERED")
    _, resumed = await api.call("POST", "/v1/schedules:resume", {"labels": {"wave": "p"}})

    async def all_delivered() -> bool:
        return len(set(receiver.delivered("p"))) == count

    await until(all_delivered, "every paused schedule delivered once resumed")
    return {
        "answers": answers,
        "paused": sum(a.get("changed", 0) for a in answers),
        "calls_after_last_answer": len(after),
        "store_paused": paused,
        "store_delivered": delivered,
        "resumed": resumed,
        "delivered_twice": twice(receiver.delivered("p")),
    }


async def run(plan: Plan) -> dict[str, Any]:
    receiver = Receiver()
    async with (
        serving(receiver.handle) as [base],
        http_cluster("bulk", plan.nodes) as (api, _),
    ):
        url = f"{base}/hook"
        print(f"  redrive of {plan.count} ...", flush=True)
        redriven = await redrive(api, receiver, url, plan.count)
        print(f"  pause racing the pollers over {plan.count} ...", flush=True)
        raced = await pause_race(api, receiver, url, plan.count)
    return {
        "suite": "bulk",
        "when": iso(datetime.now(UTC)),
        "plan": plan.__dict__,
        "redrive": redriven,
        "pause": raced,
        "aims": aims(plan, redriven, raced),
    }


def aims(plan: Plan, redriven: dict[str, Any], raced: dict[str, Any]) -> dict[str, bool]:
    """Whether each outcome is the one the verbs promise."""
    paused = raced["paused"]
    return {
        "every failed one redriven and delivered once": redriven["changed"] == plan.count
        and redriven["delivered_twice"] == 0,
        "the dry run counted them all and changed none": redriven["dry_run"].get("matched")
        == plan.count
        and redriven["dry_run"].get("changed") == 0,
        "none of the paused group called after the last answer": raced["calls_after_last_answer"]
        == 0,
        "the store holds each one paused or delivered": raced["store_paused"]
        + raced["store_delivered"]
        == plan.count
        and raced["store_paused"] == paused,
        "the resume delivered each paused one once": raced["resumed"].get("changed") == paused
        and raced["delivered_twice"] == 0,
    }


def render(result: dict[str, Any]) -> str:
    plan, r, p = result["plan"], result["redrive"], result["pause"]
    calls = ", ".join(f"{a.get('matched')}/{a.get('changed')} in {a['s']} s" for a in r["answers"])
    paused = ", ".join(
        f"{a.get('matched')}/{a.get('changed')}{' more' if a.get('more') else ''}"
        for a in p["answers"]
    )
    lines = [
        f"{plan['nodes']} nodes, {plan['count']} schedules a wave, an HTTP receiver",
        f"redrive: all DELIVERY_FAILED {r['failed_after_s']} s after due ({r['refused_calls']} "
        f"refused calls); dry run {r['dry_run'].get('matched')}; :retry calls (matched/changed) "
        f"{calls}; all delivered {r['all_delivered_s']} s after the first call, "
        f"{r['delivered_twice']} twice",
        f"pause racing the pollers: calls (matched/changed) {paused}; after the last answer "
        f"{p['calls_after_last_answer']} calls of the group; store {p['store_paused']} PAUSED, "
        f"{p['store_delivered']} DELIVERED; :resume changed {p['resumed'].get('changed')}, "
        f"{p['delivered_twice']} delivered twice",
    ]
    lines += [f"  {'met   ' if ok else 'MISSED'} {aim}" for aim, ok in result["aims"].items()]
    return "\n".join(lines)


__all__ = ["FULL", "QUICK", "render", "run"]
