"""Plays a scenario (``chaos/scenario.py``) against a local cluster of real
node processes on the embedded stack, under load, and checks the outcome
(``chaos/checker.py``).

The load posts ``rate`` schedules per second through random ready nodes, due
0-4 s ahead (one in twenty already due), each labelled with one of GROUPS
groups; one in fifty is cancelled a moment later. A 200 on the DELETE counts
it as cancelled; a DELETE with no answer (the node was paused or cut off
mid-request, and may have cancelled it) or a 5xx (the store failed
mid-call, perhaps after the cancel landed) is settled after the run by
asking a node for the schedule.

The verbs of issue 19 are in every scenario's load (the runner's, not a
scenario's field: every fault should meet them, and at these shares the
load stays what it was):

* RESCHEDULE_SHARE of the schedules get a PATCH of their executeAt (later
  or earlier, at least half a second ahead) up to a second after their
  create, some of them twice; half of them with ``If-Match`` (the version
  the last answer gave). A 200 moves the time they are owed at; a 409 (in
  flight already, or final) or a 412 leaves the time they had;
* PAUSE_SHARE are paused up to a second after their create, and half of
  those resumed 0.5-3 s later: a paused one must not go out until resumed,
  a resumed one is owed again, one never resumed is owed nothing;
* BULK_CANCELS times a run, ``POST /v1/schedules:cancel`` takes the
  PENDING and PAUSED schedules of one group (a different one each time)
  due within BULK_AHEAD seconds.

A verb with no answer or a 5xx (a PATCH, a pause, a resume), and every
member of a bulk-cancelled group (a bulk cancel answers only a count), is
settled after the run from the schedule's view (status, executeAt); the
checker (``chaos.checker.Changes``) judges the lot. Each fault gets
a window from its start to the end of the recovery allowance (failure
detection plus a lease TTL); lateness is reported inside each window and
outside all of them. After each fault the runner also measures how long the
cluster takes to settle again (every node agrees on the members, every
bucket held by its placed owner).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import re
import secrets
import tempfile
import time
from collections import Counter
from collections.abc import Coroutine, Sequence
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from chaos.checker import (
    LATE_OUTSIDE_WINDOWS,
    SAME_TIME,
    Changes,
    Window,
    check,
    occurrence,
    passed,
)
from chaos.faults.garbage import Garbage, dropped, flood
from chaos.lab.cluster import LocalCluster
from chaos.lab.harness import Recorder, broker_stores, epoch, iso, until
from chaos.lab.network import Namespaces, probe, sweep
from chaos.report import render_html
from chaos.scenario import FIELDS, Scenario, Step
from node.errors import StoreUnavailable
from node.store.tenants import TenantStore
from node.tenants.model import Tenant

# Failure detection at the lan preset (p99 about 8 s) plus the lease TTL (6 s),
# with room to spare.
RECOVERY_ALLOWANCE = 20.0
CANCEL_SHARE = 0.02
# Issue 19's verbs (the module docstring): shares of the schedules created.
RESCHEDULE_SHARE = 0.04
RESCHEDULE_AGAIN = 0.25  # of the rescheduled, moved once more
PAUSE_SHARE = 0.03
RESUME_SHARE = 0.5  # of the paused, resumed
VERB_DELAY = 1.0  # a verb follows its schedule's create by up to this (seconds)
GROUPS = 8  # each schedule's label {"group": "g<k>"}
BULK_CANCELS = 3  # bulk cancels a run, each of its own group
BULK_AHEAD = 3.0  # seconds: a bulk cancel's dueBefore, from when it is sent
BUCKETS = 256  # the nodes' default bucket count
GRACE = 60.0  # after the load, how long every accepted schedule may take to arrive
# Recurring schedules running through every fault: each occurrence must be
# delivered once (fire_all with a cap no outage here reaches, so even an
# occurrence missed by more than the misfire threshold is owed).
CHAINS = 8
CHAIN_EVERY = 2.0  # seconds
# Faults of the broker: inside their windows a producer may resend a batch
# the stalled broker had stored after all (``chaos.checker``: producer_retry).
BROKER_FAULTS = ("pause-broker", "crash-broker", "cut-broker")
# The broker may also stall on its own (the embedded one does, for tens of
# seconds under load): a send it never answered fails after the producer's
# request timeout (10 s), and only then does the node's /readyz say
# `broker: false`. A stall seen so counts as a broker fault from this long
# before the first sample that showed it.
STALL_LEAD = 12.0
SERVER_FAULTS = ("crash-store", "pause-broker", "crash-broker")
# Faults that stop the work of every node while they last: late deliveries
# are intended for as long. Any other fault is one node's, or a split the
# leases ride out: the others take its work within the recovery allowance,
# and a unit due after that must not be late (``late_outside_windows``).
CLUSTER_FAULTS = (*SERVER_FAULTS, "split")
# A flood of garbage gossip is judged from its start to this long after its
# end: a node the garbage had stalled is declared dead seconds later.
GARBAGE_JUDGED = 5.0
# What a node reports as the store's clock minus its own (a skewed node's
# shows its skew, negated).
CLOCK_OFFSET = re.compile(r"^scheduler_clock_offset_seconds\s+([0-9.eE+-]+)\s*$", re.M)
# With AUTH=on, the tenant whose key every call of the run carries.
ADMIN_TENANT = "chaos-admin"
# The longest wait between two tries of a POST that a 503 asked for.
RETRY_AFTER_CAP = 2.0
# Duplicated units printed with their copies (summary.json lists more).
SHOWN_DUPLICATES = 20


class Run:
    def __init__(
        self,
        scenario: Scenario,
        data_dir: Path,
        seed: int,
        *,
        unfenced: bool = False,
        namespaces: bool = True,
        settle_within: float = 120.0,
        external: tuple[str, str] | None = None,
    ) -> None:
        self.scenario = scenario
        # The fixed steps and those the seed draws for the ``any`` entries.
        self.steps = scenario.timeline(seed)
        # unfenced: nodes run without the fence (CHAOS_MODE=unfenced), to show
        # that the checker catches what the fence prevents.
        self.unfenced = unfenced
        self.settle_within = settle_within
        # Partitions and cuts take real links where network namespaces work;
        # elsewhere (or with namespaces=False) partitions are the nodes'
        # chaos-mode gossip filter and cuts from one server are skipped.
        network = None
        self.network = "loopback (no partition in this scenario)"
        filtered = False
        self.no_namespaces: str | None = "no step here cuts a link"
        if any(step.needs_namespaces for step in self.steps):
            sweep()
            reason = probe() if namespaces else "turned off (--no-namespaces)"
            if external:
                # Nodes in namespaces reach only the bridge, not servers
                # elsewhere (no NAT tools on the kind of host this targets).
                reason = "the servers are external"
            self.no_namespaces = reason
            if reason is None:
                network = Namespaces()
            else:
                filtered = any(step.partitions for step in self.steps)
        mode = "unfenced" if unfenced else "on" if filtered else "off"
        env = {"CHAOS_MODE": mode}
        # A fresh key per run signs the gossip (and the wake-up hints); a
        # scenario without keys runs unsigned, which nodes take only when told.
        self.cluster_keys: tuple[bytes, ...] = ()
        if scenario.cluster_keys:
            self.cluster_keys = (secrets.token_bytes(32),)
            env["CLUSTER_KEYS"] = ",".join(base64.b64encode(k).decode() for k in self.cluster_keys)
        else:
            env["GOSSIP_UNSIGNED"] = "on"
        self.cluster = LocalCluster(
            data_dir,
            env=env,
            network=network,
            external=external,
            durable_broker=any(step.do == "crash-broker" for step in self.steps),
            auth=scenario.auth,
        )
        # Records of earlier runs stay in an external broker's topic.
        self.topic = f"chaos-{self.cluster.database}" if external else "chaos"
        if network is not None or filtered:
            self.network = self.cluster.partition_kind
            if filtered:
                self.network += f"; namespaces not used: {reason}"
        self.rng = random.Random(seed)
        self.seed = seed
        self.ready: set[str] = set()
        self.paused: set[str] = set()
        self.isolated: set[str] = set()
        self.store_cut: set[str] = set()  # cut from the database, still gossiping
        self.broker_cut: set[str] = set()  # cut from the broker
        self.flooded: set[str] = set()  # under garbage gossip
        self.skewed: dict[str, float] = {}  # node -> seconds its clock runs off
        self._partitions = 0  # in force now
        self.accepted: dict[str, float] = {}  # unit (a schedule or an occurrence) -> due
        self.chains: set[str] = set()  # recurring schedules created
        self.cancelled: set[str] = set()
        # DELETEs without an answer (timed out, connection cut): cancelled or
        # not is asked again after the run, when a node can say.
        self.cancel_unknown: set[str] = set()
        # The verbs (module docstring). Times are epoch seconds of this clock.
        self.groups: dict[str, str] = {}  # schedule -> its label's group
        # Every executeAt a rescheduled one had, each with when the PATCH that
        # set it answered (None: as created); the last is in ``accepted``.
        self.reschedules: dict[str, list[tuple[float, float | None]]] = {}
        self.patch_unknown: dict[str, tuple[float, float]] = {}  # -> (its executeAt, gave up)
        self.unsure: set[str] = set()  # rescheduled, the last PATCH never settled
        # Paused: (its 200, when its resume was sent or None: still paused).
        self.pauses: dict[str, tuple[float, float | None]] = {}
        self.pause_unknown: dict[str, float] = {}  # -> when it gave up on the answer
        self.resumed: dict[str, float] = {}  # -> when the resume answered 200
        self.resume_unknown: dict[str, float] = {}  # -> when it gave up (or was refused)
        self.bulk: dict[str, float] = {}  # group -> when its bulk cancel last answered
        self.bulk_calls: list[dict[str, Any]] = []
        self.bulk_cancelled: dict[str, float] = {}  # schedule -> its group's self.bulk
        self.verbs: Counter[str] = Counter()  # each verb's answers, as "pause 409 in_flight"
        self._members_seen: set[str] = set()  # of bulk-cancelled groups, settled already
        self.refusals: Counter[str] = Counter()
        # Running nodes whose last sampled readiness failed its store check.
        self._store_unready: set[str] = set()
        self.events: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []  # each node's view, once a second
        self._started = 0.0
        self._names = 0
        self._background: list[asyncio.Task[None]] = []
        # Events waiting for the cluster to settle: one poller serves them all.
        self._settling: list[tuple[dict[str, Any], float, asyncio.Future[None]]] = []

    # -- nodes -------------------------------------------------------------------

    def _new_name(self) -> str:
        self._names += 1
        return f"node-{self._names}"

    async def _start(self, name: str, env: dict[str, str] | None = None) -> None:
        self.cluster.start_node(name, env)
        await asyncio.to_thread(self.cluster.wait_ready, name)
        self.ready.add(name)

    def _running(self) -> list[str]:
        """Ready nodes that can take calls: not paused, cut off or cut from
        the database."""
        out = self.paused | self.isolated | self.store_cut
        return sorted(
            n.name
            for n in self.cluster.nodes.values()
            if n.alive and n.name in self.ready and n.name not in out
        )

    def _serving(self) -> list[str]:
        """The running nodes a load balancer would send a call to: those whose
        readiness, as last sampled, does not fail its store check (a node
        that lost its route to the database some other way than a planned
        cut, or has not yet reconnected after one). All running ones if
        that leaves none."""
        running = self._running()
        serving = [n for n in running if n not in self._store_unready]
        return serving or running

    def _pick(self, step: Step) -> str | None:
        running = self._running()
        # A node under a lasting fault is left to it: no second fault on it.
        free = [name for name in running if name not in self.broker_cut | self.flooded]
        if step.target == "random":
            # Never the last node: a fault, not an outage.
            return self.rng.choice(free) if len(running) > 1 and free else None
        return step.target if step.target in free else None

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        self._background.append(asyncio.create_task(work))

    # -- faults ------------------------------------------------------------------

    def _halves(self) -> list[set[str]]:
        names = self._running()
        self.rng.shuffle(names)
        return [set(names[: len(names) // 2]), set(names[len(names) // 2 :])]

    def _cannot(self, step: Step) -> str | None:
        """Why this run cannot play ``step`` at all (None: it can)."""
        if step.do in SERVER_FAULTS and self.cluster.external:
            return "the servers are external: the runner cannot crash or pause them"
        if step.do in ("cut-store", "cut-broker"):
            if self.cluster.external:
                return "the servers are external: the runner cannot cut one link to them"
            if self.cluster.network is None:
                return f"needs network namespaces ({self.no_namespaces})"
        return None

    async def _play(self, step: Step) -> None:
        # Steps on the servers, on the whole cluster or adding a node have
        # no target to pick.
        target = self._pick(step) if "target" in FIELDS[step.do] else None
        event = self._event(step.do, step.label, lasting=step.lasting)
        settle = True  # time the settling from now (else the step does, later)
        cannot = self._cannot(step)
        if cannot is not None:
            event["skipped"] = cannot
        elif step.do == "start":
            target = self._new_name()
            event["node"] = target
            self._later(self._start(target))
        elif step.do in SERVER_FAULTS:
            settle = False
            self._later(self._server_fault(event, step))
        elif step.do == "split":
            halves = self._halves()
            event["node"] = " | ".join(",".join(sorted(half)) for half in halves)
            await self._partition(event, step, halves)
        elif target is None:
            event["skipped"] = "no such running node (or only one left)"
        elif step.do == "kill":
            self.ready.discard(target)
            self.skewed.pop(target, None)
            self.cluster.kill(target)
            if step.restart:
                self._later(self._start(target))
        elif step.do == "stop":
            self.ready.discard(target)
            self.skewed.pop(target, None)
            self._later(self._stop(target))
        elif step.do == "restart":
            self.ready.discard(target)
            self._later(self._restart(target))
        elif step.do == "skew-clock":
            # CHAOS_CLOCK_SKEW takes effect in chaos mode only.
            env = {
                "CHAOS_MODE": "unfenced" if self.unfenced else "on",
                "CHAOS_CLOCK_SKEW": f"{step.skew:g}",
            }
            event["skew_s"] = step.skew
            self.ready.discard(target)
            self._later(self._skew(event, target, env, step.skew))
        elif step.do == "pause":
            self.paused.add(target)
            self.cluster.pause(target)
            self._later(self._resume_later(target, step))
        elif step.do == "isolate":
            self.isolated.add(target)
            others = {n for n in self.cluster.nodes if n != target}
            await self._partition(event, step, [{target}, others], isolate=target)
        elif step.do in ("cut-store", "cut-broker"):
            server = "store" if step.do == "cut-store" else "broker"
            routes = await asyncio.to_thread(self.cluster.cut_server, target, server)
            (self.store_cut if server == "store" else self.broker_cut).add(target)
            self._later(self._reconnect_later(target, server, routes, step))
        elif step.do == "garbage-gossip":
            self.flooded.add(target)
            self._later(self._garbage(event, step, target))

        event.setdefault("node", target)
        self.events.append(event)
        if step.do == "split":
            # Each half settles on its own view; the cluster settles after the heal.
            event["skipped_settle"] = "the halves cannot agree until the heal"
        elif "skipped" not in event and settle:
            self._later(self._time_to_settle(event))

    def _event(self, do: str, label: str, *, lasting: float = 0.0) -> dict[str, Any]:
        return {
            "at": round(time.time() - self._started, 2),
            "do": do,
            "step": label,
            "lasting": lasting,
        }

    async def _stop(self, name: str) -> None:
        await asyncio.to_thread(self.cluster.stop_node, name)

    async def _restart(
        self, name: str, env: dict[str, str] | None = None, *, skew: float | None = None
    ) -> None:
        """Stop gracefully and start again: with ``env`` (a skewed clock), or
        plain, which also undoes an earlier skew."""
        await asyncio.to_thread(self.cluster.stop_node, name)
        if skew is None:
            self.skewed.pop(name, None)
        else:
            self.skewed[name] = skew
        await self._start(name, env)

    async def _skew(
        self, event: dict[str, Any], name: str, env: dict[str, str], skew: float
    ) -> None:
        """Restart the node with its wall clock ``skew`` seconds off, and note
        the offset from the store's clock it then reports (about -skew)."""
        await self._restart(name, env, skew=skew)
        with contextlib.suppress(OSError, ValueError):
            found = CLOCK_OFFSET.search(await asyncio.to_thread(self.cluster.metrics, name))
            if found:
                event["clock_offset_s"] = round(float(found.group(1)), 3)

    async def _server_fault(self, event: dict[str, Any], step: Step) -> None:
        """Crash or pause a server for the step's time (in a thread: it
        sleeps), then time the settling from its return."""
        fault = {
            "crash-store": self.cluster.crash_store,
            "pause-broker": self.cluster.pause_broker,
            "crash-broker": self.cluster.crash_broker,
        }[step.do]
        await asyncio.to_thread(fault, step.lasting)
        await self._time_to_settle(event)

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
        event = self._event("resume", "resume")
        event["node"] = name
        self.events.append(event)
        await self._time_to_settle(event)

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
        event = self._event("heal", "heal")
        event["node"] = isolated
        if unreached:
            event["filter_not_set_on"] = unreached
        self.events.append(event)
        await self._time_to_settle(event)

    async def _reconnect_later(
        self, name: str, server: str, routes: list[tuple[str, str]], step: Step
    ) -> None:
        await asyncio.sleep(step.lasting)
        await asyncio.to_thread(self.cluster.uncut, routes)
        (self.store_cut if server == "store" else self.broker_cut).discard(name)
        event = self._event("reconnect", f"reconnect to the {server}")
        event["node"] = name
        self.events.append(event)
        await self._time_to_settle(event)

    async def _garbage(self, event: dict[str, Any], step: Step, name: str) -> None:
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
        report: dict[str, Any] = {"rate": step.rate, "signed": bool(self.cluster_keys)}
        event["garbage"] = report
        before = await self._dropped(name, report, "before")
        began = time.time()
        try:
            sent = await flood(maker, node.host, node.gossip_port, step.lasting, step.rate)
        finally:
            ended = time.time()
            self.flooded.discard(name)
        await asyncio.sleep(1.0)  # the last datagrams handled
        after = await self._dropped(name, report, "after")
        rise = {
            reason: after[reason] - before.get(reason, 0.0)
            for reason in sorted(after)
            if after[reason] - before.get(reason, 0.0)
        }
        report.update(
            # From the flood's start to GARBAGE_JUDGED after its end: a node
            # the garbage stalled is declared dead seconds later.
            judged=[round(began - self._started, 2), round(ended - self._started, 2)],
            datagrams=sum(sent["datagrams"].values()),
            sent=dict(sent["datagrams"].most_common()),
            streams=dict(sent["streams"].most_common()),
            regenerated=maker.regenerated,
            dropped=rise,
        )

    async def _dropped(self, name: str, report: dict[str, Any], when: str) -> dict[str, float]:
        try:
            text = await asyncio.to_thread(self.cluster.metrics, name)
        except (OSError, ValueError) as exc:
            report[f"metrics_{when}"] = f"{type(exc).__name__}: {exc}"
            return {}
        return dropped(text)

    def _judge_garbage(self) -> list[str]:
        """Each flood's verdict, from the views sampled while it ran: no
        other node that saw the target alive when the flood began declared
        it dead (a node still counted dead after an earlier fault proves
        nothing either way), and its dropped counters rose. Returns the
        labels of the floods that failed."""
        failed = []
        for event in self.events:
            report = event.get("garbage")
            if report is None:
                continue
            if "judged" not in report:  # the flood never ran to its end
                report["passed"] = False
                failed.append(event["step"])
                continue
            start, end = report["judged"]
            target = event["node"]
            before = [s for s in self.samples if start - 3.0 <= s["t"] <= start]
            already = {
                viewer
                for viewer, states in (before[-1]["not_alive"] if before else {}).items()
                if target in states
            }
            seen: dict[str, set[str]] = {"dead": set(), "suspect": set()}
            for sample in self.samples:
                if start < sample["t"] <= end + GARBAGE_JUDGED:
                    for viewer, states in sample.get("not_alive", {}).items():
                        state = states.get(target)
                        if viewer == target or viewer in already or state is None:
                            continue
                        seen["dead" if state in ("dead", "left") else "suspect"].add(viewer)
            report["not_alive_to_at_start"] = sorted(already)
            report["declared_dead_by"] = sorted(seen["dead"])
            report["suspected_by"] = sorted(seen["suspect"])
            report["passed"] = not seen["dead"] and sum(report["dropped"].values()) > 0
            if not report["passed"]:
                failed.append(event["step"])
        return failed

    async def _time_to_settle(self, event: dict[str, Any]) -> None:
        """Wait until the cluster settles after ``event`` (or give up after
        ``settle_within``) and note how long that took."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._settling.append((event, time.time(), done))
        await done

    async def _settler(self) -> None:
        """One poll of the cluster's state serves every event waiting to
        settle (each poll asks every node for its view)."""
        while True:
            await asyncio.sleep(0.5)
            now = time.time()
            # Let the fault be noticed first.
            due = [w for w in self._settling if now - w[1] >= 1.0]
            settled = False
            if due:
                settled = await asyncio.to_thread(
                    self.cluster.settled, self.paused | self.isolated, self.store_cut
                )
            now = time.time()
            for waiter in list(self._settling):
                event, began, done = waiter
                if settled and waiter in due:
                    event["settled_after_s"] = round(now - began, 2)
                elif now - began > self.settle_within:
                    event["settled_after_s"] = None
                else:
                    continue
                self._settling.remove(waiter)
                done.set_result(None)

    async def _sample(self, stop: asyncio.Event) -> None:
        """Buckets held, alive members and the members not alive seen by
        every running node, and the readiness checks each one fails, each
        second."""
        while not stop.is_set():
            sample: dict[str, Any] = {
                "t": round(time.time() - self._started, 2),
                "held": {},
                "sees": {},
                "not_alive": {},
                "unready": {},
            }
            for name in self._running():
                try:
                    failing = await self._failing_checks(name)
                except (OSError, ValueError, KeyError, TypeError):  # down, or an error body
                    continue
                # Asked first: a node without its store answers no view.
                if "store" in failing:
                    self._store_unready.add(name)
                else:
                    self._store_unready.discard(name)
                try:
                    view = await asyncio.to_thread(self.cluster.cluster_view, name)
                    held = view["buckets"]["held"]
                    states = {m["id"]: m["state"] for m in view["members"]}
                except (OSError, ValueError, KeyError, TypeError):  # down, or an error body
                    continue
                if failing:
                    sample["unready"][name] = failing
                sample["held"][name] = held
                sample["sees"][name] = sum(1 for state in states.values() if state == "alive")
                others = {m: state for m, state in states.items() if state != "alive"}
                if others:
                    sample["not_alive"][name] = others
            # A node cut from the store takes no calls (its views read the
            # store) but still answers its probes, which should say so.
            for name in sorted(self.store_cut):
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    if failing := await self._failing_checks(name):
                        sample["unready"][name] = failing
            self.samples.append(sample)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    # -- load --------------------------------------------------------------------

    async def _post(self, session: aiohttp.ClientSession, i: int) -> None:
        """Create schedule ``s<i>``; then, drawn by their shares, cancel,
        reschedule or pause it."""
        lead = 0.0 if self.rng.random() < 0.05 else self.rng.uniform(1.0, 4.0)
        execute_at = _to_ms(datetime.now(UTC) + timedelta(seconds=lead))
        schedule_id = f"s{i}"
        group = f"g{self.rng.randrange(GROUPS)}"
        body = {
            "id": schedule_id,
            "topic": self.topic,
            "executeAt": iso(execute_at),
            "payload": i,
            "labels": {"group": group},
        }
        version: int | None = None
        last = ""
        for _ in range(6):
            nodes = self._serving()
            if not nodes:
                await asyncio.sleep(0.2)
                continue
            url = self.cluster.nodes[self.rng.choice(nodes)].url
            wait = 0.1
            try:
                async with session.post(url + "/v1/schedules", json=body) as r:
                    if r.status in (200, 201):
                        self.accepted[schedule_id] = execute_at.timestamp()
                        self.groups[schedule_id] = group
                        version = _version(await _json(r))
                        break
                    last = f"HTTP {r.status} {(await r.text())[:200]}"
                    # A client keeps the API's contract: a 503 says when to
                    # come back (a store restarting takes seconds, and six
                    # tries 0.1 s apart gave up inside one).
                    wait = _retry_after(r.headers.get("Retry-After"), wait)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                last = f"{type(exc).__name__} {exc}"[:200]
            await asyncio.sleep(wait)
        else:
            self.refusals[last] += 1
            return
        draw = self.rng.random()
        if draw < CANCEL_SHARE:
            if lead > 0.5:
                await self._cancel(session, schedule_id)
        elif draw < CANCEL_SHARE + RESCHEDULE_SHARE:
            await self._reschedule(session, schedule_id, version)
        elif draw < CANCEL_SHARE + RESCHEDULE_SHARE + PAUSE_SHARE:
            await self._pause(session, schedule_id)

    async def _chain(self, session: aiohttp.ClientSession, n: int) -> None:
        """A recurring schedule every CHAIN_EVERY s over the load; its
        occurrences join ``accepted`` once a node has taken it."""
        start = datetime.fromtimestamp(self._started, UTC).replace(microsecond=0)
        start += timedelta(seconds=2 + n * CHAIN_EVERY / CHAINS)
        end = datetime.fromtimestamp(self._started + self.scenario.duration, UTC)
        end = end.replace(microsecond=end.microsecond // 1000 * 1000)  # as the API stores it
        schedule_id = f"chain{n}"
        # Known before the first occurrence can arrive, so the recorder names it.
        self.chains.add(schedule_id)
        body = {
            "id": schedule_id,
            "topic": self.topic,
            "payload": n,
            "recurrence": {
                "every": f"PT{CHAIN_EVERY:g}S",
                "start": iso(start),
                "end": iso(end),
                "misfire": "fire_all",
                "maxCatchUp": 1000,
            },
        }
        for _ in range(50):
            nodes = self._serving()
            if nodes:
                url = self.cluster.nodes[self.rng.choice(nodes)].url
                try:
                    async with session.post(url + "/v1/schedules", json=body) as r:
                        if r.status in (200, 201):
                            break
                except (aiohttp.ClientError, TimeoutError, OSError):
                    pass
            await asyncio.sleep(0.2)
        else:
            self.refusals["recurring schedule not accepted"] += 1
            self.chains.discard(schedule_id)
            return
        when = start
        while when <= end:
            self.accepted[occurrence(schedule_id, iso(when))] = when.timestamp()
            when += timedelta(seconds=CHAIN_EVERY)

    async def _cancel(self, session: aiohttp.ClientSession, schedule_id: str) -> None:
        nodes = self._serving()
        if not nodes:
            return
        url = self.cluster.nodes[self.rng.choice(nodes)].url
        try:
            async with session.delete(url + f"/v1/schedules/{schedule_id}") as r:
                if r.status == 200:
                    self.cancelled.add(schedule_id)
                elif r.status >= 500:
                    # The store failed mid-call (a 503): the cancel may have
                    # been applied before it did (everything, seed 3: the
                    # update landed, the read after it did not), so its
                    # outcome is unknown, as with no answer at all.
                    self.cancel_unknown.add(schedule_id)
        except (aiohttp.ClientError, TimeoutError, OSError):
            # The node may have cancelled it and been paused or cut off before
            # it answered: neither lost if it never arrives nor cancelled.
            self.cancel_unknown.add(schedule_id)

    async def _verb(
        self,
        session: aiohttp.ClientSession,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int | None, Any, float] | None:
        """One call through a random running node: its status (None: no
        answer), its JSON body (None: not JSON) and when it ended, noted in
        ``verbs`` under ``method``. None: no node to ask, nothing sent."""
        nodes = self._serving()
        if not nodes:
            return None
        url = self.cluster.nodes[self.rng.choice(nodes)].url + path
        what = method if method != "POST" else path.rpartition(":")[2]  # pause, resume
        what = "bulk cancel" if what == "cancel" else what
        try:
            async with session.request(method, url, json=body, headers=headers) as r:
                data = await _json(r)
                status: int | None = r.status
        except (aiohttp.ClientError, TimeoutError, OSError):
            status, data = None, None
        code = data.get("error", {}).get("code") if isinstance(data, dict) else None
        self.verbs[f"{what} {status or 'no answer'}{f' {code}' if code else ''}"] += 1
        return status, data, time.time()

    async def _reschedule(
        self, session: aiohttp.ClientSession, schedule_id: str, version: int | None
    ) -> None:
        """PATCH a new executeAt, half a second to five ahead (later or
        earlier than the one it had), once or twice."""
        times: list[tuple[float, float | None]] = [(self.accepted[schedule_id], None)]
        while True:
            await asyncio.sleep(self.rng.uniform(0.0, VERB_DELAY))
            new = _to_ms(datetime.now(UTC) + timedelta(seconds=self.rng.uniform(0.5, 5.0)))
            # Half with the version the last answer gave: a 412 if it moved since.
            match = version is not None and self.rng.random() < 0.5
            answer = await self._verb(
                session,
                "PATCH",
                f"/v1/schedules/{schedule_id}",
                {"executeAt": iso(new)},
                {"If-Match": f'"{version}"'} if match else None,
            )
            if answer is None:
                return
            status, data, at = answer
            if status is None or status >= 500:
                # Moved or not: its view says after the run.
                self.patch_unknown[schedule_id] = (new.timestamp(), at)
                return
            if status != 200:
                return  # in flight already, final, or changed meanwhile: the time stands
            times.append((new.timestamp(), at))
            self.reschedules[schedule_id] = times
            self.accepted[schedule_id] = new.timestamp()
            version = _version(data)
            if self.rng.random() >= RESCHEDULE_AGAIN:
                return

    async def _pause(self, session: aiohttp.ClientSession, schedule_id: str) -> None:
        """Pause it; resume half of those paused 0.5-3 s later."""
        await asyncio.sleep(self.rng.uniform(0.0, VERB_DELAY))
        answer = await self._verb(session, "POST", f"/v1/schedules/{schedule_id}:pause")
        if answer is None:
            return
        status, _, paused = answer
        if status is None or status >= 500:
            self.pause_unknown[schedule_id] = paused  # paused or not: asked after the run
            return
        if status != 200:
            return  # in flight already, or final: it goes on as it was
        self.pauses[schedule_id] = (paused, None)
        if self.rng.random() >= RESUME_SHARE:
            return
        await asyncio.sleep(self.rng.uniform(0.5, 3.0))
        sent = time.time()
        answer = await self._verb(session, "POST", f"/v1/schedules/{schedule_id}:resume")
        if answer is None:
            return  # never sent: paused for good
        self.pauses[schedule_id] = (paused, sent)
        status, _, done = answer
        if status == 200:
            self.resumed[schedule_id] = done
        else:
            # No answer, a 5xx, or a refusal (a bulk cancel took it while it
            # was paused): its status after the run says.
            self.resume_unknown[schedule_id] = done

    async def _bulk_cancels(self, session: aiohttp.ClientSession) -> None:
        """BULK_CANCELS bulk cancels spread over the load, each of a group of
        its own (so a schedule it took was taken by that one call)."""
        groups = self.rng.sample(range(GROUPS), BULK_CANCELS)
        times = sorted(self.rng.uniform(0.15, 0.85) * self.scenario.duration for _ in groups)
        for group, at in zip(groups, times, strict=True):
            delay = self._started + at - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._bulk_cancel(session, f"g{group}")

    async def _bulk_cancel(self, session: aiohttp.ClientSession, group: str) -> None:
        """Cancel the group's schedules due within BULK_AHEAD s; safe to
        repeat, so tried again on no answer or a 5xx (and while ``more``)."""
        due_before = datetime.now(UTC) + timedelta(seconds=BULK_AHEAD)
        body = {"labels": {"group": group}, "dueBefore": iso(due_before)}
        call: dict[str, Any] = {
            "group": group,
            "at": round(time.time() - self._started, 2),
            "cancelled": 0,
            "answers": [],
        }
        ended = time.time()
        for _ in range(6):
            answer = await self._verb(session, "POST", "/v1/schedules:cancel", body)
            if answer is None:
                await asyncio.sleep(0.2)
                continue
            status, data, ended = answer
            call["answers"].append(status)
            if status == 200 and isinstance(data, dict):
                call["cancelled"] += int(data.get("cancelled") or 0)
                if not data.get("more"):
                    break
            elif status is not None and status < 500 and status != 429:
                break  # refused: asking again changes nothing
            else:
                await asyncio.sleep(0.5)
        self.bulk[group] = ended
        self.bulk_calls.append(call)

    async def _resolve_unknown_cancels(self) -> None:
        """The DELETEs' part of ``_resolve_unknown`` (which settles them too)."""
        await self._resolve_unknown()

    async def _resolve_unknown(self) -> None:
        """Ask the nodes what became of each call whose outcome the run does
        not know, from the schedule's view: a DELETE without an answer (or
        a 5xx) whose schedule is CANCELLED counts as cancelled, like a 200;
        the members of a bulk-cancelled group that are CANCELLED were taken
        by it; a pause without an answer whose schedule is PAUSED counts as
        a pause, a resume without one (or refused) whose schedule is still
        PAUSED as no resume; a PATCH without an answer counts if the view
        has its executeAt. A schedule no node could show stays unknown (a
        PATCH's then counts as either time)."""
        members = {
            schedule_id
            for schedule_id, group in self.groups.items()
            if group in self.bulk and schedule_id not in self.cancelled | self._members_seen
        }
        ids = (
            members
            | self.cancel_unknown
            | set(self.pause_unknown)
            | set(self.resume_unknown)
            | set(self.patch_unknown)
        )
        views = await self._views(sorted(ids))
        self._members_seen |= members & set(views)
        for schedule_id, view in views.items():
            status = view.get("status")
            if schedule_id in self.cancel_unknown:
                self.cancel_unknown.discard(schedule_id)
                if status == "CANCELLED":
                    self.cancelled.add(schedule_id)
            group = self.groups.get(schedule_id)
            if status == "CANCELLED" and schedule_id not in self.cancelled and group in self.bulk:
                self.bulk_cancelled[schedule_id] = self.bulk[group]
            if schedule_id in self.pause_unknown:
                gave_up = self.pause_unknown.pop(schedule_id)
                if status == "PAUSED":
                    self.pauses[schedule_id] = (gave_up, None)
            if schedule_id in self.resume_unknown:
                done = self.resume_unknown.pop(schedule_id)
                if status == "PAUSED":
                    self.pauses[schedule_id] = (self.pauses[schedule_id][0], None)
                elif status != "CANCELLED":  # a bulk cancel took it while it was paused
                    self.resumed[schedule_id] = done
            if schedule_id in self.patch_unknown:
                self._settle_patch(schedule_id, epoch(str(view.get("executeAt"))))
        # What no node could show: a PATCH counts as either time (the last try).
        for schedule_id in set(self.patch_unknown) - set(views):
            if schedule_id in self.unsure:
                continue
            new, gave_up = self.patch_unknown[schedule_id]
            times = self.reschedules.setdefault(schedule_id, [(self.accepted[schedule_id], None)])
            times.append((new, gave_up))
            self.unsure.add(schedule_id)

    def _settle_patch(self, schedule_id: str, execute_at: float | None) -> None:
        """A PATCH without an answer, by the executeAt its schedule's view has."""
        new, gave_up = self.patch_unknown.pop(schedule_id)
        times = self.reschedules.get(schedule_id, [(self.accepted[schedule_id], None)])
        if schedule_id in self.unsure:  # counted as either time the round before
            self.unsure.discard(schedule_id)
            times.pop()
        if execute_at is not None and abs(execute_at - new) <= SAME_TIME:
            times.append((new, gave_up))
            self.reschedules[schedule_id] = times
            self.accepted[schedule_id] = new
        elif execute_at is None or abs(execute_at - times[-1][0]) > SAME_TIME:
            # Neither time (no node should show that): either may go out.
            self.verbs["PATCH settled at neither time"] += 1
            times.append((new, gave_up))
            self.reschedules[schedule_id] = times
            self.unsure.add(schedule_id)

    async def _views(self, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Each schedule's view from the first running node that shows it."""
        found: dict[str, dict[str, Any]] = {}
        limit = asyncio.Semaphore(16)
        timeout = aiohttp.ClientTimeout(total=10)

        async def one(session: aiohttp.ClientSession, schedule_id: str) -> None:
            async with limit:
                for name in self._running():
                    url = self.cluster.nodes[name].url + f"/v1/schedules/{schedule_id}"
                    try:
                        async with session.get(url) as r:
                            body = await _json(r)
                    except (aiohttp.ClientError, TimeoutError, OSError):  # down
                        continue
                    if isinstance(body, dict) and "status" in body:
                        found[schedule_id] = body
                        return

        async with aiohttp.ClientSession(timeout=timeout, headers=self.cluster.headers) as session:
            await asyncio.gather(*(one(session, schedule_id) for schedule_id in ids))
        return found

    async def _load(self, session: aiohttp.ClientSession) -> None:
        total = int(self.scenario.rate * self.scenario.duration)
        limit = asyncio.Semaphore(64)

        async def one(i: int) -> None:
            async with limit:
                await self._post(session, i)

        tasks = [asyncio.create_task(self._chain(session, n)) for n in range(CHAINS)]
        tasks.append(asyncio.create_task(self._bulk_cancels(session)))
        for i in range(total):
            delay = self._started + i / self.scenario.rate - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)

    async def _replay(self, seen: int) -> set[str]:
        """Every schedule id in the topic, read again from the beginning by a
        fresh reader: a record seen live but gone now was lost by the broker
        (a crash of a broker that kept it only in memory)."""
        replay = Recorder(self.cluster.kafka_bootstrap, self.topic, self.chains)
        await replay.start()
        try:
            await until(lambda: len(replay.records) >= seen, 30, "the replay", strict=False)
        finally:
            await replay.stop()
        return {r[0] for r in replay.records}

    async def _faults(self) -> None:
        for step in self.steps:
            delay = self._started + step.at - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._play(step)

    def _store_crashes(self) -> list[Window]:
        """Each database kill, from the kill to the restart, named by its step
        (a skipped one killed nothing, so explains nothing)."""
        return [
            Window(e["step"], self._started + e["at"], self._started + e["at"] + e["lasting"])
            for e in self.events
            if e["do"] == "crash-store" and "skipped" not in e
        ]

    async def _admin_key(self) -> str:
        """An admin tenant and its API key, made in the run's database (the
        operator routes, /v1/cluster among them, need an admin's key)."""
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            self.cluster.mongo_uri, serverSelectionTimeoutMS=5000
        )
        tenants = TenantStore(client[self.cluster.database])
        try:
            for attempt in range(10):
                try:
                    return await tenants.add(
                        Tenant(name=ADMIN_TENANT, admin=True), datetime.now(UTC)
                    )
                except StoreUnavailable:
                    if attempt == 9:
                        raise
                    await asyncio.sleep(1.0)
            raise AssertionError("unreachable")
        finally:
            await client.close()

    async def _failing_checks(self, name: str) -> list[str]:
        checks = (await asyncio.to_thread(self.cluster.readiness, name))["checks"]
        return sorted(check for check, ok in checks.items() if not ok)

    def _note_unready(self) -> None:
        """For each lasting fault, the readiness checks the nodes failed
        while it lasted (from the samples): what an operator's probes saw."""
        for event in self.events:
            if not event["lasting"] or "skipped" in event:
                continue
            start, end = event["at"], event["at"] + event["lasting"]
            seen: dict[str, set[str]] = {}
            for sample in self.samples:
                if start <= sample["t"] <= end:
                    for name, failing in sample.get("unready", {}).items():
                        for check in failing:
                            seen.setdefault(check, set()).add(name)
            event["unready"] = {check: sorted(names) for check, names in sorted(seen.items())}

    async def _statuses(self) -> dict[str, int]:
        """How many schedules the store holds in each status at the end (a
        DELIVERY_FAILED one is a schedule given up on, whatever Kafka got)."""
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            self.cluster.mongo_uri, serverSelectionTimeoutMS=5000
        )
        try:
            rows = await (
                await client[self.cluster.database].schedules.aggregate(
                    [{"$group": {"_id": "$status", "n": {"$sum": 1}}}]
                )
            ).to_list()
        except PyMongoError as exc:  # a figure for the report, not a verdict
            return {f"unknown ({type(exc).__name__})": 0}
        finally:
            await client.close()
        return {str(row["_id"]): int(row["n"]) for row in sorted(rows, key=lambda r: str(r["_id"]))}

    # -- the run -----------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        settler: asyncio.Task[None] | None = None
        try:
            self.cluster.start_servers()
            if self.scenario.auth:
                self.cluster.api_key = await self._admin_key()
            if self.cluster.durable_broker:
                await broker_stores(self.cluster.kafka_bootstrap, 60)
            await asyncio.gather(
                *(self._start(self._new_name()) for _ in range(self.scenario.nodes))
            )
            await until(self.cluster.settled, 90, "the first nodes to settle")
            recorder = Recorder(self.cluster.kafka_bootstrap, self.topic, self.chains)
            await recorder.start()
            timeout = aiohttp.ClientTimeout(total=10)
            settler = asyncio.create_task(self._settler())
            async with aiohttp.ClientSession(
                timeout=timeout, headers=self.cluster.headers
            ) as session:
                self._started = time.time()
                sampling_done = asyncio.Event()
                sampler = asyncio.create_task(self._sample(sampling_done))
                await asyncio.gather(self._load(session), self._faults())
            for name in list(self.paused):  # a pause longer than the run ends with it
                self.cluster.resume(name)
                self.paused.discard(name)
            # Every step's aftermath: heals, restarts, floods, settling.
            await asyncio.gather(*self._background)

            unanswered = len(self.cancel_unknown)
            # Who is owed a delivery: the verbs' unknown outcomes settled, the
            # bulk cancels' takings found. A schedule no node could show now
            # is asked again after the wait.
            await self._resolve_unknown()
            still_paused = {s for s, (_, resumed) in self.pauses.items() if resumed is None}
            expected = (
                set(self.accepted)
                - self.cancelled
                - self.cancel_unknown
                - set(self.bulk_cancelled)
                - still_paused
                - set(self.pause_unknown)
            )

            def all_arrived() -> bool:
                return expected <= {r[0] for r in recorder.records}

            await until(all_arrived, GRACE, "every accepted schedule", strict=False)
            await asyncio.sleep(2)  # late duplicates, if any, arrive too
            await self._resolve_unknown()
            sampling_done.set()
            await sampler
            garbage_failed = self._judge_garbage()
            self._note_unready()
            statuses = await self._statuses()
            await recorder.stop()
            deliveries = list(recorder.deliveries)
            kept = await self._replay(len(recorder.records))
            self.events.sort(key=lambda e: float(e["at"]))
            windows: list[Window] = []
            intended: list[Window] = []
            for event in self.events:
                if "skipped" in event or event["do"] in ("start", "resume", "heal", "reconnect"):
                    continue  # not a fault: no recovery allowance
                event["window"] = len(windows)
                # From a poll interval before (work already due when it hit)
                # to the recovery allowance after the fault ends.
                start = self._started + event["at"] - 1.0
                end = start + 1.0 + event["lasting"] + RECOVERY_ALLOWANCE
                windows.append(Window(event["step"], start, end))
                # What the fault is meant to cost: while it lasts when nobody
                # can do the work (the servers down for all), else the time
                # the others take to take the work over.
                # It opens LATE_OUTSIDE_WINDOWS before the fault: a unit due
                # less than that before may still be in flight when it hits
                # (a round of the embedded store can take seconds) without
                # being that late yet, and then the fault is what makes it so.
                lasting = event["lasting"] if event["do"] in CLUSTER_FAULTS else 0.0
                opens = self._started + event["at"] - LATE_OUTSIDE_WINDOWS
                intended.append(
                    Window(event["step"], opens, start + 1.0 + lasting + RECOVERY_ALLOWANCE)
                )
            # The broker stalling on its own, as most nodes saw it.
            intended += broker_stalls(self.samples, self._started, most=True)
            result = check(
                self.accepted,
                self.cancelled,
                deliveries,
                windows,
                buckets=BUCKETS,
                kept=kept,
                store_crashes=self._store_crashes(),
                broker_faults=[
                    *(
                        windows[e["window"]]
                        for e in self.events
                        if e["do"] in BROKER_FAULTS and "window" in e
                    ),
                    *broker_stalls(self.samples, self._started),
                ],
                intended=intended,
                changes=Changes(
                    bulk_cancelled=self.bulk_cancelled,
                    paused={s: [span] for s, span in self.pauses.items()},
                    resumed=self.resumed,
                    moved=self.reschedules,
                    unsure=frozenset(self.unsure),
                ),
            )
            result.update(
                scenario=self.scenario.name,
                auth=self.scenario.auth,
                cluster_keys=bool(self.cluster_keys),
                skewed_at_end=dict(self.skewed),
                statuses=statuses,
                stranded=statuses.get("IN_FLIGHT", 0),
                garbage_failures=len(garbage_failed),
                garbage_failed=garbage_failed,
                chains=len(self.chains),
                unfenced=self.unfenced,
                network=self.network,
                seed=self.seed,
                settings=asdict(self.scenario),
                refused=sum(self.refusals.values()),
                cancels_unanswered=unanswered,
                verbs=dict(sorted(self.verbs.items())),
                bulk_calls=self.bulk_calls,
                # Verbs whose outcome no node could settle after the run.
                unsettled=len(self.cancel_unknown)
                + len(self.pause_unknown)
                + len(self.resume_unknown)
                + len(self.unsure),
                refusals=dict(self.refusals.most_common(10)),
                events=self.events,
                samples=self.samples,
                started=self._started,
            )
            result["passed"] = passed(result)
            return result
        finally:
            if settler is not None:
                settler.cancel()
            self.cluster.close()


def _to_ms(when: datetime) -> datetime:
    """``when`` cut to whole milliseconds, as the API stores times."""
    return when.replace(microsecond=when.microsecond // 1000 * 1000)


async def _json(response: aiohttp.ClientResponse) -> Any:
    """The answer's body as JSON; None when it is not JSON."""
    try:
        return json.loads(await response.text())
    except ValueError:
        return None


def _version(view: Any) -> int | None:
    """The ``version`` of a schedule's view, when it has one."""
    version = view.get("version") if isinstance(view, dict) else None
    return version if isinstance(version, int) else None


def _retry_after(header: str | None, default: float) -> float:
    """Seconds a Retry-After header asks for (at most RETRY_AFTER_CAP)."""
    try:
        return min(RETRY_AFTER_CAP, max(default, float(header))) if header else default
    except ValueError:
        return default


def render(result: dict[str, Any]) -> str:
    def ms(summary: dict[str, Any]) -> str:
        return (
            f"p50 {summary['p50'] * 1000:.0f} ms, p99 {summary['p99'] * 1000:.0f} ms, "
            f"max {summary['max'] * 1000:.0f} ms ({summary['count']})"
        )

    lines = [
        f"{result['scenario']} (seed {result['seed']}"
        f"{', nodes UNFENCED' if result['unfenced'] else ''}): {result['accepted']} accepted, "
        f"{result['cancelled']} cancelled ({result.get('cancels_unanswered', 0)} DELETEs "
        f"unanswered, asked again after the run), {result['refused']} refused, "
        f"{result['delivered']} delivered; accepted includes {result['occurrences']} "
        f"occurrences of {result['chains']} recurring schedules",
        f"lost {result['lost']}, early {result['early']} "
        f"(read before due {result.get('early_received', 0)}), "
        f"cancelled but delivered {result['cancelled_delivered']}, "
        f"delivered while paused {result.get('paused_delivered', 0)}, "
        f"rescheduled at the wrong time {result.get('rescheduled_wrong_time', 0)}, "
        f"duplicates {result['duplicates']} ({_kinds(result['duplicates_by_kind'])}), "
        f"stale claims {result['stale_claims']}, gone from the topic {result['vanished']}, "
        f"unexpected occurrences {result['unexpected_occurrences']}",
        _verb_line(result),
        *_broker_reuse_lines(result),
        *_duplicate_lines(result),
        f"network: {result['network']}; auth {'on' if result.get('auth') else 'off'}, "
        f"cluster keys {'on' if result.get('cluster_keys') else 'off'}",
        f"lateness overall: {ms(result['lateness_s'])}",
        f"lateness outside fault windows: {ms(result['lateness_outside_windows_s'])}",
        f"late by more than {LATE_OUTSIDE_WINDOWS:g} s outside each fault's intended window "
        f"(its hand-over, or all of it when nobody could work): "
        f"{result.get('late_outside_windows', 0)}"
        + (
            f" ({', '.join(result['late_outside_windows_ids'][:5])} ...)"
            if result.get("late_outside_windows")
            else ""
        ),
        "schedules in the store at the end: "
        + (", ".join(f"{k} {v}" for k, v in result.get("statuses", {}).items()) or "none"),
    ]
    for event in result["events"]:
        settled = event.get("settled_after_s")
        line = f"  at {event['at']:6.1f} s  {event['step']:<28} {event.get('node') or ''}"
        if "skipped" in event:
            line += f"  skipped: {event['skipped']}"
        elif "skipped_settle" in event:
            line += f"  (not timed: {event['skipped_settle']})"
        else:
            line += f"  settled after {settled} s" if settled is not None else "  did not settle"
        if event.get("filter_not_set_on"):
            line += f"  (gossip filter not set on {', '.join(event['filter_not_set_on'])})"
        if "clock_offset_s" in event:
            line += f"  (store clock - its clock: {event['clock_offset_s']:+g} s)"
        lines.append(line)
        if "garbage" in event:
            lines.append(f"{'':13}{_garbage_line(event['garbage'])}")
        if event.get("unready"):
            failing = "; ".join(f"{k} on {', '.join(v)}" for k, v in event["unready"].items())
            lines.append(f"{'':13}/readyz failed meanwhile: {failing}")
        if "window" in event:
            window = result["windows"][event["window"]]
            lines.append(f"{'':13}lateness in its window: {ms(window['lateness_s'])}")
    for reason, count in result["refusals"].items():
        lines.append(f"refused after 6 tries ({count}): {reason}")
    if result.get("garbage_failures"):
        lines.append(
            f"garbage gossip failed ({result['garbage_failures']}): the target was declared "
            "dead, or its dropped-packet counters did not rise: "
            + ", ".join(result["garbage_failed"])
        )
    lines.append("PASSED" if result["passed"] else "FAILED: an invariant broke (see above)")
    return "\n".join(lines)


def _garbage_line(report: dict[str, Any]) -> str:
    """A flood's figures: what was sent, what the target counted dropped, verdict."""
    if "passed" not in report:
        return "garbage: not judged"
    dropped = ", ".join(f"{k} {v:g}" for k, v in report.get("dropped", {}).items()) or "none"
    streams = sum(report.get("streams", {}).values())
    verdict = "kept alive" if report["passed"] else "FAILED"
    if report.get("declared_dead_by"):
        verdict += f", declared dead by {', '.join(report['declared_dead_by'])}"
    if report.get("suspected_by"):
        verdict += f", suspected by {', '.join(report['suspected_by'])}"
    errors = [report[k] for k in ("metrics_before", "metrics_after") if k in report]
    return (
        f"garbage: {report.get('datagrams', 0)} datagrams, {streams} streams; dropped: "
        f"{dropped}; {verdict}" + (f" ({'; '.join(errors)})" if errors else "")
    )


def _verb_line(result: dict[str, Any]) -> str:
    """What the verbs did: counts of the schedules each changed, and every
    answer they got (``verbs``), e.g. ``pause 409 in_flight 2``."""
    calls = result.get("bulk_calls", [])
    answers = ", ".join(f"{k} {v}" for k, v in result.get("verbs", {}).items()) or "none"
    return (
        f"schedules changed by the verbs: {result.get('rescheduled', 0)} rescheduled, "
        f"{result.get('paused', 0)} paused ({result.get('resumed', 0)} resumed, "
        f"{result.get('still_paused', 0)} still paused at the end), "
        f"{result.get('bulk_cancelled', 0)} taken by {len(calls)} bulk cancels "
        f"(answered {sum(c['cancelled'] for c in calls)} cancelled), "
        f"{result.get('unsettled', 0)} outcomes unsettled; answers: {answers}"
    )


def _kinds(by_kind: dict[str, int]) -> str:
    return ", ".join(f"{kind} {count}" for kind, count in by_kind.items())


def broker_stalls(
    samples: Sequence[dict[str, Any]], started: float, *, most: bool = False
) -> list[Window]:
    """The spells in which some node's /readyz (``most``: more than half of
    the nodes sampled) said the broker was not answering, injected or not,
    as windows (epoch seconds) that open STALL_LEAD before the first sample
    that showed one and close a second after the last. Samples come once a
    second; a gap of more than two closes a spell. With ``most`` a broker
    cut of one node is not a spell: that node's trouble, not the broker's."""
    spells: list[list[float]] = []
    for sample in samples:
        unready = sample.get("unready", {})
        saying = sum(1 for failing in unready.values() if "broker" in failing)
        heard = len(set(sample.get("held", {})) | set(unready))
        if not saying or (most and saying * 2 <= heard):
            continue
        at = float(sample["t"])
        if spells and at - spells[-1][1] <= 2.0:
            spells[-1][1] = at
        else:
            spells.append([at, at])
    return [
        Window("broker stalled (/readyz)", started + first - STALL_LEAD, started + last + 1.0)
        for first, last in spells
    ]


def _broker_reuse_lines(result: dict[str, Any]) -> list[str]:
    """Say so when the broker served one offset with two records: it may have
    overwritten an acknowledged one, which then reads as lost."""
    reused = result.get("offsets_reused", 0)
    if not reused:
        return []
    shown = ", ".join(result["offsets_reused_ids"][:10])
    return [
        f"the broker served {reused} offsets with two different records ({shown}"
        f"{', ...' if reused > 10 else ''}): it gave an offset twice, so a record it "
        "acknowledged may have been overwritten before it was read"
    ]


def _duplicate_lines(result: dict[str, Any]) -> list[str]:
    """One line per duplicated unit, failures first: its kind, the fault
    that explains it, and each copy as token/attempt, time into the run,
    value digest and partition:offset."""
    explained = result["duplicates_explained"]
    lines = []
    for entry in explained[:SHOWN_DUPLICATES]:
        why = f" ({entry['window']})" if entry["window"] else ""
        copies = "; ".join(
            f"t{c['token']}/a{c['attempt']} at {c['at'] - result['started']:.3f} s "
            f"#{c['digest'] or '?'} {c['partition']}:{c['offset']}"
            for c in entry["copies"]
        )
        lines.append(f"  {entry['id']}: {entry['kind']}{why}: {copies}")
    if result["duplicates"] > len(lines):
        lines.append(
            f"  ... {result['duplicates'] - len(lines)} more duplicated units "
            f"(summary.json lists {len(explained)})"
        )
    return lines


def write(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    (out / "report.html").write_text(render_html(result))


def main(
    scenario: Scenario,
    seed: int,
    out: Path | None,
    keep: Path | None,
    *,
    unfenced: bool = False,
    namespaces: bool = True,
    external: tuple[str, str] | None = None,
) -> int:
    async def play(data_dir: Path) -> dict[str, Any]:
        return await Run(
            scenario, data_dir, seed, unfenced=unfenced, namespaces=namespaces, external=external
        ).run()

    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        result = asyncio.run(play(keep))
    else:
        with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
            result = asyncio.run(play(Path(tmp)))
    print(render(result))
    if out is not None:
        write(result, out)
        print(f"wrote {out / 'summary.json'} and {out / 'report.html'}")
    return 0 if result["passed"] else 1
