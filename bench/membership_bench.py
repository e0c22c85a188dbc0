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

import contextlib
import gc
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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from chaos.lab.stats import percentile
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
    steady: float = STEADY  # seconds over which traffic is counted


class Seen:
    """Counts, as the simulator reports them, the members that have seen an
    event about one member: O(1) per event, where asking every member's view
    after every event costs O(N) each (minutes at N = 5,000)."""

    def __init__(self, sim: Simulator) -> None:
        self.target: tuple[str, EventKind] | None = None
        self.observers: set[str] = set()
        sim.watch(self._observe)

    def expect(self, member: str, kind: EventKind) -> None:
        self.target = (member, kind)
        self.observers = set()

    def _observe(self, observation: Any) -> None:
        event = observation.event
        if self.target == (event.member.id, event.kind):
            self.observers.add(observation.observer)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a simulation: the simulator
    holds N views of N members, millions of long-lived objects, and every
    full collection walks them all (a 2,000-member bootstrap took 94 s with
    it, 37 s without). Nothing is lost: it runs once at the end."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


def simulate(case: SimCase, config: SwimConfig, seed: int) -> dict[str, Any]:
    with collector_paused():
        return _simulate(case, config, seed)


def _simulate(case: SimCase, config: SwimConfig, seed: int) -> dict[str, Any]:
    started = time.perf_counter()
    sim = Simulator(config, seed=seed, loss=case.loss)
    ids = sim.bootstrap(case.members)
    seen = Seen(sim)
    sim.run_until(WARMUP)
    before = {i: (sim.nodes[i].packets_sent, sim.nodes[i].bytes_sent) for i in ids}
    stream_before = {i: sim.nodes[i].stream_bytes_sent for i in ids}
    sim.run_until(WARMUP + case.steady)
    packets = [(sim.nodes[i].packets_sent - before[i][0]) / case.steady for i in ids]
    total = [(sim.nodes[i].bytes_sent - before[i][1]) / case.steady for i in ids]
    stream = [(sim.nodes[i].stream_bytes_sent - stream_before[i]) / case.steady for i in ids]

    rng = random.Random(seed)
    detections: list[float] = []
    disseminations: list[float] = []
    crashed: set[str] = set()
    for _ in range(case.crashes):
        victim = rng.choice([i for i in ids if i not in crashed])
        crashed.add(victim)
        at = sim.now
        sim.crash(victim)
        seen.expect(victim, EventKind.DEAD)
        live = len(ids) - len(crashed)
        sim.run_until(at + 300, stop=lambda n=live: len(seen.observers) >= n)  # type: ignore[misc]
        dead_at = sim.first_seen(victim, EventKind.DEAD, at)
        detections.extend(t - at for t in dead_at.values())
        if dead_at:
            # From the first DEAD verdict to the last member to hear of it.
            disseminations.append(max(dead_at.values()) - min(dead_at.values()))
        sim.run_until(sim.now + 5)

    at = sim.now
    seed_member = rng.choice([i for i in ids if i not in crashed])
    seen.expect("joiner", EventKind.JOINED)
    live = len(ids) - len(crashed)
    sim.add_node("joiner", seeds=[seed_member])
    sim.run_until(at + 300, stop=lambda: len(seen.observers) >= live)
    known = sim.first_seen("joiner", EventKind.JOINED, at)
    join_all = max(known.values()) - at if len(known) >= live else float("nan")

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
        "dead_disseminated_s": spread(disseminations),
        "join_known_by_all_s": join_all,
        "packets_per_member_s": statistics.fmean(packets),
        "bytes_per_member_s": statistics.fmean(total),
        "push_pull_bytes_per_member_s": statistics.fmean(stream),
        "datagram_bytes_per_member_s": statistics.fmean(total) - statistics.fmean(stream),
        "false_deaths": false_deaths,
        "steady_s": case.steady,
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


def sim_cases(quick: bool) -> list[SimCase]:
    if quick:
        return [SimCase(n, loss, 2, 10.0) for n in (10, 100) for loss in (0.01, 0.05)]
    cases = []
    for members in (10, 100, 1000, 5000):
        for loss in (0.01, 0.05):
            # Large clusters: one crash, a shorter traffic window (the same
            # rates; a simulated second of 5,000 members takes a while).
            crashes = 5 if members <= 100 else 1
            steady = STEADY if members <= 1000 else 10.0
            cases.append(SimCase(members, loss, crashes, steady))
    return cases


def run(quick: bool) -> dict[str, Any]:
    results: dict[str, Any] = {"suite": "membership", "sim": [], "real": []}
    for case in sim_cases(quick):
        print(f"sim N={case.members} loss={case.loss:.0%} ...", flush=True)
        results["sim"].append(simulate(case, LAN, seed=case.members))
    print("sim partition ...", flush=True)
    results["partition"] = partition(LAN, seed=3, members=40 if quick else 100)
    base = 20000 + os.getpid() % 10000
    real = [(10, 2)] if quick else [(10, 20), (30, 10)]
    presets = ["fast"] if quick else sorted(PRESETS)
    for size, trials in real:
        for index, preset in enumerate(presets):
            print(f"real {size} agents, {preset} ...", flush=True)
            port = base + index * 100 + size * 10
            results["real"].append(real_trials(size, preset, trials, port))
    return results


def render(results: dict[str, Any]) -> str:
    lines = [
        "simulated, lan preset (T = 1 s); detection = crash -> DEAD at each live member; "
        "dead->all = first DEAD verdict until the last member hears it (dissemination)",
        f"{'N':>5} {'loss':>5} {'detect p50':>10} {'p99':>6} {'max':>6} {'dead->all':>9} "
        f"{'join all':>8} {'pkts/s':>6} {'B/s':>6} {'udp B/s':>7} {'pp B/s':>6} {'false':>5}",
    ]
    for r in results["sim"]:
        d = r["detection_s"]
        lines.append(
            f"{r['members']:>5} {r['loss']:>5.0%} {d['p50']:>10.1f} {d['p99']:>6.1f} "
            f"{d['max']:>6.1f} {r['dead_disseminated_s']['max']:>9.2f} "
            f"{r['join_known_by_all_s']:>8.1f} "
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


def measure(quick: bool) -> dict[str, Any]:
    return run(quick)
