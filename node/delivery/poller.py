"""The bucket poller: delivers the due schedules of the buckets this node
holds leases on (DESIGN.md "Bucket poller").

One loop serves all held buckets: one due-work query per wake-up with
``bucket $in held``, rather than a task and a query per bucket, so an idle
node asks the store about one question per poll interval whatever its bucket
count, and a burst fills large batches. Ownership stays per bucket: every
write carries that bucket's token.

Each round:

1. find due work (PENDING, dueAt <= now, oldest first, index-served); the
   same query looks one poll interval ahead to learn the next due time;
2. claim the batch in one bulk write (PENDING -> IN_FLIGHT, with the token);
3. drop anything whose lease's local deadline passed during the claim, then
   publish to Kafka and wait for the acks;
4. complete each one as ``outcomes.py`` decides (DELIVERED, back to
   PENDING with backoff, DELIVERY_FAILED past the retry limit and to the
   dead-letter topic when configured, a recurring one's next occurrence),
   fenced by the token;
5. sleep until the next due time or the poll interval, whichever is
   sooner, but at least until the batch linger since the round began has
   passed; a hint from the API (a schedule due sooner) or a lease change
   cuts the sleep short.

Schedules left IN_FLIGHT by an older token (a former owner died or paused
mid-batch) are made due again whenever leases change and every renew period.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import structlog

from node.delivery.fairness import by_due, fair_order
from node.delivery.history_writer import HistoryWriter
from node.delivery.leases import LeaseManager
from node.delivery.outcomes import Rules
from node.delivery.publisher import KafkaPublisher
from node.errors import SchedulerError
from node.metrics import NodeMetrics
from node.schedule.record import Record, build_record
from node.schedule.times import aware, utcnow
from node.store.contract import Claimed, Completion, Outcome
from node.store.history import Attempt
from node.store.schedules import ScheduleStore

log = structlog.get_logger("node.poller")

# How far a loop that delivered in its last round looks ahead (seconds).
BUSY_LOOKAHEAD = 0.25
# Under a backlog, batches of due work read per window query, and how long
# what was read stays good for.
READ_AHEAD = 10
READ_AHEAD_SECONDS = 5.0


class BucketPoller:
    def __init__(
        self,
        store: ScheduleStore,
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
    ) -> None:
        self.store = store
        self.leases = leases
        self.publisher = publisher
        self.metrics = metrics
        self.node_id = node_id
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.batch_linger = batch_linger
        self.rules = rules
        self.dead_letter_topic = dead_letter_topic
        self.history = history
        # The tenants whose due work a backlog could hide (None: no fairness,
        # plain oldest first, kept to measure what fairness buys).
        self.tenant_names = tenant_names
        self._tenant_turn = 0
        # Due schedules read beyond this round's batch under a backlog.
        self._read_ahead: list[dict[str, Any]] = []
        self._read_ahead_at = 0.0
        self._backlogged = False
        self.wall = wall
        self.monotonic = monotonic
        self._wake = asyncio.Event()
        self._wake_at: datetime | None = None
        self._recover_at = 0.0
        self._delivered_last_round = False
        self._stopping = False
        self._idle = asyncio.Event()  # set between rounds
        self._idle.set()
        # Buckets of the batch claimed and not yet completed in this round.
        self._busy: set[int] = set()
        # What a failed round left behind (a store error after its claim):
        # completions decided but not written, and claims that may have been
        # made but were never published. Settled first thing next round.
        self._unsettled: list[Completion] = []
        self._unclaimed: list[tuple[str, int]] = []

    # -- signals from the rest of the node ---------------------------------------

    def hint(self, due_at: datetime) -> None:
        """A schedule of a held bucket falls due at ``due_at``: wake by then."""
        if self._wake_at is None or due_at < self._wake_at:
            self._wake.set()

    def leases_changed(self) -> None:
        self._recover_at = 0.0
        self._read_ahead = []  # read under other leases: look again
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
            await asyncio.wait_for(self._wake.wait(), timeout=delay)
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
        # Cleared before the query: a hint arriving during this round then
        # makes the following sleep return at once instead of being missed.
        self._wake.clear()
        tokens = self.leases.usable()
        self.metrics.buckets_owned.set(len(tokens))
        if not tokens:
            return self.poll_interval
        if self._unsettled or self._unclaimed:
            await self._settle()
        if self.monotonic() >= self._recover_at:
            await self._recover(tokens)
        now = self.wall()
        # Looking ahead tells an idle loop how long it may sleep. A busy loop
        # comes back after the linger anyway, so it looks ahead only a little:
        # the window read is the cluster's schedules due within the lookahead,
        # and under load a full poll interval of them is most of the query.
        busy = self._delivered_last_round
        lookahead = min(self.poll_interval, BUSY_LOOKAHEAD) if busy else self.poll_interval
        started = time.perf_counter()
        docs = await self._find_due(tokens, now, now + timedelta(seconds=lookahead))
        self.metrics.store_seconds.labels("find_due").observe(time.perf_counter() - started)
        due = [d for d in docs if aware(d["dueAt"]) <= now]
        self._delivered_last_round = bool(due)
        if due:
            await self._deliver(due, tokens)
            return 0.0
        if docs:
            return max(0.0, (aware(docs[0]["dueAt"]) - self.wall()).total_seconds())
        # Nothing within a short lookahead says nothing about the rest of
        # the poll interval: look again at once, with the full lookahead.
        return 0.0 if lookahead < self.poll_interval else self.poll_interval

    async def _find_due(
        self, tokens: dict[int, int], now: datetime, until: datetime
    ) -> list[dict[str, Any]]:
        """This round's batch (oldest first, shared fairly among tenants).

        Under a backlog the due window is read READ_AHEAD batches at a time
        and the rest kept for the next rounds (for READ_AHEAD_SECONDS at most):
        on a store that reads the whole due range whatever the limit (the
        embedded one: 2 s at 50,000 due), that query then runs once per
        READ_AHEAD rounds, not every round. Kept schedules may have been
        cancelled or moved meanwhile; the claim's conditions skip those.
        Other tenants' oldest due schedules are still looked up every round.
        """
        tenants = await self._tenants()
        kept = [d for d in self._read_ahead if d["bucket"] in tokens and aware(d["dueAt"]) <= now]
        if kept and self.monotonic() - self._read_ahead_at < READ_AHEAD_SECONDS:
            present = {d.get("tenant") for d in kept}
            others = [t for t in tenants or () if t not in present]
            pool = kept + await self.store.oldest_due_of(others, until, tokens, self.batch_size)
            limit = len(pool)
        else:
            backlog = len(self._read_ahead) > 0 or self._backlogged
            limit = self.batch_size * (READ_AHEAD if backlog else 1)
            pool = await self.store.find_due(tokens, until, limit, tenants)
            self._read_ahead_at = self.monotonic()
        # The one place fairness is applied: the pool in the order a fair
        # round takes it (or plain oldest first, kept to measure fairness).
        ordered = sorted(pool, key=by_due) if tenants is None else fair_order(pool)
        ordered = ordered[:limit]
        batch = sorted(ordered[: self.batch_size], key=by_due)
        self._read_ahead = ordered[self.batch_size :]
        self._backlogged = len(ordered) > self.batch_size
        return batch

    async def _tenants(self) -> list[str] | None:
        """The tenants to serve fairly this round, starting one further each
        round, so that when there are more than a round looks up, all get turns."""
        if self.tenant_names is None:
            return None
        names = sorted(await self.tenant_names())
        if not names:
            return names
        self._tenant_turn = (self._tenant_turn + 1) % len(names)
        return names[self._tenant_turn :] + names[: self._tenant_turn]

    async def _recover(self, tokens: dict[int, int]) -> None:
        self._recover_at = self.monotonic() + self.leases.renew_interval
        recovered = await self.store.recover_in_flight(tokens)
        if recovered:
            self.metrics.recovered.inc(len(recovered))
            log.warning(
                "re-delivering schedules left in flight by a former owner",
                count=len(recovered),
                ids=recovered[:20],
            )

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
                written = await self.store.complete(completions)
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
            log.warning("put back what a failed claim may have taken", restored=restored)

    async def _deliver(self, due: list[dict[str, Any]], tokens: dict[int, int]) -> None:
        now = self.wall()
        started = time.perf_counter()
        try:
            claimed = await self.store.claim(due, tokens, self.node_id, now)
        except Exception:
            # No answer, so no knowing which of these the claim took: put back
            # any that our token holds (a claim that never applied matches nothing).
            self._unclaimed.extend((d["_id"], tokens[d["bucket"]]) for d in due)
            raise
        self._busy = {c.bucket for c in claimed}
        try:
            await self._complete(claimed, started)
        finally:
            self._busy = set()

    async def _complete(self, claimed: list[Claimed], started: float) -> None:
        self.metrics.store_seconds.labels("claim").observe(time.perf_counter() - started)
        self.metrics.batch_size.observe(len(claimed))
        # The claim may have waited; publish nothing for a lease that could
        # have expired meanwhile. Its next owner recovers those schedules.
        live = [c for c in claimed if self.leases.is_usable(c.bucket, c.token)]
        if len(live) < len(claimed):
            self.metrics.deliveries.labels("abandoned").inc(len(claimed) - len(live))
            log.warning(
                "lease gone mid-batch (expired or handed over)", abandoned=len(claimed) - len(live)
            )
        try:
            live = await self._skip_misfired(live)
            records = [build_record(c.doc, c.token, c.attempt) for c in live]
        except Exception:
            self._unclaimed.extend((c.id, c.token) for c in live)  # none was published
            raise
        if not live:
            return
        started = time.perf_counter()
        results = await self.publisher.publish(records)
        self.metrics.publish_seconds.observe(time.perf_counter() - started)

        delivered = [c for c, err in zip(live, results, strict=True) if err is None]
        failures = [
            (c, f"{type(err).__name__}: {err}")
            for c, err in zip(live, results, strict=True)
            if err is not None
        ]
        done_at = self.wall()
        done = [self.rules.delivered(c, done_at) for c in delivered]
        exhausted = [(c, error) for c, error in failures if self.rules.exhausted(c)]
        if exhausted and self.dead_letter_topic:
            await self._dead_letter(exhausted)
        failed = [self.rules.failed(c, error, done_at) for c, error in failures]
        try:
            started = time.perf_counter()
            marked = await self.store.complete(done) if done else 0
            self.metrics.store_seconds.labels("mark_delivered").observe(
                time.perf_counter() - started
            )
            if failed:
                await self.store.complete(failed)
        except Exception:
            # Published, and the outcome decided: write it next round. (A
            # completion already written matches nothing the second time.)
            self._unsettled.extend([*done, *failed])
            raise
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
            self._record(delivered, done_at, Outcome.DELIVERED)
            for c in delivered:
                lateness = (done_at - aware(c.doc["executeAt"])).total_seconds()
                self.metrics.lateness.observe(max(lateness, 0.0))
                log.debug(
                    "schedule delivered", **_about(c), lateness_s=round(max(lateness, 0.0), 4)
                )
        if failed:
            self._failed(failed)

    async def _skip_misfired(self, claimed: list[Claimed]) -> list[Claimed]:
        """Occurrences of recurring schedules whose misfire policy is skip and
        which are too late are not published: their chain moves on. The rest
        go ahead."""
        now = self.wall()
        skipped = [c for c in claimed if self.rules.should_skip(c, now)]
        if not skipped:
            return claimed
        completions = [self.rules.skipped(c, now) for c in skipped]
        try:
            moved = await self.store.complete(completions)
        except Exception:
            self._unsettled.extend(completions)
            raise
        self._record(skipped, now, Outcome.SKIPPED)
        self.metrics.deliveries.labels("skipped").inc(moved)
        log.info("missed occurrences skipped", count=len(skipped), ids=[c.id for c in skipped][:20])
        skipped_ids = {c.id for c in skipped}
        return [c for c in claimed if c.id not in skipped_ids]

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
                    execute_at=aware(c.doc["executeAt"]),
                    attempt=c.attempt,
                    at=at,
                    node=self.node_id,
                    token=c.token,
                    outcome=outcome.value,
                    error=error,
                )
                for c in claimed
            ]
        )

    async def _dead_letter(self, failures: list[tuple[Claimed, str]]) -> None:
        records = []
        for claimed, error in failures:
            original = build_record(claimed.doc, claimed.token, claimed.attempt)
            headers = [
                *original.headers,
                ("original-topic", original.topic.encode()),
                ("error", error.encode()[:1024]),
            ]
            records.append(Record(self.dead_letter_topic, original.key, original.value, headers))
        results = await self.publisher.publish(records)
        for (claimed, _error), err in zip(failures, results, strict=True):
            if err is not None:
                log.error("dead-letter publish failed", **_about(claimed), error=str(err))


def _about(claimed: Claimed) -> dict[str, Any]:
    """What a log line says of one claimed schedule."""
    return {
        "schedule_id": claimed.id,
        "bucket": claimed.bucket,
        "token": claimed.token,
        "attempt": claimed.attempt,
    }


__all__ = ["BucketPoller"]
