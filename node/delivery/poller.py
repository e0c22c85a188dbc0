"""The bucket poller: delivers the due schedules of the buckets this node
holds leases on (DESIGN.md "Bucket poller").

One loop serves all held buckets, and reads them one by one through a book
of what it knows of each (``due_book.py``): a bucket is read when it was
just gained, when a hint says it holds work sooner than its view, when its
cached due work ran out behind a full read, and when it is idle: just
before its next due time while the store's change feed tells of every write
that could make work due sooner (``due_feed.py``), else once a poll
interval. So a node reads its own buckets only, a bucket with work in hand
costs the store nothing until the work is delivered, and the future backlog
costs nothing at all. Ownership stays per bucket: every write carries that
bucket's token.

Each round:

1. write what the HTTP calls started by earlier rounds answered; settle
   what a failed round left (completions to write, claims to put back);
   make due again what an older owner left in flight in buckets just
   gained, and in every held bucket once a while;
2. read the buckets the book asks for (due now or within a poll interval),
   and start the read past the slow lanes when the book wants one (it runs
   beside the rounds: ``past_lanes.py``);
3. choose the batch from the due work in the book, shared fairly among
   tenants (when a view is full, tenants absent from it are asked for their
   own earliest due work), leaving unclaimed what must wait (a Kafka record
   while the broker is down, a call to a host with HTTP_MAX_PER_HOST calls
   out, a flow key whose rate or parallelism is spent: ``flow_gate.py``
   asks the store for the keys' slots and slices, a round trip for all
   keys each); its size opens from a small first claim after an idle round up to
   the batch size (``claim_window.py``), so a burst's first records leave
   after a small claim;
4. claim it in one bulk write (PENDING -> IN_FLIGHT, with the token, only if
   still due and no newer token wrote it);
5. drop anything whose lease's local deadline passed during the claim; end
   what must not go out (``Rules.plan``: past its deadline, a missed
   occurrence to skip); start the HTTP calls (each is written by a later
   round when it answers, so no endpoint holds a round); publish the Kafka
   records and wait for the acks;
6. complete each record as ``outcomes.py`` decides (``Rules.decide``:
   DELIVERED, back to PENDING with backoff or after the destination's wait,
   DELIVERY_FAILED past the retry limit or refused, to the dead letter when
   configured, a recurring one's next occurrence), fenced by the token;
7. sleep until the next due time in the book or the next read it wants,
   but at least until the batch linger since the round began has passed; a
   hint (a schedule due sooner), a lease change or a call's answer cuts the
   sleep short.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

import structlog

from node.config import NodeConfig
from node.delivery.claim_window import ClaimWindow
from node.delivery.due_book import DueBook, Read
from node.delivery.due_feed import DueFeed
from node.delivery.fairness import by_turn, fair_share, next_window
from node.delivery.flow_gate import FlowGate, flow_key
from node.delivery.history_writer import HistoryWriter
from node.delivery.leases import LeaseManager
from node.delivery.outcomes import Decided, Rules
from node.delivery.past_lanes import PastRead
from node.delivery.sink import Failed, Sink, Trouble
from node.delivery.sinks.http import HttpSink
from node.delivery.sinks.kafka import METADATA_DEADLINE, KafkaPublisher
from node.delivery.sinks.router import Router, dead_letter_item
from node.delivery.urgent import Urgent, UrgentWatch
from node.errors import SchedulerError
from node.metrics import NodeMetrics
from node.schedule.destination import MAX_TIMEOUT, http_host, is_http
from node.schedule.model import DEFAULT_PRIORITY, Status, priority_of
from node.schedule.payload import LARGE, needs_fetch, payload_size
from node.schedule.record import Record, build_record
from node.schedule.times import aware, utcnow
from node.schedule.trace import REQUEST_ID_FIELD
from node.schedule.webhook import HttpCall, build_call
from node.store.contract import (
    MAX_TENANTS_PER_ROUND,
    Attempt,
    Claimed,
    Completion,
    DueChange,
    FlowGates,
    Outcome,
    Schedules,
)
from node.store.flow import SLOT_TERM

log = structlog.get_logger(__name__)

# Schedules held in the book at once, as batches: a backlog is read this
# many batches at a time, not whole into memory.
READ_AHEAD = 4
# Reads in flight at once (the embedded store serves them one at a time
# anyway; a real MongoDB serves them in parallel).
CONCURRENT_READS = 8
# Held buckets searched for what an older owner (or a lost round of ours)
# left in flight, besides when gained: each once a RECOVERY_SWEEP, in turn,
# in slices of at least SWEEP_SLICE, but never more than SWEEP_RATE a second:
# the sweep costs the store at most that (one read a bucket) whatever B, and
# a bucket is searched once in max(30 s, held / 2) (128 s for 256 buckets on
# one node, 34 minutes for 4,096; a gained bucket at once). It is what an
# idle node asks per bucket: at 4 a second, 3 nodes holding 4,096 buckets
# searched 1.4 times as often as at 256 (bench idle), at 2 the same.
RECOVERY_SWEEP = 30.0
SWEEP_RATE = 2.0
SWEEP_SLICE = 8
# The default of how long a claim may stay IN_FLIGHT under this node's own
# token before the sweep takes it for stranded (seconds; see longest_round).
STRANDED_AFTER = 120.0


def longest_round(store_timeout: float, publish_timeout: float) -> float:
    """The longest a round can hold a claim, in seconds: the claim, two
    publishes (the batch, its dead letters) and three writes (marks,
    failures, put-backs) each at its deadline, and as much again for a write
    the server still applies after the client gave up on it."""
    return 2 * (4 * store_timeout + 2 * publish_timeout)


# At start, how long the loop waits for the change feed to open before its
# first reads (seconds; then it polls until the feed opens).
FEED_OPEN_WAIT = 5.0
# While the broker is down, the wait before probing it again: doubling from
# the first to the last (seconds).
BROKER_BACKOFF = 0.5
BROKER_BACKOFF_MAX = 10.0
# How long the answers of HTTP calls gather before the loop is woken to
# write them (seconds): at most this much later a completion is written
# and a call's slot taken again; the call itself has gone already.
ANSWER_GATHER = 0.05
# At stop, how long the HTTP calls in flight may take to answer before
# they are left IN_FLIGHT for the bucket's next owner to recover (seconds).
CALLS_GRACE = 5.0
# Payload bytes published at once: a batch of large payloads goes in parts
# of this size, each fetched just before it is published.
PUBLISH_PART_BYTES = 8 * 1024 * 1024
# The registered tenants (whose names label the per-tenant series) are read
# again when a batch holds a tenant they do not name, at most once in this
# many seconds (the tenant directory's own cache is as long): a node
# delivering for unregistered tenants asks no more than that, and a tenant
# registered meanwhile is named by its next batch.
TENANT_NAMES_EVERY = 5.0


class BucketPoller:
    def __init__(
        self,
        store: Schedules,
        leases: LeaseManager,
        publisher: KafkaPublisher,
        metrics: NodeMetrics,
        *,
        node_id: str,
        batch_size: int,
        poll_interval: float,
        rules: Rules,
        batch_linger: float = 0.0,
        dead_letter_topic: str = "",
        history: HistoryWriter | None = None,
        tenant_names: Callable[[], Awaitable[Sequence[str]]] | None = None,
        registered_tenants: Callable[[], Awaitable[Sequence[str]]] | None = None,
        wall: Callable[[], datetime] = utcnow,
        monotonic: Callable[[], float] = time.monotonic,
        stranded_after: float = STRANDED_AFTER,
        http: Sink[HttpCall] | None = None,
        http_per_host: int = 16,
        dead_letter_url: str = "",
        circuit_open: Callable[[str], bool] | None = None,
        watch_changes: bool = False,
        flow: FlowGates | None = None,
    ) -> None:
        self.store = store
        # The cluster-wide counts of flow control, and what this node knows
        # of its keys (None: schedules' flow control is not enforced; a
        # node always has it, the twins of some tests have not).
        self.flow = flow
        self.gate = FlowGate(SLOT_TERM)
        # Whether the last batch held only work of flow keys (no linger then).
        self._flow_in_hand = False
        # Follow the store's change feed (WATCH_CHANGES): a bucket with
        # nothing due is then not read before its next due time.
        self.feed = DueFeed(store, self, monotonic=monotonic) if watch_changes else None
        # Set when the first reads may go: the feed opened, or stopping.
        self._may_read = asyncio.Event()
        # Longer than any round can hold a claim (node/process.py derives it
        # from the store's and the broker's deadlines): a schedule IN_FLIGHT
        # under our own token for longer belongs to no round any more.
        self.stranded_after = timedelta(seconds=stranded_after)
        self.leases = leases
        self.publisher = publisher
        self.metrics = metrics
        self.node_id = node_id
        self.poll_interval = poll_interval
        self.batch_linger = batch_linger
        self.rules = rules
        self.dead_letter_topic = dead_letter_topic
        self.dead_letter_url = dead_letter_url
        self.http = http
        self.http_per_host = http_per_host
        # Whether a URL's host has its circuit open (the HTTP sink's
        # breakers): its schedules wait unclaimed until a probe may go.
        self.circuit_open = circuit_open
        # HTTP calls started and not yet written, by id; the answers in since
        # the last round; the tasks still waiting for one.
        self._calls: dict[str, Claimed] = {}
        self._answers: list[tuple[Claimed, Failed | None]] = []
        self._call_tasks: set[asyncio.Task[None]] = set()
        self._calls_changed = asyncio.Event()
        self._answers_wake: asyncio.TimerHandle | None = None
        # Whether the last batch left due work in hand it could have taken
        # (past the claim window): the next round comes at once.
        self._more_in_hand = False
        self.history = history
        # The tenants whose due work a backlog could hide (None: no fairness,
        # plain oldest first, kept to measure what fairness buys).
        self.tenant_names = tenant_names
        self._tenant_turn = 0
        # The registered tenants (None: every tenant but the default is
        # "other" in the metrics), and when they were last read (monotonic).
        self.registered_tenants = registered_tenants
        self._tenants_read_at: float | None = None
        self.book = DueBook(refresh=poll_interval, budget=batch_size * READ_AHEAD)
        self.window = ClaimWindow(batch_size)
        self.wall = wall
        self.monotonic = monotonic
        self._wake = asyncio.Event()
        self._wake_at: datetime | None = None
        # The sweep's place: when it last searched, and the last bucket it did.
        self._swept_at: float | None = None
        self._swept_last = -1
        self._stopping = False
        self._idle = asyncio.Event()  # set between rounds
        self._idle.set()
        # Buckets of the batch claimed and not yet completed in this round.
        self._busy: set[int] = set()
        self._claimed: list[Claimed] = []  # and the claims themselves
        # What a failed round left behind (a store error after its claim):
        # completions decided but not written, and claims that may have been
        # made but were never published. Settled first thing next round.
        self._unsettled: list[Completion] = []
        self._unclaimed: list[Claimed] = []
        # Set while the broker is found down: no claim before this
        # (monotonic), and then only after a probe answers.
        self._broker_retry_at: float | None = None
        self._broker_backoff = 0.0
        # Schedules above the default priority, kept until due: then into
        # the work in hand, ahead of a backlog (``urgent.py``).
        self._urgent = UrgentWatch()
        # The read past the slow lanes, while one is out (``_start_past_read``).
        self._past_task: asyncio.Task[None] | None = None

    # -- signals from the rest of the node ---------------------------------------

    def hint(self, bucket: int, due_at: datetime | None) -> None:
        """A schedule of a held bucket falls due at ``due_at`` (None: not
        said): wake by then, and read the bucket again if its view would not
        have seen it (``DueBook.hint``)."""
        sooner = self.book.hint(bucket, due_at, now=self.wall())
        if sooner or self._wake_at is None or (due_at is not None and due_at < self._wake_at):
            self._wake.set()

    # -- the change feed (``due_feed.py``) -----------------------------------------

    def feed_opened(self) -> None:
        self._may_read.set()
        self.book.watch(True)
        self.metrics.change_feed_open.set(1)
        self._wake.set()

    def feed_lost(self) -> None:
        self.book.watch(False)
        self.metrics.change_feed_open.set(0)
        self._wake.set()

    def changed(self, change: DueChange) -> None:
        self.metrics.change_feed_events.inc()
        # Not what the book knows already: a schedule it holds or took, a
        # write of this node's own that it told the book itself (``_own_writes``).
        if self.book.news(
            change.bucket, change.schedule_id, change.due_at, inserted=change.inserted
        ):
            self.hint(change.bucket, change.due_at)
            if change.inserted and (change.priority or DEFAULT_PRIORITY) > DEFAULT_PRIORITY:
                self._urgent.told(Urgent(change.schedule_id, change.bucket, change.due_at))

    def accepted(self, doc: dict[str, Any]) -> None:
        """This node stored ``doc`` in a held bucket: into the book, and wake
        by its due time."""
        self.book.accepted(doc)
        due_at = aware(doc["dueAt"])
        if priority_of(doc) > DEFAULT_PRIORITY:
            self._urgent.told(Urgent(str(doc["_id"]), int(doc["bucket"]), due_at, doc))
        if self._wake_at is None or due_at < self._wake_at:
            self._wake.set()

    def leases_changed(self) -> None:
        self._wake.set()

    def in_flight(self) -> list[Claimed]:
        """The claims this node holds and has not written back yet: the
        round's batch being delivered, the HTTP calls out, and what a failed
        round left to settle. Due, and not delivered yet (the metrics)."""
        claims = {c.id: c for c in self._claimed}
        claims.update((c.id, c) for c in self._calls.values())
        claims.update((c.id, c) for c in self._unclaimed)
        claims.update((c.claimed.id, c.claimed) for c in self._unsettled)
        return list(claims.values())

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        self._may_read.set()  # a node stopped as it starts waits for no feed

    async def quiesce(self, buckets: set[int] | None = None) -> None:
        """Return once no claimed work in ``buckets`` (default: any) is in flight.

        A bucket with nothing claimed may go at once: a claim still on its
        way finds its lease gone at the post-claim check and publishes
        nothing, leaving the schedules for the next owner to recover.
        """
        if buckets is None or self._busy & buckets:
            await self._idle.wait()
        while self._calls and (
            buckets is None or {c.bucket for c in self._calls.values()} & buckets
        ):
            # HTTP calls still out in these buckets: each is written by a
            # round after it answers (or given up at stop).
            self._calls_changed.clear()
            await self._calls_changed.wait()

    # -- the loop -------------------------------------------------------------

    async def run(self) -> None:
        feed = None if self.feed is None else asyncio.create_task(self.feed.run(), name="due-feed")
        if feed is not None:
            # The first reads after the feed has opened: read before, every
            # bucket would be read again when it opens (B reads twice).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FEED_OPEN_WAIT):
                    await self._may_read.wait()
        try:
            await self._loop()
        finally:
            if feed is not None:
                feed.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await feed

    async def _loop(self) -> None:
        failures = 0
        while not self._stopping:
            started = self.monotonic()
            try:
                delay = await self.run_once()
                failures = 0
            except Exception as exc:
                # A bug must not silently end delivery for this node: log it
                # loudly and keep going; the leases stay fenced either way.
                failures += 1
                delay = min(self.poll_interval * 2**failures, 10.0)
                if isinstance(exc, SchedulerError) and exc.retriable:
                    log.warning("store error in poller", error=str(exc), retry_in=delay)
                else:
                    log.exception("unexpected error in poller", retry_in=delay)
            # Linger: schedules falling due within the next few milliseconds
            # wait to share one round (one query, one claim, one mark)
            # instead of costing three round trips each. Hints do not cut
            # this short; stopping waits for it, at most the linger.
            linger = self.batch_linger - (self.monotonic() - started)
            opens = self.gate.next_open(self.monotonic())
            if opens is not None:
                linger = min(linger, opens)  # a flow key's next slice opens
            if self._flow_in_hand:
                # Only a flow key's work in hand: it goes a slice's share or
                # a slot at a time, and each must go when it opens (a linger
                # cost a key of 20 a second a quarter of its slices).
                linger = 0.0
            if linger > 0 and not self._stopping:
                await asyncio.sleep(linger)
                delay -= linger
            if delay > 0 and not self._stopping:
                await self._sleep(delay)
        if self._past_task is not None:
            self._past_task.cancel()
        await self._finish_calls(CALLS_GRACE)

    async def _sleep(self, delay: float) -> None:
        self._wake_at = self.wall() + timedelta(seconds=delay)
        try:
            # asyncio.timeout: wait_for (3.11) may swallow a cancellation.
            async with asyncio.timeout(delay):
                await self._wake.wait()
        except TimeoutError:
            pass
        finally:
            self._wake_at = None

    async def run_once(self) -> float:
        """One round; returns how long to sleep before the next."""
        self._idle.clear()
        try:
            return await self._round()
        finally:
            self._idle.set()

    async def _round(self) -> float:
        # Cleared before the reads: a hint arriving during this round then
        # makes the following sleep return at once instead of being missed.
        self._wake.clear()
        tokens = self.leases.usable()
        self.metrics.buckets_owned.set(len(tokens))
        gained = self.book.sync(tokens)
        if self._answers:
            # Before anything else, leases or none: a bucket being handed
            # over waits for its calls to be written (quiesce), and each
            # write is fenced by the token it was claimed under.
            await self._settle_calls()
        if not tokens:
            return self.poll_interval
        if self._unsettled or self._unclaimed:
            await self._settle_left()
        await self._recover(tokens, gained)
        # While the broker is down no record is claimed (what is due stays
        # PENDING, no attempt spent on an outage); HTTP calls still go.
        broker_up = await self._broker_ready()
        if not broker_up and self.http is None:
            return self._broker_wait()
        now, monotonic = self.wall(), self.monotonic()
        started = time.perf_counter()
        waiting = self._holds_back(broker_up, count=False)
        await self._read(self.book.reads(now, monotonic, self.poll_interval, waiting))
        if self._urgent:
            await self._read_urgent(now)
        self._start_past_read(now, monotonic, self._stalls(broker_up))
        self.metrics.store_seconds.labels("find_due").observe(time.perf_counter() - started)
        batch = await self._choose(now, self.window.size, kafka=broker_up)
        self.window.took(len(batch))
        await self._name_tenants(batch)
        await self._deliver_batch(batch, tokens)
        if batch:
            if self._more_in_hand:
                return 0.0
            # All it could take, the rest held back (a host at its bound): no
            # round at once to find nothing, but the next due time or read,
            # or an answer, whichever comes first (the round's own lateness
            # when a host's calls go a bound at a time).
            now, monotonic = self.wall(), self.monotonic()
        idle = self._idle_for(now, monotonic, kafka=broker_up)
        return idle if broker_up else min(idle, self._broker_wait())

    async def _name_tenants(self, batch: list[dict[str, Any]]) -> None:
        """Learn the registered tenants (the metrics' tenant labels) when
        ``batch`` holds a tenant they do not name and they were not read
        lately (TENANT_NAMES_EVERY). A failed read leaves the labels as
        they were: the outcome is counted all the same."""
        if self.registered_tenants is None or not batch:
            return
        labels = self.metrics.tenant_labels
        monotonic = self.monotonic()
        if all(labels.names(str(doc.get("tenant"))) for doc in batch) or (
            self._tenants_read_at is not None
            and monotonic - self._tenants_read_at < TENANT_NAMES_EVERY
        ):
            return
        self._tenants_read_at = monotonic
        try:
            labels.known(await self.registered_tenants())
        except SchedulerError as exc:
            log.warning("could not read the registered tenants", error=str(exc))

    async def _deliver_batch(self, batch: list[dict[str, Any]], tokens: dict[int, int]) -> None:
        """Deliver the batch: what no flow key limits at once, and beside it
        the flow gate's asks of the store (``_admit``), whose admitted work
        is claimed after (a second claim, only when both kinds are in the
        batch): work of no key never waits on a flow key's round trips (it
        did, and a burst of it beside a limited key's came out 1.3 times
        later at p99, measured)."""
        limited = [d for d in batch if flow_key(d) is not None] if self.flow is not None else []
        free = [d for d in batch if flow_key(d) is None] if limited else batch
        # Only a flow key's work: no linger (``_loop``). With other work the
        # round lingers as ever: its batching is worth more to the store.
        self._flow_in_hand = bool(limited) and not free
        admitting = asyncio.create_task(self._admit(limited)) if self.flow is not None else None
        try:
            if free:
                self.book.taken(free)
                await self._deliver(free, tokens)
        except BaseException:
            if admitting is not None:
                # A reservation it made goes unused: the limit errs low.
                admitting.cancel()
                with contextlib.suppress(BaseException):
                    await admitting
            raise
        admitted = self._in_their_slices(await admitting) if admitting is not None else []
        if admitted:
            self.book.taken(admitted)
            await self._deliver(admitted, tokens)

    def _in_their_slices(self, admitted: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Of the admitted work, what may still start: one past its slice
        already (the batch's other work took that long) is not claimed at
        all, rather than claimed and put back, two writes for nothing on a
        store the other work keeps busy. It stays due; the share is lost
        (the limit errs low)."""
        now = self.wall()
        return [d for d in admitted if not self.gate.too_late(str(d["_id"]), now)]

    def _broker_wait(self) -> float:
        assert self._broker_retry_at is not None
        return max(0.0, self._broker_retry_at - self.monotonic())

    async def _read(self, reads: list[Read]) -> None:
        """Read the buckets the book asks for, a few at a time."""
        if not reads:
            return
        gate = asyncio.Semaphore(CONCURRENT_READS)

        async def one(read: Read) -> None:
            next_at, peeked = None, False
            async with gate:
                docs = await self.store.find_due(read.bucket, read.until, read.limit, read.after)
                if read.peek and not docs and read.after is None:
                    next_at, peeked = await self.store.next_due(read.bucket, read.until), True
            self.book.learned(read, docs, self.monotonic(), next_at, peeked=peeked)

        await asyncio.gather(*(one(read) for read in reads))

    async def _read_urgent(self, now: datetime) -> None:
        """The schedules above the default priority due by ``now`` that a
        full view hides join the work in hand (a round takes the higher
        priority first): the document this node stored, else read by id,
        one targeted read each (a few: priority is for the urgent minority
        of the work). One a view holds, or would read, goes as it is."""
        hidden = [u for u in self._urgent.due(now) if self.book.hides(u.bucket, u.due_at)]
        for urgent in hidden:
            if urgent.doc is not None:
                self.book.urgent(urgent.doc)
        ids = [u.schedule_id for u in hidden if u.doc is None]
        if not ids:
            return
        gate = asyncio.Semaphore(CONCURRENT_READS)

        async def one(schedule_id: str) -> dict[str, Any] | None:
            async with gate:
                return await self.store.get(schedule_id)

        try:
            found = await asyncio.gather(*(one(schedule_id) for schedule_id in ids))
        except Exception:
            for urgent in hidden:
                self._urgent.told(urgent)
            raise
        for doc in found:
            if doc is not None and doc.get("status") == Status.PENDING.value:
                self.book.urgent(doc)

    def _start_past_read(
        self, now: datetime, monotonic: float, stalled: Callable[[dict[str, Any]], bool]
    ) -> None:
        """Look for what is due behind the slow lanes' backlogs
        (``past_lanes.py``), beside the rounds: it reads every crowded
        bucket, and a round waiting on it would hold back the work already
        in hand (the embedded store takes a few milliseconds a bucket: a
        second and more with a hung host's backlog in every view). Its
        answer wakes the loop."""
        past = self.book.past_read(now, monotonic, stalled)
        if past is not None:
            self._past_task = asyncio.create_task(self._read_past(past))

    async def _read_past(self, past: PastRead) -> None:
        started = time.perf_counter()
        try:
            docs = await self.store.find_due_past(
                past.tokens, past.until, past.limit, past.skipping
            )
            self.metrics.store_seconds.labels("find_due_past").observe(
                time.perf_counter() - started
            )
        except Exception as exc:
            self.book.past_failed(self.monotonic())
            log.warning("could not read past the slow lanes", error=str(exc))
        else:
            self.book.learned_past(past, docs, self.monotonic())
            log.debug(
                "read past the slow lanes",
                buckets=len(past.tokens),
                whole=past.whole,
                skipping=sorted(str(lane) for lane in past.skipping),
                found=len(docs),
                seconds=round(time.perf_counter() - started, 3),
            )
        finally:
            self._past_task = None
            self._wake.set()

    async def _choose(
        self, now: datetime, size: int, *, kafka: bool = True
    ) -> list[dict[str, Any]]:
        """This round's batch, at most ``size``: the due work in the book,
        shared fairly among tenants (earliest first within each). When a full view holds only
        due work, other tenants' work may wait behind it in that bucket: the
        tenants absent from the pool are asked for their own earliest due
        work there."""
        # What is held back as a whole (a host at its bound, its circuit
        # open, the broker down) is left in the book, asked once per route.
        pool = self.book.due(now, self._holds_back(kafka, count=False))
        if self.tenant_names is None:
            # Plain oldest first across the cluster's backlog (kept only to
            # measure what fairness buys): nothing past what the book holds
            # of every bucket, or a later schedule would pass an earlier one
            # still unread behind a full view.
            # The higher priority first (equal ones as they were, oldest
            # first), before a host's bound takes the first few of its calls.
            in_order = sorted(self.book.in_order(pool), key=lambda doc: -priority_of(doc))
            takeable = self._takeable(in_order, kafka)
            self._more_in_hand = len(takeable) > size
            return takeable[:size]
        hiding = self.book.hiding(now)
        # In a fixed order: a window of them per round, each after the last.
        tenants = sorted(await self.tenant_names()) if hiding else []
        if tenants:
            # A tenant with due work held back in those views is present:
            # what waits behind them is its own backlog (asked for, that
            # would be the same held work again, at the cost of a read of
            # every hiding bucket).
            present = {str(d.get("tenant")) for d in pool} | self.book.tenants(hiding)
            others, self._tenant_turn = next_window(
                tenants, self._tenant_turn, present, MAX_TENANTS_PER_ROUND
            )
            if others:
                seen = {d["_id"] for d in pool}
                extra = await self.store.oldest_due_of(others, now, hiding, size)
                pool += [d for d in extra if d["_id"] not in seen]
        # The higher priority first, then the oldest, before a host's bound
        # or a flow key's room takes the first few of their work (in due
        # order, a host at its bound took the earliest low ones, round
        # after round, and an urgent call waited for the whole backlog).
        takeable = self._takeable(sorted(pool, key=by_turn), kafka)
        self._more_in_hand = len(takeable) > size
        return fair_share(takeable, size)

    async def _admit(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Of the flow keys' work in ``batch``, what flow control lets go now
        (``flow_gate.py``): the keys' slots taken (or renewed) and their rate
        reserved, a round trip for all keys each; the slots of keys with no
        due work here given back."""
        assert self.flow is not None
        # The slices by the time of the asks, not the round's start: the
        # reads between may have taken a slice's length.
        now, monotonic = self.wall(), self.monotonic()
        self.gate.settle(self._calls_out())
        asks = self.gate.asks(batch, monotonic)
        if asks.slots:
            self.gate.held(asks, await self.flow.hold(asks.slots), monotonic)
        names, wants = self.gate.rate_wants(asks, now)
        grants = await self.flow.reserve(wants) if wants else []
        admitted, refused = self.gate.admit(asks, names, grants, wants, monotonic, now)
        for tenant, count in refused.items():
            if count:
                self.metrics.held_back(tenant, count)
        await self._release_idle_slots(now, monotonic)
        self.metrics.flow_keys_limited.set(self.gate.keys_shut(monotonic))
        kept = {id(doc) for doc in admitted}
        return [doc for doc in batch if id(doc) in kept]

    async def _release_idle_slots(self, now: datetime, monotonic: float) -> None:
        assert self.flow is not None
        idle = self.gate.idle(self.book.due_flow_keys(now), monotonic)
        if not idle:
            return
        try:
            await self.flow.release(idle)
        except SchedulerError as exc:
            # They expire on their own (SLOT_TERM): the key waits that long
            # at most for another node to take them.
            log.warning("could not give back flow-control slots", error=str(exc))

    def _calls_out(self) -> set[str]:
        """The ids of the HTTP calls started and not yet answered."""
        answered = {claim.id for claim, _result in self._answers}
        return {sid for sid in self._calls if sid not in answered}

    def _idle_for(self, now: datetime, monotonic: float, *, kafka: bool = True) -> float:
        """Nothing to claim: sleep until the book's next due time or next
        read, at most a poll interval. Due work held back (a host at its
        bound, the broker down) is no time to wake at: an answer, or the
        broker's probe, is."""
        delay = self.poll_interval
        held = self._holds_back(kafka, count=False)
        next_due = self.book.next_due(held, ordered=self.tenant_names is None)
        if next_due is not None:
            delay = min(delay, (next_due - now).total_seconds())
        next_read = self.book.next_read(now, held, self._stalls(kafka), monotonic)
        if next_read is not None:
            delay = min(delay, next_read - monotonic)
        opens = self.gate.next_open(monotonic)
        if opens is not None:
            delay = min(delay, opens)
        return max(0.0, delay)

    async def _recover(self, tokens: dict[int, int], gained: set[int]) -> None:
        """What an older owner left in flight is due again: in the buckets
        just gained, and in the held ones in turn, SWEEP_RATE a second (a
        stale owner that claimed after we took over, its lease's deadline
        missed).
        The sweep also takes what our own token has held IN_FLIGHT for longer
        than any round lasts: the safety net under everything a failed round
        keeps for settling (it runs between rounds, so no round of ours is
        working on anything then)."""
        swept = self._sweep_slice(tokens)
        buckets = {**swept, **{b: tokens[b] for b in gained}}
        if not buckets:
            return
        stranded_before = self.wall() - self.stranded_after
        recovered = await self.store.recover_in_flight(buckets, stranded_before)
        if recovered:
            self.metrics.recovered.inc(len(recovered))
            self.book.stale({b for b in buckets})
            log.warning(
                "re-delivering schedules left in flight by a former owner or a failed round",
                count=len(recovered),
                ids=recovered[:20],
            )

    def _sweep_slice(self, tokens: dict[int, int]) -> dict[int, int]:
        """The held buckets the sweep searches now: as many as are owed since
        the last slice (each held one once a RECOVERY_SWEEP, at most
        SWEEP_RATE a second; all, after a long pause), each after the last
        one searched, in bucket order round the held ones."""
        now = self.monotonic()
        if self._swept_at is None:
            self._swept_at = now  # the buckets held at start are searched as gained
            return {}
        rate = min(SWEEP_RATE, len(tokens) / RECOVERY_SWEEP)
        owed = int((now - self._swept_at) * rate)
        if owed < min(SWEEP_SLICE, len(tokens)) or not tokens:
            return {}
        held = sorted(tokens)
        start = bisect.bisect_right(held, self._swept_last)
        chosen = (held[start:] + held[:start])[:owed]
        self._swept_at, self._swept_last = now, chosen[-1]
        return {b: tokens[b] for b in chosen}

    async def _write(self, completions: Sequence[Completion]) -> int:
        """Write completions. What goes back to PENDING (a retry, a chain's
        next occurrence) is told to the book, so its bucket is read in time
        (and the change feed's news of the same write is none)."""
        pending: list[tuple[Claimed, datetime]] = []
        for completion in completions:
            occurrence = completion.occurrence
            due_at = completion.due_at or (occurrence.next_at if occurrence else None)
            if completion.status == Status.PENDING and due_at is not None:
                pending.append((completion.claimed, due_at))
        async with self._own_writes((c, due_at) for c, due_at in pending):
            written = await self.store.complete(completions)
        for claimed, due_at in pending:
            self.book.hint(claimed.bucket, due_at)
        return written

    async def _unclaim(self, claims: Sequence[Claimed]) -> int:
        """Put claims back to PENDING (their due times as they were): the
        callers mark their buckets stale, and the change feed's news of the
        same write is none."""
        async with self._own_writes((c, None) for c in claims):
            return await self.store.unclaim(claims)

    @contextlib.asynccontextmanager
    async def _own_writes(
        self, writes: Iterable[tuple[Claimed, datetime | None]]
    ) -> AsyncIterator[None]:
        """Around a write of these back to PENDING (at a due time; None: as
        it was), which this node tells its book of itself: the book knows
        the change feed's news of it (``DueBook.wrote``). A write that fails
        may have been applied all the same, and its news taken for ours:
        their buckets are read again."""
        written = list(writes)
        for claimed, due_at in written:
            self.book.wrote(claimed.bucket, claimed.id, due_at)
        try:
            yield
        except BaseException:
            self.book.unwritten(c.id for c, _due_at in written)
            self.book.stale({c.bucket for c, _due_at in written})
            raise

    async def _settle_left(self) -> None:
        """Finish what a failed round left, before anything new: write the
        completions it decided, and put back what it may have claimed but never
        published. Both are fenced by their tokens, so for a bucket that has
        changed hands since they match nothing (its next owner recovers it);
        the round that owns this node's token is the only one that can, or a
        batch would stay IN_FLIGHT under a live token for good."""
        if self._unsettled:
            completions, self._unsettled = self._unsettled, []
            try:
                written = await self._write(completions)
            except Exception:
                self._unsettled = completions + self._unsettled
                raise
            log.warning("completed what a failed round left", written=written, of=len(completions))
        if self._unclaimed:
            claims, self._unclaimed = self._unclaimed, []
            try:
                restored = await self._unclaim(claims)
            except Exception:
                self._unclaimed = claims + self._unclaimed
                raise
            self.book.stale({c.bucket for c in claims})
            log.warning("put back claims never published", restored=restored, of=len(claims))

    async def _deliver(self, due: list[dict[str, Any]], tokens: dict[int, int]) -> None:
        now = self.wall()
        started = time.perf_counter()
        # Out of the book and not yet written back: claimed, as far as the
        # metrics know, from the moment the claim is asked (``in_flight``).
        self._claimed = [Claimed(d, tokens[d["bucket"]]) for d in due]
        try:
            claimed = await self.store.claim(due, tokens, self.node_id, now)
        except Exception:
            # No answer, so no knowing which of these the claim took: put back
            # any that our token holds (a claim that never applied matches nothing).
            self._unclaimed.extend(self._claimed)
            self.book.stale({d["bucket"] for d in due})
            self._claimed = []
            raise
        self._busy, self._claimed = {c.bucket for c in claimed}, claimed
        try:
            await self._complete(claimed, started)
        finally:
            self._busy, self._claimed = set(), []

    async def _complete(self, claimed: list[Claimed], started: float) -> None:
        """Publish what the claim took and still may be, and write what
        became of each. The rules decide (``outcomes.py``: ``plan`` before,
        ``decide`` after); this only moves data. Kafka records are published
        and written in this round; HTTP calls are started here and each is
        settled on its own when it answers (``_settle_calls``), so one slow
        endpoint never holds a round."""
        self.metrics.store_seconds.labels("claim").observe(time.perf_counter() - started)
        self.metrics.batch_size.observe(len(claimed))
        live = self._still_held(claimed)
        if not live:
            return
        plan = self.rules.plan(live, self.wall())
        try:
            await self._end_unpublished(plan.ended)
        except Exception:
            self._unclaimed.extend(plan.publish)  # none was published
            raise
        calls = [c for c in plan.publish if is_http(c.doc)]
        records = [c for c in plan.publish if not is_http(c.doc)]
        if calls:
            try:
                await self._start_calls(calls)
            except Exception:
                # None of the records went out, nor the calls not started.
                self._unclaimed.extend(c for c in plan.publish if c.id not in self._calls)
                raise
        if records:
            published, results, unread = await self._publish_records(records)
            await self._settle(published, results, unread)

    def _still_held(self, claimed: list[Claimed]) -> list[Claimed]:
        """The claims whose lease is still usable. The claim may have waited;
        publish nothing for a lease that could have expired meanwhile. Put
        those back, fenced by their token: if the bucket has a new owner this
        matches nothing (the new owner recovers them, their token being older
        than its own); if the lease only lapsed here and a renew then kept it
        under the same token, no other owner ever will, and they would stay
        IN_FLIGHT for good."""
        live: list[Claimed] = []
        abandoned: list[Claimed] = []
        now = self.wall()
        for claim in claimed:
            usable = self.leases.is_usable(claim.bucket, claim.token)
            # A start reserved by flow control goes by its slice's bound, or
            # not at all: held up past it, it would count in another window.
            (live if usable and not self.gate.too_late(claim.id, now) else abandoned).append(claim)
        if abandoned:
            self._unclaimed.extend(abandoned)
            self.book.stale({c.bucket for c in abandoned})
            self.metrics.delivery_outcome("abandoned", _tenants(abandoned))
            log.warning(
                "lease gone mid-batch (expired or handed over), or a flow-control slice passed",
                abandoned=len(abandoned),
            )
        return live

    async def _end_unpublished(self, completions: list[Completion]) -> None:
        """Write what ends here unpublished: EXPIRED (the document records
        when, so its history shows it without a history write) and skipped
        occurrences (recorded). Unwritten, they are written next round."""
        if not completions:
            return
        try:
            await self._write(completions)
        except Exception:
            self._unsettled.extend(completions)
            raise
        for outcome in (Outcome.EXPIRED, Outcome.SKIPPED):
            ended = [c for c in completions if c.outcome == outcome]
            if not ended:
                continue
            self.metrics.delivery_outcome(outcome.value, _tenants(c.claimed for c in ended))
            ids = sorted(c.claimed.id for c in ended)
            log.info(
                "claims ended unpublished", outcome=outcome.value, count=len(ids), ids=ids[:20]
            )
            if outcome == Outcome.SKIPPED:
                self._record([c.claimed for c in ended], ended[0].at, Outcome.SKIPPED)

    async def _publish_records(
        self, live: list[Claimed]
    ) -> tuple[list[Claimed], list[Failed | None], list[Claimed]]:
        """Publish ``live`` to Kafka: (the claims published, a result for
        each, the claims left unpublished because their payloads could not
        be read)."""
        started = time.perf_counter()
        try:
            results, unread = await self._publish(live)
        except Exception:
            # No answer per record (a bug, a producer gone): nobody knows
            # what went out. Put the batch back, to be published again.
            self._unclaimed.extend(live)
            self.book.stale({c.bucket for c in live})
            raise
        self.metrics.publish_seconds.observe(time.perf_counter() - started)
        if unread:
            log.warning("large payloads could not be read: put back unpublished", count=len(unread))
        return [c for c in live if c.id not in unread], results, list(unread.values())

    async def _settle(
        self, published: list[Claimed], results: list[Failed | None], unread: list[Claimed]
    ) -> None:
        """Decide and write what became of published claims (dead letters
        sent first: a failure whose dead letter did not go out keeps
        retrying rather than end without a record), then count and log."""
        now = self.wall()
        ending = [
            (c, f.error)
            for c, f in zip(published, results, strict=True)
            if f is not None and self.rules.ends(c, f, now)
        ]
        unsent = await self._dead_letter(ending) if ending and self._dead_letters else set()
        decided = self.rules.decide(published, results, self.wall(), unsent)
        put_back = [*decided.put_back, *unread]
        try:
            marked = await self._write_decided(decided, put_back)
        finally:
            self.book.stale({c.bucket for c in put_back})
            if any(not is_http(c.doc) for c in decided.put_back):
                self._broker_deferred(published, results, decided)
        self._report(decided, marked)

    async def _write_decided(self, decided: Decided, put_back: list[Claimed]) -> int:
        """Write the outcomes as one unit; returns how many deliveries were
        marked. Whichever write fails, all of it is kept for the next round
        to settle (a completion or a put-back already written matches nothing
        the second time). Else a write failing part way would leave the rest
        IN_FLIGHT under this node's live token, which no recovery of an older
        owner's work would ever touch."""
        try:
            started = time.perf_counter()
            marked = await self._write(decided.done) if decided.done else 0
            self.metrics.store_seconds.labels("mark_delivered").observe(
                time.perf_counter() - started
            )
            rest = [*decided.failed, *decided.deferred]
            if rest:
                await self._write(rest)
            if put_back:
                await self._unclaim(put_back)
        except Exception:
            self._unsettled.extend([*decided.done, *decided.failed, *decided.deferred])
            self._unclaimed.extend(put_back)
            raise
        return marked

    def _report(self, decided: Decided, marked: int) -> None:
        """Count, log and record what was written (history off the path)."""
        delivered = [c.claimed for c in decided.done]
        if delivered:
            kept, fenced = self._fenced(delivered, marked)
            self.metrics.delivery_outcome("delivered", _tenants(kept))
            if fenced:
                # A newer owner took these over while we published: they went
                # out twice, and the fence kept our stale mark off its work.
                self.metrics.delivery_outcome("fenced", _tenants(fenced))
                log.warning(
                    "completion rejected by a newer lease token",
                    fenced=len(delivered) - marked,
                    buckets=sorted({c.bucket for c in delivered}),
                )
            # A one-shot schedule's document records its delivery already
            # (deliveredAt, attempts, owner, token): its history shows it
            # from there, and the store is spared a write for nearly every record.
            done_at = decided.done[0].at
            self._record([c for c in delivered if c.recurring], done_at, Outcome.DELIVERED)
            for level, count in Counter(priority_of(c.doc) for c in delivered).items():
                self.metrics.delivered_priority.labels(str(level)).inc(count)
            for c in delivered:
                lateness = max((done_at - c.execute_at).total_seconds(), 0.0)
                self.metrics.lateness.observe(lateness)
                log.info("schedule delivered", **_about(c), lateness_s=round(lateness, 4))
        if decided.failed:
            self._failed(decided.failed)
        if decided.deferred:
            self.metrics.delivery_outcome("deferred", _tenants(c.claimed for c in decided.deferred))
            for completion in decided.deferred:
                self._record(
                    [completion.claimed], completion.at, Outcome.DEFERRED, completion.error
                )
            log.info(
                "the destination asked to wait: deferred, no attempt spent",
                count=len(decided.deferred),
                error=decided.deferred[0].error,
            )

    def _fenced(self, delivered: list[Claimed], marked: int) -> tuple[list[Claimed], list[Claimed]]:
        """(marked, fenced) of the deliveries whose mark matched ``marked`` of
        them: the store says how many, not which, so the fenced are taken
        first among those whose lease this node no longer holds under their
        token (a newer owner's), for the per-tenant counts."""
        fenced = len(delivered) - marked
        if fenced <= 0:
            return delivered, []
        lost = [c for c in delivered if not self.leases.is_usable(c.bucket, c.token)]
        held = [c for c in delivered if self.leases.is_usable(c.bucket, c.token)]
        ordered = [*lost, *held]
        return ordered[fenced:], ordered[:fenced]

    # -- HTTP calls: started by a round, each settled when it answers ------------

    async def _start_calls(self, claims: list[Claimed]) -> None:
        """Start an HTTP call per claim (payloads read first, a few megabytes
        at a time); each answer is settled by the next round. What cannot be
        read is put back unpublished."""
        assert self.http is not None
        http = self.http
        for part in _by_bytes(claims, PUBLISH_PART_BYTES):
            payloads = await self._payloads(part)
            if payloads is None:
                self._unclaimed.extend(part)
                self.book.stale({c.bucket for c in part})
                continue
            for claim in part:
                doc = (
                    {**claim.doc, LARGE: payloads[claim.id]} if claim.id in payloads else claim.doc
                )
                call = build_call(doc, claim.token, claim.attempt)
                self._calls[claim.id] = claim
                task = asyncio.create_task(self._call(http, claim, call))
                self._call_tasks.add(task)
                task.add_done_callback(self._call_tasks.discard)

    async def _call(self, http: Sink[HttpCall], claim: Claimed, call: HttpCall) -> None:
        try:
            [result] = await http.publish([call])
        except Exception as exc:  # a bug in the sink: the call's fate is unknown
            log.exception("HTTP call raised", **_about(claim))
            result = Failed(f"{type(exc).__name__}: {exc}", Trouble.RETRY)
        self._answers.append((claim, result))
        self._wake_for_answers()

    def _wake_for_answers(self) -> None:
        """Wake the loop for the answers in, once in ANSWER_GATHER: the
        answers arriving meanwhile share one write (a round per answer cost
        the store three round trips per call) and the slots they free are
        claimed again together."""
        if self._answers_wake is None:
            loop = asyncio.get_running_loop()
            self._answers_wake = loop.call_later(ANSWER_GATHER, self._answers_due)

    def _answers_due(self) -> None:
        self._answers_wake = None
        self._wake.set()

    async def _settle_calls(self) -> None:
        """Settle the HTTP calls that answered since the last round."""
        answers, self._answers = self._answers, []
        claims = [claim for claim, _result in answers]
        try:
            await self._settle(claims, [result for _claim, result in answers], [])
        finally:
            # Written, or kept in _unsettled/_unclaimed for the next round.
            for claim in claims:
                self._calls.pop(claim.id, None)
            self._calls_changed.set()

    def _hosts_busy(self) -> Counter[str]:
        """HTTP calls in flight by host: waiting on the host, not those
        answered and not yet written (the bound is the host's, and a call
        answered is off it; counted until written, a host's calls went a
        bound per round or two, as slow as the store, and a fast host
        behind a hung one's backlog fell behind its load)."""
        answered = {claim.id for claim, _result in self._answers}
        return Counter(http_host(c.doc) for c in self._calls.values() if c.id not in answered)

    def _takeable(self, pool: list[dict[str, Any]], kafka: bool) -> list[dict[str, Any]]:
        """Of the due ``pool``, what a round may claim (``_holds_back``); the
        rest wait in the book, unclaimed, costing nothing, and never hold
        what may go."""
        held = self._holds_back(kafka)
        return [doc for doc in pool if not held(doc)]

    def _holds_back(self, kafka: bool, *, count: bool = True) -> Callable[[dict[str, Any]], bool]:
        """Whether a due schedule must wait unclaimed: what is stalled
        (``_stalls``), or a call to a host that has HTTP_MAX_PER_HOST calls
        out already (with ``count``, counting those this test lets through:
        one test per batch)."""
        busy = self._hosts_busy()
        stalled = self._stalls(kafka)
        monotonic, now = self.monotonic(), self.wall()
        by_key: Counter[str] = Counter()
        rooms: dict[str, int] = {}

        def held(doc: dict[str, Any]) -> bool:
            if stalled(doc):
                return True
            if self.flow is not None and (found := flow_key(doc)) is not None:
                # Shut keys as a route; a batch holds at most a key's room.
                if self.gate.shut(doc, monotonic):
                    return True
                if count:
                    if found[0] not in rooms:
                        rooms[found[0]] = self.gate.room(doc, now)
                    if by_key[found[0]] >= rooms[found[0]]:
                        return True
                    by_key[found[0]] += 1
            if not is_http(doc):
                return False
            host = http_host(doc)
            if busy[host] >= self.http_per_host:
                return True
            busy[host] += count
            return False

        return held

    def _stalls(self, kafka: bool) -> Callable[[dict[str, Any]], bool]:
        """Whether a due schedule goes nowhere for now, whatever else is out:
        a Kafka record while the broker is down (``kafka`` False), a call
        while this node has no HTTP sink, or to a host whose circuit is open
        (until its cooldown is over: then the probe, and a few more that the
        sink defers, are claimed)."""

        circuit_open = self.circuit_open
        # By URL: a backlog is thousands of schedules and a few URLs, and
        # asking a breaker parses the URL (a round asks for every one).
        open_by_url: dict[str, bool] = {}

        def stalled(doc: dict[str, Any]) -> bool:
            if not is_http(doc):
                return not kafka
            if self.http is None:
                return True
            if circuit_open is None:
                return False
            url = doc["http"]["url"]
            if url not in open_by_url:
                open_by_url[url] = circuit_open(url)
            return open_by_url[url]

        return stalled

    async def _finish_calls(self, grace: float) -> None:
        """At stop: wait up to ``grace`` for the calls in flight and write
        what they answered. The rest stay IN_FLIGHT under this token; the
        bucket's next owner recovers them (at least once)."""
        if self._call_tasks:
            await asyncio.wait(set(self._call_tasks), timeout=grace)
        for task in list(self._call_tasks):
            task.cancel()
        if self._answers:
            try:
                await self._settle_calls()
            except Exception as exc:
                log.warning("could not write the last HTTP answers", error=str(exc))
        self._calls.clear()
        self._calls_changed.set()

    async def _publish(
        self,
        live: list[Claimed],
        as_item: Callable[[Claimed, dict[str, Any]], Record | HttpCall] | None = None,
    ) -> tuple[list[Failed | None], dict[str, Claimed]]:
        """Publish ``live`` and wait for every answer, a few megabytes of
        payload at a time: the large payloads (read without them,
        ``node/schedule/payload.py``) are fetched for each part just before
        it goes, so a batch of large ones is never all in memory at once.
        Returns a result per claim published and, by id, the claims left
        unpublished because their payloads could not be read (the store
        failed part way). ``as_item``: the record or call a claim (its
        document, payload loaded) becomes; by default its own record."""
        as_item = as_item or (lambda c, doc: build_record(doc, c.token, c.attempt))
        results: list[Failed | None] = []
        unread: dict[str, Claimed] = {}
        for part in _by_bytes(live, PUBLISH_PART_BYTES):
            payloads = None if unread else await self._payloads(part)
            if payloads is None:
                unread.update((c.id, c) for c in part)
                continue
            items = [
                as_item(c, {**c.doc, LARGE: payloads[c.id]} if c.id in payloads else c.doc)
                for c in part
            ]
            results += await self._router.publish(items)
        return results, unread

    async def _payloads(self, part: list[Claimed]) -> dict[str, bytes] | None:
        """The large payloads of ``part`` by id, or None when the store did
        not give them all."""
        missing = [c for c in part if needs_fetch(c.doc)]
        if not missing:
            return {}
        try:
            payloads = await self.store.large_payloads(missing)
        except SchedulerError as exc:
            log.warning("could not read large payloads", error=str(exc))
            return None
        return payloads if all(c.id in payloads for c in missing) else None

    def _failed(self, completions: list[Completion]) -> None:
        """Count and record publishes that failed (written already)."""
        for completion in completions:
            self._record([completion.claimed], completion.at, completion.outcome, completion.error)
            log.warning("publish failed", **_about(completion.claimed), error=completion.error)
        retried = [c.claimed for c in completions if c.outcome == Outcome.RETRYING]
        failed = [c.claimed for c in completions if c.outcome != Outcome.RETRYING]
        self.metrics.delivery_outcome("retried", _tenants(retried))
        self.metrics.delivery_outcome("failed", _tenants(failed))

    def _record(
        self, claimed: list[Claimed], at: datetime, outcome: Outcome, error: str | None = None
    ) -> None:
        """Hand the attempts to the history writer (never waits for the store)."""
        if self.history is None:
            return
        self.history.add(
            [
                Attempt(
                    schedule_id=c.id,
                    tenant=str(c.doc["tenant"]),
                    run=c.run,
                    execute_at=c.execute_at,
                    attempt=c.attempt,
                    at=at,
                    node=self.node_id,
                    token=c.token,
                    outcome=outcome.value,
                    error=error,
                    life=aware(c.doc["createdAt"]) if c.doc.get("createdAt") else None,
                    request_id=c.doc.get(REQUEST_ID_FIELD),
                )
                for c in claimed
            ]
        )

    def _broker_deferred(
        self, published: list[Claimed], results: list[Failed | None], decided: Decided
    ) -> None:
        """The broker could not take these: they went back to PENDING with
        the attempt undone (an outage must not spend the retry budget). When
        it took none of the batch's records, it is down: claim no record
        until it answers."""
        self.metrics.delivery_outcome("deferred", _tenants(decided.put_back))
        reasons = [f.error for f in results if f is not None and f.wait is None]
        kafka_took = any(
            f is None and not is_http(c.doc) for c, f in zip(published, results, strict=True)
        )
        if not kafka_took:
            self._broker_trouble(reasons[0] if reasons else "")
        log.warning(
            "the broker did not take these: deferred, no attempt spent",
            count=len(decided.put_back),
            error=reasons[0] if reasons else None,
        )

    def _broker_trouble(self, error: str) -> None:
        """The broker took nothing: wait before claiming again, longer each time."""
        self._broker_backoff = min(
            BROKER_BACKOFF_MAX, max(BROKER_BACKOFF, self._broker_backoff * 2)
        )
        self._broker_retry_at = self.monotonic() + self._broker_backoff
        self.metrics.broker_available.set(0)
        log.warning(
            "broker unavailable: claiming paused", retry_in=self._broker_backoff, error=error
        )

    async def _broker_ready(self) -> bool:
        """Whether to claim now: yes unless the broker was found down, in which
        case only once its wait is over and a probe finds it back."""
        if self._broker_retry_at is None:
            return True
        if self.monotonic() < self._broker_retry_at:
            return False
        if not await self.publisher.reachable():
            self._broker_trouble("no answer to a metadata request")
            return False
        log.info("broker back: claiming again", after_s=round(self._broker_backoff, 2))
        self._broker_retry_at, self._broker_backoff = None, 0.0
        self.metrics.broker_available.set(1)
        return True

    @property
    def _router(self) -> Router:
        # Made on use: tests put a twin in place of the publisher.
        return Router(self.publisher, self.http)

    @property
    def _dead_letters(self) -> bool:
        return bool(self.dead_letter_topic or self.dead_letter_url)

    async def _dead_letter(self, failures: list[tuple[Claimed, str]]) -> set[str]:
        """Send these to the dead-letter topic or URL; returns the ids it did
        not take (they keep retrying rather than fail without a record)."""
        errors = {claimed.id: error for claimed, error in failures}

        def dead_letter(claimed: Claimed, doc: dict[str, Any]) -> Record | HttpCall:
            error = _header_text(errors[claimed.id])
            return dead_letter_item(
                doc, claimed.token, claimed.attempt, error, self.dead_letter_topic,
                self.dead_letter_url,
            )  # fmt: skip

        claims = [claimed for claimed, _error in failures]
        try:
            results, unread = await self._publish(claims, dead_letter)
        except Exception as exc:  # no answer: none of them is known to be there
            log.exception("dead-letter publish raised")
            results, unread = (
                [Failed(f"{type(exc).__name__}: {exc}", Trouble.DESTINATION)] * len(claims),
                {},
            )
        unsent = set(unread)
        published = [c for c in claims if c.id not in unread]
        for claimed, failure in zip(published, results, strict=True):
            if failure is not None:
                unsent.add(claimed.id)
                log.error("dead-letter publish failed", **_about(claimed), error=failure.error)
        return unsent


def _tenants(claims: Iterable[Claimed]) -> list[str]:
    """The tenant of each claim (the metrics count outcomes by tenant)."""
    return [str(c.doc.get("tenant")) for c in claims]


def _header_text(text: str) -> str:
    """One line of printable ASCII, at most 1 KiB: what a header may carry."""
    return "".join(c if " " <= c <= "~" else "?" for c in " ".join(text.split()))[:1024]


def _by_bytes(claims: list[Claimed], most: int) -> list[list[Claimed]]:
    """``claims`` in order, in parts of at most ``most`` bytes of payload
    (a single larger one alone)."""
    parts: list[list[Claimed]] = []
    size = 0
    for claim in claims:
        weight = payload_size(claim.doc)
        if not parts or size + weight > most:
            parts.append([])
            size = 0
        parts[-1].append(claim)
        size += weight
    return parts


def _about(claimed: Claimed) -> dict[str, Any]:
    """What a log line says of one claimed schedule."""
    return {
        "schedule_id": claimed.id,
        "bucket": claimed.bucket,
        "token": claimed.token,
        "attempt": claimed.attempt,
        "request_id": claimed.doc.get(REQUEST_ID_FIELD),
    }


__all__ = ["BucketPoller"]


def configured_poller(
    config: NodeConfig,
    store: Schedules,
    leases: LeaseManager,
    publisher: KafkaPublisher,
    metrics: NodeMetrics,
    *,
    history: HistoryWriter | None,
    tenant_names: Callable[[], Awaitable[Sequence[str]]],
    registered_tenants: Callable[[], Awaitable[Sequence[str]]] | None = None,
    wall: Callable[[], datetime] = utcnow,
    http: HttpSink | None = None,
    flow: FlowGates | None = None,
) -> BucketPoller:
    """The poller a node's settings make: the node process's, and the one the
    delivery bench runs on the memory store."""
    return BucketPoller(
        store,
        leases,
        publisher,
        metrics,
        node_id=config.node_id,
        batch_size=config.batch_size,
        poll_interval=config.poll_interval,
        batch_linger=config.batch_linger,
        rules=Rules(
            config.retry,
            timedelta(seconds=config.misfire_threshold),
            outage_bound=timedelta(seconds=config.http_outage_bound),
        ),
        dead_letter_topic=config.dead_letter_topic,
        dead_letter_url=config.dead_letter_url,
        http=http,
        http_per_host=config.http_max_per_host,
        circuit_open=http.circuit_open if http is not None else None,
        history=history,
        tenant_names=tenant_names if config.fair_tenants else None,
        registered_tenants=registered_tenants,
        wall=wall,
        watch_changes=config.watch_changes,
        flow=flow,
        # An HTTP call is written by the round after it answers: it holds
        # its claim up to its timeout (at most MAX_TIMEOUT) and a round more.
        stranded_after=longest_round(
            config.store_timeout,
            max(publisher.request_timeout + METADATA_DEADLINE, MAX_TIMEOUT.total_seconds()),
        ),
    )
