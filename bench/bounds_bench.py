"""``python -m bench bounds``: what the largest request of each route costs
a node, and what a tenant's read flood costs another tenant's deliveries.

Part one (memory and stalls). One node process on the embedded stack, with
the defaults (256 KiB payloads, 16 MiB batch bodies); each case sends the
largest body or asks the largest page its route allows, and also the
attacks the limits exist for (16 MiB of nested empty arrays, four 16 MiB
batches at once, a book of due schedules with 256 KiB payloads). For each
case: the node's peak resident memory (VmHWM, reset before the case), the
longest a /healthz probe took meanwhile (polled every 10 ms: an upper bound
of how long the event loop stood still), the stalls of a second or more
the node itself counted (``scheduler_process_stalls``), and the answers'
statuses. The bound: the StatefulSet's 512 Mi, and no stall of a second.

Part two (a read flood). Tenant B's schedules fall due over the run, ten a
second; tenant A has 20,000 PENDING. Three runs on fresh databases, one
node each: no flood; six clients of A listing its PENDING schedules (the
finding's flood: a page of 100 by status) as fast as they are answered
(after a 429 or a 503, as soon as its Retry-After allows), under the
default read budget; and the same flood with a budget nothing reaches
(READ_BUDGET 1,000 s a second, READ_TIMEOUT 5 s). Reported: B's lateness
p50/p99/max in each, and the ratios to the run without a flood.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp

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
from node.schedule.parse import MAX_JSON_VALUES, parse_schedule_object
from node.store.documents import schedule_document
from node.store.schedules import ScheduleStore

LIMITS = Limits(max_payload_bytes=256 * 1024, horizon=timedelta(days=400))
# The pod's memory limit in docker/k8s/statefulset.yaml.
MEMORY_BOUND_MIB = 512
PAYLOAD = 256 * 1024  # MAX_PAYLOAD_BYTES's default
BATCH_BODY = 16 * 1024 * 1024  # the batch route's body limit


@dataclass(frozen=True)
class Sizes:
    listed: int  # schedules with the largest payload, for listings and GETs
    due: int  # due at once with the largest payload (the book)
    tenant_a: int  # PENDING schedules of the flooding tenant
    trickle_seconds: float  # tenant B's schedules fall due over this long
    flood_clients: int


FULL = Sizes(listed=1000, due=400, tenant_a=20_000, trickle_seconds=40, flood_clients=6)
QUICK = Sizes(listed=40, due=20, tenant_a=500, trickle_seconds=6, flood_clients=2)


# -- the node's side: memory, stalls ---------------------------------------------


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak(pid: int) -> None:
    """Start the peak (VmHWM) afresh (Linux: clear_refs, 5)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def stalls(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith("scheduler_process_stalls_total "):
            return float(line.split()[1])
    return 0.0


class LoopWatch:
    """Polls /healthz every 10 ms; the longest answer bounds a loop stall."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopWatch:
        self._task = asyncio.create_task(self._poll())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _poll(self) -> None:
        while True:
            began = time.perf_counter()
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with self.session.get(self.url + "/healthz") as response:
                    await response.read()
            self.longest = max(self.longest, time.perf_counter() - began)
            await asyncio.sleep(0.01)


Call = Callable[[aiohttp.ClientSession, str], Awaitable[list[int]]]


async def send(
    session: aiohttp.ClientSession, method: str, url: str, body: bytes | None = None
) -> int:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    async with session.request(method, url, data=body, headers=headers) as response:
        await response.read()
        return response.status


def due_now() -> str:
    return iso(datetime.now(UTC) + timedelta(days=30))


def one(payload_json: bytes) -> bytes:
    return (
        b'{"topic":"bounds","executeAt":"'
        + due_now().encode()
        + b'","payload":'
        + payload_json
        + b"}"
    )


def largest_json_payload() -> bytes:
    """A payload of the most values a byte limit allows: zeros and commas."""
    values = min(PAYLOAD // 2 - 1, MAX_JSON_VALUES - 10)
    return b"[" + b",".join([b"0"] * values) + b"]"


def batch(items: int, payload_b64: str) -> bytes:
    schedule = {"topic": "bounds", "executeAt": due_now(), "payloadBase64": payload_b64}
    return json.dumps({"schedules": [schedule] * items}).encode()


def largest_batch() -> bytes:
    """1,000 schedules whose base64 payloads fill 16 MiB."""
    room = (BATCH_BODY - 200_000) // 1000
    raw = b"x" * (room * 3 // 4)
    return batch(1000, base64.b64encode(raw).decode())


def nested_empty_arrays() -> bytes:
    """The attack of finding 4: 16 MiB of [[],[],...]."""
    return b"[" + b",".join([b"[]"] * (BATCH_BODY // 3 - 2)) + b"]"


def memory_cases(sizes: Sizes) -> list[tuple[str, Call]]:
    big = base64.b64encode(b"y" * PAYLOAD).decode()

    async def create_values(s: aiohttp.ClientSession, url: str) -> list[int]:
        return [await send(s, "POST", url + "/v1/schedules", one(largest_json_payload()))]

    async def create_bytes(s: aiohttp.ClientSession, url: str) -> list[int]:
        body = b'{"topic":"bounds","executeAt":"' + due_now().encode() + b'","payloadBase64":"'
        return [await send(s, "POST", url + "/v1/schedules", body + big.encode() + b'"}')]

    async def batch_bytes(s: aiohttp.ClientSession, url: str) -> list[int]:
        return [await send(s, "POST", url + "/v1/schedules:batch", largest_batch())]

    async def batch_values(s: aiohttp.ClientSession, url: str) -> list[int]:
        per = (MAX_JSON_VALUES - 20_000) // 1000
        schedule = {"topic": "bounds", "executeAt": due_now(), "payload": [0] * per}
        body = json.dumps({"schedules": [schedule] * 1000}).encode()
        return [await send(s, "POST", url + "/v1/schedules:batch", body)]

    async def nested(s: aiohttp.ClientSession, url: str) -> list[int]:
        return [await send(s, "POST", url + "/v1/schedules:batch", nested_empty_arrays())]

    async def four_batches(s: aiohttp.ClientSession, url: str) -> list[int]:
        body = largest_batch()
        return list(
            await asyncio.gather(
                *(send(s, "POST", url + "/v1/schedules:batch", body) for _ in range(4))
            )
        )

    async def list_basic(s: aiohttp.ClientSession, url: str) -> list[int]:
        return [await send(s, "GET", url + "/v1/schedules?tenant=listed&limit=1000")]

    async def list_full(s: aiohttp.ClientSession, url: str) -> list[int]:
        statuses, after = [], None
        for _ in range(3):  # three pages of the full view, each bounded by bytes
            query = "?tenant=listed&limit=1000&view=full" + (f"&after={after}" if after else "")
            async with s.get(url + "/v1/schedules" + query) as response:
                page = await response.json()
                statuses.append(response.status)
            after = page.get("next")
            if not after:
                break
        return statuses

    async def get_one(s: aiohttp.ClientSession, url: str) -> list[int]:
        return [await send(s, "GET", url + "/v1/schedules/listed-0?tenant=listed")]

    async def patch(s: aiohttp.ClientSession, url: str) -> list[int]:
        body = b'{"payloadBase64":"' + big.encode() + b'"}'
        return [await send(s, "PATCH", url + "/v1/schedules/listed-1?tenant=listed", body)]

    async def counts(s: aiohttp.ClientSession, url: str) -> list[int]:
        return [await send(s, "GET", url + "/v1/schedules?tenant=listed&counts=true&limit=1")]

    return [
        ("POST one schedule, payload of 131,071 values", create_values),
        ("POST one schedule, 256 KiB base64 payload", create_bytes),
        ("POST :batch, 1,000 schedules in 16 MiB", batch_bytes),
        (f"POST :batch, 1,000 schedules of {MAX_JSON_VALUES:,} values", batch_values),
        ("POST :batch, 16 MiB of nested empty arrays", nested),
        ("4 x POST :batch of 16 MiB at once", four_batches),
        (f"GET list of {sizes.listed} with 256 KiB payloads", list_basic),
        ("GET list view=full, 3 pages", list_full),
        ("GET one with a 256 KiB payload", get_one),
        ("PATCH a 256 KiB payload", patch),
        ("GET list counts=true", counts),
    ]


def stored(
    tenant: str, count: int, first: datetime, step: float, payload: bytes, topic: str = ""
) -> list[Any]:
    now = datetime.now(UTC)
    encoded = base64.b64encode(payload).decode()
    docs = []
    for i in range(count):
        body = {
            "id": f"{tenant}-{i}",
            "topic": topic or f"bounds-{tenant}",
            "executeAt": iso(first + timedelta(seconds=i * step)),
            "payloadBase64": encoded,
        }
        new = parse_schedule_object(body, LIMITS, now, lambda _: tenant)
        docs.append(schedule_document(new, BUCKETS, now))
    return docs


async def memory(servers: Servers, sizes: Sizes) -> list[dict[str, Any]]:
    database = "bounds_memory"
    async with servers.client() as client:
        store = ScheduleStore(client[database], BUCKETS)
        await store.prepare(datetime.now(UTC))
        far = datetime.now(UTC) + timedelta(days=30)
        await insert(store.schedules, stored("listed", sizes.listed, far, 1.0, b"z" * PAYLOAD))
    # What is measured here is memory: the read bounds (part two's) stay
    # out of the way, so the largest pages are read whole.
    node = NodeProcess(
        servers.mongo_uri,
        servers.bootstrap,
        database,
        servers.scratch / "n.log",
        ("--read-budget", "1000", "--read-timeout", "60"),
    )
    rows: list[dict[str, Any]] = []
    try:
        node.wait_ready()
        pid = node.process.pid
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            cases = memory_cases(sizes)
            cases.append(("a book of due schedules, 256 KiB payloads", due_book(servers, sizes)))
            for name, call in cases:
                reset_peak(pid)
                before = stalls(node.url)
                async with LoopWatch(session, node.url) as watch:
                    statuses = await call(session, node.url)
                rows.append(
                    {
                        "case": name,
                        "statuses": statuses,
                        "peak_rss_mib": peak_rss_mib(pid),
                        "longest_healthz_s": watch.longest,
                        "stalls_1s": stalls(node.url) - before,
                    }
                )
                print(f"  {name}: {rows[-1]}", flush=True)
    finally:
        node.stop()
    async with servers.client() as fresh:
        await fresh.drop_database(database)
    return rows


def due_book(servers: Servers, sizes: Sizes) -> Call:
    """``sizes.due`` schedules with 256 KiB payloads, all due now: the node
    reads them, claims and publishes them (status 200 once all arrived)."""

    async def call(session: aiohttp.ClientSession, url: str) -> list[int]:
        async with servers.client() as client:
            store = ScheduleStore(client["bounds_memory"], BUCKETS)
            now = datetime.now(UTC)
            await insert(store.schedules, stored("due", sizes.due, now, 0.0, b"d" * PAYLOAD))
        async with TopicReader(servers.bootstrap, "bounds-due") as reader:
            arrived = await reader.wait_for(sizes.due, time.monotonic() + 600)
        return [200 if arrived else 504]

    return call


# -- the read flood ------------------------------------------------------------------


# Each run's node settings: the defaults, or with a read budget nothing
# reaches (and the client's 5 s deadline for a read): what the budget adds.
FLOOD_MODES: dict[str, tuple[str, ...]] = {
    "quiet": (),
    "budgeted": (),
    "unbudgeted": ("--read-budget", "1000", "--read-timeout", "5"),
}


async def flood_run(servers: Servers, sizes: Sizes, mode: str) -> dict[str, Any]:
    database = f"bounds_flood_{mode}"
    topic = f"bounds-B-{mode}"  # a topic per run: the reader reads from its start
    async with servers.client() as client:
        store = ScheduleStore(client[database], BUCKETS)
        await store.prepare(datetime.now(UTC))
        far = datetime.now(UTC) + timedelta(days=30)
        await insert(store.schedules, stored("A", sizes.tenant_a, far, 0.001, b"{}"))
        trickle = int(sizes.trickle_seconds * 10)
        first = datetime.now(UTC) + timedelta(seconds=10)
        step = sizes.trickle_seconds / trickle
        await insert(store.schedules, stored("B", trickle, first, step, b"1", topic))
    extra = FLOOD_MODES[mode]
    node = NodeProcess(
        servers.mongo_uri, servers.bootstrap, database, servers.scratch / "n.log", extra
    )
    answered: dict[int, int] = {}
    stop = asyncio.Event()

    async def flooder(session: aiohttp.ClientSession) -> None:
        """Asks again as soon as it may: at once after an answer, after the
        Retry-After of a 429 or a 503 (as a client library does)."""
        query = "/v1/schedules?tenant=A&status=PENDING"
        while not stop.is_set():
            wait = 0.0
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(node.url + query) as response:
                    await response.read()
                    answered[response.status] = answered.get(response.status, 0) + 1
                    wait = float(response.headers.get("Retry-After", 0))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(wait, 0.001))

    try:
        node.wait_ready()
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
            TopicReader(servers.bootstrap, topic) as reader,
        ):
            flooders = (
                [asyncio.create_task(flooder(session)) for _ in range(sizes.flood_clients)]
                if mode != "quiet"
                else []
            )
            await reader.wait_for(trickle, time.monotonic() + sizes.trickle_seconds + 300)
            stop.set()
            await asyncio.gather(*flooders)
            deliveries = list(reader.deliveries)
    finally:
        node.stop()
    async with servers.client() as fresh:
        await fresh.drop_database(database)
    return {
        "mode": mode,
        "records": len({d.schedule_id for d in deliveries}),
        "expected": trickle,
        "b_lateness_s": summary([d.at - d.execute_at for d in deliveries]),
        "flood_answers": answered,
    }


async def run(sizes: Sizes) -> dict[str, Any]:
    with embedded_servers("bench-bounds-") as servers:
        print("memory and stalls, the largest request of each route ...", flush=True)
        rows = await memory(servers, sizes)
        floods = {}
        for mode in FLOOD_MODES:
            print(f"read flood: {mode} ...", flush=True)
            floods[mode] = await flood_run(servers, sizes, mode)
    quiet = floods["quiet"]["b_lateness_s"]["p99"]
    return {
        "suite": "bounds",
        "when": iso(datetime.now(UTC)),
        "sizes": sizes.__dict__,
        "memory_bound_mib": MEMORY_BOUND_MIB,
        "cases": rows,
        "within_bounds": all(
            r["peak_rss_mib"] < MEMORY_BOUND_MIB and r["stalls_1s"] == 0 for r in rows
        ),
        "floods": floods,
        "b_p99_budgeted_over_quiet": floods["budgeted"]["b_lateness_s"]["p99"] / quiet,
        "b_p99_unbudgeted_over_quiet": floods["unbudgeted"]["b_lateness_s"]["p99"] / quiet,
    }


def render(result: dict[str, Any]) -> str:
    lines = [f"one node, defaults; bound: {result['memory_bound_mib']} MiB, no stall of 1 s"]
    lines.append(f"{'case':58} {'peak MiB':>9} {'healthz s':>10} {'stalls':>6}  statuses")
    for row in result["cases"]:
        lines.append(
            f"{row['case']:58} {row['peak_rss_mib']:9.0f} {row['longest_healthz_s']:10.3f} "
            f"{row['stalls_1s']:6.0f}  {row['statuses']}"
        )
    lines.append(f"all within bounds: {result['within_bounds']}")
    for mode, flood in result["floods"].items():
        b = flood["b_lateness_s"]
        lines.append(
            f"flood {mode:10} B p50 {b['p50']:.3f} s, p99 {b['p99']:.3f} s, max {b['max']:.3f} s "
            f"({flood['records']}/{flood['expected']}); A's answers {flood['flood_answers']}"
        )
    lines.append(
        f"ratio B p99: budgeted flood / quiet = {result['b_p99_budgeted_over_quiet']:.2f}, "
        f"unbudgeted flood / quiet = {result['b_p99_unbudgeted_over_quiet']:.2f}"
    )
    return "\n".join(lines)


__all__ = ["FULL", "QUICK", "render", "run"]
