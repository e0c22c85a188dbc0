"""Does the broker keep every record it acknowledged while several producers
write one topic at once, through crashes and stalls of the broker?
``python -m chaos broker-check``.

The chaos checker counts a schedule as lost when the store says it was
delivered (marked only after the broker's acknowledgement) and the topic
does not hold it. That verdict is only as good as the broker: one that
gives an offset to two records overwrites one of them. This check takes the
scheduler out of the question: N producers (separate producers, acks=all,
not idempotent: Tansu refuses idempotence) write keyed records to one topic
at once (one partition, or ``--partitions P``, the key picking it as a
node's records do), then a reader reads every partition whole and compares
with what was acknowledged. Each producer sends one record per request and
waits for its acknowledgement, or with ``--in-flight K`` sends K records
together (linger 2 ms) and waits for all of their acknowledgements, as a
node publishes a batch; ``--batch-gap`` spaces its batches out.

Faults hit the broker while they write, spread over the round: the k-th of
F faults comes once k/(F+2) of the records are settled (acknowledged or
failed) and at least GAP seconds after the previous one ended, so the
producers write before, between and after them.

- ``--crashes N``: N times, SIGKILL the durable broker, keep it down DOWN
  seconds and restart it on the same port and storage, as the chaos
  ``crash-broker`` does (``LocalCluster.crash_broker``: the same argv and
  environment). The producers connected before stay and reconnect on
  their own.
- ``--pause SECONDS``: after the crashes, SIGSTOP the broker, and SIGCONT
  SECONDS later, as the chaos ``pause`` of Kafka does (alone, it comes
  once a third of the records are settled).

A request the broker does not answer within the producer's request timeout
(``--request-timeout``) is retried by the producer, as any is, until that
timeout has passed since the record was sent; a record whose send then
fails counts as not acknowledged. Only records whose send returned an
offset count as acknowledged, and each missing one is shown with the
partition and offset it was given, when its acknowledgement came relative
to the faults, and what the partition holds at that offset now.

By default it checks the embedded durable broker (Tansu 0.6 keeping its
topics in SeaweedFS, what ``crash-broker`` needs); ``--memory`` the
in-memory one (no ``--crashes``: it would forget everything),
``--kafka-bootstrap`` any Kafka (no faults there: the check does not own
that broker's process). A broker fit for the chaos verdicts reports 0
missing and 0 offsets given to two records.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from chaos.lab import objectstore
from node.ops import embedded

HOST = "127.0.0.1"
# Seconds without a new record after which the reader stops: past the
# embedded broker's metadata cache (5 s).
QUIET = 8.0
# Seconds a crashed broker stays down (the soak's were 2.6 and 4.8).
DOWN = 3.0
# Seconds at least between the end of a fault and the next one.
GAP = 3.0
# Records a second each producer writes with --crashes unless told
# (--batch-gap): unpaced, they are all written before the first restart is
# over.
CRASH_PACE = 80.0
# An acknowledgement this many seconds after a fault ended counts as one the
# broker sent on its way back.
RIGHT_AFTER = 1.0
# Missing records shown in detail, per round.
SHOWN = 10
# Seconds between looks at whether the next fault is due.
POLL = 0.05

Place = tuple[int, int]  # (partition, offset)


@dataclass(frozen=True)
class Options:
    producers: int
    records: int  # per producer and round
    in_flight: int = 1
    request_timeout: float | None = None  # None: aiokafka's
    partitions: int = 1
    batch_gap: float = 0.0
    crashes: int = 0
    pause: float = 0.0

    @property
    def faults(self) -> list[str]:
        return ["crash"] * self.crashes + (["pause"] if self.pause > 0 else [])

    @property
    def fault_names(self) -> list[str]:
        crashes = [f"crash {n}" for n in range(1, self.crashes + 1)]
        return crashes + (["pause 1"] if self.pause > 0 else [])


@dataclass(frozen=True)
class Ack:
    partition: int  # what the broker said the record got
    offset: int
    at: float  # time.monotonic() when the send returned

    @property
    def place(self) -> Place:
        return self.partition, self.offset


@dataclass(frozen=True)
class Fault:
    kind: str  # "crash" or "pause"
    number: int  # among the round's faults of its kind, from 1
    acknowledged: int  # acknowledgements before it
    settled: int  # sends acknowledged or failed before it
    start: float  # time.monotonic() of the SIGKILL or SIGSTOP
    end: float  # and of the port open again, or of the SIGCONT

    @property
    def name(self) -> str:
        return f"{self.kind} {self.number}"

    @property
    def signal_name(self) -> str:
        return "SIGKILL" if self.kind == "crash" else "SIGSTOP"

    @property
    def back(self) -> str:
        return "restart" if self.kind == "crash" else "SIGCONT"

    def line(self, right_after: int) -> str:
        """How long it lasted, when it came, and ``right_after``: the
        acknowledgements within RIGHT_AFTER s of its end."""
        return (
            f"  {self.name}: {self.end - self.start:.1f} s from the {self.signal_name} to the "
            f"{self.back}, after {self.acknowledged} acks ({self.settled} sends settled); "
            f"{right_after} acks within {RIGHT_AFTER:g} s of the {self.back}"
        )


@dataclass(frozen=True)
class Round:
    acknowledged: int
    failed: int  # sends that raised: not acknowledged
    read: int
    read_by_partition: list[int]
    offsets_reused: int  # offsets served with more than one record
    missing: list[str]  # acknowledged, not in the topic
    details: list[str]  # a line for each missing record (SHOWN at most)
    read_twice: int  # records in the topic more than once (a retry's copy)
    misplaced: int  # acknowledged, in the topic, but not where acknowledged
    acks_shared: int  # places acknowledged to two records
    failed_present: int  # sends that failed, records there all the same
    faults: list[Fault]
    not_made: list[str]  # faults not begun: the producers had finished
    right_after: list[int]  # per fault, acknowledgements within RIGHT_AFTER s of its end
    failed_by_phase: Counter[str]
    missing_by_phase: Counter[str]

    def lines(self, number: int) -> list[str]:
        faults = zip(self.faults, self.right_after, strict=True)
        return [
            self._head(number),
            self._anomalies(),
            *(fault.line(after) for fault, after in faults),
            *self._not_made(),
            *self._phases(),
            *(f"  missing {line}" for line in self.details),
        ]

    def _head(self, number: int) -> str:
        shown = ", ".join(self.missing[:5]) + (", ..." if len(self.missing) > 5 else "")
        return (
            f"round {number}: {self.acknowledged} acknowledged, {self.failed} sends failed, "
            f"{self.read} read, {self.offsets_reused} offsets given to two records, "
            f"{len(self.missing)} missing" + (f" ({shown})" if self.missing else "")
        )

    def _anomalies(self) -> str:
        line = (
            f"  {self.read_twice} read twice, {self.misplaced} acknowledged at another offset, "
            f"{self.acks_shared} offsets acknowledged to two records, "
            f"{self.failed_present} failed sends there all the same"
        )
        if len(self.read_by_partition) > 1:
            line += "; read by partition " + ", ".join(map(str, self.read_by_partition))
        return line

    def _not_made(self) -> list[str]:
        if not self.not_made:
            return []
        return [
            f"  not made: {', '.join(self.not_made)} (the producers had finished; "
            "more --records or a longer --batch-gap)"
        ]

    def _phases(self) -> list[str]:
        if not self.faults:
            return []
        counted = (("failed", self.failed_by_phase), ("missing", self.missing_by_phase))
        return [
            f"  {label} by phase: " + ", ".join(f"{k}: {v}" for k, v in counts.items())
            for label, counts in counted
            if counts
        ]


def default_batch_gap(crashes: int, in_flight: int) -> float:
    """Seconds between a producer's batches unless told: CRASH_PACE records
    a second with crashes, unpaced without."""
    return in_flight / CRASH_PACE if crashes > 0 else 0.0


class Broker:
    """The embedded broker this check runs, restarted after a crash on the
    same port and storage with the same argv and environment, as
    ``LocalCluster.crash_broker`` restarts it."""

    def __init__(self, argv: list[str], env: dict[str, str], log: IO[bytes], port: int) -> None:
        self.argv, self.env, self.log, self.port = argv, env, log, port
        self.process = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        return embedded.spawn(self.argv, log=self.log, env=self.env)

    def wait_ready(self) -> None:
        embedded.wait_for_port(HOST, self.port, 60, self.process)

    async def crash(self, down_for: float) -> tuple[float, float]:
        """SIGKILL, stay down ``down_for`` s, restart, wait for the port;
        returns when it was killed and when it listened again."""
        self.process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        await asyncio.to_thread(self.process.wait)
        await asyncio.sleep(down_for)
        self.process = await asyncio.to_thread(self._spawn)
        await asyncio.to_thread(self.wait_ready)
        return killed, time.monotonic()

    async def pause(self, seconds: float) -> tuple[float, float]:
        """SIGSTOP, SIGCONT ``seconds`` later (also when cancelled)."""
        process = self.process
        process.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            await asyncio.sleep(seconds)
        finally:
            process.send_signal(signal.SIGCONT)
        return stopped, time.monotonic()

    def discard(self) -> None:
        embedded.discard(self.process)


class Tally:
    """What the producers were told, record by record."""

    def __init__(self) -> None:
        self.acks: dict[str, Ack] = {}
        self.failures: dict[str, float] = {}  # record: time.monotonic() of the failure

    @property
    def settled(self) -> int:
        return len(self.acks) + len(self.failures)


def fault_due(k: int, count: int, total: int) -> float:
    """Sends settled before the k-th (from 1) of ``count`` faults is due:
    k/(count+2) of the ``total``, so that records are written before the
    first fault, between each two, and after the last."""
    return total * k / (count + 2)


async def wait_for_turn(tally: Tally, due: float, ready_at: float, done: asyncio.Event) -> bool:
    """Wait until ``due`` sends are settled and time.monotonic() has reached
    ``ready_at``; False if the producers are ``done`` first."""
    while not done.is_set():
        if tally.settled >= due and time.monotonic() >= ready_at:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), POLL)
    return False


async def strike(broker: Broker, kind: str, options: Options) -> tuple[float, float]:
    """One fault of ``kind`` on the broker; when it began and ended."""
    if kind == "crash":
        return await broker.crash(DOWN)
    return await broker.pause(options.pause)


async def inject(
    broker: Broker, options: Options, tally: Tally, done: asyncio.Event
) -> list[Fault]:
    """The round's faults, each once its share of the records is settled and
    GAP s after the last one ended; none begun once the producers are done."""
    faults: list[Fault] = []
    kinds = options.faults
    total = options.producers * options.records
    ready_at = 0.0
    for k, kind in enumerate(kinds, start=1):
        if not await wait_for_turn(tally, fault_due(k, len(kinds), total), ready_at, done):
            break
        acknowledged, settled = len(tally.acks), tally.settled
        start, end = await strike(broker, kind, options)
        number = sum(1 for f in faults if f.kind == kind) + 1
        faults.append(Fault(kind, number, acknowledged, settled, start, end))
        ready_at = end + GAP
    return faults


async def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()


def producer_settings(bootstrap: str, options: Options) -> dict[str, Any]:
    """Each producer's configuration: acks=all, not idempotent."""
    settings: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "acks": "all",
        # One record per request; a batch's records share requests, with
        # the node's linger.
        "linger_ms": 0 if options.in_flight == 1 else 2,
    }
    if options.request_timeout is not None:
        settings["request_timeout_ms"] = int(options.request_timeout * 1000)
    return settings


async def send(producer: AIOKafkaProducer, topic: str, value: str, tally: Tally) -> None:
    """One record, keyed by itself; its acknowledgement or failure tallied."""
    data = value.encode()
    try:
        future = await producer.send(topic, data, key=data)
        metadata = await future
    except (KafkaError, TimeoutError, OSError):
        tally.failures[value] = time.monotonic()
        return
    tally.acks[value] = Ack(metadata.partition, metadata.offset, time.monotonic())


async def produce(
    number: int, topic: str, settings: dict[str, Any], options: Options, tally: Tally
) -> None:
    """Producer ``number``'s records, p{number}-0 on, ``options.in_flight``
    at a time, ``options.batch_gap`` s between batches."""
    producer = AIOKafkaProducer(**settings)
    await producer.start()
    try:
        for start in range(0, options.records, options.in_flight):
            if start and options.batch_gap > 0:
                await asyncio.sleep(options.batch_gap)
            batch = range(start, min(start + options.in_flight, options.records))
            await asyncio.gather(*(send(producer, topic, f"p{number}-{i}", tally) for i in batch))
    finally:
        await producer.stop()


async def write(
    bootstrap: str, topic: str, options: Options, tally: Tally, broker: Broker | None
) -> list[Fault]:
    """All the producers' records, with the faults (given a ``broker``)
    among them; the faults made."""
    settings = producer_settings(bootstrap, options)
    done = asyncio.Event()
    faulting: asyncio.Task[list[Fault]] | None = None
    if broker is not None and options.faults:
        faulting = asyncio.create_task(inject(broker, options, tally, done))
    try:
        await asyncio.gather(
            *(produce(n, topic, settings, options, tally) for n in range(options.producers))
        )
        done.set()  # the fault under way ends; no other begins
        return await faulting if faulting is not None else []
    finally:
        if faulting is not None and not faulting.done():
            faulting.cancel()  # SIGCONTs a broker paused still


async def one_round(
    bootstrap: str, topic: str, options: Options, broker: Broker | None = None
) -> Round:
    await create_topic(bootstrap, topic, options.partitions)
    tally = Tally()
    faults = await write(bootstrap, topic, options, tally, broker)
    served = await read_all(bootstrap, topic, options.partitions, tally)
    not_made = options.fault_names[len(faults) :]
    return judge(tally, served, faults, not_made, options.partitions)


async def read_all(
    bootstrap: str, topic: str, partitions: int, tally: Tally
) -> list[tuple[int, int, str]]:
    """Every (partition, offset, record) the topic serves from its start."""
    assigned = [TopicPartition(topic, p) for p in range(partitions)]
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await reader.start()
    served: list[tuple[int, int, str]] = []
    try:
        reader.assign(assigned)
        await reader.seek_to_beginning(*assigned)
        # The embedded broker answers a fetch with the end offset it cached
        # (for up to 5 s), not the one it has: a read stopped at that end
        # would call records missing that are only not yet counted. Read
        # until everything acknowledged is there or nothing new comes.
        quiet_since = time.monotonic()
        seen: set[str] = set()
        while not tally.acks.keys() <= seen and time.monotonic() - quiet_since < QUIET:
            for part, batch in (await reader.getmany(*assigned, timeout_ms=500)).items():
                if batch:
                    quiet_since = time.monotonic()
                for record in batch:
                    value = (record.value or b"").decode()
                    served.append((part.partition, record.offset, value))
                    seen.add(value)
    finally:
        await reader.stop()
    return served


def _last(at: float, faults: list[Fault]) -> Fault | None:
    """The last fault begun by ``at``."""
    return next((f for f in reversed(faults) if f.start <= at), None)


def phase(at: float, faults: list[Fault]) -> str:
    """When ``at`` falls: before the faults, during one, or after one ended."""
    last = _last(at, faults)
    if last is None:
        return "before the faults"
    return f"during {last.name}" if at <= last.end else f"after {last.name}"


def when(at: float, faults: list[Fault]) -> str:
    """``at`` relative to the fault it follows ("" with no faults)."""
    last = _last(at, faults)
    if last is None:
        return "before the faults" if faults else ""
    if at <= last.end:
        return f"during {last.name}, {at - last.start:.2f} s in"
    return f"{at - last.end:+.2f} s from the {last.back} of {last.name}"


Held = dict[Place, list[str]]  # place: the records served there, in order
Where = dict[str, list[Place]]  # record: the places it was served at, in order


def index(served: list[tuple[int, int, str]]) -> tuple[Held, Where]:
    """What the reader was served, looked up by place and by record."""
    held: defaultdict[Place, list[str]] = defaultdict(list)
    where: defaultdict[str, list[Place]] = defaultdict(list)
    for partition, offset, value in served:
        held[partition, offset].append(value)
        where[value].append((partition, offset))
    return dict(held), dict(where)


def missing_records(acks: dict[str, Ack], where: Where) -> list[str]:
    """The records acknowledged and never served, in the order of the
    places they were given."""
    return sorted(acks.keys() - where.keys(), key=lambda value: acks[value].place)


def describe_missing(value: str, ack: Ack, held: Held, faults: list[Fault]) -> str:
    """Where a missing record was acknowledged, when, and what is there now."""
    moment = when(ack.at, faults)
    there = ", ".join(held.get(ack.place, [])) or "nothing"
    return (
        f"{value}: given partition {ack.partition} offset {ack.offset}"
        + (f", acknowledged {moment}" if moment else "")
        + f"; that offset holds {there}"
    )


def read_by_partition(served: list[tuple[int, int, str]], partitions: int) -> list[int]:
    counts = Counter(partition for partition, _, _ in served)
    return [counts[n] for n in range(partitions)]


def reused_offsets(held: Held) -> int:
    """Places served with more than one record."""
    return sum(1 for values in held.values() if len(values) > 1)


def read_twice(where: Where) -> int:
    """Records served at more than one place."""
    return sum(1 for places in where.values() if len(places) > 1)


def misplaced(acks: dict[str, Ack], where: Where) -> int:
    """Records served, but none of them where they were acknowledged."""
    return sum(1 for value, ack in acks.items() if value in where and ack.place not in where[value])


def shared_acks(acks: dict[str, Ack]) -> int:
    """Places acknowledged to more than one record."""
    given = Counter(ack.place for ack in acks.values())
    return sum(1 for count in given.values() if count > 1)


def acks_right_after(acks: dict[str, Ack], fault: Fault) -> int:
    """Acknowledgements within RIGHT_AFTER s after the fault ended."""
    return sum(1 for ack in acks.values() if 0 <= ack.at - fault.end <= RIGHT_AFTER)


def by_phase(moments: Iterable[float], faults: list[Fault]) -> Counter[str]:
    return Counter(phase(at, faults) for at in moments)


def judge(
    tally: Tally,
    served: list[tuple[int, int, str]],
    faults: list[Fault],
    not_made: list[str],
    partitions: int,
) -> Round:
    """Compare what the producers were told with what the reader was served."""
    acks = tally.acks
    held, where = index(served)
    missing = missing_records(acks, where)
    return Round(
        acknowledged=len(acks),
        failed=len(tally.failures),
        read=len(served),
        read_by_partition=read_by_partition(served, partitions),
        offsets_reused=reused_offsets(held),
        missing=missing,
        details=[describe_missing(v, acks[v], held, faults) for v in missing[:SHOWN]],
        read_twice=read_twice(where),
        misplaced=misplaced(acks, where),
        acks_shared=shared_acks(acks),
        failed_present=sum(1 for value in tally.failures if value in where),
        faults=faults,
        not_made=not_made,
        right_after=[acks_right_after(acks, fault) for fault in faults],
        failed_by_phase=by_phase(tally.failures.values(), faults),
        missing_by_phase=by_phase((acks[v].at for v in missing), faults),
    )


async def check(bootstrap: str, options: Options, rounds: int, broker: Broker | None = None) -> int:
    lost = 0
    for number in range(1, rounds + 1):
        topic = f"broker-check-{os.getpid()}-{number}"
        result = await one_round(bootstrap, topic, options, broker)
        print("\n".join(result.lines(number)), flush=True)
        lost += len(result.missing)
    print(f"{lost} acknowledged records missing in {rounds} rounds")
    return 1 if lost else 0


def refusal(options: Options, memory: bool, bootstrap: str | None) -> str | None:
    """Why the check cannot fault the broker it is given, or None."""
    if bootstrap is not None and options.faults:
        return "--crashes and --pause need the embedded broker, not --kafka-bootstrap"
    if memory and options.crashes:
        return "--crashes needs the durable broker: from memory it forgets everything"
    return None


def main(options: Options, rounds: int, memory: bool, bootstrap: str | None) -> int:
    refused = refusal(options, memory, bootstrap)
    if refused is not None:
        print(f"broker-check: {refused}", file=sys.stderr)
        return 2
    if bootstrap is not None:
        return asyncio.run(check(bootstrap, options, rounds))
    return check_embedded(options, rounds, memory)


def check_embedded(options: Options, rounds: int, memory: bool) -> int:
    """The check on the embedded broker, over SeaweedFS unless ``memory``,
    started in a scratch directory and discarded after."""
    with (
        tempfile.TemporaryDirectory(prefix="broker-check-") as scratch,
        contextlib.ExitStack() as stack,
    ):
        data = Path(scratch)
        log = stack.enter_context((data / "servers.log").open("ab"))
        env = dict(os.environ)
        argv = embedded.kafka_argv(HOST, port := embedded.free_port(HOST))
        if not memory:
            store, s3_port = objectstore.start(data / "s3", log)
            stack.callback(embedded.discard, store)
            env.update(objectstore.broker_env(s3_port))
            argv += ["--storage-engine", objectstore.STORAGE_URL]
        broker = Broker(argv, env, log, port)
        stack.callback(broker.discard)
        broker.wait_ready()
        print(f"broker: Tansu {'in memory' if memory else 'over SeaweedFS (durable)'}")
        return asyncio.run(check(f"{HOST}:{port}", options, rounds, broker))
