"""``python -m bench indexes``: what the listing indexes (labels, key,
topic, due order; ``node/store/documents.py``) cost delivery on the
embedded store.

One node, the same burst due at once, taking turns: with every index the
node creates, and with the four listing indexes dropped right after it
started (``WithoutListingIndexes``). A real MongoDB updates only the index
entries whose keys changed, so there a claim or a mark never touches them
(they cost at insert and TTL delete); the embedded SecantusDB rewrites
every entry of a document on any update, which is what this measures.
Ratios within the run only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench import workloads
from bench.delivery_bench import Runner, machine
from bench.stack import Servers, embedded_servers, store_operations
from bench.systems import Scheduler
from bench.workloads import ratio
from node.store.documents import INDEXES

LISTING_INDEXES = ("by_tenant_label", "by_tenant_key", "by_tenant_topic", "by_tenant_due")
assert set(LISTING_INDEXES) <= {spec.name for spec in INDEXES}


class WithoutListingIndexes(Scheduler):
    """The node as it is, on a collection without the listing indexes."""

    name = "scheduler-without-listing-indexes"

    async def start(self, servers: Servers, database: str, processes: int) -> None:
        await super().start(servers, database, processes)
        async with servers.client() as client:
            for name in LISTING_INDEXES:
                await client[database]["schedules"].drop_index(name)


@dataclass(frozen=True)
class Plan:
    burst: int
    turns: int
    tail: float


FULL = Plan(burst=5_000, turns=2, tail=120.0)
QUICK = Plan(burst=300, turns=1, tail=60.0)


async def run(plan: Plan) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"with": [], "without": []}
    with embedded_servers("bench-indexes-") as servers:
        runner = Runner(servers)
        async with servers.client() as client:
            await store_operations(client)
        for _ in range(plan.turns):
            for label, system in (("with", Scheduler), ("without", WithoutListingIndexes)):
                runs[label].append(
                    await runner.measure(system(), 1, workloads.burst(plan.burst), plan.tail)
                )

    def mean(label: str, pick: Any) -> float:
        return float(sum(pick(r) for r in runs[label])) / len(runs[label])

    figures = {
        label: {
            "records_per_s": mean(label, lambda r: r["records_per_s"]),
            "store_cpu_s_per_1000": mean(label, lambda r: r["cpu_s_per_1000"]["store"]),
        }
        for label in runs
    }
    return {
        "suite": "indexes",
        "machine": machine(),
        "plan": plan.__dict__,
        "runs": runs,
        "figures": figures,
        "ratios": {
            "throughput_with_over_without": ratio(
                figures["with"]["records_per_s"], figures["without"]["records_per_s"]
            ),
            "store_cpu_with_over_without": ratio(
                figures["with"]["store_cpu_s_per_1000"], figures["without"]["store_cpu_s_per_1000"]
            ),
        },
    }


def render(result: dict[str, Any]) -> str:
    lines = [f"{'listing indexes':<16} {'records/s (each turn)':<28} {'store cpu/1k':>12}"]
    for label, runs in result["runs"].items():
        each = " / ".join(f"{r['records_per_s']:,.0f}" for r in runs)
        cpu = result["figures"][label]["store_cpu_s_per_1000"]
        lines.append(f"{label:<16} {each:<28} {cpu:>12.2f}")
    r = result["ratios"]
    lines.append(
        f"with over without: throughput {r['throughput_with_over_without']:.2f}x, "
        f"store CPU per 1,000 delivered {r['store_cpu_with_over_without']:.2f}x"
    )
    return "\n".join(lines)


__all__ = ["FULL", "QUICK", "render", "run"]
