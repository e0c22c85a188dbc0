"""``python -m bench membership``: the gossip layer, simulated and real.

Simulated (deterministic, virtual time, the real codec for byte counts):
for N members at a loss rate, the time from a crash until every live member
marks it DEAD, the time until a joining member is known by all, packets and
bytes sent per member per second in steady state, and false DEAD
declarations of healthy members; a 30 s partition of 100 members and the
time to one view after it heals.

Real: agent processes (``python -m membership agent``) on loopback; kill -9
one, time until every other prints it dead; restart it; repeat.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.report import publish
from chaos.stats import percentile
from membership.config import LAN, PRESETS, SwimConfig
from membership.messages import EventKind, State
from membership.simulator import Simulator

WARMUP = 10.0
STEADY = 30.0


def spread(values: list[float]) -> dict[str, float]:
    return {
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values) if values else float("nan"),
    }


@dataclass(frozen=True)
class SimCase:
    members: int
    loss: float
    crashes: int


def simulate(case: SimCase, config: SwimConfig, seed: int) -> dict[str, Any]:
    started = time.perf_counter()
    sim = Simulator(config, seed=seed, loss=case.loss)
    ids = sim.bootstrap(case.members)
    sim.run_until(WARMUP)
    before = {i: (sim.nodes[i].packets_sent, sim.nodes[i].bytes_sent) for i in ids}
    stream_before = {i: sim.nodes[i].stream_bytes_sent for i in ids}
    sim.run_until(WARMUP + STEADY)
    packets = [(sim.nodes[i].packets_sent - before[i][0]) / STEADY for i in ids]
    total = [(sim.nodes[i].bytes_sent - before[i][1]) / STEADY for i in ids]
    stream = [(sim.nodes[i].stream_bytes_sent - stream_before[i]) / STEADY for i in ids]

    rng = random.Random(seed)
    detections: list[float] = []
    crashed: set[str] = set()
    for _ in range(case.crashes):
        victim = rng.choice([i for i in ids if i not in crashed])
        crashed.add(victim)
        at = sim.now
        sim.crash(victim)
        sim.run_until(at + 300, stop=lambda v=victim: sim.all_see(v, State.DEAD))  # type: ignore[misc]
        seen = sim.first_seen(victim, EventKind.DEAD, at)
        detections.extend(t - at for t in seen.values())
        sim.run_until(sim.now + 5)

    at = sim.now
    seed_member = rng.choice([i for i in ids if i not in crashed])
    sim.add_node("joiner", seeds=[seed_member])
    sim.run_until(at + 300, stop=lambda: sim.all_see("joiner", State.ALIVE))
    known = sim.first_seen("joiner", EventKind.JOINED, at)
    join_all = max(known.values()) - at if len(known) >= len(sim.live()) - 1 else float("nan")

    false_deaths = sum(
        1
        for o in sim.observations
        if o.event.kind == EventKind.DEAD and o.event.member.id not in crashed
    )
    return {
        "members": case.members,
        "loss": case.loss,
        "detection_s": spread(detections),
        "detections": len(detections),
        "join_known_by_all_s": join_all,
        "packets_per_member_s": statistics.fmean(packets),
        "bytes_per_member_s": statistics.fmean(total),
        "push_pull_bytes_per_member_s": statistics.fmean(stream),
        "datagram_bytes_per_member_s": statistics.fmean(total) - statistics.fmean(stream),
        "false_deaths": false_deaths,
        "simulated_s": sim.now,
        "wall_s": time.perf_counter() - started,
    }


def partition(
    config: SwimConfig, seed: int, members: int = 100, cut: float = 30.0
) -> dict[str, Any]:
    sim = Simulator(config, seed=seed, loss=0.01)
    ids = sim.bootstrap(members)
    sim.run_until(WARMUP)
    half = members // 2
    sim.partition(ids[:half], ids[half:])
    sim.run_until(sim.now + cut)
    split_view = sum(
        1 for i in ids for j in ids if i != j and sim.nodes[i].swim.state_of(j) != State.ALIVE
    )
    healed_at = sim.now
    sim.heal()
    period = config.push_pull_period(members)

    def one_view() -> bool:
        return all(sim.nodes[i].swim.state_of(j) == State.ALIVE for i in ids for j in ids if i != j)

    sim.run_until(healed_at + 20 * period, stop=one_view)
    healed = one_view()
    return {
        "members": members,
        "cut_s": cut,
        "pairs_not_alive_at_heal": split_view,
        "push_pull_period_s": period,
        "heal_s": sim.now - healed_at if healed else float("nan"),
        "heal_in_push_pull_periods": (sim.now - healed_at) / period if healed else float("nan"),
    }


# -- real processes ------------------------------------------------------------


class Agent:
    def __init__(self, member: str, port: int, seeds: str, preset: str) -> None:
        self.member = member
        self.port = port
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "membership",
                "agent",
                "--id",
                member,
                "--port",
                str(port),
                "--seeds",
                seeds,
                "--preset",
                preset,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                continue

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


class RealCluster:
    def __init__(self, size: int, preset: str, base_port: int) -> None:
        self.preset = preset
        self.base_port = base_port
        # Every member as a seed, as a DNS name for a headless Service gives:
        # a restarted member finds the cluster through whoever is up.
        self.seeds = ",".join(f"127.0.0.1:{base_port + i}" for i in range(size))
        self.agents: dict[str, Agent] = {}
        self.views: dict[str, dict[str, str]] = {}
        for i in range(size):
            self.start(f"a{i}", base_port + i)

    def start(self, member: str, port: int) -> None:
        self.agents[member] = Agent(member, port, self.seeds, self.preset)
        self.views[member] = {}

    def pump(self) -> list[tuple[str, dict[str, Any]]]:
        seen = []
        for observer, agent in self.agents.items():
            while True:
                try:
                    line = agent.lines.get_nowait()
                except queue.Empty:
                    break
                if "member" in line:
                    self.views[observer][line["member"]] = line["kind"]
                seen.append((observer, line))
        return seen

    def wait(self, condition: Any, within: float) -> bool:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            self.pump()
            if condition():
                return True
            time.sleep(0.02)
        return False

    def all_alive(self) -> bool:
        live = [m for m, a in self.agents.items() if a.process.poll() is None]
        return all(
            self.views[o].get(m) in ("joined", "alive") for o in live for m in live if o != m
        )

    def stop(self) -> None:
        for agent in self.agents.values():
            agent.kill()


def real_trials(size: int, preset: str, trials: int, base_port: int) -> dict[str, Any]:
    cluster = RealCluster(size, preset, base_port)
    try:
        if not cluster.wait(cluster.all_alive, 60):
            raise RuntimeError("agents did not form one cluster")
        rng = random.Random(7)
        detections: list[float] = []
        false_deaths = 0
        for _ in range(trials):
            victim = rng.choice(sorted(cluster.agents))
            others = [m for m in cluster.agents if m != victim]
            killed_at = time.time()
            cluster.agents[victim].kill()
            dead_at: dict[str, float] = {}
            deadline = time.monotonic() + 60
            while len(dead_at) < len(others) and time.monotonic() < deadline:
                for observer, line in cluster.pump():
                    if line.get("member") == victim and line["kind"] == "dead":
                        dead_at.setdefault(observer, line["t"])
                    elif line["kind"] == "dead":
                        false_deaths += 1
                time.sleep(0.01)
            if len(dead_at) == len(others):
                detections.append(max(dead_at.values()) - killed_at)
            cluster.start(victim, cluster.base_port + int(victim[1:]))
            if not cluster.wait(cluster.all_alive, 60):
                raise RuntimeError("restarted agent did not rejoin")
        return {
            "members": size,
            "preset": preset,
            "trials": trials,
            "completed": len(detections),
            "all_marked_dead_s": spread(detections),
            "false_deaths": false_deaths,
        }
    finally:
        cluster.stop()


def run(quick: bool) -> dict[str, Any]:
    sizes = [10, 100] if quick else [10, 50, 100, 1000]
    results: dict[str, Any] = {"suite": "membership", "sim": [], "real": []}
    for members in sizes:
        for loss in (0.01, 0.05, 0.10):
            crashes = 1 if members >= 1000 else 5
            print(f"sim N={members} loss={loss:.0%} ...", flush=True)
            results["sim"].append(simulate(SimCase(members, loss, crashes), LAN, seed=members))
    print("sim partition ...", flush=True)
    results["partition"] = partition(LAN, seed=3, members=40 if quick else 100)
    trials = 3 if quick else 20
    base = 20000 + os.getpid() % 10000
    for index, preset in enumerate(sorted(PRESETS)):
        print(f"real 10 agents, {preset} ...", flush=True)
        results["real"].append(real_trials(10, preset, trials, base + index * 100))
    return results


def render(results: dict[str, Any]) -> str:
    lines = [
        "simulated, lan preset (T = 1 s); detection = crash -> DEAD at each live member",
        f"{'N':>5} {'loss':>5} {'detect p50':>10} {'p99':>6} {'max':>6} {'join all':>8} "
        f"{'pkts/s':>6} {'B/s':>6} {'udp B/s':>7} {'pp B/s':>6} {'false':>5}",
    ]
    for r in results["sim"]:
        d = r["detection_s"]
        lines.append(
            f"{r['members']:>5} {r['loss']:>5.0%} {d['p50']:>10.1f} {d['p99']:>6.1f} "
            f"{d['max']:>6.1f} {r['join_known_by_all_s']:>8.1f} "
            f"{r['packets_per_member_s']:>6.1f} {r['bytes_per_member_s']:>6.0f} "
            f"{r['datagram_bytes_per_member_s']:>7.0f} {r['push_pull_bytes_per_member_s']:>6.0f} "
            f"{r['false_deaths']:>5}"
        )
    p = results["partition"]
    lines.append(
        f"partition: {p['members']} members cut in two for {p['cut_s']:.0f} s; one view "
        f"{p['heal_s']:.1f} s after healing = {p['heal_in_push_pull_periods']:.2f} push-pull "
        f"periods ({p['push_pull_period_s']:.0f} s)"
    )
    lines.append(
        "memberlist, lan, kill -9 of 1 of 100 at 1% loss: detection p50 9.9 s, p99 12.0 s, "
        "0 false; about 245 B/s per node at 50, 1.6 KB/s at 1,000"
    )
    for r in results["real"]:
        d = r["all_marked_dead_s"]
        lines.append(
            f"real {r['members']} agents, {r['preset']}: kill -9 -> all mark DEAD "
            f"p50 {d['p50']:.1f} s, p99 {d['p99']:.1f} s, max {d['max']:.1f} s over "
            f"{r['completed']}/{r['trials']} trials, {r['false_deaths']} false deaths"
        )
    return "\n".join(lines)


def main(quick: bool, out: Path | None) -> int:
    results = run(quick)
    return publish(results, render(results), out)
