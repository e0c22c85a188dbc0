"""N nodes in one process: each runs the node's own ownership loop, lease
book and poller over the shared in-memory store and the simulated broker,
its membership the real SWIM state machine on the membership simulator's
network; only the edges are simulated (``chaos/sim/``: the loop's virtual
time, the store's gate, the broker).

A node's life: ``start`` (a process starting: a fresh lease book and
poller), ``crash`` (its tasks end where they stand, nothing released; the
store keeps what it wrote), ``pause`` / ``resume`` (a frozen process: its
freeze holds everything it would run until it resumes, so a call it had
out lands and is answered late, as a zombie's is; its monotonic clock runs
on through the pause, as CLOCK_MONOTONIC does, unless ``frozen_clock``),
``set_skew`` (its host's wall clock stepped), and its gates to the store
and the broker, each of which can be cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from chaos.sim import loop, mutants
from chaos.sim.broker import Broker
from chaos.sim.receiver import Receiver, Session
from chaos.sim.store import Gate, Gated, Server
from membership.config import SwimConfig
from membership.messages import State
from membership.simulator import Simulator
from node.delivery.clock import StoreClock
from node.delivery.leases import LeaseManager
from node.delivery.outcomes import Rules
from node.delivery.ownership import Ownership
from node.delivery.poller import BucketPoller
from node.delivery.server_watch import ServerWatch
from node.delivery.sinks.http import HttpSink
from node.errors import StoreUnavailable
from node.metrics import NodeMetrics
from node.schedule.egress import EgressPolicy
from node.schedule.retry import RetryPolicy
from node.store.memory import Documents, MemoryLeases, MemorySchedules
from ring import PLACEMENT_VERSION

# How often the membership simulator is brought up to the loop's time.
GOSSIP_STEP = 0.05
# Every tenant's signing key (the receiver checks no signature).
SIGNING_KEY = b"simulated signing key, 32 bytes"
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
    # Follow the store's change feed (WATCH_CHANGES, on by default in a node).
    watch_changes: bool = True
    swim: SwimConfig = field(default_factory=SwimConfig)
    # One protection taken out (``chaos/sim/mutants.py``); "" for none.
    mutant: str = ""


class Clock:
    """The store's clock (UTC) from the loop's virtual time: what every
    node's reading of the store's clock is, less its own skew. Made inside
    the running loop, whose time it reads."""

    def __init__(self, start: datetime) -> None:
        self.start = start
        self.loop = asyncio.get_running_loop()
        self._last: tuple[float, datetime] = (-1.0, start)

    def loop_time(self) -> float:
        """Seconds since the simulation began."""
        return self.loop.time() - loop.EPOCH

    def wall(self) -> datetime:
        now = self.loop.time()
        if now != self._last[0]:  # read often at one instant: made once
            # To the millisecond, as stored times are.
            elapsed = round((now - loop.EPOCH) * 1000) / 1000
            self._last = (now, self.start + timedelta(seconds=elapsed))
        return self._last[1]


@dataclass
class SimNode:
    name: str
    cluster: Cluster
    store_gate: Gate
    frozen_clock: bool = False  # a pause stops its monotonic clock too
    skew: float = 0.0  # seconds its host's wall clock is off the store's (``set_skew``)
    alive: bool = False
    paused: bool = False
    generation: int = 0  # how many times it started
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    freeze: loop.Freeze = field(default_factory=loop.Freeze)
    _context: contextvars.Context = field(default_factory=contextvars.copy_context)
    _paused_for: float = 0.0  # seconds of frozen pauses its clock left out
    _paused_at: float | None = None
    _held_skew: float | None = None  # a step back held (``set_skew``)
    _freeze_unseen_until: float = 0.0  # loop time a frozen pause may still go unseen
    ownership: Ownership | None = None
    poller: BucketPoller | None = None
    servers: ServerWatch | None = None
    store: Any = None  # the node's gated view of the schedules, once started

    def monotonic(self) -> float:
        """Its monotonic clock: the loop's time less every pause that
        stopped it (a clock that ran through a pause leaves nothing out, and
        none ever runs back)."""
        # The loop's own time, not less its start: a wait the node computes
        # from this clock then ends on it to the bit, not a float's step early.
        now = self.cluster.clock.loop.time()
        if not self._paused_for and (self._paused_at is None or not self.frozen_clock):
            return now
        stopped = now - self._paused_at if self._paused_at is not None and self.frozen_clock else 0
        return now - self._paused_for - stopped

    def host_wall(self) -> datetime:
        """Its host's wall clock: the store's, off by its skew."""
        return self.cluster.clock.wall() + timedelta(seconds=self.skew)

    def set_skew(self, seconds: float) -> None:
        """Step its host's wall clock to ``seconds`` off the store's.

        Never back while its monotonic clock has missed a freeze that no
        answer of the store has yet shown it: from a frozen pause until a
        lease's length after it (by then every lease from before the freeze
        has been renewed through the store or has ended on its own clock).
        A host that shows no clock that counted the freeze is outside the
        lease guard's model (docs/chaos.md), so such a step waits.
        """
        if seconds < self.skew and self._freeze_unseen():
            self._held_skew = seconds
            return
        self.skew, self._held_skew = seconds, None

    def _freeze_unseen(self) -> bool:
        if self.paused and self.frozen_clock:
            return True
        return self.cluster.clock.loop.time() < self._freeze_unseen_until

    def _apply_held_skew(self) -> None:
        if self._held_skew is not None:
            self.set_skew(self._held_skew)

    def start(self) -> None:
        assert not self.alive
        self.generation += 1
        self.alive, self.paused = True, False
        # Its tasks, and theirs, run in a context that names its freeze.
        self.freeze = loop.Freeze()
        self._context = contextvars.copy_context()
        self._context.run(loop.FREEZE.set, self.freeze)
        # A new process: its monotonic clock its own, whatever froze the last one's.
        self.frozen_clock, self._paused_at, self._paused_for = False, None, 0.0
        self._freeze_unseen_until = 0.0
        self._apply_held_skew()
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
            # The host's clock, as the node's (``node/process.py``).
            wall=(lambda: self.host_wall().timestamp()) if wall_guard else None,
            unfenced=unfenced,
        )
        publisher = cluster.broker.producer(self.name, cluster.clock.wall)
        clock = StoreClock(schedules.server_time, monotonic=self.monotonic, wall=self.host_wall)
        # What is due, by the store's clock as the node estimates it (the
        # mutant: by its host's clock).
        wall = self.host_wall if settings.mutant == mutants.HOST_CLOCK else clock.now
        http = HttpSink(
            EgressPolicy(),
            _signing_keys,
            clock=clock.now,
            monotonic=self.monotonic,
            sessions=lambda: Session(cluster.receiver),  # type: ignore[arg-type,return-value]
        )
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
            wall=wall,
            monotonic=self.monotonic,
            watch_changes=settings.watch_changes,
            http=http,
            circuit_open=http.circuit_open,
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
        self.servers = ServerWatch(
            clock, publisher.reachable, lease_ttl=settings.lease_ttl, monotonic=self.monotonic
        )
        self._tasks = [self._task(self._run(clock, http), "start")]
        if self.name in cluster.gossip.nodes and cluster.gossip.nodes[self.name].crashed:
            cluster.gossip.nodes.pop(self.name)
        if self.name not in cluster.gossip.nodes:
            seeds = [n for n, node in cluster.gossip.nodes.items() if not node.crashed]
            cluster.gossip.add_node(self.name, seeds=seeds[:3], meta=self.meta())
        cluster._told(self.name)

    async def _run(self, clock: StoreClock, http: HttpSink) -> None:
        """As the node process starts: a reading of the store's clock first
        (nothing is judged due by the host's), then the work."""
        await http.start()
        while True:
            try:
                await clock.read()
                break
            except StoreUnavailable:
                await asyncio.sleep(1.0)
        assert self.ownership and self.poller and self.servers
        self._tasks += [
            self._task(self.ownership.run(), "ownership"),
            self._task(self.poller.run(), "poller"),
            self._task(self.servers.run(self._placeability_changed, self.view_changed), "servers"),
        ]

    def _task(self, work: Any, name: str) -> asyncio.Task[None]:
        """A task of the node's, whose death of an error is the run's failure:
        in the node process, a task that died would stop its work for good."""
        task = asyncio.create_task(work, name=f"{self.name}-{name}", context=self._context)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.cluster.died.append(f"{task.get_name()}: {task.exception()!r}")

    def meta(self) -> tuple[tuple[str, str], ...]:
        """Its gossip metadata, as the node's (``NodeProcess._meta``)."""
        cut = self.servers.advertised() if self.servers else {}
        return tuple(sorted({"placement": str(PLACEMENT_VERSION), **cut}.items()))

    def _placeability_changed(self) -> None:
        self.cluster.gossip.update_meta(self.name, self.meta())
        self.view_changed()

    async def crash(self) -> None:
        """The process dies: its tasks end where they stand."""
        if not self.alive:
            return
        self.alive = False
        self.freeze.thaw()  # so that its tasks can end
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        self.cluster.gossip.crash(self.name)

    def pause(self) -> None:
        if self.alive and not self.paused:
            self.paused = True
            self.freeze.frozen = True
            self._paused_at = self.cluster.clock.loop.time()
            self.cluster.gossip.pause(self.name)

    def resume(self) -> None:
        if self.alive and self.paused:
            self.paused = False
            if self._paused_at is not None and self.frozen_clock:
                self._paused_for += self.cluster.clock.loop.time() - self._paused_at
                until = self.cluster.clock.loop.time() + self.cluster.settings.lease_ttl
                self._freeze_unseen_until = until
                self.cluster.clock.loop.call_at(until, self._apply_held_skew)
            self._paused_at = None
            self.freeze.thaw()
            self.cluster.gossip.resume(self.name)

    def view_changed(self) -> None:
        if self.alive and self.ownership is not None:
            self.ownership.view_changed()


async def _signing_keys(tenant: str) -> list[bytes]:
    return [SIGNING_KEY]


class Cluster:
    """The nodes, the shared store and broker, the gossip network."""

    def __init__(self, seed: int, settings: Settings, broker: Broker) -> None:
        self.seed = seed
        self.settings = settings
        self.rng = random.Random(seed)
        self.clock = Clock(EPOCH_WALL)
        self.documents = Documents()
        self.server = Server(self.documents)
        if settings.mutant == mutants.UNJOURNALED_MARKS:
            self.server.unjournaled |= {"complete"}
        self.leases = MemoryLeases("", self.clock.wall)
        self.broker = broker
        self.receiver = Receiver(broker, self.clock.wall, random.Random(f"{seed}/receiver"))
        self.gossip = Simulator(settings.swim, seed=seed)
        self.nodes: dict[str, SimNode] = {}
        # The node tasks that ended with an error: each a bug.
        self.died: list[str] = []
        # Node -> how many of the faults of one node it is under now.
        self.impaired: dict[str, int] = {}
        # The nodes whose gossip told of a change since the last step (a
        # dict as an ordered set: no hash order in a replay).
        self._changed: dict[str, None] = {}
        self.gossip.watch(lambda seen: self._told(seen.observer))

    def _told(self, name: str) -> None:
        self._changed[name] = None

    def add(self, name: str) -> SimNode:
        gate = Gate(random.Random(f"{self.seed}/gate/{name}"), server=self.server)
        node = SimNode(name, self, gate)
        self.nodes[name] = node
        self.impaired[name] = 0
        return node

    def alive_members(self, name: str) -> Mapping[str, int]:
        """The placement's input for node ``name``, as its process makes it
        (``NodeProcess._alive_members``): the alive members that answered
        its probes, less those its server watch leaves out."""
        gossip, node = self.gossip.nodes.get(name), self.nodes[name]
        if gossip is None or node.servers is None:
            return {name: PLACEMENT_VERSION}
        answered = {
            m.id: dict(m.meta) for m in gossip.swim.view() if m.state == State.ALIVE and m.answered
        }
        return node.servers.placed(answered)

    async def gossip_loop(self) -> None:
        """Bring the membership simulator to the loop's time, step by step,
        and tell each node whose gossip told of a change (as the node's
        membership events do, ``NodeProcess._on_membership_event``)."""
        while True:
            await asyncio.sleep(GOSSIP_STEP)
            self.gossip.run_until(self.clock.loop_time())
            changed, self._changed = self._changed, {}
            for name in changed:
                self.nodes[name].view_changed()

    def live(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.alive and not n.paused]

    def serving(self, rng: random.Random) -> SimNode | None:
        live = self.live()
        return rng.choice(live) if live else None
