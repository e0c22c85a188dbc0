"""The fault player: plays a scenario's timeline (``chaos/scenario.py``) on
the lab's cluster, and writes each step into the run's history as an
``info`` op of the ``nemesis`` process, its value the event the report
shows (``at`` seconds into the run, ``do``, ``step``, ``lasting``, the
``node`` it hit, or why it was ``skipped``). What is learnt of a step later
(how long the cluster took to settle after it, what a flood sent and the
node dropped, a skewed node's clock offset) is a ``note`` op naming it.

The end of a lasting fault (a resume, a heal, a reconnect) is an event of
its own, and after each the player times how long the cluster takes to
settle again: every node agrees on the members, every bucket held by its
placed owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from chaos.faults.garbage import Garbage, dropped, flood
from chaos.faults.kinds import RECEIVER_FAULTS, SERVER_FAULTS
from chaos.history import NEMESIS, NOTE, History
from chaos.lab.cluster import LocalCluster
from chaos.lab.receiver import Receiver
from chaos.scenario import FIELDS, Step

# What a node reports as the store's clock minus its own (a skewed node's
# shows its skew, negated).
CLOCK_OFFSET = re.compile(r"^scheduler_clock_offset_seconds\s+([0-9.eE+-]+)\s*$", re.M)
# How often the settling of the cluster is polled, and how long after a
# fault the first poll waits (let the fault be noticed first).
SETTLE_POLL = 0.5
SETTLE_AFTER = 1.0

# The receiver's mode while each of its faults lasts (down is no mode: the
# process is killed).
RECEIVER_MODES = {"receiver-503": "503", "receiver-slow": "slow", "receiver-400": "400"}
# The event that ends a receiver fault (``chaos.faults.kinds.NOT_FAULTS``).
RECEIVER_UP = "receiver-up"
# Why the cluster's settling is not timed after a receiver's fault or its end.
RECEIVER_SETTLE = "the receiver's faults leave the cluster as it was"

# A step's work after its event is written: given the event's op index.
FollowUp = Callable[[int], Coroutine[Any, Any, None]]


@dataclass
class Player:
    cluster: LocalCluster
    history: History
    rng: random.Random
    unfenced: bool
    cluster_keys: tuple[bytes, ...]
    no_namespaces: str | None  # why the run has no network namespaces (None: it has)
    settle_within: float
    # The run's webhook receiver (None: the load delivers nothing by HTTP).
    receiver: Receiver | None = None
    # What the steps have done to the nodes, as the load and the sampler ask.
    ready: set[str] = field(default_factory=set)
    paused: set[str] = field(default_factory=set)
    isolated: set[str] = field(default_factory=set)
    store_cut: set[str] = field(default_factory=set)  # cut from the database, still gossiping
    broker_cut: set[str] = field(default_factory=set)  # cut from the broker
    flooded: set[str] = field(default_factory=set)  # under garbage gossip
    skewed: dict[str, float] = field(default_factory=dict)  # node -> seconds its clock is off
    _partitions: int = 0  # in force now
    _names: int = 0
    _background: list[asyncio.Task[None]] = field(default_factory=list)
    # Events waiting for the cluster to settle: one poller serves them all.
    _settling: list[tuple[int, float, asyncio.Future[None]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._plays: dict[str, Callable[[Step, str, dict[str, Any]], Awaitable[FollowUp | None]]]
        self._plays = {
            "kill": self._kill,
            "stop": self._stop,
            "restart": self._restart_step,
            "skew-clock": self._skew_step,
            "pause": self._pause,
            "isolate": self._isolate,
            "cut-store": self._cut,
            "cut-broker": self._cut,
            "garbage-gossip": self._flood,
        }

    # -- nodes -------------------------------------------------------------------

    def new_name(self) -> str:
        self._names += 1
        return f"node-{self._names}"

    async def start(self, name: str, env: dict[str, str] | None = None) -> None:
        self.cluster.start_node(name, env)
        await asyncio.to_thread(self.cluster.wait_ready, name)
        self.ready.add(name)

    def running(self) -> list[str]:
        """Ready nodes that can take calls: not paused, cut off or cut from
        the database."""
        out = self.paused | self.isolated | self.store_cut
        return sorted(
            n.name
            for n in self.cluster.nodes.values()
            if n.alive and n.name in self.ready and n.name not in out
        )

    def _pick(self, step: Step) -> str | None:
        running = self.running()
        # A node under a lasting fault is left to it: no second fault on it.
        free = [name for name in running if name not in self.broker_cut | self.flooded]
        if step.target == "random":
            # Never the last node: a fault, not an outage.
            return self.rng.choice(free) if len(running) > 1 and free else None
        return step.target if step.target in free else None

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        self._background.append(asyncio.create_task(work))

    async def play_all(self, steps: Sequence[Step]) -> None:
        for step in steps:
            delay = self.history.started + step.at - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.play(step)

    async def aftermath(self) -> None:
        """Every step's aftermath: heals, restarts, floods, settling; a pause
        longer than the run ends with it."""
        for name in list(self.paused):
            self.cluster.resume(name)
            self.paused.discard(name)
        await asyncio.gather(*self._background)

    # -- one step ----------------------------------------------------------------

    def _cannot(self, step: Step) -> str | None:
        """Why this run cannot play ``step`` at all (None: it can)."""
        if step.do in SERVER_FAULTS and self.cluster.external:
            return "the servers are external: the runner cannot crash or pause them"
        if step.do in RECEIVER_FAULTS and self.receiver is None:
            return "no receiver runs: the load delivers nothing by HTTP"
        if step.do in ("cut-store", "cut-broker"):
            if self.cluster.external:
                return "the servers are external: the runner cannot cut one link to them"
            if self.cluster.network is None:
                return f"needs network namespaces ({self.no_namespaces})"
        return None

    async def play(self, step: Step) -> None:
        # Steps on the servers, on the whole cluster or adding a node have
        # no target to pick.
        target = self._pick(step) if "target" in FIELDS[step.do] else None
        event = self._event(step.do, step.label, lasting=step.lasting)
        follow_up = await self._follow_up(step, target, event)
        event.setdefault("node", target)
        if step.do == "split":
            # Each half settles on its own view; the cluster settles after the heal.
            event["skipped_settle"] = "the halves cannot agree until the heal"
        if step.do in RECEIVER_FAULTS:
            event["skipped_settle"] = RECEIVER_SETTLE
        index = self.history.event(NEMESIS, step.do, time.time(), **event).index
        if follow_up is not None:
            self._later(follow_up(index))
        # A server fault times its settling itself, from its end.
        if (
            "skipped" not in event
            and "skipped_settle" not in event
            and step.do not in SERVER_FAULTS
        ):
            self._later(self.time_to_settle(index))

    async def _follow_up(
        self, step: Step, target: str | None, event: dict[str, Any]
    ) -> FollowUp | None:
        """Play the step (noting what it did in ``event``); what it leaves to
        do once its event is written."""
        cannot = self._cannot(step)
        if cannot is not None:
            event["skipped"] = cannot
            return None
        if step.do == "start":
            name = event["node"] = self.new_name()
            return lambda _: self.start(name)
        if step.do in SERVER_FAULTS:
            return lambda index: self._server_fault(index, step)
        if step.do in RECEIVER_FAULTS:
            if step.retry_after:
                event["retry_after"] = step.retry_after
            return lambda _: self._receiver_fault(step)
        if step.do == "split":
            halves = self._halves()
            event["node"] = " | ".join(",".join(sorted(half)) for half in halves)
            await self._partition(event, step, halves)
            return None
        if target is None:
            event["skipped"] = "no such running node (or only one left)"
            return None
        return await self._plays[step.do](step, target, event)

    def _event(self, do: str, label: str, *, lasting: float = 0.0) -> dict[str, Any]:
        return {
            "at": round(time.time() - self.history.started, 2),
            "do": do,
            "step": label,
            "lasting": lasting,
        }

    def _note(self, index: int, **fields: Any) -> None:
        self.history.event(NEMESIS, NOTE, time.time(), of=index, **fields)

    def _end(self, do: str, label: str, node: str | None, **fields: Any) -> int:
        """The end of a lasting fault, as an event of its own."""
        event = self._event(do, label)
        event["node"] = node
        return self.history.event(NEMESIS, do, time.time(), **event, **fields).index

    # -- the steps that hit one node ----------------------------------------------

    async def _kill(self, step: Step, target: str, event: dict[str, Any]) -> FollowUp | None:
        self.ready.discard(target)
        self.skewed.pop(target, None)
        self.cluster.kill(target)
        return (lambda _: self.start(target)) if step.restart else None

    async def _stop(self, step: Step, target: str, event: dict[str, Any]) -> FollowUp | None:
        self.ready.discard(target)
        self.skewed.pop(target, None)
        return lambda _: self._stop_node(target)

    async def _restart_step(
        self, step: Step, target: str, event: dict[str, Any]
    ) -> FollowUp | None:
        self.ready.discard(target)
        return lambda _: self._restart(target)

    async def _skew_step(self, step: Step, target: str, event: dict[str, Any]) -> FollowUp | None:
        # CHAOS_CLOCK_SKEW takes effect in chaos mode only.
        env = {
            "CHAOS_MODE": "unfenced" if self.unfenced else "on",
            "CHAOS_CLOCK_SKEW": f"{step.skew:g}",
        }
        event["skew_s"] = step.skew
        self.ready.discard(target)
        return lambda index: self._skew(index, target, env, step.skew)

    async def _pause(self, step: Step, target: str, event: dict[str, Any]) -> FollowUp | None:
        self.paused.add(target)
        self.cluster.pause(target)
        return lambda _: self._resume_later(target, step)

    async def _isolate(self, step: Step, target: str, event: dict[str, Any]) -> FollowUp | None:
        self.isolated.add(target)
        others = {n for n in self.cluster.nodes if n != target}
        await self._partition(event, step, [{target}, others], isolate=target)
        return None

    async def _cut(self, step: Step, target: str, event: dict[str, Any]) -> FollowUp | None:
        server = "store" if step.do == "cut-store" else "broker"
        routes = await asyncio.to_thread(self.cluster.cut_server, target, server)
        (self.store_cut if server == "store" else self.broker_cut).add(target)
        return lambda _: self._reconnect_later(target, server, routes, step)

    async def _flood(self, step: Step, target: str, event: dict[str, Any]) -> FollowUp | None:
        self.flooded.add(target)
        event["garbage"] = {"rate": step.rate, "signed": bool(self.cluster_keys)}
        return lambda index: self._garbage(index, step, target, dict(event["garbage"]))

    # -- what the steps leave running ------------------------------------------------

    async def _stop_node(self, name: str) -> None:
        await asyncio.to_thread(self.cluster.stop_node, name)

    async def _restart(
        self, name: str, env: dict[str, str] | None = None, *, skew: float | None = None
    ) -> None:
        """Stop gracefully and start again: with ``env`` (a skewed clock), or
        plain, which also undoes an earlier skew."""
        await self._stop_node(name)
        if skew is None:
            self.skewed.pop(name, None)
        else:
            self.skewed[name] = skew
        await self.start(name, env)

    async def _skew(self, index: int, name: str, env: dict[str, str], skew: float) -> None:
        """Restart the node with its wall clock ``skew`` seconds off, and note
        the offset from the store's clock it then reports (about -skew)."""
        await self._restart(name, env, skew=skew)
        with contextlib.suppress(OSError, ValueError):
            found = CLOCK_OFFSET.search(await asyncio.to_thread(self.cluster.metrics, name))
            if found:
                self._note(index, clock_offset_s=round(float(found.group(1)), 3))

    async def _server_fault(self, index: int, step: Step) -> None:
        """Crash or pause a server for the step's time (in a thread: it
        sleeps), then time the settling from its return."""
        fault = {
            "crash-store": self.cluster.crash_store,
            "pause-broker": self.cluster.pause_broker,
            "crash-broker": self.cluster.crash_broker,
        }[step.do]
        await asyncio.to_thread(fault, step.lasting)
        await self.time_to_settle(index)

    async def _receiver_fault(self, step: Step) -> None:
        """Take the receiver down (SIGKILL), or switch its mode, for the
        step's time; then bring it back up, an event of its own."""
        receiver = self.receiver
        assert receiver is not None  # _cannot said so
        if step.do == "receiver-down":
            await asyncio.to_thread(receiver.kill)
        else:
            await asyncio.to_thread(receiver.mode, RECEIVER_MODES[step.do], step.retry_after)
        await asyncio.sleep(step.lasting)
        if step.do == "receiver-down":
            await asyncio.to_thread(receiver.start)
        else:
            await asyncio.to_thread(receiver.mode, "up")
        self._end(RECEIVER_UP, "receiver up", None, skipped_settle=RECEIVER_SETTLE)

    def _halves(self) -> list[set[str]]:
        names = self.running()
        self.rng.shuffle(names)
        return [set(names[: len(names) // 2]), set(names[len(names) // 2 :])]

    async def _partition(
        self,
        event: dict[str, Any],
        step: Step,
        groups: list[set[str]],
        *,
        isolate: str | None = None,
    ) -> None:
        unreached = await asyncio.to_thread(self.cluster.partition, groups, isolate=isolate)
        if unreached:
            event["filter_not_set_on"] = unreached
        self._later(self._heal_later(step, isolate))

    async def _resume_later(self, name: str, step: Step) -> None:
        await asyncio.sleep(step.lasting)
        self.cluster.resume(name)
        self.paused.discard(name)
        if self.cluster.network is None and not self._partitions:
            # A gossip filter that a heal could not clear while it slept.
            await asyncio.to_thread(self.cluster.heal)
        # The zombie wakes up believing it still owns its buckets: the fence
        # must reject its writes, and the cluster must take it back in.
        await self.time_to_settle(self._end("resume", "resume", name))

    async def _heal_later(self, step: Step, isolated: str | None) -> None:
        """Undo this partition (with namespaces, only this one: an isolation
        or a split that overlaps it stays; the gossip filter heals all)."""
        self._partitions += 1
        await asyncio.sleep(step.lasting)
        self._partitions -= 1
        unreached = await asyncio.to_thread(self.cluster.heal_partition, isolate=isolated)
        if self.cluster.network is None:
            self.isolated.clear()
        elif isolated is not None:
            self.isolated.discard(isolated)
        fields = {"filter_not_set_on": unreached} if unreached else {}
        await self.time_to_settle(self._end("heal", "heal", isolated, **fields))

    async def _reconnect_later(
        self, name: str, server: str, routes: list[tuple[str, str]], step: Step
    ) -> None:
        await asyncio.sleep(step.lasting)
        await asyncio.to_thread(self.cluster.uncut, routes)
        (self.store_cut if server == "store" else self.broker_cut).discard(name)
        await self.time_to_settle(self._end("reconnect", f"reconnect to the {server}", name))

    async def _garbage(self, index: int, step: Step, name: str, report: dict[str, Any]) -> None:
        """Flood the node's gossip port for the step's time; note what was
        sent and what the node counted as dropped. Whether the others kept
        it alive meanwhile is judged from the samples after the run."""
        node = self.cluster.nodes[name]
        peers = [(n.name, n.gossip_address) for n in self.cluster.nodes.values() if n is not node]
        maker = Garbage(
            random.Random(self.rng.random()),
            self.cluster_keys,
            target=name,
            target_address=node.gossip_address,
            peers=peers,
        )
        before = await self._dropped(name, report, "before")
        began = time.time()
        try:
            sent = await flood(maker, node.host, node.gossip_port, step.lasting, step.rate)
        finally:
            ended = time.time()
            self.flooded.discard(name)
        await asyncio.sleep(1.0)  # the last datagrams handled
        after = await self._dropped(name, report, "after")
        started = self.history.started
        report.update(
            # From the flood's start to GARBAGE_JUDGED after its end: a node
            # the garbage stalled is declared dead seconds later.
            judged=[round(began - started, 2), round(ended - started, 2)],
            datagrams=sum(sent["datagrams"].values()),
            sent=dict(sent["datagrams"].most_common()),
            streams=dict(sent["streams"].most_common()),
            regenerated=maker.regenerated,
            dropped={
                reason: after[reason] - before.get(reason, 0.0)
                for reason in sorted(after)
                if after[reason] - before.get(reason, 0.0)
            },
        )
        self._note(index, garbage=report)

    async def _dropped(self, name: str, report: dict[str, Any], when: str) -> dict[str, float]:
        try:
            text = await asyncio.to_thread(self.cluster.metrics, name)
        except (OSError, ValueError) as exc:
            report[f"metrics_{when}"] = f"{type(exc).__name__}: {exc}"
            return {}
        return dropped(text)

    # -- settling ----------------------------------------------------------------

    async def time_to_settle(self, index: int) -> None:
        """Wait until the cluster settles after the event at ``index`` (or
        give up after ``settle_within``) and note how long that took."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._settling.append((index, time.time(), done))
        await done

    async def settler(self) -> None:
        """One poll of the cluster's state serves every event waiting to
        settle (each poll asks every node for its view)."""
        while True:
            await asyncio.sleep(SETTLE_POLL)
            now = time.time()
            due = [w for w in self._settling if now - w[1] >= SETTLE_AFTER]
            settled = False
            if due:
                settled = await asyncio.to_thread(
                    self.cluster.settled, self.paused | self.isolated, self.store_cut
                )
            now = time.time()
            for waiter in list(self._settling):
                index, began, done = waiter
                if settled and waiter in due:
                    self._note(index, settled_after_s=round(now - began, 2))
                elif now - began > self.settle_within:
                    self._note(index, settled_after_s=None)
                else:
                    continue
                self._settling.remove(waiter)
                done.set_result(None)
