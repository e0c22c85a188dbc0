"""The bucket poller: delivers the due schedules of the buckets this node
holds leases on (DESIGN.md "Bucket poller").

One loop serves all held buckets, and reads them one by one through a book
of what it knows of each (``due_book.py``): a bucket is read when it was
just gained, when a hint says it holds work sooner than its view, when its
cached due work ran out behind a full read, or once a poll interval when it
is idle. So a node reads its own buckets only, a bucket with work in hand
costs the store nothing until the work is delivered, and the future backlog
costs nothing at all. Ownership stays per bucket: every write carries that
bucket's token.

Each round:

1. settle what a failed round left (completions to write, claims to put
   back); make due again what an older owner left in flight in buckets just
   gained, and in every held bucket once a while;
2. read the buckets the book asks for (due now or within a poll interval);
3. choose the batch from the due work in the book, shared fairly among
   tenants (when a view is full, tenants absent from it are asked for their
   own earliest due work); its size opens from a small first claim after an
   idle round up to the batch size (``claim_window.py``), so a burst's first
   records leave after a small claim;
4. claim it in one bulk write (PENDING -> IN_FLIGHT, with the token, only if
   still due and no newer token wrote it);
5. drop anything whose lease's local deadline passed during the claim, then
   publish to Kafka and wait for the acks;
6. complete each one as ``outcomes.py`` decides (DELIVERED, back to
   PENDING with backoff, DELIVERY_FAILED past the retry limit and to the
   dead-letter topic when configured, a recurring one's next occurrence),
   fenced by the token;
7. sleep until the next due time in the book or the next read it wants,
   but at least until the batch linger since the round began has passed; a
   hint (a schedule due sooner) or a lease change cuts the sleep short.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import structlog

from node.config import NodeConfig
from node.delivery.claim_window import ClaimWindow
from node.delivery.due_book import DueBook, Read
from node.delivery.fairness import by_due, fair_share, next_window
from node.delivery.history_writer import HistoryWriter
from node.delivery.leases import LeaseManager
from node.delivery.outcomes import Rules
from node.delivery.publisher import METADATA_DEADLINE, Failed, KafkaPublisher
from node.errors import SchedulerError
from node.metrics import NodeMetrics
from node.schedule.model import Status
from node.schedule.payload import LARGE, needs_fetch, payload_size
from node.schedule.record import Record, build_record
from node.schedule.times import aware, utcnow
from node.store.contract import (
    MAX_TENANTS_PER_ROUND,
    Attempt,
    Claimed,
    Completion,
    Outcome,
    Schedules,
)

log = structlog.get_logger("node.poller")

# Schedules held in the book at once, as batches: a backlog is read this
# many batches at a time, not whole into memory.
READ_AHEAD = 4
# Reads in flight at once (the embedded store serves them one at a time
# anyway; a real MongoDB serves them in parallel).
CONCURRENT_READS = 8
# How often every held bucket is searched for what an older owner left in
# flight, besides when it is gained (seconds).
RECOVERY_SWEEP = 30.0
# The default of how long a claim may stay IN_FLIGHT under this node's own
# token before the sweep takes it for stranded (seconds; see longest_round).
STRANDED_AFTER = 120.0


def longest_round(store_timeout: float, publish_timeout: float) -> float:
    """The longest a round can hold a claim, in seconds: the claim, two
    publishes (the batch, its dead letters) and three writes (marks,
    failures, put-backs) each at its deadline, and as much again for a write
    the server still applies after the client gave up on it."""
    return 2 * (4 * store_timeout + 2 * publish_timeout)


# While the broker is down, the wait before probing it again: doubling from
# the first to the last (seconds).
BROKER_BACKOFF = 0.5
BROKER_BACKOFF_MAX = 10.0
# Payload bytes published at once: a batch of large payloads goes in parts
# of this size, each fetched just before it is published.
PUBLISH_PART_BYTES = 8 * 1024 * 1024


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
        wall: Callable[[], datetime] = utcnow,
        monotonic: Callable[[], float] = time.monotonic,
        stranded_after: float = STRANDED_AFTER,
    ) -> None:
        self.store = store
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
        self.history = history
        # The tenants whose due work a backlog could hide (None: no fairness,
        # plain oldest first, kept to measure what fairness buys).
        self.tenant_names = tenant_names
        self._tenant_turn = 0
        self.book = DueBook(refresh=poll_interval, budget=batch_size * READ_AHEAD)
        self.window = ClaimWindow(batch_size)
        self.wall = wall
        self.monotonic = monotonic
        self._wake = asyncio.Event()
        self._wake_at: datetime | None = None
        self._swept_at = float("-inf")
        self._stopping = False
        self._idle = asyncio.Event()  # set between rounds
        self._idle.set()
        # Buckets of the batch claimed and not yet completed in this round.
        self._busy: set[int] = set()
        # What a failed round left behind (a store error after its claim):
        # completions decided but not written, and claims that may have been
        # made but were never published. Settled first thing next round.
        self._unsettled: list[Completion] = []
        self._unclaimed: list[Claimed] = []
        # Set while the broker is found down: no claim before this
        # (monotonic), and then only after a probe answers.
        self._broker_retry_at: float | None = None
        self._broker_backoff = 0.0

    # -- signals from the rest of the node ---------------------------------------

    def hint(self, bucket: int, due_at: datetime) -> None:
        """A schedule of a held bucket falls due at ``due_at``: wake by then,
        and read the bucket again if its view would not have seen it."""
        if self.book.hint(bucket, due_at) or self._wake_at is None or due_at < self._wake_at:
            self._wake.set()

    def accepted(self, doc: dict[str, Any]) -> None:
        """This node stored ``doc`` in a held bucket: into the book, and wake
        by its due time."""
        self.book.accepted(doc)
        due_at = aware(doc["dueAt"])
        if self._wake_at is None or due_at < self._wake_at:
            self._wake.set()

    def leases_changed(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    async def quiesce(self, buckets: set[int] | None = None) -> None:
        """Return once no claimed work in ``buckets`` (default: any) is in flight.

        A bucket with nothing claimed may go at once: a claim still on its
        way finds its lease gone at the post-claim check and publishes
        nothing, leaving the schedules for the next owner to recover.
        """
        if buckets is None or self._busy & buckets:
            await self._idle.wait()

    # -- the loop -------------------------------------------------------------

    async def run(self) -> None:
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
            if linger > 0 and not self._stopping:
                await asyncio.sleep(linger)
                delay -= linger
            if delay > 0 and not self._stopping:
                await self._sleep(delay)

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
        if not tokens:
            return self.poll_interval
        if self._unsettled or self._unclaimed:
            await self._settle()
        await self._recover(tokens, gained)
        if not await self._broker_ready():
            # Nothing is read or claimed while the broker is down: what is due
            # stays PENDING, and no attempt is spent on an outage.
            assert self._broker_retry_at is not None
            return max(0.0, self._broker_retry_at - self.monotonic())
        now, monotonic = self.wall(), self.monotonic()
        started = time.perf_counter()
        await self._read(self.book.reads(now, monotonic, self.poll_interval))
        self.metrics.store_seconds.labels("find_due").observe(time.perf_counter() - started)
        batch = await self._choose(now, self.window.size)
        self.window.took(len(batch))
        if batch:
            self.book.taken(batch)
            await self._deliver(batch, tokens)
            return 0.0
        return self._idle_for(now, monotonic)

    async def _read(self, reads: list[Read]) -> None:
        """Read the buckets the book asks for, a few at a time."""
        if not reads:
            return
        gate = asyncio.Semaphore(CONCURRENT_READS)

        async def one(read: Read) -> None:
            async with gate:
                docs = await self.store.find_due(read.bucket, read.until, read.limit)
            self.book.learned(read, docs, self.monotonic())

        await asyncio.gather(*(one(read) for read in reads))

    async def _choose(self, now: datetime, size: int) -> list[dict[str, Any]]:
        """This round's batch, at most ``size``: the due work in the book,
        shared fairly among tenants (earliest first within each). When a full view holds only
        due work, other tenants' work may wait behind it in that bucket: the
        tenants absent from the pool are asked for their own earliest due
        work there."""
        pool = self.book.due(now)
        if self.tenant_names is None:
            # Plain oldest first across the cluster's backlog (kept only to
            # measure what fairness buys): nothing past what the book holds
            # of every bucket, or a later schedule would pass an earlier one
            # still unread behind a full view.
            frontier = self.book.frontier()
            return [d for d in pool if frontier is None or by_due(d) <= frontier][:size]
        hiding = self.book.hiding(now)
        # In a fixed order: a window of them per round, each after the last.
        tenants = sorted(await self.tenant_names()) if hiding else []
        if tenants:
            present = {str(d.get("tenant")) for d in pool}
            others, self._tenant_turn = next_window(
                tenants, self._tenant_turn, present, MAX_TENANTS_PER_ROUND
            )
            if others:
                seen = {d["_id"] for d in pool}
                extra = await self.store.oldest_due_of(others, now, hiding, size)
                pool += [d for d in extra if d["_id"] not in seen]
        return fair_share(pool, size)

    def _idle_for(self, now: datetime, monotonic: float) -> float:
        """Nothing due: sleep until the book's next due time or next read,
        at most a poll interval."""
        delay = self.poll_interval
        next_due = self.book.next_due()
        if next_due is not None:
            delay = min(delay, (next_due - now).total_seconds())
        next_read = self.book.next_read()
        if next_read is not None:
            delay = min(delay, next_read - monotonic)
        return max(0.0, delay)

    async def _recover(self, tokens: dict[int, int], gained: set[int]) -> None:
        """What an older owner left in flight is due again: in the buckets
        just gained, and in every held one once a sweep interval (a stale
        owner that claimed after we took over, its lease's deadline missed).
        The sweep also takes what our own token has held IN_FLIGHT for longer
        than any round lasts: the safety net under everything a failed round
        keeps for settling (it runs between rounds, so no round of ours is
        working on anything then)."""
        stranded_before: datetime | None = None
        if self.monotonic() - self._swept_at >= RECOVERY_SWEEP:
            self._swept_at = self.monotonic()
            buckets = tokens
            stranded_before = self.wall() - self.stranded_after
        else:
            buckets = {b: tokens[b] for b in gained}
        if not buckets:
            return
        recovered = await self.store.recover_in_flight(buckets, stranded_before)
        if recovered:
            self.metrics.recovered.inc(len(recovered))
            self.book.stale({b for b in buckets})
            log.warning(
                "re-delivering schedules left in flight by a former owner or a failed round",
                count=len(recovered),
                ids=recovered[:20],
            )

    async def _write(self, completions: Sequence[Completion]) -> int:
        """Write completions. What goes back to PENDING (a retry, a chain's
        next occurrence) is told to the book, so its bucket is read in time."""
        written = await self.store.complete(completions)
        for completion in completions:
            occurrence = completion.occurrence
            due_at = completion.due_at or (occurrence.next_at if occurrence else None)
            if completion.status == Status.PENDING and due_at is not None:
                self.book.hint(completion.claimed.bucket, due_at)
        return written

    async def _settle(self) -> None:
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
                restored = await self.store.unclaim(claims)
            except Exception:
                self._unclaimed = claims + self._unclaimed
                raise
            self.book.stale({c.bucket for c in claims})
            log.warning("put back claims never published", restored=restored, of=len(claims))

    async def _deliver(self, due: list[dict[str, Any]], tokens: dict[int, int]) -> None:
        now = self.wall()
        started = time.perf_counter()
        try:
            claimed = await self.store.claim(due, tokens, self.node_id, now)
        except Exception:
            # No answer, so no knowing which of these the claim took: put back
            # any that our token holds (a claim that never applied matches nothing).
            self._unclaimed.extend(Claimed(d, tokens[d["bucket"]]) for d in due)
            self.book.stale({d["bucket"] for d in due})
            raise
        self._busy = {c.bucket for c in claimed}
        try:
            await self._complete(claimed, started)
        finally:
            self._busy = set()

    async def _complete(self, claimed: list[Claimed], started: float) -> None:
        """Publish what the claim took and still may be, and write what
        became of each: decided whole before anything is written."""
        self.metrics.store_seconds.labels("claim").observe(time.perf_counter() - started)
        self.metrics.batch_size.observe(len(claimed))
        live = await self._end_unpublishable(self._still_held(claimed))
        if not live:
            return
        results = await self._publish_batch(live)
        outcomes = await self._decide(results)
        marked = await self._write_outcomes(outcomes, results)
        self._report(results.delivered, marked, outcomes)

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
        for claim in claimed:
            (live if self.leases.is_usable(claim.bucket, claim.token) else abandoned).append(claim)
        if abandoned:
            self._unclaimed.extend(abandoned)
            self.book.stale({c.bucket for c in abandoned})
            self.metrics.deliveries.labels("abandoned").inc(len(abandoned))
            log.warning("lease gone mid-batch (expired or handed over)", abandoned=len(abandoned))
        return live

    async def _end_unpublishable(self, live: list[Claimed]) -> list[Claimed]:
        """End what must not be published (past its deadline, a missed
        occurrence to skip); returns the rest. On an error none was published:
        all are put back next round."""
        try:
            live = await self._expire_overdue(live)
            return await self._skip_misfired(live)
        except Exception:
            self._unclaimed.extend(live)
            raise

    async def _publish_batch(self, live: list[Claimed]) -> _Results:
        """Publish ``live`` and sort the answers by what became of each."""
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
        published = [c for c in live if c.id not in unread]
        return _sorted(published, results, list(unread.values()))

    async def _decide(self, results: _Results) -> _Outcomes:
        """Every outcome of the batch (``outcomes.py``), dead letters
        published first: a failure whose dead letter did not go out keeps
        retrying rather than end without a record."""
        done_at = self.wall()
        exhausted = [(c, error) for c, error in results.failures if self.rules.exhausted(c)]
        unsent: set[str] = set()
        if exhausted and self.dead_letter_topic:
            unsent = await self._dead_letter(exhausted)
        return _Outcomes(
            done=[self.rules.delivered(c, done_at) for c in results.delivered],
            failed=[
                self.rules.failed(c, error, done_at, dead_letter_failed=c.id in unsent)
                for c, error in results.failures
            ],
            put_back=[*results.deferred, *results.unread],
            at=done_at,
        )

    async def _write_outcomes(self, outcomes: _Outcomes, results: _Results) -> int:
        """Write the outcomes as one unit; returns how many deliveries were
        marked. Whichever write fails, all of it is kept for the next round
        to settle (a completion or a put-back already written matches nothing
        the second time). Else a write failing part way would leave the rest
        IN_FLIGHT under this node's live token, which no recovery of an older
        owner's work would ever touch."""
        try:
            started = time.perf_counter()
            marked = await self._write(outcomes.done) if outcomes.done else 0
            self.metrics.store_seconds.labels("mark_delivered").observe(
                time.perf_counter() - started
            )
            if outcomes.failed:
                await self._write(outcomes.failed)
            if outcomes.put_back:
                await self.store.unclaim(outcomes.put_back)
        except Exception:
            self._unsettled.extend([*outcomes.done, *outcomes.failed])
            self._unclaimed.extend(outcomes.put_back)
            raise
        finally:
            self.book.stale({c.bucket for c in outcomes.put_back})
            if results.deferred:
                self._deferred(results.deferred, results.reasons, results.delivered)
        return marked

    def _report(self, delivered: list[Claimed], marked: int, outcomes: _Outcomes) -> None:
        """Count, log and record what was written (history off the path)."""
        if delivered:
            self.metrics.deliveries.labels("delivered").inc(marked)
            if marked < len(delivered):
                # A newer owner took these over while we published: they went
                # out twice, and the fence kept our stale mark off its work.
                self.metrics.deliveries.labels("fenced").inc(len(delivered) - marked)
                log.warning(
                    "completion rejected by a newer lease token",
                    fenced=len(delivered) - marked,
                    buckets=sorted({c.bucket for c in delivered}),
                )
            # A one-shot schedule's document records its delivery already
            # (deliveredAt, attempts, owner, token): its history shows it
            # from there, and the store is spared a write for nearly every record.
            self._record([c for c in delivered if c.recurring], outcomes.at, Outcome.DELIVERED)
            for c in delivered:
                lateness = max((outcomes.at - c.execute_at).total_seconds(), 0.0)
                self.metrics.lateness.observe(lateness)
                log.debug("schedule delivered", **_about(c), lateness_s=round(lateness, 4))
        if outcomes.failed:
            self._failed(outcomes.failed)

    async def _publish(
        self,
        live: list[Claimed],
        as_record: Callable[[Claimed, dict[str, Any]], Record] | None = None,
    ) -> tuple[list[Failed | None], dict[str, Claimed]]:
        """Publish ``live``, a few megabytes of payload at a time: the large
        payloads (read without them, ``node/schedule/payload.py``) are
        fetched for each part just before it goes, so a batch of large ones
        is never all in memory at once. Returns a result per claim published
        and, by id, the claims left unpublished because their payloads could
        not be read (the store failed part way). ``as_record``: the record a
        claim (its document, payload loaded) becomes; by default its own."""
        as_record = as_record or (lambda c, doc: build_record(doc, c.token, c.attempt))
        results: list[Failed | None] = []
        unread: dict[str, Claimed] = {}
        for part in _by_bytes(live, PUBLISH_PART_BYTES):
            missing = [c for c in part if needs_fetch(c.doc)]
            payloads: dict[str, bytes] = {}
            if missing and not unread:
                try:
                    payloads = await self.store.large_payloads(missing)
                except SchedulerError as exc:
                    log.warning("could not read large payloads", error=str(exc))
            if any(c.id not in payloads for c in missing):
                unread.update((c.id, c) for c in part)
                continue
            records = [
                as_record(c, {**c.doc, LARGE: payloads[c.id]} if c.id in payloads else c.doc)
                for c in part
            ]
            results += await self.publisher.publish(records)
        return results, unread

    async def _expire_overdue(self, claimed: list[Claimed]) -> list[Claimed]:
        """One-shots past their deadline (``expireAfter``) are not published:
        they end EXPIRED. The document records when (``expiredAt``), so its
        history shows it without a history write. The rest go ahead."""
        now = self.wall()
        overdue = [c for c in claimed if self.rules.should_expire(c, now)]
        return await self._end_unpublished(
            claimed, [self.rules.expired(c, now) for c in overdue], "expired"
        )

    async def _skip_misfired(self, claimed: list[Claimed]) -> list[Claimed]:
        """Occurrences of recurring schedules whose misfire policy is skip and
        which are too late are not published: their chain moves on. The rest
        go ahead."""
        now = self.wall()
        skipped = [c for c in claimed if self.rules.should_skip(c, now)]
        left = await self._end_unpublished(
            claimed, [self.rules.skipped(c, now) for c in skipped], "skipped"
        )
        if skipped:
            self._record(skipped, now, Outcome.SKIPPED)
        return left

    async def _end_unpublished(
        self, claimed: list[Claimed], completions: list[Completion], outcome: str
    ) -> list[Claimed]:
        """Write ``completions`` (claims that end here, unpublished) and return
        the claims left to publish. Unwritten, they are written next round."""
        if not completions:
            return claimed
        try:
            written = await self._write(completions)
        except Exception:
            self._unsettled.extend(completions)
            raise
        self.metrics.deliveries.labels(outcome).inc(written)
        ended = {c.claimed.id for c in completions}
        log.info("claims ended unpublished", outcome=outcome, count=written, ids=sorted(ended)[:20])
        return [c for c in claimed if c.id not in ended]

    def _failed(self, completions: list[Completion]) -> None:
        """Count and record publishes that failed (written already)."""
        for completion in completions:
            self._record([completion.claimed], completion.at, completion.outcome, completion.error)
            log.warning("publish failed", **_about(completion.claimed), error=completion.error)
        retried = sum(1 for c in completions if c.outcome == Outcome.RETRYING)
        self.metrics.deliveries.labels("retried").inc(retried)
        self.metrics.deliveries.labels("failed").inc(len(completions) - retried)

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
                )
                for c in claimed
            ]
        )

    def _deferred(
        self, deferred: list[Claimed], reasons: list[Failed], delivered: list[Claimed]
    ) -> None:
        """The broker could not take these: they go back to PENDING with the
        attempt undone (an outage must not spend the retry budget; written
        with the batch's outcomes). When it took nothing of the batch, it is
        down: claim nothing until it answers."""
        self.metrics.deliveries.labels("deferred").inc(len(deferred))
        if not delivered:
            self._broker_trouble(reasons[0].error if reasons else "")
        log.warning(
            "the broker did not take these: deferred, no attempt spent",
            count=len(deferred),
            error=reasons[0].error if reasons else None,
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

    async def _dead_letter(self, failures: list[tuple[Claimed, str]]) -> set[str]:
        """Publish these to the dead-letter topic; returns the ids it did not
        take (they keep retrying rather than fail without a record)."""
        errors = {claimed.id: error for claimed, error in failures}

        def dead_letter(claimed: Claimed, doc: dict[str, Any]) -> Record:
            original = build_record(doc, claimed.token, claimed.attempt)
            headers = [
                *original.headers,
                ("original-topic", original.topic.encode()),
                ("error", errors[claimed.id].encode()[:1024]),
            ]
            return Record(self.dead_letter_topic, original.key, original.value, headers)

        claims = [claimed for claimed, _error in failures]
        try:
            results, unread = await self._publish(claims, dead_letter)
        except Exception as exc:  # no answer: none of them is known to be there
            log.exception("dead-letter publish raised")
            results, unread = (
                [Failed(f"{type(exc).__name__}: {exc}", broker=True)] * len(claims),
                {},
            )
        unsent = set(unread)
        published = [c for c in claims if c.id not in unread]
        for claimed, failure in zip(published, results, strict=True):
            if failure is not None:
                unsent.add(claimed.id)
                log.error("dead-letter publish failed", **_about(claimed), error=failure.error)
        return unsent


@dataclass(frozen=True)
class _Results:
    """A published batch, sorted by what became of each record."""

    delivered: list[Claimed]
    deferred: list[Claimed]  # the broker's trouble: put back, no attempt spent
    reasons: list[Failed]  # why, for each deferred one
    failures: list[tuple[Claimed, str]]  # the record's own fault: an attempt spent
    unread: list[Claimed]  # unpublished: the store did not give their payloads


@dataclass(frozen=True)
class _Outcomes:
    """What the batch's schedules become, decided before any is written."""

    done: list[Completion]
    failed: list[Completion]
    put_back: list[Claimed]
    at: datetime


def _sorted(
    published: list[Claimed], results: list[Failed | None], unread: list[Claimed]
) -> _Results:
    delivered: list[Claimed] = []
    deferred: list[Claimed] = []
    reasons: list[Failed] = []
    failures: list[tuple[Claimed, str]] = []
    for claim, failure in zip(published, results, strict=True):
        if failure is None:
            delivered.append(claim)
        elif failure.broker:
            deferred.append(claim)
            reasons.append(failure)
        else:
            failures.append((claim, failure.error))
    return _Results(delivered, deferred, reasons, failures, unread)


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
    wall: Callable[[], datetime] = utcnow,
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
        rules=Rules(config.retry, timedelta(seconds=config.misfire_threshold)),
        dead_letter_topic=config.dead_letter_topic,
        history=history,
        tenant_names=tenant_names if config.fair_tenants else None,
        wall=wall,
        stranded_after=longest_round(
            config.store_timeout, publisher.request_timeout + METADATA_DEADLINE
        ),
    )
