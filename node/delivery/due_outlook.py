"""What is due in this node's buckets, for the metrics: how many schedules
are due and not delivered yet (``scheduler_due_backlog``), how late the
oldest of them is (``scheduler_oldest_due_age_seconds``), and how many fall
due within the next minute, five and hour (``scheduler_due_within``).

Read at scrape time from what the poller knows already: its view of each
bucket it holds (``due_book.py``), a bucket's PENDING schedules from the
earliest, up to a share of the read budget, and the claims it has not
written back yet (being published, an HTTP call out: ``in_flight``). The
leases usable at the scrape decide which buckets count, so a bucket lost
stops counting at once (its view goes only at the poller's next round).

Where a view is truncated (it is full and all it holds is due: a backlog
behind it) the views say only "at least", and that is when the figure
matters: after an outage a node's views hold its read budget (four
batches, about 2,000 schedules at the defaults), so a backlog of 100,000
would read as 2,000 and an alert on it would never fire. The exact figure
needs a count in the store, ``Schedules.due_backlog``: a range of
``bucket_status_due`` per bucket. Against a real MongoDB, counting on every
scrape would cost what a quiet cluster must not: one count per bucket held
(B / N) and, with the count's limit left off, every index entry of the
backlog (a million due after an outage: a million entries read per scrape,
per node). So it is counted only for what the views cannot say, and
bounded:

* only truncated views' buckets: a view that holds all that is due (a
  quiet bucket, or one keeping up) costs nothing, so a quiet cluster's
  store sees no read more for the metrics, whatever B;
* at most once in COUNT_EVERY seconds however often the node is scraped,
  at most COUNT_BUCKETS buckets at a time (those counted longest ago
  first), each count stopping at COUNT_LIMIT entries (MongoDB's count with
  a limit stops its index scan there; the filter is the index's prefix and
  a count needs no field of the document, so no document is fetched): at
  most 32 statements and 320,000 index entries in ten seconds, whatever B
  or the backlog (not measured against a MongoDB server here; at the
  millions of entries a second an index scan runs, a few percent of one
  core at the very worst);
* on the API's connection pool (the scrape is an API call), never on the
  poller's, and never in a delivery round;
* between counts a count is carried forward by what the poller took from
  the bucket since (``Outlook.taken``), so a draining backlog falls with
  its deliveries; what was stored since is not added: the figure errs low.

The embedded SecantusDB reads a bucket's whole range before applying the
limit, so there a count costs the bucket's backlog (about 20 ms for 1,250
due schedules), at the same bounded rate.

The forecast (``scheduler_due_within``) is the views' alone, never counted:
a view holds what its last read returned, up to that read's bound (a poll
interval ahead; with the change feed a minute, and an idle bucket is read
just before its next due time) and its share of the read budget, so it is
a lower bound wherever a window reaches past a view's bound or a view is
truncated. Counting the future in the store would read every bucket's
range up to an hour ahead, B ranges on every scrape of a quiet cluster.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

import structlog

from node.delivery.due_book import DueBook, Outlook
from node.errors import SchedulerError
from node.metrics import DueFigures
from node.schedule.times import aware
from node.store.contract import Claimed

log = structlog.get_logger(__name__)

# The store's counts of truncated views' buckets: at most once in this many
# seconds, at most this many buckets at a time, each stopping at this many
# schedules (past it, the figure is a lower bound), and a scrape waits this
# long for them at most (seconds; a hung store must not hang the scrape).
COUNT_EVERY = 10.0
COUNT_BUCKETS = 32
COUNT_LIMIT = 10_000
COUNT_DEADLINE = 1.0
# The forecast's windows (seconds): what falls due within each from now.
WINDOWS = (60, 300, 3600)

# ``Schedules.due_backlog``: bucket -> PENDING schedules due by then, each
# count stopping at the limit.
Count = Callable[[Collection[int], datetime, int], Awaitable[Mapping[int, int]]]


@dataclass(frozen=True)
class Counted:
    """A truncated bucket's due schedules as the store counted them."""

    token: int  # the lease's, when counted: under another, it says nothing
    count: int
    taken: int  # ``Outlook.taken`` just before the count
    at: float  # monotonic


def figures(
    outlooks: Mapping[int, Outlook],
    counted: Mapping[int, Counted],
    now: datetime,
    in_flight: Iterable[Claimed] = (),
) -> DueFigures:
    """The figures at ``now`` from the views of the buckets held (and the
    store's counts of the truncated ones), with the claims not written back
    yet of those buckets, under the same tokens."""
    backlog = 0
    oldest: datetime | None = None
    within = dict.fromkeys(WINDOWS, 0)
    for bucket, outlook in outlooks.items():
        due = bisect.bisect_right(outlook.due_times, now)
        for window in WINDOWS:
            until = now + timedelta(seconds=window)
            within[window] += bisect.bisect_right(outlook.due_times, until) - due
        known = due
        count = counted.get(bucket)
        if outlook.truncated and count is not None and count.token == outlook.token:
            known = max(due, count.count - (outlook.taken - count.taken))
        backlog += known
        if due and (oldest is None or outlook.due_times[0] < oldest):
            oldest = outlook.due_times[0]
    for claim in in_flight:
        held = outlooks.get(claim.bucket)
        if held is not None and held.token == claim.token:
            backlog += 1
            due_at = aware(claim.doc["dueAt"])
            oldest = due_at if oldest is None else min(oldest, due_at)
    age = 0.0 if oldest is None else max(0.0, (now - oldest).total_seconds())
    return DueFigures(backlog=backlog, oldest_age=age, within=within)


class DueOutlook:
    """The figures of ``due_outlook.py`` for one node: ``figures`` at scrape
    time, ``refresh`` (awaited by the scrape first) for the store's counts."""

    def __init__(
        self,
        book: DueBook,
        usable: Callable[[], Mapping[int, int]],
        now: Callable[[], datetime],
        count: Count | None = None,
        *,
        in_flight: Callable[[], Iterable[Claimed]] = tuple,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.book = book
        self.usable = usable  # bucket -> token of the leases work may start under
        self.now = now  # the store's clock (what decides what is due)
        self.count = count
        self.in_flight = in_flight  # the poller's claims not written back yet
        self.monotonic = monotonic
        self.counted: dict[int, Counted] = {}
        self._counting_at: float | None = None

    def figures(self) -> DueFigures:
        now = self.now()
        outlooks = self.book.outlook(self.usable(), now)
        return figures(outlooks, self.counted, now, self.in_flight())

    async def refresh(self) -> None:
        """Count the truncated views' buckets in the store, as bounded above;
        a count that fails, or is not back by COUNT_DEADLINE, leaves the
        figure to the views (a lower bound) and the counts made before it."""
        if self.count is None:
            return
        started = self.monotonic()
        if self._counting_at is not None and started - self._counting_at < COUNT_EVERY:
            return
        now = self.now()
        outlooks = self.book.outlook(self.usable(), now)
        truncated = {b: o for b, o in outlooks.items() if o.truncated}
        self.counted = {
            b: c
            for b, c in self.counted.items()
            if b in truncated and truncated[b].token == c.token
        }
        if not truncated:
            return
        self._counting_at = started
        chosen = sorted(truncated, key=lambda b: (self._counted_at(b), b))[:COUNT_BUCKETS]
        try:
            async with asyncio.timeout(COUNT_DEADLINE):
                for bucket in chosen:
                    await self._count(bucket, truncated[bucket].token, now)
        except (SchedulerError, TimeoutError) as exc:
            log.warning("could not count the due backlog", error=str(exc) or "timed out")

    async def _count(self, bucket: int, token: int, now: datetime) -> None:
        assert self.count is not None
        taken = self.book.taken_from(bucket, token)
        found = await self.count([bucket], now, COUNT_LIMIT)
        if taken is not None:
            self.counted[bucket] = Counted(token, found.get(bucket, 0), taken, self.monotonic())

    def _counted_at(self, bucket: int) -> float:
        counted = self.counted.get(bucket)
        return float("-inf") if counted is None else counted.at
