"""The rebalancing scenario: load through 3 real node processes while a 4th
joins, one is killed with SIGKILL and one leaves gracefully; then check that
nothing was lost and every duplicate is explained by a fencing-token change.

``python -m chaos rebalance [--full] [--out FILE]``: ``--full`` is 10,000
schedules over 60 s; the default (what CI runs) is 2,000 over 30 s.
"""

from __future__ import annotations

import asyncio
import json
import random
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp

from chaos.lab.cluster import LocalCluster
from chaos.lab.harness import iso, until
from chaos.lab.stats import percentile
from chaos.observe import Recorder

BATCH_SIZE = 500  # the node default: the most one owner can have in flight
LEASE_TTL = 6.0  # the node default
POLL_INTERVAL = 1.0  # the node default


@dataclass(frozen=True)
class Scale:
    schedules: int
    seconds: float


CI = Scale(2000, 30.0)
FULL = Scale(10_000, 60.0)


async def run(scale: Scale, data_dir: Path, seed: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    cluster = LocalCluster(data_dir)
    timeline: dict[str, float] = {}
    accepted: dict[str, datetime] = {}
    refused = 0
    refusals: Counter[str] = Counter()  # the last answer of each refused schedule
    try:
        cluster.start_servers()
        for name in ("node-1", "node-2", "node-3"):
            cluster.start_node(name)
        for name in ("node-1", "node-2", "node-3"):
            cluster.wait_ready(name)
        try:
            await until(cluster.settled, 90, "the first 3 nodes to settle")
        except RuntimeError:
            raise RuntimeError("the first 3 nodes did not settle:\n" + cluster.describe()) from None
        topic = "rebalance"
        recorder = Recorder(cluster.kafka_bootstrap, topic)
        await recorder.start()
        down: set[str] = set()
        # Like a load balancer, send only to nodes whose /readyz said yes: a
        # node process that is starting does not listen yet.
        ready = {"node-1", "node-2", "node-3"}
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        limit = asyncio.Semaphore(64)

        async def post(i: int) -> None:
            nonlocal refused
            lead = 0.0 if rng.random() < 0.05 else rng.uniform(1.0, 4.0)
            execute_at = datetime.now(UTC) + timedelta(seconds=lead)
            schedule_id = f"s{i}"
            body = {"id": schedule_id, "topic": topic, "executeAt": iso(execute_at), "payload": i}
            async with limit:
                last = ""
                for _ in range(6):
                    live = [
                        n
                        for n in cluster.nodes.values()
                        if n.alive and n.name in ready and n.name not in down
                    ]
                    node = rng.choice(live)
                    try:
                        async with session.post(node.url + "/v1/schedules", json=body) as r:
                            if r.status in (200, 201):
                                accepted[schedule_id] = execute_at.replace(
                                    microsecond=execute_at.microsecond // 1000 * 1000
                                )
                                return
                            last = f"{node.name}: HTTP {r.status} {(await r.text())[:200]}"
                    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                        last = f"{node.name}: {type(exc).__name__} {exc}"[:200]
                    await asyncio.sleep(0.1)
                refused += 1
                refusals[last] += 1

        async def load() -> None:
            started = time.monotonic()
            tasks = []
            for i in range(scale.schedules):
                delay = started + i * scale.seconds / scale.schedules - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(post(i)))
            await asyncio.gather(*tasks)

        async def faults() -> None:
            start = time.time()
            await asyncio.sleep(0.2 * scale.seconds)
            timeline["join"] = time.time() - start
            cluster.start_node("node-4")

            async def serve_when_ready() -> None:
                await asyncio.to_thread(cluster.wait_ready, "node-4")
                ready.add("node-4")
                timeline["join_ready"] = time.time() - start

            readiness = asyncio.create_task(serve_when_ready())
            await asyncio.sleep(0.25 * scale.seconds)
            down.add("node-2")
            timeline["kill"] = time.time() - start
            kill_at = time.time()
            cluster.kill("node-2")

            def node2_dead() -> bool:
                try:
                    view = cluster.cluster_view("node-1")
                except (OSError, ValueError):
                    return False
                return {m["id"]: m["state"] for m in view["members"]}.get("node-2") == "dead"

            await until(node2_dead, 90, "node-2 to be declared dead")
            timeline["kill_detected_after"] = time.time() - kill_at
            await asyncio.sleep(max(0.0, start + 0.7 * scale.seconds - time.time()))
            down.add("node-3")
            timeline["leave"] = time.time() - start
            await asyncio.to_thread(cluster.stop_node, "node-3")
            timeline["leave_done"] = time.time() - start
            await readiness

        load_started = time.time()
        await asyncio.gather(load(), faults())
        await session.close()

        def all_delivered() -> bool:
            return set(accepted) <= {r[0] for r in recorder.records}

        await until(all_delivered, 120, "every accepted schedule to be delivered", strict=False)
        await asyncio.sleep(2)  # late duplicates, if any, arrive too
        await recorder.stop()
        result = report(scale, accepted, recorder.records, timeline, load_started, refused)
        result["refusals"] = dict(refusals.most_common(10))
        return result
    finally:
        cluster.close()


def report(
    scale: Scale,
    accepted: dict[str, datetime],
    records: list[tuple[str, int, int, float]],
    timeline: dict[str, float],
    load_started: float,
    refused: int,
) -> dict[str, Any]:
    by_id: dict[str, list[tuple[int, int, float]]] = {}
    for schedule_id, token, attempt, at in records:
        by_id.setdefault(schedule_id, []).append((token, attempt, at))
    lost = sorted(set(accepted) - set(by_id))
    duplicates = {i: r for i, r in by_id.items() if len(r) > 1}
    # A repeat is explained when the copies went out under different fencing
    # tokens (a new owner took over) or as later attempts of one owner.
    unexplained = [
        i
        for i, r in duplicates.items()
        if len({(token, attempt) for token, attempt, _ in r}) < len(r)
    ]
    kill_at = load_started + timeline.get("kill", 0.0)
    # From one poll interval before the kill (due work the killed node had
    # not finished) until its leases have surely expired and been taken.
    window_start = kill_at - POLL_INTERVAL
    window_end = kill_at + timeline.get("kill_detected_after", 0.0) + LEASE_TTL + 2.0
    outside: list[float] = []
    inside: list[float] = []
    worst: list[tuple[float, float]] = []
    for schedule_id, execute_at in accepted.items():
        if schedule_id not in by_id:
            continue
        late = max(0.0, min(at for _, _, at in by_id[schedule_id]) - execute_at.timestamp())
        in_window = window_start <= execute_at.timestamp() <= window_end
        (inside if in_window else outside).append(late)
        if not in_window:
            worst.append((round(execute_at.timestamp() - load_started, 2), round(late, 3)))
    return {
        "scenario": "rebalance",
        "schedules": scale.schedules,
        "seconds": scale.seconds,
        "accepted": len(accepted),
        "refused": refused,
        "delivered": len(by_id),
        "lost": len(lost),
        "lost_ids": lost[:20],
        "duplicates": len(duplicates),
        "duplicates_unexplained": len(unexplained),
        "in_flight_bound": BATCH_SIZE,
        "timeline_s": timeline,
        "lateness_outside_kill_window_s": {
            "p50": percentile(outside, 50),
            "p99": percentile(outside, 99),
            "max": max(outside) if outside else float("nan"),
            "count": len(outside),
            "worst": sorted(worst, key=lambda w: -w[1])[:15],
        },
        "lateness_in_kill_window_s": {
            "p99": percentile(inside, 99),
            "max": max(inside) if inside else float("nan"),
            "count": len(inside),
            "bound": timeline.get("kill_detected_after", 0.0) + LEASE_TTL,
        },
    }


def render(result: dict[str, Any]) -> str:
    out, win = result["lateness_outside_kill_window_s"], result["lateness_in_kill_window_s"]
    t = result["timeline_s"]
    return "\n".join(
        [
            f"rebalance: {result['accepted']} accepted of {result['schedules']} over "
            f"{result['seconds']:g} s; join at {t.get('join', 0):.0f} s, kill -9 at "
            f"{t.get('kill', 0):.0f} s (declared dead after "
            f"{t.get('kill_detected_after', 0):.1f} s), "
            f"graceful leave at {t.get('leave', 0):.0f} s",
            f"lost {result['lost']}, duplicates {result['duplicates']} "
            f"(unexplained {result['duplicates_unexplained']}, bound {result['in_flight_bound']})",
            f"lateness outside the kill window: p50 {out['p50'] * 1000:.0f} ms, "
            f"p99 {out['p99'] * 1000:.0f} ms, max {out['max'] * 1000:.0f} ms ({out['count']})",
            f"lateness inside it: p99 {win['p99']:.1f} s, max {win['max']:.1f} s "
            f"(detection + lease TTL = {win['bound']:.1f} s; {win['count']} schedules)",
            *(
                f"refused after 6 tries ({count}): {reason}"
                for reason, count in result.get("refusals", {}).items()
            ),
        ]
    )


def main(
    full: bool,
    out: Path | None,
    schedules: int | None = None,
    seconds: float | None = None,
    keep: Path | None = None,
) -> int:
    scale = FULL if full else CI
    scale = Scale(schedules or scale.schedules, seconds or scale.seconds)
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        result = asyncio.run(run(scale, keep))
    else:
        with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
            result = asyncio.run(run(scale, Path(tmp)))
    print(render(result))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
    ok = result["lost"] == 0 and result["duplicates_unexplained"] == 0
    return 0 if ok else 1
