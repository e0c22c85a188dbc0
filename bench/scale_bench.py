"""``python -m bench scale``: does a node read only its own work, so that
more nodes add capacity, and does a future backlog cost nothing?

On one embedded store and broker, one after the other on fresh databases:

* 20,000 due at once at N = 1, 2, 3, 4 node processes: records/s, the
  owners' documents read per delivered record, the store's CPU s per 1,000
  delivered, and how soon the first record went out; at N = 1, 2, 3 the
  same again at B = 4,096 buckets (a database of its own), right after the
  B = 256 run of the same N: what 16 times the buckets cost a burst;
* 2,000 due at once at N = 1, 2, 3: the first record's lateness;
* at N = 1, the same burst and an idle window with 100,000 schedules
  pending two days ahead, against an empty collection, in the same run:
  burst throughput and the store's operations per second while idle. The
  two collections take turns, twice each, and each figure is the mean of
  its two: an idle node's reads come as fast as the store answers them, so
  a window where the machine was busier would otherwise decide the ratio.

Ratios within the run only: the machine is shared, the store is one Python
process, and the figures of one run are not those of another.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from bench import workloads
from bench.delivery_bench import Runner, machine
from bench.destinations import Kafka
from bench.stack import documents, embedded_servers, insert, operations_between, store_operations
from bench.systems import Scheduler
from bench.workloads import ratio


@dataclass(frozen=True)
class Plan:
    nodes: tuple[int, ...]
    burst: int
    first_nodes: tuple[int, ...]
    first_burst: int
    future: int
    future_burst: int
    idle_seconds: float
    tail: float
    wide_nodes: tuple[int, ...] = (1, 2, 3)  # the burst again at WIDE buckets


FULL = Plan(
    nodes=(1, 2, 3, 4),
    burst=20_000,
    first_nodes=(1, 2, 3),
    first_burst=2_000,
    future=100_000,
    future_burst=10_000,
    idle_seconds=30.0,
    tail=300.0,
)
# The bucket count the bursts are run again at (the default being 256).
WIDE = 4096
QUICK = Plan(
    nodes=(1, 3),
    burst=1_000,
    first_nodes=(1, 3),
    first_burst=200,
    future=5_000,
    future_burst=500,
    idle_seconds=5.0,
    tail=60.0,
)


async def idle_operations(runner: Runner, database: str, seconds: float) -> float:
    """One node on ``database``, nothing due: the store's operations per
    second over ``seconds`` (reads of idle buckets, lease renews)."""
    system = Scheduler()
    try:
        await system.start(runner.servers, database, 1)
        await asyncio.sleep(2.0)  # past the first reads of every bucket
        before = await runner.store_operations()
        started = time.monotonic()
        await asyncio.sleep(seconds)  # a measurement window, not a wait
        after = await runner.store_operations()
        elapsed = time.monotonic() - started
    finally:
        system.stop()
    ops = operations_between(before, after)
    return sum(v for k, v in ops.items() if k != "requests") / elapsed


async def load_future(runner: Runner, database: str, count: int) -> None:
    """``count`` schedules pending two days ahead in ``database``."""
    later = datetime.now(UTC) + timedelta(days=2)
    docs = documents([later + timedelta(seconds=i) for i in range(count)], "bench.future", "fut")
    async with runner.servers.client() as client:
        await insert(client[database]["schedules"], docs)


# Each collection's idle window and burst are measured this many times, in turns.
TURNS = 2


async def with_future(runner: Runner, plan: Plan) -> tuple[dict[str, Any], dict[str, Any]]:
    """Idle load and burst throughput at N = 1 on an empty collection and on
    one with ``plan.future`` schedules waiting two days ahead, in turns."""
    runner.sequence += 1
    parts = {0: f"future_{runner.sequence}_empty", plan.future: f"future_{runner.sequence}_backlog"}
    await load_future(runner, parts[plan.future], plan.future)
    idles: dict[int, list[float]] = {future: [] for future in parts}
    bursts: dict[int, list[dict[str, Any]]] = {future: [] for future in parts}
    for _ in range(TURNS):
        for future, database in parts.items():
            idles[future].append(await idle_operations(runner, database, plan.idle_seconds))
    for _ in range(TURNS):
        for future, database in parts.items():
            bursts[future].append(
                await runner.measure(
                    Scheduler(), 1, workloads.burst(plan.future_burst), plan.tail, database=database
                )
            )
    async with runner.servers.client() as client:
        for database in parts.values():
            await client.drop_database(database)
    empty, backlog = (
        {
            "future": future,
            "idle_ops_per_s": sum(idles[future]) / TURNS,
            "idle_ops_each": idles[future],
            "records_per_s": sum(b["records_per_s"] for b in bursts[future]) / TURNS,
            "bursts": bursts[future],
        }
        for future in parts
    )
    return empty, backlog


async def wide_burst(runner: Runner, n: int, plan: Plan) -> dict[str, Any]:
    """The burst at N = ``n`` with BUCKETS = WIDE, its schedules in those buckets."""
    system = Scheduler(name=f"scheduler-b{WIDE}", env={"BUCKETS": str(WIDE)})
    kafka = Kafka(runner.servers, buckets=WIDE)
    return await runner.measure(
        system, n, workloads.burst(plan.burst), plan.tail, destination=kafka
    )


async def run(plan: Plan) -> dict[str, Any]:
    with embedded_servers("bench-scale-") as servers:
        runner = Runner(servers)
        async with servers.client() as client:
            await store_operations(client)  # the counters answer before anything runs
        bursts, wide = [], []
        for n in plan.nodes:
            bursts.append(
                await runner.measure(Scheduler(), n, workloads.burst(plan.burst), plan.tail)
            )
            if n in plan.wide_nodes:
                wide.append(await wide_burst(runner, n, plan))
        firsts = []
        for n in plan.first_nodes:
            firsts.append(
                await runner.measure(Scheduler(), n, workloads.burst(plan.first_burst), plan.tail)
            )
        empty, backlog = await with_future(runner, plan)
    result: dict[str, Any] = {
        "suite": "scale",
        "machine": machine(),
        "plan": plan.__dict__,
        "bursts": bursts,
        "wide": wide,
        "firsts": firsts,
        "empty": empty,
        "backlog": backlog,
    }
    result["ratios"] = ratios(result)
    result["aims"] = aims(result)
    return result


def _by_n(rows: list[dict[str, Any]], n: int) -> dict[str, Any]:
    return next(r for r in rows if r["processes"] == n)


def ratios(result: dict[str, Any]) -> dict[str, Any]:
    one = _by_n(result["bursts"], 1)
    return {
        "throughput_over_one_node": {
            r["processes"]: ratio(r["records_per_s"], one["records_per_s"])
            for r in result["bursts"]
        },
        "store_cpu_per_1000_over_one_node": {
            r["processes"]: ratio(r["cpu_s_per_1000"]["store"], one["cpu_s_per_1000"]["store"])
            for r in result["bursts"]
        },
        "wide_throughput_over_256": {
            r["processes"]: ratio(
                r["records_per_s"], _by_n(result["bursts"], r["processes"])["records_per_s"]
            )
            for r in result.get("wide", [])
        },
        "backlog_burst_over_empty": ratio(
            result["backlog"]["records_per_s"], result["empty"]["records_per_s"]
        ),
        "backlog_idle_ops_over_empty": ratio(
            result["backlog"]["idle_ops_per_s"], result["empty"]["idle_ops_per_s"]
        ),
    }


def aims(result: dict[str, Any]) -> list[dict[str, Any]]:
    r = result["ratios"]
    out = []
    for row in result["bursts"]:
        read = row["documents_read_per_record"]
        out.append(
            {
                "aim": f"documents read per delivered record, N = {row['processes']}, <= 1.2",
                "measured": read,
                "met": read is not None and read <= 1.2,
            }
        )
    for n in (2, 3):
        if n in r["throughput_over_one_node"]:
            throughput = r["throughput_over_one_node"][n]
            cpu = r["store_cpu_per_1000_over_one_node"][n]
            out.append(
                {
                    "aim": f"burst throughput N = {n} / N = 1 >= 1.0, or store CPU per 1,000 "
                    f"within 1.15x where the store is the limit",
                    "measured": {"throughput": throughput, "store_cpu": cpu},
                    "met": throughput >= 1.0 or cpu <= 1.15,
                }
            )
    for row in result["firsts"]:
        out.append(
            {
                "aim": f"{row['expected']} due at once, N = {row['processes']}: the first record "
                "at most 1 s after due",
                "measured": row["first_lateness_s"],
                "met": row["first_lateness_s"] <= 1.0,
            }
        )
    for n, over in r.get("wide_throughput_over_256", {}).items():
        out.append(
            {
                "aim": f"B = {WIDE}: burst throughput at N = {n} >= 0.95x of B = 256's",
                "measured": over,
                "met": over >= 0.95,
            }
        )
    out.append(
        {
            "aim": "future backlog: burst throughput >= 0.85x of an empty collection's",
            "measured": r["backlog_burst_over_empty"],
            "met": r["backlog_burst_over_empty"] >= 0.85,
        }
    )
    out.append(
        {
            "aim": "future backlog: idle store operations/s <= 1.2x of an empty collection's",
            "measured": r["backlog_idle_ops_over_empty"],
            "met": r["backlog_idle_ops_over_empty"] <= 1.2,
        }
    )
    return out


def render(result: dict[str, Any]) -> str:
    lines = [
        f"{'N':>2} {'due':>6} {'rec/s':>7} {'first s':>7} {'p99 s':>7} {'reads/rec':>9} "
        f"{'store cpu/1k':>12} {'store busy':>10} {'dup':>4}"
    ]
    for r in [*result["bursts"], *result.get("wide", []), *result["firsts"]]:
        read = r["documents_read_per_record"]
        wide = f" B={WIDE}" if r["system"].endswith(f"b{WIDE}") else ""
        lines.append(
            f"{r['processes']:>2} {r['expected']:>6} {r['records_per_s']:>7,.0f} "
            f"{r['first_lateness_s']:>7.2f} {r['lateness_s']['p99']:>7.2f} "
            f"{math.nan if read is None else read:>9.3f} "
            f"{r['cpu_s_per_1000']['store']:>12.2f} {r['busy']['store']:>10.0%} "
            f"{r['duplicates']:>4}{wide}"
        )
    for label in ("empty", "backlog"):
        part = result[label]
        lines.append(
            f"N=1, {part['future']:,} pending in the future: idle "
            + " / ".join(f"{v:.1f}" for v in part["idle_ops_each"])
            + f" store ops/s, bursts of {part['bursts'][0]['expected']:,} at "
            + " / ".join(f"{b['records_per_s']:,.0f}" for b in part["bursts"])
            + " records/s"
        )
    r = result["ratios"]
    lines.append(
        "throughput over N=1: "
        + ", ".join(f"N={n} {v:.2f}x" for n, v in r["throughput_over_one_node"].items())
        + "; store CPU per 1,000 over N=1: "
        + ", ".join(f"N={n} {v:.2f}x" for n, v in r["store_cpu_per_1000_over_one_node"].items())
    )
    if r.get("wide_throughput_over_256"):
        lines.append(
            f"throughput at B={WIDE} over B=256: "
            + ", ".join(f"N={n} {v:.2f}x" for n, v in r["wide_throughput_over_256"].items())
        )
    lines.append(
        f"with the future backlog, over empty: burst {r['backlog_burst_over_empty']:.2f}x, "
        f"idle store ops {r['backlog_idle_ops_over_empty']:.2f}x"
    )
    for aim in result["aims"]:
        lines.append(f"  {'met   ' if aim['met'] else 'MISSED'} {aim['aim']}: {aim['measured']}")
    return "\n".join(lines)


__all__ = ["FULL", "QUICK", "render", "run"]
