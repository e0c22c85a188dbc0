"""One simulated run: a seed draws the cluster (1-7 nodes), the load and
the faults; the run plays them in virtual time; the chaos checker judges
its history. The same seed gives the same history, byte for byte: its
``digest`` says so.

What a seed draws, in this order, from one ``random.Random(seed)``: the
node count, then the fault timeline (``draw_faults``), then everything the
load and the nodes draw as they run (each from its own generator seeded
from the seed, so a change to one does not move the others).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from chaos.checker import FIGURES, INVARIANTS, MUST_HOLD, check, late_past_windows, passed
from chaos.history import DELIVERY_FAILED, NEMESIS, OBSERVER, History, Topic
from chaos.lab.harness import iso
from chaos.settle import needs_views, settle
from chaos.sim import loop, mutants, receiver
from chaos.sim.broker import Broker
from chaos.sim.cluster import Cluster, Settings, SimNode
from chaos.sim.load import Load
from chaos.sim.mutants import MUTANTS
from chaos.sim.store import REPLICATION_LAG
from node.schedule.model import Status, public_id

MAX_NODES = 7
POLLING_SHARE = 0.25
LOAD_RATE = 2.5  # creates a second
# What the simulation judges: the chaos checker's invariants, and (its
# windows being exact) that nothing is late past them.
JUDGED = (*INVARIANTS, late_past_windows)
# After the load: every fault healed, then at most this long for what is
# owed to go out, then this long more for late copies to show.
DRAIN = 300.0
LATE_COPIES = 10.0
# Named as the real harness names its faults (``chaos/faults/kinds.py``)
# where it has them, so the checker gives each the same window; the rest
# are the simulation's own.
FAULT_KINDS = (
    "kill", "pause", "pause-frozen-clock", "cut-store", "slow-store", "lose-store-answers",
    "cut-broker", "pause-broker", "lose-broker-acks", "isolate", "skew-clock", "crash-store",
    *receiver.FAULTS,
)  # fmt: skip
# The faults whose end brings their node back into the placement, so that
# the buckets move back to it: the simulation notes that as a fault of its
# own, REJOIN, intended as long as a fault's hand-over (the real runs' node
# starts are not faults: their joins come one at a time, on settled views;
# here one comes while the views are still settling from the last fault,
# a partition's end taking up to a push-pull interval).
REJOIN = "rejoin"
REJOINS = ("kill", "pause", "pause-frozen-clock", "isolate", "cut-store", "cut-broker")
# How long a fault lasts (seconds, drawn between), where not 1-25: a store
# is down as long as a failover takes (its election, about as long as the
# lag its secondaries had), which leases of a 6 s term outlive when short.
LASTS = {"crash-store": (0.5, 8.0)}
# How far a skewed host's clock is off the store's, at most (either way).
MAX_SKEW = 60.0
EVERY_NODE = ("slow-store", "pause-broker", "crash-store", *receiver.FAULTS)
# Faults a node rides out holding its buckets: its store calls fail at
# random but not for a lease's term (so it stays in the placement, and its
# leases stay its own), or its broker's acks are lost (it publishes again).
# Its work is late by as long as they last: nobody else can do it.
HELD = ("lose-store-answers", "lose-broker-acks")


@dataclass(frozen=True)
class Fault:
    at: float  # seconds into the run
    kind: str
    target: str  # a node, or "" for every node
    lasts: float  # seconds
    skew: float = 0.0  # skew-clock: seconds the host's clock steps by


@dataclass(frozen=True)
class Outcome:
    seed: int
    nodes: int
    simulated: float  # seconds of virtual time
    result: Mapping[str, Any]
    passed: bool
    digest: str
    faults: tuple[Fault, ...]

    def violations(self) -> dict[str, Any]:
        """Each failed invariant's count (and a node task's death: ``died``)."""
        return {key: self.result[key] for key in (*MUST_HOLD, "died") if self.result.get(key)}


def draw_faults(rng: random.Random, names: list[str], duration: float) -> list[Fault]:
    faults, at = [], rng.uniform(3.0, 15.0)
    while at < duration:
        kind = rng.choice(FAULT_KINDS)
        target = "" if kind in EVERY_NODE else rng.choice(names)
        lasts = round(rng.uniform(*LASTS.get(kind, (1.0, 25.0))), 3)
        skew = round(rng.uniform(-MAX_SKEW, MAX_SKEW), 3) if kind == "skew-clock" else 0.0
        faults.append(Fault(round(at, 3), kind, target, lasts, skew))
        at += rng.uniform(3.0, 25.0)
    return faults


def simulate(
    seed: int, minutes: float = 10.0, *, mutant: str = "", settings: Settings | None = None
) -> Outcome:
    """Run seed ``seed`` for ``minutes`` of simulated load (with one
    protection taken out: ``mutant``); its outcome."""
    if mutant and mutant not in MUTANTS:
        raise ValueError(f"no mutant {mutant!r}: one of {', '.join(MUTANTS)}")
    # A quarter of the seeds poll every bucket, as a node does with
    # WATCH_CHANGES=off or on a store without change streams.
    watch = random.Random(f"{seed}/feed").random() >= POLLING_SHARE
    settings = replace(settings or Settings(), mutant=mutant, watch_changes=watch)
    rng = random.Random(seed)
    count = rng.randint(1, MAX_NODES)
    names = [f"n{i}" for i in range(1, count + 1)]
    duration = minutes * 60
    faults = draw_faults(rng, names, duration)
    # Node code that draws from the random module (jitter) draws the same.
    random.seed(f"{seed}/module")
    with mutants.applied(mutant):
        result, digest, simulated = loop.run(_run(seed, names, faults, duration, settings))
    ok = passed(result) and not result["died"]
    return Outcome(seed, count, simulated, result, ok, digest, tuple(faults))


async def _run(
    seed: int, names: list[str], faults: list[Fault], duration: float, settings: Settings
) -> tuple[dict[str, Any], str, float]:
    broker = Broker()
    cluster = Cluster(seed, settings, broker)
    history = History(started=cluster.clock.wall().timestamp(), meta={"buckets": settings.buckets})
    for name in names:
        cluster.add(name).start()
    gossip = asyncio.create_task(cluster.gossip_loop())
    load = Load(cluster, history, random.Random(f"{seed}/load"), LOAD_RATE, duration)
    nemesis = asyncio.create_task(_play(cluster, history, faults))
    await load.run()
    await nemesis
    await _heal(cluster, history)
    await _drain(cluster)
    await asyncio.sleep(LATE_COPIES)
    for node in cluster.nodes.values():
        await node.crash()  # the run is over: its tasks end
    gossip.cancel()
    views = _views(cluster, needs_views(history))
    settled = settle(history, views)
    for doc in cluster.documents.by_id.values():
        if doc["status"] == Status.DELIVERY_FAILED.value:
            # As the real runner notes them: the checker's delivery_failed.
            at, schedule_id = cluster.clock.wall().timestamp(), public_id(str(doc["_id"]))
            settled.event(OBSERVER, DELIVERY_FAILED, at, id=schedule_id, error=doc.get("lastError"))
    result = check(settled, Topic(tuple(broker.log)), JUDGED, figures=FIGURES)
    result["stranded"] = _stranded(cluster)
    result["died"], result["died_ids"] = len(cluster.died), cluster.died[:5]
    digest = _digest(settled, broker)
    return result, digest, cluster.clock.loop_time()


async def _play(cluster: Cluster, history: History, faults: list[Fault]) -> None:
    """Each fault at its time, undone when it has lasted; every fault ends
    by the load's end at the latest (``_heal``)."""
    pending: list[asyncio.Task[None]] = []
    for fault in faults:
        delay = fault.at - cluster.clock.loop_time()
        if delay > 0:
            await asyncio.sleep(delay)
        pending.append(asyncio.create_task(_one(cluster, history, fault)))
    await asyncio.gather(*pending)


async def _one(cluster: Cluster, history: History, fault: Fault) -> None:
    node = cluster.nodes.get(fault.target)
    label = f"{fault.kind} {fault.target}".strip()
    if node is not None:
        cluster.impaired[node.name] += 1
    # A fault of one node whose work no other can take costs all of its
    # length, as a fault of the servers does: when every node is under one,
    # or when it is one the node rides out holding its buckets.
    unshared = node is not None and (fault.kind in HELD or all(cluster.impaired.values()))
    lasting = fault.lasts + (REPLICATION_LAG if fault.kind == "crash-store" else 0.0)
    # What the real player notes of a 503 (``chaos/faults/player.py``): the wait it asks for.
    noted = {"retry_after": receiver.RETRY_AFTER} if fault.kind == receiver.UNAVAILABLE else {}
    _event(cluster, history, fault.kind, label, fault.target, lasting, unshared=unshared, **noted)
    try:
        undo = await _apply(cluster, node, fault)
        if undo is None:
            return
        await asyncio.sleep(fault.lasts)
        await undo()
        _event(cluster, history, "heal", label, fault.target, 0.0)
        if fault.kind in REJOINS:
            # Its buckets move back to it: a hand-over, judged as a fault's.
            _event(cluster, history, REJOIN, f"{REJOIN} {fault.target}", fault.target, 0.0)
    finally:
        if node is not None:
            cluster.impaired[node.name] -= 1


def _event(
    cluster: Cluster,
    history: History,
    do: str,
    label: str,
    node: str,
    lasting: float,
    *,
    unshared: bool = False,
    **noted: Any,
) -> None:
    """A nemesis event as the real player writes one (``chaos/faults/player.py``)."""
    at = cluster.clock.wall().timestamp()
    extra = {**noted, **({"unshared": True} if unshared else {})}
    history.event(NEMESIS, do, at, at=round(at - history.started, 3), do=do, step=label,
                  lasting=lasting, node=node or None, **extra)  # fmt: skip


async def _apply(cluster: Cluster, node: SimNode | None, fault: Fault) -> Any:
    """Start ``fault``; the coroutine function that ends it (None: nothing to end)."""
    if fault.kind == "pause-broker":
        cluster.broker.stall()
        return _async(cluster.broker.resume)
    if fault.kind == "slow-store":
        return _latency(cluster, 2.0)
    if fault.kind in receiver.FAULTS:
        cluster.receiver.mode = fault.kind
        return _async(lambda: setattr(cluster.receiver, "mode", receiver.UP))
    if fault.kind == "crash-store":
        # The secondaries fall behind, then the primary dies (``store.py``).
        cluster.server.lag()
        await asyncio.sleep(REPLICATION_LAG)
        cluster.server.crash()
        return _async(lambda: setattr(cluster.server, "down", False))
    assert node is not None
    if fault.kind == "kill":
        return await _kill(node)
    if fault.kind in ("pause", "pause-frozen-clock"):
        if not node.alive or node.paused:
            return None
        node.frozen_clock = fault.kind == "pause-frozen-clock"
        node.pause()
        return _async(node.resume)
    if fault.kind == "skew-clock":
        return _skew_clock(cluster, node, fault)
    return _ONE_NODE[fault.kind](cluster, node)


async def _kill(node: SimNode) -> Any:
    if not node.alive:
        return None
    await node.crash()

    async def restart() -> None:
        if not node.alive:
            node.start()

    return restart


def _cut_store(cluster: Cluster, node: SimNode) -> Any:
    node.store_gate.cut = True
    return _async(lambda: setattr(node.store_gate, "cut", False))


def _lose_store_answers(cluster: Cluster, node: SimNode) -> Any:
    node.store_gate.lose_answers = 0.3
    return _async(lambda: setattr(node.store_gate, "lose_answers", 0.0))


def _cut_broker(cluster: Cluster, node: SimNode) -> Any:
    cluster.broker.cut.add(node.name)
    return _async(lambda: cluster.broker.cut.discard(node.name))


def _lose_broker_acks(cluster: Cluster, node: SimNode) -> Any:
    cluster.broker.lost_acks[node.name] = 3
    return _async(lambda: cluster.broker.lost_acks.pop(node.name, None))


def _skew_clock(cluster: Cluster, node: SimNode, fault: Fault) -> Any:
    node.set_skew(fault.skew)
    return _async(lambda: node.set_skew(0.0))


def _isolate(cluster: Cluster, node: SimNode) -> Any:
    cluster.gossip.partition([node.name], [n for n in cluster.nodes if n != node.name])
    return _async(cluster.gossip.heal)


# The faults of one node that need no waiting to start.
_ONE_NODE: dict[str, Callable[[Cluster, SimNode], Any]] = {
    "cut-store": _cut_store,
    "lose-store-answers": _lose_store_answers,
    "cut-broker": _cut_broker,
    "lose-broker-acks": _lose_broker_acks,
    "isolate": _isolate,
}


def _latency(cluster: Cluster, seconds: float) -> Any:
    """Every node's store calls take ``seconds`` longer, until undone."""
    for node in cluster.nodes.values():
        node.store_gate.latency = seconds

    async def undo() -> None:
        for node in cluster.nodes.values():
            node.store_gate.latency = 0.0

    return undo


def _async(undo: Any) -> Any:
    async def run() -> None:
        undo()

    return run


async def _heal(cluster: Cluster, history: History) -> None:
    """Every fault ends, every crashed node starts again."""
    cluster.server.down = False
    cluster.receiver.mode = receiver.UP
    cluster.broker.resume()
    cluster.broker.cut.clear()
    cluster.broker.lost_acks.clear()
    cluster.gossip.heal()
    for node in cluster.nodes.values():
        node.store_gate.cut, node.store_gate.latency, node.store_gate.lose_answers = False, 0, 0
        node.set_skew(0.0)
        node.resume()
        if not node.alive:
            node.start()
    _event(cluster, history, "heal", "heal all", "", 0.0)


async def _drain(cluster: Cluster) -> None:
    """Until nothing due is left undelivered, DRAIN at most (what is owed
    includes a retry or a wait whose time is still to come)."""
    waited = 0.0
    while waited < DRAIN:
        now = cluster.clock.wall()
        owed = [
            d
            for d in cluster.documents.by_id.values()
            if d["status"] in (Status.PENDING.value, Status.IN_FLIGHT.value)
            and min(d["dueAt"], d["executeAt"]) <= now
        ]
        if not owed:
            return
        await asyncio.sleep(1.0)
        waited += 1.0


def _views(cluster: Cluster, ids: set[str]) -> dict[str, dict[str, Any]]:
    """What a GET of each schedule would show, from the store itself."""
    views = {}
    for stored_id, doc in cluster.documents.by_id.items():
        schedule_id = public_id(stored_id)
        if schedule_id in ids:
            views[schedule_id] = {"status": doc["status"], "executeAt": iso(doc["executeAt"])}
    return views


def _stranded(cluster: Cluster) -> int:
    return sum(d["status"] == Status.IN_FLIGHT.value for d in cluster.documents.by_id.values())


def _digest(history: History, broker: Broker) -> str:
    """Of the whole history and what the broker got: equal for equal runs."""
    hasher = hashlib.blake2b(digest_size=16)
    for op in history:
        hasher.update(json.dumps(op.as_dict(), sort_keys=True, default=str).encode())
    for delivery in broker.log:
        hasher.update(repr(delivery).encode())
    return hasher.hexdigest()
