"""Plays a scenario (``chaos/scenario.py``) against a local cluster of real
node processes on the embedded stack, under load, and checks the outcome
(``chaos/checker.py``).

The load posts ``rate`` schedules per second through random ready nodes, due
0-4 s ahead (one in twenty already due); one in fifty is cancelled a moment
later. A 200 on the DELETE counts it as cancelled; a DELETE with no answer
(the node was paused or cut off mid-request, and may have cancelled it) or a
5xx (the store failed mid-call, perhaps after the cancel landed) is settled
after the run by asking a node for the schedule. Each fault gets
a window from its start to the end of the recovery allowance (failure
detection plus a lease TTL); lateness is reported inside each window and
outside all of them. After each fault the runner also measures how long the
cluster takes to settle again (every node agrees on the members, every
bucket held by its placed owner).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp

from chaos.checker import Window, check, occurrence, passed
from chaos.cluster import LocalCluster, get_json
from chaos.harness import Recorder, broker_stores, iso, until
from chaos.network import Namespaces, probe, sweep
from chaos.report import render_html
from chaos.scenario import FIELDS, Scenario, Step

# Failure detection at the lan preset (p99 about 8 s) plus the lease TTL (6 s),
# with room to spare.
RECOVERY_ALLOWANCE = 20.0
CANCEL_SHARE = 0.02
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
        # unfenced: nodes run without the fence (CHAOS_MODE=unfenced), to show
        # that the checker catches what the fence prevents.
        self.unfenced = unfenced
        self.settle_within = settle_within
        # Partitions cut real links where network namespaces work; elsewhere
        # (or with namespaces=False) the nodes' chaos-mode gossip filter.
        network = None
        self.network = "loopback (no partition in this scenario)"
        filtered = False
        if any(step.partitions for step in scenario.steps):
            sweep()
            reason = probe() if namespaces else "turned off (--no-namespaces)"
            if external:
                # Nodes in namespaces reach only the bridge, not servers
                # elsewhere (no NAT tools on the kind of host this targets).
                reason = "the servers are external"
            if reason is None:
                network = Namespaces()
            else:
                filtered = True
        mode = "unfenced" if unfenced else "on" if filtered else "off"
        self.cluster = LocalCluster(
            data_dir,
            env={"CHAOS_MODE": mode},
            network=network,
            external=external,
            durable_broker=any(step.do == "crash-broker" for step in scenario.steps),
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
        self._partitions = 0  # in force now
        self.accepted: dict[str, float] = {}  # unit (a schedule or an occurrence) -> due
        self.chains: set[str] = set()  # recurring schedules created
        self.cancelled: set[str] = set()
        # DELETEs without an answer (timed out, connection cut): cancelled or
        # not is asked again after the run, when a node can say.
        self.cancel_unknown: set[str] = set()
        self.refusals: Counter[str] = Counter()
        self.events: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []  # each node's view, once a second
        self._started = 0.0
        self._names = 0
        self._background: list[asyncio.Task[None]] = []

    # -- nodes -------------------------------------------------------------------

    def _new_name(self) -> str:
        self._names += 1
        return f"node-{self._names}"

    async def _start(self, name: str) -> None:
        self.cluster.start_node(name)
        await asyncio.to_thread(self.cluster.wait_ready, name)
        self.ready.add(name)

    def _running(self) -> list[str]:
        return sorted(
            n.name
            for n in self.cluster.nodes.values()
            if n.alive and n.name in self.ready and n.name not in self.paused | self.isolated
        )

    def _pick(self, step: Step) -> str | None:
        running = self._running()
        if step.target == "random":
            # Never the last node: a fault, not an outage.
            return self.rng.choice(running) if len(running) > 1 else None
        return step.target if step.target in running else None

    # -- faults ------------------------------------------------------------------

    def _halves(self) -> list[set[str]]:
        names = self._running()
        self.rng.shuffle(names)
        return [set(names[: len(names) // 2]), set(names[len(names) // 2 :])]

    async def _play(self, step: Step) -> None:
        # Steps on the servers, on the whole cluster or adding a node have
        # no target to pick.
        target = self._pick(step) if "target" in FIELDS[step.do] else None
        event = self._event(step.do, step.label, lasting=step.lasting)
        if step.do == "start":
            target = self._new_name()
            event["node"] = target
            self._background.append(asyncio.create_task(self._start(target)))
        elif step.do in ("crash-store", "pause-broker", "crash-broker") and self.cluster.external:
            event["skipped"] = "the servers are external: the runner cannot crash or pause them"
        elif step.do == "crash-store":
            await asyncio.to_thread(self.cluster.crash_store, step.lasting)
        elif step.do == "pause-broker":
            await asyncio.to_thread(self.cluster.pause_broker, step.lasting)
        elif step.do == "crash-broker":
            await asyncio.to_thread(self.cluster.crash_broker, step.lasting)
        elif step.do == "split":
            halves = self._halves()
            event["node"] = " | ".join(",".join(sorted(half)) for half in halves)
            await self._partition(event, step, halves)
        elif target is None:
            event["skipped"] = "no such running node (or only one left)"
        elif step.do == "kill":
            self.ready.discard(target)
            self.cluster.kill(target)
            if step.restart:
                self._background.append(asyncio.create_task(self._start(target)))
        elif step.do == "stop":
            self.ready.discard(target)
            await asyncio.to_thread(self.cluster.stop_node, target)
        elif step.do == "restart":
            self.ready.discard(target)
            await asyncio.to_thread(self.cluster.stop_node, target)
            self._background.append(asyncio.create_task(self._start(target)))
        elif step.do == "pause":
            self.paused.add(target)
            self.cluster.pause(target)
            self._background.append(asyncio.create_task(self._resume_later(target, step)))
        elif step.do == "isolate":
            self.isolated.add(target)
            others = {n for n in self.cluster.nodes if n != target}
            await self._partition(event, step, [{target}, others], isolate=target)

        event.setdefault("node", target)
        self.events.append(event)
        if step.do == "split":
            # Each half settles on its own view; the cluster settles after the heal.
            event["skipped_settle"] = "the halves cannot agree until the heal"
        elif "skipped" not in event:
            self._background.append(asyncio.create_task(self._time_to_settle(event)))

    def _event(self, do: str, label: str, *, lasting: float = 0.0) -> dict[str, Any]:
        return {
            "at": round(time.time() - self._started, 2),
            "do": do,
            "step": label,
            "lasting": lasting,
        }

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
        self._background.append(asyncio.create_task(self._heal_later(step)))

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

    async def _heal_later(self, step: Step) -> None:
        self._partitions += 1
        await asyncio.sleep(step.lasting)
        self._partitions -= 1
        unreached = await asyncio.to_thread(self.cluster.heal)
        self.isolated.clear()
        event = self._event("heal", "heal")
        event["node"] = None
        if unreached:
            event["filter_not_set_on"] = unreached
        self.events.append(event)
        await self._time_to_settle(event)

    async def _time_to_settle(self, event: dict[str, Any]) -> None:
        began = time.time()
        await asyncio.sleep(1.0)  # let the fault be noticed first
        deadline = began + self.settle_within
        while time.time() < deadline:
            unreachable = self.paused | self.isolated
            settled = await asyncio.to_thread(self.cluster.settled, unreachable)
            if settled:
                event["settled_after_s"] = round(time.time() - began, 2)
                return
            await asyncio.sleep(0.5)
        event["settled_after_s"] = None

    async def _sample(self, stop: asyncio.Event) -> None:
        """Buckets held and alive members seen by every running node, each second."""
        while not stop.is_set():
            sample: dict[str, Any] = {
                "t": round(time.time() - self._started, 2),
                "held": {},
                "sees": {},
            }
            for name in self._running():
                try:
                    view = await asyncio.to_thread(self.cluster.cluster_view, name)
                    held = view["buckets"]["held"]
                    sees = sum(1 for m in view["members"] if m["state"] == "alive")
                except (OSError, ValueError, KeyError, TypeError):  # down, or an error body
                    continue
                sample["held"][name] = held
                sample["sees"][name] = sees
            self.samples.append(sample)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    # -- load --------------------------------------------------------------------

    async def _post(self, session: aiohttp.ClientSession, i: int) -> None:
        lead = 0.0 if self.rng.random() < 0.05 else self.rng.uniform(1.0, 4.0)
        execute_at = datetime.now(UTC) + timedelta(seconds=lead)
        execute_at = execute_at.replace(microsecond=execute_at.microsecond // 1000 * 1000)
        schedule_id = f"s{i}"
        body = {"id": schedule_id, "topic": self.topic, "executeAt": iso(execute_at), "payload": i}
        last = ""
        for _ in range(6):
            nodes = self._running()
            if not nodes:
                await asyncio.sleep(0.2)
                continue
            url = self.cluster.nodes[self.rng.choice(nodes)].url
            try:
                async with session.post(url + "/v1/schedules", json=body) as r:
                    if r.status in (200, 201):
                        self.accepted[schedule_id] = execute_at.timestamp()
                        break
                    last = f"HTTP {r.status} {(await r.text())[:200]}"
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                last = f"{type(exc).__name__} {exc}"[:200]
            await asyncio.sleep(0.1)
        else:
            self.refusals[last] += 1
            return
        if lead > 0.5 and self.rng.random() < CANCEL_SHARE:
            await self._cancel(session, schedule_id)

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
            nodes = self._running()
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
        nodes = self._running()
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

    async def _resolve_unknown_cancels(self) -> None:
        """Ask a node what became of each DELETE that got no answer (or a 5xx): a
        schedule it reports CANCELLED counts as cancelled, like a 200."""
        for schedule_id in sorted(self.cancel_unknown):
            status = await self._status(schedule_id)
            if status is not None:
                self.cancel_unknown.discard(schedule_id)
            if status == "CANCELLED":
                self.cancelled.add(schedule_id)

    async def _status(self, schedule_id: str) -> str | None:
        """A schedule's status from the first running node that knows it."""
        for name in self._running():
            url = self.cluster.nodes[name].url + f"/v1/schedules/{schedule_id}"
            try:
                body = await asyncio.to_thread(get_json, url)
            except (OSError, ValueError):  # down, or not JSON
                continue
            if isinstance(body, dict) and "status" in body:
                return str(body["status"])
        return None

    async def _load(self, session: aiohttp.ClientSession) -> None:
        total = int(self.scenario.rate * self.scenario.duration)
        limit = asyncio.Semaphore(64)

        async def one(i: int) -> None:
            async with limit:
                await self._post(session, i)

        tasks = [asyncio.create_task(self._chain(session, n)) for n in range(CHAINS)]
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
        for step in self.scenario.steps:
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

    # -- the run -----------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        try:
            self.cluster.start_servers()
            if self.cluster.durable_broker:
                await broker_stores(self.cluster.kafka_bootstrap, 60)
            await asyncio.gather(
                *(self._start(self._new_name()) for _ in range(self.scenario.nodes))
            )
            await until(self.cluster.settled, 90, "the first nodes to settle")
            recorder = Recorder(self.cluster.kafka_bootstrap, self.topic, self.chains)
            await recorder.start()
            timeout = aiohttp.ClientTimeout(total=10)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                self._started = time.time()
                sampling_done = asyncio.Event()
                sampler = asyncio.create_task(self._sample(sampling_done))
                await asyncio.gather(self._load(session), self._faults())
            for name in list(self.paused):  # a pause longer than the run ends with it
                self.cluster.resume(name)
                self.paused.discard(name)
            await asyncio.gather(*self._background)

            # Waited for without the unanswered DELETEs: those are settled after.
            expected = set(self.accepted) - self.cancelled - self.cancel_unknown

            def all_arrived() -> bool:
                return expected <= {r[0] for r in recorder.records}

            await until(all_arrived, GRACE, "every accepted schedule", strict=False)
            await asyncio.sleep(2)  # late duplicates, if any, arrive too
            unanswered = len(self.cancel_unknown)
            await self._resolve_unknown_cancels()
            sampling_done.set()
            await sampler
            await recorder.stop()
            deliveries = list(recorder.deliveries)
            kept = await self._replay(len(recorder.records))
            self.events.sort(key=lambda e: float(e["at"]))
            windows: list[Window] = []
            for event in self.events:
                if "skipped" in event or event["do"] in ("start", "resume", "heal"):
                    continue  # not a fault: no recovery allowance
                event["window"] = len(windows)
                # From a poll interval before (work already due when it hit)
                # to the recovery allowance after the fault ends.
                start = self._started + event["at"] - 1.0
                end = start + 1.0 + event["lasting"] + RECOVERY_ALLOWANCE
                windows.append(Window(event["step"], start, end))
            result = check(
                self.accepted,
                self.cancelled,
                deliveries,
                windows,
                buckets=BUCKETS,
                kept=kept,
                store_crashes=self._store_crashes(),
                broker_faults=[
                    windows[e["window"]]
                    for e in self.events
                    if e["do"] in BROKER_FAULTS and "window" in e
                ],
            )
            result.update(
                scenario=self.scenario.name,
                chains=len(self.chains),
                unfenced=self.unfenced,
                network=self.network,
                seed=self.seed,
                settings=asdict(self.scenario),
                refused=sum(self.refusals.values()),
                cancels_unanswered=unanswered,
                refusals=dict(self.refusals.most_common(10)),
                events=self.events,
                samples=self.samples,
                started=self._started,
                passed=passed(result),
            )
            return result
        finally:
            self.cluster.close()


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
        f"lost {result['lost']}, early {result['early']}, "
        f"cancelled but delivered {result['cancelled_delivered']}, "
        f"duplicates {result['duplicates']} ({_kinds(result['duplicates_by_kind'])}), "
        f"stale claims {result['stale_claims']}, gone from the topic {result['vanished']}, "
        f"unexpected occurrences {result['unexpected_occurrences']}",
        *_duplicate_lines(result),
        f"network: {result['network']}",
        f"lateness overall: {ms(result['lateness_s'])}",
        f"lateness outside fault windows: {ms(result['lateness_outside_windows_s'])}",
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
        lines.append(line)
        if "window" in event:
            window = result["windows"][event["window"]]
            lines.append(f"{'':13}lateness in its window: {ms(window['lateness_s'])}")
    for reason, count in result["refusals"].items():
        lines.append(f"refused after 6 tries ({count}): {reason}")
    lines.append("PASSED" if result["passed"] else "FAILED: an invariant broke (see above)")
    return "\n".join(lines)


def _kinds(by_kind: dict[str, int]) -> str:
    return ", ".join(f"{kind} {count}" for kind, count in by_kind.items())


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
