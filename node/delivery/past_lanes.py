"""The due work hidden behind slow lanes, one read per node.

A bucket's view holds its earliest due schedules, at most a read's limit.
When that is a backlog of a lane that goes slowly, the records and other
hosts' calls due behind it in the same bucket would wait until the backlog
has drained. A *lane* is what a due schedule waits on (``lane``: its host,
or None for Kafka). A lane is *slow* node-wide, not per bucket: while it
is stalled (a host with its circuit open, Kafka while the broker is down),
or while its due calls make up more than half of a full view (a hung host's
backlog, or one draining a bound at a time).
A full view whose due work includes a slow lane is *crowded*. A lane that
is not slow is never skipped: its own later work in a crowded bucket may
be due before anything the views hold of it in other buckets (the
isolation bench: a fast host's calls hidden behind a hung host's backlog
in every bucket waited up to ten intervals while every host with a due
call in some full view, at its bound, with more calls due than it takes
at once, or late, was skipped).

So the node reads, in one statement for all its crowded buckets, their
PENDING schedules due soon but those of the slow lanes (``PastRead``: one
index range per bucket and lane gap, ``bucket_status_host_due``), and adds
what it finds to the views. The poller makes it beside its rounds, one at a
time, so the work in hand never waits on it. Each reads ahead as far as
the next can come, so what falls due meanwhile is in hand in time, and a
schedule this node stores meanwhile within its reach joins its finds with
no read. When: the first at once; buckets newly crowded a refresh
interval after the last read, and those alone (the others are covered up
to their bounds: while a hung host's backlog fills the views one by one,
a read of every crowded bucket each interval was a statement per bucket
on the embedded store, half its time); every crowded bucket a refresh
after the last such read for a lane no longer slow, a hint into a crowded
bucket or a find the last read should have made (a hint lost), else
doubling up to WHOLE_READ_EVERY intervals (what is new past the last
read's reach is only time moving on), but a full read is followed a
refresh before its last schedule falls due, and at once when all it
brought has been taken. Its cost is one read per node per interval at
most, whatever the number of buckets or the size of the backlogs, and
what it walks is work the node takes next, never the backlog it skips.

Pure: no IO and no clock reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from node.delivery.routes import Lane, Routes, due_at
from node.schedule.destination import lane

Doc = dict[str, Any]


@dataclass(frozen=True)
class PastRead:
    """Read the PENDING schedules of ``tokens``' buckets due by ``until``,
    but those of the lanes ``skipping``, earliest first, at most ``limit``."""

    tokens: Mapping[int, int]  # bucket -> the token its view was read under
    until: datetime
    limit: int
    skipping: frozenset[Lane]
    # Every crowded bucket (else only those newly crowded: the others are
    # covered by the last reads, up to their bounds).
    whole: bool = True


@dataclass
class PastLanes:
    refresh: float  # seconds: the shortest interval between reads
    longest: float  # seconds: the longest, while reads find nothing
    limit: int
    _at: float | None = None  # monotonic: the last read of every crowded bucket
    _last: float | None = None  # monotonic: the last read of any
    _every: float = 0.0  # seconds to the next whole read (0: ``refresh``)
    _full: bool = False  # the last whole read returned its limit
    # A read is out (the poller makes it beside its rounds): no other until
    # it is learned or has failed.
    pending: bool = False
    _whole: bool = False  # the read out is of every crowded bucket
    skipped: frozenset[Lane] = frozenset()  # the lanes the reads skip
    # bucket -> up to when the reads hold every schedule of it of the lanes
    # they did not skip: a read's own bound, or when full its last
    # schedule's due time.
    bounds: dict[int, datetime] = field(default_factory=dict)

    @property
    def covered(self) -> frozenset[int]:
        return frozenset(self.bounds)

    @property
    def bound(self) -> datetime | None:
        """Up to when the reads hold every schedule of every bucket covered."""
        return min(self.bounds.values(), default=None)

    def read(
        self,
        crowded: Mapping[int, tuple[int, Routes]],
        slow: frozenset[Lane],
        now: datetime,
        monotonic: float,
    ) -> PastRead | None:
        """The read to make now, if any. ``crowded``: bucket -> (token, its
        view's schedules by route) of the full views; ``slow``: the slow lanes
        (``slow_lanes``)."""
        if self.pending:
            return None
        lanes = self._lanes(crowded, slow, now)
        # A bucket no longer crowded is read whole again, not past.
        self.bounds = {b: bound for b, bound in self.bounds.items() if b in lanes}
        if not lanes:
            self._at = self._last = None
            self._every, self.skipped = 0.0, frozenset()
            return None
        whole_at, newly_at = self._times(lanes, crowded, now)
        if monotonic >= whole_at:
            buckets, whole = sorted(lanes), True
        elif monotonic >= newly_at:
            buckets, whole = sorted(set(lanes) - set(self.bounds)), False
        else:
            return None
        skipping = frozenset().union(*lanes.values())
        if not whole:
            skipping |= self.skipped  # what the other buckets' reads skipped
        tokens = {b: crowded[b][0] for b in buckets}
        until = now + timedelta(seconds=self.longest + self.refresh)
        self.pending, self._whole = True, whole
        return PastRead(tokens, until, self.limit, skipping, whole)

    def learned(self, read: PastRead, docs: Sequence[Doc], missed: bool, monotonic: float) -> None:
        """A read came back with ``docs``, some of which the last read should
        have found (``missed``: a hint lost, or never sent): look less often
        while reads find nothing they should not have (what is new past the
        last one's bound is time moving on; each reads ahead as far as the
        next). A full read did not reach its own bound, so the next comes a
        refresh before its last schedule falls due, and at once when all it
        brought has been taken (``_more``). A read of the buckets newly
        crowded only adds them (the next whole read comes when it would)."""
        full = len(docs) >= read.limit
        bound = due_at(docs[-1]) if full else read.until
        self._last, self.pending = monotonic, False
        if not read.whole:
            self.bounds.update(dict.fromkeys(read.tokens, bound))
            self.skipped = read.skipping
            if missed:
                self._every = self.refresh
            return
        room = self.longest
        if full:
            read_at = read.until - timedelta(seconds=self.longest + self.refresh)
            room = (bound - read_at).total_seconds() - self.refresh
        every = min(2 * (self._every or self.refresh), self.longest, room)
        self._every = self.refresh if missed else max(self.refresh, every)
        self._at, self._full = monotonic, full
        self.skipped, self.bounds = read.skipping, dict.fromkeys(read.tokens, bound)

    def failed(self, monotonic: float) -> None:
        """The read failed: the next comes when this one's successor would."""
        self._last, self.pending = monotonic, False
        if self._whole:
            self._at = monotonic

    def covers(self, doc: Doc) -> bool:
        """Whether the last reads would have returned ``doc``: in a bucket
        they covered, of a lane they did not skip, due by its bound."""
        bound = self.bounds.get(int(doc["bucket"]))
        return bound is not None and lane(doc) not in self.skipped and due_at(doc) <= bound

    def hinted(self) -> None:
        """A schedule falls due in a crowded bucket: read at the next interval."""
        self._every = 0.0

    def next_at(
        self,
        crowded: Mapping[int, tuple[int, Routes]],
        slow: frozenset[Lane],
        now: datetime,
    ) -> float | None:
        """The monotonic time of the next read (-inf: now); None: none wanted
        (nor while one is out: its answer wakes the poller)."""
        if self.pending:
            return None
        lanes = self._lanes(crowded, slow, now)
        return min(self._times(lanes, crowded, now)) if lanes else None

    @staticmethod
    def _lanes(
        crowded: Mapping[int, tuple[int, Routes]], slow: frozenset[Lane], now: datetime
    ) -> dict[int, frozenset[Lane]]:
        """bucket -> the slow lanes due in its view, of the views with any."""
        return {
            bucket: found
            for bucket, (_, routes) in crowded.items()
            if (found := routes.due_lanes(now) & slow)
        }

    def _times(
        self,
        lanes: Mapping[int, frozenset[Lane]],
        crowded: Mapping[int, tuple[int, Routes]],
        now: datetime,
    ) -> tuple[float, float]:
        """When to read every crowded bucket, and when those newly crowded
        (whose backlogs nothing has read past: a refresh after the last
        read, so buckets filling one by one cost a read per interval at
        most, and only of them; a whole read each time cost a statement per
        crowded bucket on the embedded store, every interval while a hung
        host's backlog grew)."""
        never = float("inf")
        if self._at is None or self._more(crowded, now):
            return float("-inf"), never
        # A lane no longer skipped: what it holds behind every view has not
        # been read.
        skipping = frozenset().union(*lanes.values())
        every = self.refresh if not skipping >= self.skipped else self._every or self.refresh
        newly = not set(lanes) <= set(self.bounds)
        last = self._last if self._last is not None else self._at
        return self._at + every, (last + self.refresh if newly else never)

    def _more(self, crowded: Mapping[int, tuple[int, Routes]], now: datetime) -> bool:
        """The last whole read was full and all it brought has been taken
        (the views hold only due work of the lanes it skipped; work read
        ahead waits for its time, so the same read is not made again
        meanwhile)."""
        return self._full and all(
            routes.all_due_of(self.skipped, now)
            for bucket, (_, routes) in crowded.items()
            if bucket in self.bounds
        )


def slow_lanes(
    full_views: Iterable[tuple[Routes, int]],
    views: Iterable[Routes],
    now: datetime,
    stalled: Callable[[Doc], bool] | None,
) -> frozenset[Lane]:
    """The lanes that go slowly or not at all: of the due work in ``views``
        (every view's), whatever is ``stalled`` (a host with its circuit open,
        Kafka while the broker is down); and the hosts whose due calls make up
        more than half of what a full view's last read returned (``full_views``:
    each view's schedules by route, and how many that read returned): a backlog a bound at
        a time, or a hung host's. Not a host that merely has calls due, in many
        views or at its bound: a fast one does, most of the time, and its later
        calls behind another's backlog would go unread (the isolation bench)."""
    # One schedule of each lane asks: whether a lane is stalled is the
    # lane's (a circuit, the broker), and a backlog is thousands of them.
    first: dict[Lane, Doc] = {}
    for routes in views:
        for (found, _url, _key), doc in routes.due_heads(now):
            first.setdefault(found, doc)
    stopped = {found for found, doc in first.items() if stalled is not None and stalled(doc)}
    crowding: set[Lane] = set()
    for routes, read in full_views:
        calls = routes.due_calls_by_host(now)
        crowding.update(host for host, count in calls.items() if 2 * count > read)
    return frozenset(stopped | crowding)
