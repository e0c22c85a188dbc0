"""``python -m bench idle``: what a cluster with nothing due costs the
store, at 256 buckets and at 4,096.

For N = 1 and 3 node processes and B = 256 and 4,096 buckets (BUCKETS, pinned
in the database at first use, so each run has a fresh database of its own):

* 100,000 schedules PENDING, due 1 to 30 days ahead, stored as the API
  stores them, with the node's indexes in place;
* the nodes started one after the other, then a wait, with a deadline, until
  every bucket's lease is held (unexpired in the ``buckets`` collection) and
  each with the owner the nodes' views place it on: its seconds from the
  first node's start, or how many were held when the deadline passed (the
  run goes on with whatever holds: the figures are then of fewer buckets
  worked, and the table says so);
* a wait, with a deadline, until the nodes have read every bucket they
  gained (a due read and a peek at the next due time each: three statements
  on the embedded store, 12,288 at 4,096 buckets), seen as the store's
  queries falling under READS_DONE a second; its seconds are reported;
* a few seconds more, then a window in which nothing falls due: the
  store's operations per second by kind (serverStatus opcounters: round
  trips, not documents), the store's CPU seconds per second and the nodes'
  (summed over them).

Each N's quiet runs take turns over B, ``rounds`` passes, every other one
backwards (256, 4,096, 4,096, 256, 256, 4,096), and each figure a ratio
uses is the least of its runs: an idle store's CPU is thousandths of a
core, and some windows carry a burst of the store's own work. The
same N at the first B then runs again polling (``WATCH_CHANGES=off``: every
idle bucket read once a ``POLL_INTERVAL``, as every node did before the
change feed). The ratios are B = 4,096 over B = 256 at the same N (what
more buckets cost a cluster doing nothing: each held bucket is a view of due
work to keep, and a lease), and the quiet cluster over the polling one at
B = 256. Ratios within the run only: the machine is shared, the store is one
Python process, and the figures of one run are not another's. The store
runs without its expiry sweep (``embedded_servers``): a minute's walk of
every document, in whichever window it fell, was the largest cost of an
idle store and none of the scheduler's.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import AsyncMongoClient

from bench.delivery_bench import machine
from bench.stack import (
    OPERATION_KINDS,
    Servers,
    cpu_of,
    documents,
    embedded_servers,
    insert,
    iso,
    operations_between,
    store_operations,
)
from bench.systems import Scheduler
from bench.workloads import ratio
from chaos.lab.cluster import LocalCluster
from node.store.leases import held_now
from node.store.schedules import ScheduleStore


@dataclass(frozen=True)
class Plan:
    nodes: tuple[int, ...]  # node processes
    buckets: tuple[int, ...]  # BUCKETS; the first is what the others are set over
    pending: int  # schedules waiting, none due during the run
    first_day: float  # they fall due evenly from this many days ahead ...
    last_day: float  # ... to this many
    # Seconds from the first node's start for every lease to be held where
    # it is placed; past it the run is measured as it stands.
    lease_deadline: float
    settle: float  # seconds between the leases held and the window
    window: float  # seconds measured
    # Node counts run again polling (WATCH_CHANGES=off), at the first B.
    polling: tuple[int, ...] = (1, 3)
    # Rounds of the quiet runs of each N, in turn over the bucket counts:
    # forwards, then backwards, then forwards (256, 4,096, 4,096, 256, 256,
    # 4,096), each figure the least of its rounds. An idle store's CPU is
    # thousandths of a core, and some windows carry a burst of the store's
    # own work, some 1.2 CPU s, whatever B (0.06-0.07 CPU s/s in 5 of 12
    # windows, 0.003-0.021 in the others, 2026-11-28): one window each, a
    # mean or even a median of three would judge that burst, not B.
    rounds: int = 3


FULL = Plan(
    nodes=(1, 3),
    buckets=(256, 4096),
    pending=100_000,
    first_day=1,
    last_day=30,
    lease_deadline=60,
    settle=5,
    window=20,
)
# A smoke run: the four runs, the ratios computed, in about four minutes here
# (a B = 4,096 run whose leases never all come spends the whole deadline).
QUICK = Plan(
    nodes=(1, 3),
    buckets=(256, 4096),
    pending=10_000,
    first_day=1,
    last_day=30,
    lease_deadline=60,
    settle=2,
    window=5,
    rounds=1,
)
# Seconds a polling cluster runs before its window (its reads never fall
# off, so there is nothing to wait for; 11-13 s of start-up reads at 256).
POLLING_SETTLE = 15.0
# How often the wait asks the store how many leases are held.
LEASE_POLL = 0.25

Client = AsyncMongoClient[dict[str, Any]]


def later(plan: Plan, now: datetime) -> list[datetime]:
    """``plan.pending`` due times, evenly from ``first_day`` to ``last_day`` ahead."""
    first = now + timedelta(days=plan.first_day)
    step = timedelta(days=plan.last_day - plan.first_day) / max(plan.pending - 1, 1)
    return [first + i * step for i in range(plan.pending)]


async def load(client: Client, database: str, buckets: int, docs: list[dict[str, Any]]) -> None:
    """A fresh ``database`` as the API leaves it: the bucket count pinned and
    the node's indexes created by the node's own start-up step (so the nodes
    find them in place, not built over 100,000 documents while they start),
    then ``docs`` inserted through those indexes."""
    await ScheduleStore(client[database], buckets).prepare(datetime.now(UTC))
    await insert(client[database]["schedules"], docs)


async def held_leases(client: Client, database: str) -> int:
    """Leases held now, under live sessions (node/store/leases.py)."""
    return await held_now(client[database])


async def wait_for_leases(
    client: Client,
    database: str,
    cluster: LocalCluster,
    buckets: int,
    started: float,
    deadline: float,
) -> dict[str, Any]:
    """Wait until all ``buckets`` leases are held and the cluster has settled
    (each bucket with its placed owner), or until the monotonic ``deadline``.
    Seconds are from ``started``; None for what did not happen in time."""
    held_s: float | None = None
    while True:
        held = await held_leases(client, database)
        at = time.monotonic()
        if held == buckets:
            held_s = at - started if held_s is None else held_s
            # Asked only once all are held: each answer reads every lease.
            if await asyncio.to_thread(cluster.settled):
                return {"held": held, "held_s": held_s, "settled_s": at - started}
        if at >= deadline:
            return {"held": held, "held_s": held_s, "settled_s": None}
        await asyncio.sleep(LEASE_POLL)


async def measure(
    servers: Servers,
    plan: Plan,
    processes: int,
    buckets: int,
    docs: list[dict[str, Any]],
    *,
    polling: bool = False,
) -> dict[str, Any]:
    """One cluster of ``processes`` nodes and ``buckets`` buckets over ``docs``,
    on a database of its own, dropped after; ``polling``: without the
    change feed."""
    database = f"idle_n{processes}_b{buckets}{'_polling' if polling else ''}"
    print(
        f"  N={processes} B={buckets}{' polling' if polling else ''}: loading {len(docs):,} ...",
        flush=True,
    )
    env = {"BUCKETS": str(buckets), **({"WATCH_CHANGES": "off"} if polling else {})}
    system = Scheduler(env=env)
    try:
        async with servers.client() as client:
            await load(client, database, buckets, docs)
            started = time.monotonic()
            cluster = await system.start_nodes(servers, database, processes)
            ready_s = time.monotonic() - started
            deadline = started + plan.lease_deadline
            leases = await wait_for_leases(client, database, cluster, buckets, started, deadline)
        print(f"    {lease_text(leases, buckets, plan.lease_deadline)}", flush=True)
        if polling:
            # Polling reads every bucket each interval: its reads never fall
            # off. The quiet cluster's start-up reads at this B took about as
            # long as POLLING_SETTLE; after that, polling is what it is.
            leases["reads_done_s"] = None
            await asyncio.sleep(POLLING_SETTLE)
        else:
            async with servers.client() as client:
                leases["reads_done_s"] = await wait_for_reads(
                    client, started, deadline=started + 300
                )
            print(f"    start-up reads done after {_seconds(leases['reads_done_s'])}", flush=True)
        await asyncio.sleep(plan.settle)
        window = await idle_window(servers, system.pids(), plan.window)
        alive = sum(node.alive for node in cluster.nodes.values())
        async with servers.client() as client:
            leases["held_at_end"] = await held_leases(client, database)
    finally:
        system.stop()
        async with servers.client() as client:
            await client.drop_database(database)
    return {
        "processes": processes,
        "buckets": buckets,
        "polling": polling,
        "pending": len(docs),
        "nodes_ready_s": ready_s,
        "leases": {**leases, "of": buckets, "deadline_s": plan.lease_deadline},
        "nodes_alive_at_end": alive,
        **window,
    }


# The store's queries a second under which the nodes are taken to have read
# every bucket they gained (each bucket's own later reads are far fewer).
READS_DONE = 20.0
READS_PERIOD = 5.0


async def wait_for_reads(client: Client, started: float, deadline: float) -> float | None:
    """Seconds from ``started`` until the store's queries over READS_PERIOD
    fall under READS_DONE a second (None: not by ``deadline``)."""
    before = await store_operations(client)
    while time.monotonic() < deadline:
        await asyncio.sleep(READS_PERIOD)  # a rate is counted over a period
        now = await store_operations(client)
        if (now["query"] - before["query"]) / READS_PERIOD < READS_DONE:
            return time.monotonic() - started
        before = now
    return None


def _seconds(value: float | None) -> str:
    return "NOT within the deadline" if value is None else f"{value:.0f} s"


async def idle_window(servers: Servers, node_pids: list[int], seconds: float) -> dict[str, Any]:
    """The store's operations and the store's and nodes' CPU over ``seconds``,
    per second."""
    async with servers.client() as client:
        ops_before = await store_operations(client)
        cpu_before = cpu_of([servers.mongo_pid, *node_pids])
        started = time.monotonic()
        await asyncio.sleep(seconds)  # the measurement window, not a wait for something
        cpu_after = cpu_of([servers.mongo_pid, *node_pids])
        elapsed = time.monotonic() - started
        ops = operations_between(ops_before, await store_operations(client))
    used = {pid: cpu_after[pid] - cpu_before[pid] for pid in cpu_before}
    node_cpu = [used[pid] / elapsed for pid in node_pids]
    return {
        "window_s": elapsed,
        "store_ops_per_s": {kind: count / elapsed for kind, count in ops.items()},
        # Round trips of every kind; numRequests (``requests``) counts the
        # same calls again, from the network's side.
        "store_ops_per_s_total": sum(ops[kind] for kind in OPERATION_KINDS) / elapsed,
        "store_cpu_per_s": used[servers.mongo_pid] / elapsed,
        "node_cpu_per_s": sum(node_cpu),
        "node_cpu_per_s_each": node_cpu,
    }


def turns(plan: Plan) -> list[tuple[int, int]]:
    """(N, B) of each quiet run, in order: for each N, ``rounds`` passes over
    the bucket counts, every other one backwards."""
    order = []
    for processes in plan.nodes:
        for round_ in range(plan.rounds):
            passes = plan.buckets if round_ % 2 == 0 else plan.buckets[::-1]
            order += [(processes, buckets) for buckets in passes]
    return order


async def run(plan: Plan) -> dict[str, Any]:
    rows = []
    with embedded_servers("bench-idle-", ttl_sweep=False) as servers:
        # The same schedules for every run of a B: a bucket count of their own.
        due = later(plan, datetime.now(UTC))
        docs = {b: documents(due, "bench.idle", "idle", buckets=b) for b in plan.buckets}
        for processes, buckets in turns(plan):
            rows.append(await measure(servers, plan, processes, buckets, docs[buckets]))
        base = plan.buckets[0]
        for processes in plan.polling:
            rows.append(await measure(servers, plan, processes, base, docs[base], polling=True))
    result: dict[str, Any] = {
        "suite": "idle",
        "when": iso(datetime.now(UTC)),
        "machine": machine(),
        "plan": asdict(plan),
        "runs": rows,
    }
    result["ratios"] = ratios(result)
    return result


FIGURES = ("store_ops_per_s_total", "store_cpu_per_s", "node_cpu_per_s")


def ratios(result: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """N -> B (or "polling") -> figure -> that figure at B over the same at
    the plan's first B, the same N; "polling": the quiet cluster at the
    first B over the same cluster polling (NaN where either run is
    missing)."""
    base = result["plan"]["buckets"][0]
    rows = least(result["runs"])
    out: dict[str, dict[str, dict[str, float]]] = {}

    def over(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, float]:
        return {f: ratio(a[f], b[f]) if a and b else float("nan") for f in FIGURES}

    for n in result["plan"]["nodes"]:
        for b in result["plan"]["buckets"][1:]:
            out.setdefault(str(n), {})[str(b)] = over(
                rows.get((n, b, False)), rows.get((n, base, False))
            )
        if n in result["plan"].get("polling", ()):
            out.setdefault(str(n), {})["polling"] = over(
                rows.get((n, base, False)), rows.get((n, base, True))
            )
    return out


def least(runs: list[dict[str, Any]]) -> dict[tuple[int, int, bool], dict[str, float]]:
    """(N, B, polling) -> each of FIGURES, the least over that cluster's runs
    (as timeit takes the least: what the work costs, without what else the
    machine and the store did in some windows)."""
    grouped: dict[tuple[int, int, bool], list[dict[str, Any]]] = {}
    for r in runs:
        grouped.setdefault((r["processes"], r["buckets"], r.get("polling", False)), []).append(r)
    return {key: {f: min(r[f] for r in group) for f in FIGURES} for key, group in grouped.items()}


def lease_text(leases: dict[str, Any], buckets: int, deadline: float) -> str:
    """How the wait for the leases ended, deadline and all."""
    held = f"leases held: {leases['held']}/{buckets}"
    if leases["held_s"] is None:
        return f"{held}: NOT all held after {deadline:g} s"
    if leases["settled_s"] is None:
        return (
            f"{held} after {leases['held_s']:.1f} s, NOT each with its placed owner "
            f"after {deadline:g} s"
        )
    return f"{held} after {leases['held_s']:.1f} s, settled after {leases['settled_s']:.1f} s"


def render(result: dict[str, Any]) -> str:
    plan = result["plan"]
    kinds = [k for k in OPERATION_KINDS if k != "insert"]  # nothing is inserted while idle
    lines = [
        f"{plan['pending']:,} pending, due {plan['first_day']:g}-{plan['last_day']:g} days "
        f"ahead; measured over {plan['window']:g} s, {plan['settle']:g} s after the start-up "
        "reads (every bucket gained read once)",
        f"{'N':>2} {'B':>5} {'store ops/s':>11} "
        + " ".join(f"{k:>8}" for k in kinds)
        + f" {'store cpu/s':>11} {'nodes cpu/s':>11}  leases (from the first node's start)",
    ]
    for r in sorted(
        result["runs"], key=lambda r: (r.get("polling", False), r["processes"], r["buckets"])
    ):
        per_kind = r["store_ops_per_s"]
        polled = " polling" if r.get("polling") else ""
        lines.append(
            f"{r['processes']:>2} {r['buckets']:>5}{polled} {r['store_ops_per_s_total']:>11,.1f} "
            + " ".join(f"{per_kind[k]:>8,.1f}" for k in kinds)
            + f" {r['store_cpu_per_s']:>11.3f} {r['node_cpu_per_s']:>11.3f}  "
            + lease_text(r["leases"], r["buckets"], plan["lease_deadline"])
            + (
                f"; after {POLLING_SETTLE:g} s"
                if r.get("polling")
                else f"; reads done after {_seconds(r['leases'].get('reads_done_s'))}"
            )
            + _after(r)
        )
    lines.append("cpu/s = CPU seconds per second (1.0: one core busy); nodes: summed")
    if plan.get("rounds", 1) > 1:
        lines.append(
            f"each ratio over the least of {plan['rounds']} rounds, in turn over B "
            "(forwards, then backwards, ...)"
        )
    base = plan["buckets"][0]
    for n, by_b in result["ratios"].items():
        for b, f in by_b.items():
            what = f"B={base} quiet over polling" if b == "polling" else f"B={b} over B={base}"
            lines.append(
                f"N={n}, {what}: store ops/s {f['store_ops_per_s_total']:.2f}x, "
                f"store cpu/s {f['store_cpu_per_s']:.2f}x, nodes cpu/s {f['node_cpu_per_s']:.2f}x"
            )
    return "\n".join(lines)


def _after(r: dict[str, Any]) -> str:
    """What changed by the window's end: leases lost, a node gone."""
    notes = []
    if r["leases"]["held_at_end"] != r["leases"]["held"]:
        notes.append(f"{r['leases']['held_at_end']} held at the end")
    if r["nodes_alive_at_end"] != r["processes"]:
        notes.append(f"only {r['nodes_alive_at_end']} node(s) alive at the end")
    return f" ({'; '.join(notes)})" if notes else ""


__all__ = ["FULL", "QUICK", "render", "run"]
