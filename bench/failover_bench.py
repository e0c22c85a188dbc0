"""``python -m bench failover``: how long a dead node's buckets go undelivered.

Three node processes on the embedded stack deliver a steady load (well under
capacity). Part way through, the node whose buckets hold the most of it gets
SIGKILL (no leave, no lease release). Measured, for the default timing
(``lan`` membership preset, LEASE_TTL 6 s) and for a tightened one
(``fast`` preset, LEASE_TTL 3 s), and the default before this one (LEASE_TTL
10 s) for comparison:

* detected: kill until a survivor's view marks the node dead;
* taken over: kill until every one of its buckets is leased by a survivor;
* resumed: for each of its buckets that had a schedule due within 2 s
  after the kill, the first delivery of that bucket after the kill (so the
  figure is when delivery came back, not when the bucket next had work);
  p50 and max over those buckets;
* the lateness of its buckets' schedules (max: the gap a consumer saw), and
  of the survivors' own buckets over the same time (p99: unaffected?);
* lost (never delivered) and duplicates.

A bucket comes back once the dead owner's lease has expired by the store's
clock (between TTL - TTL/3 and TTL after the kill, by when it last renewed)
and a survivor's view no longer places it on the dead node (detection), so
resumed ~ max(detection, lease expiry) + one acquire retry and one round.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from bench import workloads
from bench.stack import Delivery, Servers, TopicReader, documents, embedded_servers, iso, summary
from bench.systems import Scheduler
from bench.workloads import Workload
from chaos.lab.cluster import LocalCluster, get_json
from chaos.lab.stats import percentile

POLL = 0.5  # how often the monitor asks each survivor for its view


@dataclass(frozen=True)
class Setting:
    name: str
    label: str
    env: dict[str, str] = field(default_factory=dict)


SETTINGS = (
    Setting("default", "lan preset, LEASE_TTL 6 s (the defaults)"),
    Setting("lan-10", "lan preset, LEASE_TTL 10 s (the default before)", {"LEASE_TTL": "10"}),
    Setting("tight", "fast preset, LEASE_TTL 3 s", {"MEMBERSHIP_PRESET": "fast", "LEASE_TTL": "3"}),
)


@dataclass(frozen=True)
class Plan:
    rate: float  # schedules due per second
    seconds: float  # how long the load lasts
    kill_at: float  # seconds after T0
    trials: int  # kills per setting
    settings: tuple[str, ...] = tuple(s.name for s in SETTINGS)


# Well under what 3 nodes deliver on the embedded store (about 90/s), so the
# survivors keep up and the gap measured is the failover's, not a backlog's.
FULL = Plan(rate=40, seconds=45, kill_at=15, trials=3)
QUICK = Plan(rate=40, seconds=15, kill_at=5, trials=1, settings=("tight",))
# A bucket of the dead node is judged when it had a schedule due this soon
# after the kill (at 40/s over 256 buckets, about a quarter of its buckets).
BUSY_WITHIN = 2.0


class Monitor:
    """Watches the survivors' views after the kill: when the dead node is
    marked dead, and when all its buckets are leased elsewhere."""

    def __init__(self, cluster: LocalCluster, victim: str, buckets: set[int]) -> None:
        self.cluster = cluster
        self.victim = victim
        self.buckets = buckets
        self.detected_at: float | None = None
        self.taken_over_at: float | None = None

    async def watch(self) -> None:
        survivors = [n for n in self.cluster.nodes.values() if n.name != self.victim]
        while self.detected_at is None or self.taken_over_at is None:
            for node in survivors:
                with contextlib.suppress(OSError, ValueError, KeyError):
                    view = await asyncio.to_thread(get_json, node.url + "/v1/cluster")
                    now = time.time()
                    states = {m["id"]: m["state"] for m in view["members"]}
                    if self.detected_at is None and states.get(self.victim) in ("dead", "left"):
                        self.detected_at = now
                    owners = {o["bucket"]: o["owner"] for o in view["buckets"]["owners"]}
                    if self.taken_over_at is None and all(
                        owners.get(b) not in (None, self.victim) for b in self.buckets
                    ):
                        self.taken_over_at = now
            await asyncio.sleep(POLL)


def resumption(
    docs: list[dict[str, Any]],
    due: list[float],
    deliveries: list[Delivery],
    victim_buckets: set[int],
    killed_at: float,
) -> dict[str, Any]:
    """Per bucket of the dead node, when delivery came back (see the module doc)."""
    first: dict[str, float] = {}
    for d in sorted(deliveries, key=lambda d: d.at):
        first.setdefault(d.schedule_id, d.at)
    bucket_of = {str(doc["_id"]): int(doc["bucket"]) for doc in docs}
    due_of = {str(doc["_id"]): t for doc, t in zip(docs, due, strict=True)}
    busy = {bucket_of[i] for i, t in due_of.items() if killed_at <= t < killed_at + BUSY_WITHIN}
    busy &= victim_buckets
    after: dict[int, float] = defaultdict(lambda: float("inf"))
    for schedule_id, at in first.items():
        bucket = bucket_of.get(schedule_id)
        if bucket in busy and at > killed_at:
            after[bucket] = min(after[bucket], at)
    resumed = [after[b] - killed_at for b in busy]
    theirs = [
        first[i] - t for i, t in due_of.items() if i in first and bucket_of[i] in victim_buckets
    ]
    end = killed_at + max(resumed, default=0.0)
    others = [
        first[i] - t
        for i, t in due_of.items()
        if i in first and bucket_of[i] not in victim_buckets and killed_at <= t <= end
    ]
    return {
        "buckets_judged": len(busy),
        "resumed_s": {"p50": percentile(resumed, 50), "max": max(resumed, default=float("nan"))},
        "victim_lateness_s": summary(theirs),
        "survivor_lateness_during_gap_s": summary(others),
    }


async def trial(servers: Servers, setting: Setting, plan: Plan, index: int) -> dict[str, Any]:
    database = f"failover_{setting.name}_{index}"
    topic = f"failover.{database}"
    system = Scheduler(env=setting.env)
    await system.start(servers, database, 3)
    cluster = system.cluster
    assert cluster is not None
    try:
        workload: Workload = workloads.steady(plan.rate, plan.seconds, 1.0)
        t0 = time.time() + workload.count / 1500 + 3
        docs = documents(
            [datetime.fromtimestamp(t0 + o, UTC) for o in workload.offsets], topic, database
        )
        due = [doc["executeAt"].timestamp() for doc in docs]
        await system.load(servers, database, docs)
        # The owner of the most loaded buckets: the most schedules of this load.
        view = await asyncio.to_thread(get_json, cluster.nodes["node-0"].url + "/v1/cluster")
        owner_of = {o["bucket"]: o["owner"] for o in view["buckets"]["owners"]}
        load = Counter(owner_of.get(int(doc["bucket"])) for doc in docs)
        victim = max((name for name in cluster.nodes), key=lambda name: load[name])
        victim_buckets = {b for b, owner in owner_of.items() if owner == victim}
        async with TopicReader(servers.bootstrap, topic) as reader:
            await asyncio.sleep(max(0.0, t0 + plan.kill_at - time.time()))
            killed_at = time.time()
            cluster.kill(victim)
            monitor = Monitor(cluster, victim, victim_buckets)
            watching = asyncio.create_task(monitor.watch())
            await reader.wait_for(workload.count, time.monotonic() + plan.seconds + 90)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(watching, timeout=30)
            deliveries = list(reader.deliveries)
    finally:
        system.stop()
        async with servers.client() as client:
            await client.drop_database(database)
    verdict = workloads.judge([str(d["_id"]) for d in docs], due, t0, deliveries, time.time())

    def since_kill(at: float | None) -> float:
        return at - killed_at if at is not None else float("nan")

    return {
        "setting": setting.name,
        "victim": victim,
        "victim_buckets": len(victim_buckets),
        "victim_share_of_load": load[victim] / len(docs),
        "detected_s": since_kill(monitor.detected_at),
        "taken_over_s": since_kill(monitor.taken_over_at),
        **resumption(docs, due, deliveries, victim_buckets, killed_at),
        "lost": verdict.undelivered,
        "duplicates": verdict.duplicates,
    }


async def run(plan: Plan) -> dict[str, Any]:
    trials: list[dict[str, Any]] = []
    with embedded_servers("bench-failover-") as servers:
        for setting in [s for s in SETTINGS if s.name in plan.settings]:
            for index in range(plan.trials):
                print(f"  {setting.label}, trial {index + 1} ...", flush=True)
                trials.append(await trial(servers, setting, plan, index))
    by_setting = {}
    for setting in [s for s in SETTINGS if s.name in plan.settings]:
        mine = [t for t in trials if t["setting"] == setting.name]
        by_setting[setting.name] = {
            "label": setting.label,
            "resumed_max_s": max(t["resumed_s"]["max"] for t in mine),
            "victim_lateness_max_s": max(t["victim_lateness_s"]["max"] for t in mine),
            "lost": sum(t["lost"] for t in mine),
        }
    return {
        "suite": "failover",
        "when": iso(datetime.now(UTC)),
        "plan": asdict(plan),
        "settings": by_setting,
        "trials": trials,
    }


def render(result: dict[str, Any]) -> str:
    plan = result["plan"]
    lines = [
        f"3 nodes, {plan['rate']:g} schedules/s for {plan['seconds']:g} s; SIGKILL of the node "
        f"with the most of them at {plan['kill_at']:g} s; times from the kill, in s",
        f"{'setting':<8} {'victim':<7} {'buckets':>7} {'detected':>8} {'leased':>7} "
        f"{'resumed p50':>11} {'max':>5} {'its late max':>12} {'others p99':>10} "
        f"{'lost':>4} {'dup':>4}",
    ]
    for t in result["trials"]:
        lines.append(
            f"{t['setting']:<8} {t['victim']:<7} {t['victim_buckets']:>7} "
            f"{t['detected_s']:>8.1f} {t['taken_over_s']:>7.1f} "
            f"{t['resumed_s']['p50']:>11.1f} {t['resumed_s']['max']:>5.1f} "
            f"{t['victim_lateness_s']['max']:>12.1f} "
            f"{t['survivor_lateness_during_gap_s']['p99']:>10.2f} {t['lost']:>4} "
            f"{t['duplicates']:>4}"
        )
    for name, s in result["settings"].items():
        lines.append(
            f"{name}: {s['label']}: the dead node's buckets delivered again within "
            f"{s['resumed_max_s']:.1f} s (worst trial); {s['lost']} lost"
        )
    return "\n".join(lines)


__all__ = ["FULL", "QUICK", "render", "resumption", "run"]
