"""What the run sees of the cluster besides the API's answers: every record
of the topic (``Recorder``), each node's view and readiness once a second
(``Sampler``), and what those samples say: the spells in which the nodes
said the broker stalled (written into the history for the checker), the
readiness checks failed during each fault, and each flood of garbage
gossip's verdict."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from aiokafka import ConsumerRecord

from chaos.history import BROKER_STALL, NEMESIS, NOTE, OBSERVER, Delivery, History, occurrence
from chaos.lab.cluster import LocalCluster
from chaos.lab.harness import epoch, until
from node.ops.tail import topic_consumer

# The broker may also stall on its own (the embedded one does, for tens of
# seconds under load): a send it never answered fails after the producer's
# request timeout (10 s), and only then does the node's /readyz say
# `broker: false`. A stall seen so counts as a broker fault from this long
# before the first sample that showed it.
STALL_LEAD = 12.0
# A flood of garbage gossip is judged from its start to this long after its
# end: a node the garbage had stalled is declared dead seconds later.
GARBAGE_JUDGED = 5.0
STALL_LABEL = "broker stalled (/readyz)"
# The longest the fresh reader at the end reads the topic for (seconds).
REPLAY_WITHIN = 30.0


class Recorder:
    """Every record of the topic, from the beginning, named by the unit the
    checker judges: the schedule id, or for the ids in ``recurring`` one
    occurrence (``chaos.history.occurrence``)."""

    def __init__(self, bootstrap: str, topic: str, recurring: Collection[str] = ()) -> None:
        self.consumer = topic_consumer(bootstrap, topic)
        self.recurring = recurring
        # Each record with the evidence the checker weighs a duplicate by
        # (value digest, partition, offset) ...
        self.deliveries: list[Delivery] = []
        # ... and as the plain tuple chaos/rebalance.py unpacks.
        self.records: list[tuple[str, int, int, float]] = []  # unit, token, attempt, at
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self._task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        while True:
            batch = await self.consumer.getmany(timeout_ms=200, max_records=5000)
            received = time.time()
            for part in batch.values():
                for record in part:
                    delivery = self._delivery(record, received)
                    self.deliveries.append(delivery)
                    self.records.append(
                        (delivery.schedule_id, delivery.token, delivery.attempt, delivery.at)
                    )

    def _delivery(self, record: ConsumerRecord[bytes, bytes], received: float) -> Delivery:
        headers = dict(record.headers)
        unit = headers["schedule-id"].decode()
        if unit in self.recurring:
            unit = occurrence(unit, headers["execute-at"].decode())
        return Delivery(
            unit,
            int(headers["fence-token"]),
            int(headers["attempt"]),
            record.timestamp / 1000,
            # Equal for a producer's resend of one batch: the bytes it sent twice.
            digest=hashlib.blake2b(record.value or b"", digest_size=8).hexdigest(),
            partition=record.partition,
            offset=record.offset,
            received=received,
            # The time it was published for: a rescheduled schedule had others.
            execute_at=epoch(headers.get("execute-at", b"").decode()),
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.consumer.stop()


async def replay(
    bootstrap: str,
    topic: str,
    recurring: Collection[str],
    seen: int,
    wanted: Collection[str] = (),
) -> list[Delivery]:
    """Every record in the topic, read again from the beginning by a fresh
    reader: a record seen live but gone now was lost by the broker (a crash
    of a broker that kept it only in memory), and one the live reader was
    never served is in the topic all the same. It reads as many records as
    the live reader was served and every unit of ``wanted`` (owed, and not
    seen live), or for REPLAY_WITHIN at most (the broker over object storage
    shows a record it took during a stall a few seconds late)."""
    reader = Recorder(bootstrap, topic, recurring)
    await reader.start()
    missing = set(wanted)

    def read_enough() -> bool:
        return len(reader.records) >= seen and not missing - {r[0] for r in reader.records}

    try:
        await until(read_enough, REPLAY_WITHIN, "the replay", strict=False)
    finally:
        await reader.stop()
    return list(reader.deliveries)


def served_late(live: Iterable[Delivery], replayed: Iterable[Delivery]) -> tuple[Delivery, ...]:
    """The records the fresh reader found that the live one was never served
    (by unit, bytes and place: the same record read by both is one)."""
    seen = {d.record for d in live}
    return tuple(d for d in replayed if d.record not in seen)


class Sampler:
    """Buckets held, alive members and the members not alive seen by every
    running node, and the readiness checks each one fails, each second."""

    def __init__(
        self,
        cluster: LocalCluster,
        running: Callable[[], list[str]],
        store_cut: Collection[str],
    ) -> None:
        self.cluster = cluster
        self.started = 0.0  # epoch seconds: the samples' times are from it
        self.running = running
        self.store_cut = store_cut
        self.samples: list[dict[str, Any]] = []
        # Running nodes whose last sampled readiness failed its store check.
        self.store_unready: set[str] = set()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self, started: float) -> None:
        """Sample from now, each sample's time in seconds from ``started``."""
        self.started = started
        self._task = asyncio.create_task(self.run(self._stop))

    async def stop(self) -> None:
        """Stop after the sample under way, if any."""
        self._stop.set()
        if self._task is not None:
            await self._task

    def serving(self, running: list[str]) -> list[str]:
        """The running nodes a load balancer would send a call to: those whose
        readiness, as last sampled, does not fail its store check (a node
        that lost its route to the database some other way than a planned
        cut, or has not yet reconnected after one). All running ones if
        that leaves none."""
        serving = [n for n in running if n not in self.store_unready]
        return serving or running

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            sample: dict[str, Any] = {
                "t": round(time.time() - self.started, 2),
                "held": {},
                "sees": {},
                "not_alive": {},
                "unready": {},
            }
            for name in self.running():
                await self._one(name, sample)
            # A node cut from the store takes no calls (its views read the
            # store) but still answers its probes, which should say so.
            for name in sorted(self.store_cut):
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    if failing := await self._failing_checks(name):
                        sample["unready"][name] = failing
            self.samples.append(sample)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    async def _one(self, name: str, sample: dict[str, Any]) -> None:
        try:
            failing = await self._failing_checks(name)
        except (OSError, ValueError, KeyError, TypeError):  # down, or an error body
            return
        # Asked first: a node without its store answers no view.
        if "store" in failing:
            self.store_unready.add(name)
        else:
            self.store_unready.discard(name)
        try:
            view = await asyncio.to_thread(self.cluster.cluster_view, name)
            held = view["buckets"]["held"]
            states = {m["id"]: m["state"] for m in view["members"]}
        except (OSError, ValueError, KeyError, TypeError):  # down, or an error body
            return
        if failing:
            sample["unready"][name] = failing
        sample["held"][name] = held
        sample["sees"][name] = sum(1 for state in states.values() if state == "alive")
        others = {m: state for m, state in states.items() if state != "alive"}
        if others:
            sample["not_alive"][name] = others

    async def _failing_checks(self, name: str) -> list[str]:
        checks = (await asyncio.to_thread(self.cluster.readiness, name))["checks"]
        return sorted(check for check, ok in checks.items() if not ok)


# -- what the samples say (pure) ---------------------------------------------------


def broker_stalls(samples: Sequence[Mapping[str, Any]], *, most: bool = False) -> list[list[float]]:
    """The spells in which some node's /readyz (``most``: more than half of
    the nodes sampled) said the broker was not answering, injected or not,
    as [first, last] sample times (seconds into the run). Samples come once
    a second; a gap of more than two closes a spell. With ``most`` a broker
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
    return spells


def note_stalls(history: History, samples: Sequence[Mapping[str, Any]]) -> None:
    """Write the broker's stalls into the history, as windows (epoch
    seconds) that open STALL_LEAD before the first sample that showed one
    and close a second after the last: the spells any node saw, and (marked
    ``most``) those most nodes saw."""
    started = history.started
    for most in (False, True):
        for first, last in broker_stalls(samples, most=most):
            history.event(
                OBSERVER,
                BROKER_STALL,
                time.time(),
                label=STALL_LABEL,
                start=started + first - STALL_LEAD,
                end=started + last + 1.0,
                most=most,
            )


def note_unready(history: History, samples: Sequence[Mapping[str, Any]]) -> None:
    """For each lasting fault, the readiness checks the nodes failed while
    it lasted: what an operator's probes saw."""
    for op in history.events(NEMESIS):
        event = op.value
        if op.f == NOTE or not event.get("lasting") or "skipped" in event:
            continue
        start, end = event["at"], event["at"] + event["lasting"]
        seen: dict[str, set[str]] = {}
        for sample in samples:
            if start <= sample["t"] <= end:
                for name, failing in sample.get("unready", {}).items():
                    for check in failing:
                        seen.setdefault(check, set()).add(name)
        unready = {check: sorted(names) for check, names in sorted(seen.items())}
        history.event(NEMESIS, NOTE, time.time(), of=op.index, unready=unready)


def judge_floods(history: History, samples: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each flood's verdict, from the views sampled while it ran: no other
    node that saw the target alive when the flood began declared it dead (a
    node still counted dead after an earlier fault proves nothing either
    way), and its dropped counters rose. Notes each verdict in the history;
    returns the labels of the floods that failed."""
    reports: dict[int, dict[str, Any]] = {}
    labels: dict[int, tuple[str, str]] = {}
    for op in history.events(NEMESIS):
        if "garbage" in op.value:
            index = int(op.value.get("of", op.index))
            reports[index] = dict(op.value["garbage"])
            if op.f != NOTE:
                labels[index] = (op.value["step"], op.value["node"])
    failed = []
    for index, report in reports.items():
        label, target = labels[index]
        report.update(_flood_verdict(report, target, samples))
        history.event(NEMESIS, NOTE, time.time(), of=index, garbage=report)
        if not report["passed"]:
            failed.append(label)
    return failed


def _flood_verdict(
    report: Mapping[str, Any], target: str, samples: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    if "judged" not in report:  # the flood never ran to its end
        return {"passed": False}
    start, end = report["judged"]
    before = [s for s in samples if start - 3.0 <= s["t"] <= start]
    already = {
        viewer
        for viewer, states in (before[-1]["not_alive"] if before else {}).items()
        if target in states
    }
    seen: dict[str, set[str]] = {"dead": set(), "suspect": set()}
    for sample in samples:
        if start < sample["t"] <= end + GARBAGE_JUDGED:
            for viewer, states in sample.get("not_alive", {}).items():
                state = states.get(target)
                if viewer == target or viewer in already or state is None:
                    continue
                seen["dead" if state in ("dead", "left") else "suspect"].add(viewer)
    return {
        "not_alive_to_at_start": sorted(already),
        "declared_dead_by": sorted(seen["dead"]),
        "suspected_by": sorted(seen["suspect"]),
        "passed": not seen["dead"] and sum(report["dropped"].values()) > 0,
    }
