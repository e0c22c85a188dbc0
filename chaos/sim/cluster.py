"""N nodes in one process: each runs the node's own ownership loop, lease
book and poller over the shared in-memory store and the simulated broker,
its membership the real SWIM state machine on the membership simulator's
network; only the edges are simulated (``chaos/sim/``: the loop's virtual
time, the store's gate, the broker).

A node's life: ``start`` (a process starting: a fresh lease book and
poller), ``crash`` (its tasks end where they stand, nothing released; the
store keeps what it wrote), ``pause`` / ``resume`` (a frozen process: its
calls wait at the store and the broker until it resumes, then land late,
as a zombie's do; its monotonic clock runs on through the pause, as
CLOCK_MONOTONIC does, unless ``frozen_clock``), and its gates to the store
and the broker, each of which can be cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from chaos.sim import loop, mutants
from chaos.sim.broker import Broker, Producer
from chaos.sim.store import Gate, Gated
from membership.config import SwimConfig
from membership.messages import State
from membership.simulator import Simulator
from node.delivery.leases import LeaseManager
from node.delivery.outcomes import Rules
from node.delivery.ownership import Ownership
from node.delivery.poller import BucketPoller
from node.metrics import NodeMetrics
from node.schedule.retry import RetryPolicy
from node.store.memory import Documents, MemoryLeases, MemorySchedules
from ring import PLACEMENT_VERSION

# How often the membership simulator is brought up to the loop's time.
GOSSIP_STEP = 0.05
# The store's clock when a simulation begins: any fixed time.
EPOCH_WALL = datetime(2030, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Settings:
    """What every simulated node runs with (a node's settings, scaled to
    keep a simulated run short and its faults meaningful)."""

    buckets: int = 16
    lease_ttl: float = 6.0
    poll_interval: float = 1.0
    batch_size: int = 20
    retry: RetryPolicy = field(
        default_factory=lambda: RetryPolicy(
            max_attempts=5, backoff=timedelta(seconds=1), backoff_max=timedelta(seconds=8)
        )
    )
    misfire_threshold: float = 60.0
    swim: SwimConfig = field(default_factory=SwimConfig)
    # One protection taken out (``chaos/sim/mutants.py``); "" for none.
    mutant: str = ""


class Clock:
    """The store's clock (UTC) from the loop's virtual time: what every
    node's reading of the store's clock is, less its own skew."""

    def __init__(self, start: datetime) -> None:
        self.start = start

    def loop_time(self) -> float:
        """Seconds since the simulation began."""
        return asyncio.get_running_loop().time() - loop.EPOCH

    def wall(self) -> datetime:
        # To the millisecond, as stored times are.
        elapsed = round(self.loop_time() * 1000) / 1000
        return self.start + timedelta(seconds=elapsed)


@dataclass
class SimNode:
    name: str
    cluster: Cluster
    store_gate: Gate
    frozen_clock: bool = False  # a pause stops its monotonic clock too
    alive: bool = False
    paused: bool = False
    generation: int = 0  # how many times it started
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _paused_for: float = 0.0  # seconds of pause its frozen clock left out
    _paused_at: float | None = None
    ownership: Ownership | None = None
    poller: BucketPoller | None = None
    store: Any = None  # the node's gated view of the schedules, once started

    def monotonic(self) -> float:
        now = self.cluster.clock.loop_time()
        if not self.frozen_clock:
            return now
        paused = self._paused_for + (now - self._paused_at if self._paused_at is not None else 0)
        return now - paused

    async def running(self) -> None:
        """Return at once unless paused: then when resumed."""
        await self.store_gate.running.wait()

    def start(self) -> None:
        assert not self.alive
        self.generation += 1
        self.alive, self.paused = True, False
        # A new process: its monotonic clock its own, whatever froze the last one's.
        self.frozen_clock, self._paused_at, self._paused_for = False, None, 0.0
        self.store_gate.running.set()
        cluster = self.cluster
        settings = cluster.settings
        metrics = NodeMetrics()
        unfenced = settings.mutant == mutants.UNFENCED
        schedules = Gated(
            MemorySchedules(
                settings.buckets,
                cluster.clock.wall,
                documents=cluster.documents,
                unfenced=unfenced,
            ),
            self.store_gate,
        )
        wall_guard = settings.mutant != mutants.MONOTONIC_ONLY
        leases = LeaseManager(
            Gated(cluster.leases.of(self.name), self.store_gate),
            settings.lease_ttl,
            monotonic=self.monotonic,
            wall=(lambda: cluster.clock.wall().timestamp()) if wall_guard else None,
            unfenced=unfenced,
        )
        publisher = Pausing(cluster.broker.producer(self.name, cluster.clock.wall), self)
        rng = random.Random(f"{cluster.seed}/{self.name}/{self.generation}")
        self.store = schedules  # the API's calls go the same way as the poller's
        self.poller = BucketPoller(
            schedules,
            leases,
            publisher,  # type: ignore[arg-type]
            metrics,
            node_id=self.name,
            batch_size=settings.batch_size,
            poll_interval=settings.poll_interval,
            rules=Rules(settings.retry, timedelta(seconds=settings.misfire_threshold), rng),
            wall=cluster.clock.wall,
            monotonic=self.monotonic,
        )
        self.ownership = Ownership(
            self.name,
            settings.buckets,
            leases,
            self.poller,
            metrics,
            alive_members=lambda: cluster.alive_members(self.name),
            monotonic=self.monotonic,
        )
        self._tasks = [
            asyncio.create_task(self.ownership.run(), name=f"{self.name}-ownership"),
            asyncio.create_task(self.poller.run(), name=f"{self.name}-poller"),
        ]
        if self.name in cluster.gossip.nodes and cluster.gossip.nodes[self.name].crashed:
            cluster.gossip.nodes.pop(self.name)
        if self.name not in cluster.gossip.nodes:
            seeds = [n for n, node in cluster.gossip.nodes.items() if not node.crashed]
            cluster.gossip.add_node(self.name, seeds=seeds[:3])

    async def crash(self) -> None:
        """The process dies: its tasks end where they stand."""
        if not self.alive:
            return
        self.alive = False
        self.store_gate.running.set()  # what waited on a pause ends with the process
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        self._tasks = []
        self.cluster.gossip.crash(self.name)

    def pause(self) -> None:
        if self.alive and not self.paused:
            self.paused = True
            self.store_gate.running.clear()
            self._paused_at = self.cluster.clock.loop_time()
            self.cluster.gossip.pause(self.name)

    def resume(self) -> None:
        if self.alive and self.paused:
            self.paused = False
            if self._paused_at is not None:
                self._paused_for += self.cluster.clock.loop_time() - self._paused_at
            self._paused_at = None
            self.store_gate.running.set()
            self.cluster.gossip.resume(self.name)

    def view_changed(self) -> None:
        if self.alive and self.ownership is not None:
            self.ownership.view_changed()


@dataclass
class Pausing:
    """A node's producer that waits while the node is paused."""

    inner: Producer
    node: SimNode

    @property
    def request_timeout(self) -> float:
        return self.inner.request_timeout

    async def reachable(self) -> bool:
        await self.node.running()
        return await self.inner.reachable()

    async def publish(self, records: Any) -> Any:
        await self.node.running()
        return await self.inner.publish(records)


class Cluster:
    """The nodes, the shared store and broker, the gossip network."""

    def __init__(self, seed: int, settings: Settings, broker: Broker) -> None:
        self.seed = seed
        self.settings = settings
        self.rng = random.Random(seed)
        self.clock = Clock(EPOCH_WALL)
        self.documents = Documents()
        self.leases = MemoryLeases("", self.clock.wall)
        self.broker = broker
        self.gossip = Simulator(settings.swim, seed=seed)
        self.nodes: dict[str, SimNode] = {}
        self._views: dict[str, tuple[str, ...]] = {}

    def add(self, name: str) -> SimNode:
        gate = Gate(random.Random(f"{self.seed}/gate/{name}"))
        node = SimNode(name, self, gate)
        self.nodes[name] = node
        return node

    def alive_members(self, name: str) -> Mapping[str, int]:
        gossip = self.gossip.nodes.get(name)
        if gossip is None:
            return {name: PLACEMENT_VERSION}
        return {
            m.id: PLACEMENT_VERSION
            for m in gossip.swim.view()
            if m.state == State.ALIVE and m.answered
        }

    async def gossip_loop(self) -> None:
        """Bring the membership simulator to the loop's time, step by step,
        and tell each node whose view changed."""
        while True:
            await asyncio.sleep(GOSSIP_STEP)
            self.gossip.run_until(self.clock.loop_time())
            for name, node in self.nodes.items():
                if not node.alive:
                    continue
                view = tuple(sorted(self.alive_members(name)))
                if self._views.get(name) != view:
                    self._views[name] = view
                    node.view_changed()

    def live(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.alive and not n.paused]

    def serving(self, rng: random.Random) -> SimNode | None:
        live = self.live()
        return rng.choice(live) if live else None
