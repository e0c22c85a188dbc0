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
no read. When: the first at once; a refresh interval after the last for
buckets newly crowded, a lane no longer slow, a hint into a crowded bucket
or a find the last read should have made (a hint lost); else doubling up
to WHOLE_READ_EVERY intervals (what is new past the last read's reach is
only time moving on), but a full read is followed a refresh before its
last schedule falls due, and at once when all it brought has been taken.
Its cost is one read per node per interval at most, whatever the number
of buckets or the size of the backlogs, and what it walks is work the node
takes next, never the backlog it skips.

Pure: no IO and no clock reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from node.schedule.destination import lane
from node.schedule.times import aware

Doc = dict[str, Any]
Lane = str | None


@dataclass(frozen=True)
class PastRead:
    """Read the PENDING schedules of ``tokens``' buckets due by ``until``,
    but those of the lanes ``skipping``, earliest first, at most ``limit``."""

    tokens: Mapping[int, int]  # bucket -> the token its view was read under
    until: datetime
    limit: int
    skipping: frozenset[Lane]


@dataclass
class PastLanes:
    refresh: float  # seconds: the shortest interval between reads
    longest: float  # seconds: the longest, while reads find nothing
    limit: int
    _at: float | None = None  # monotonic: the last read
    _every: float = 0.0  # seconds to the next (0: ``refresh``)
    _full: bool = False  # the last read returned its limit
    # A read is out (the poller makes it beside its rounds): no other until
    # it is learned or has failed.
    pending: bool = False
    skipped: frozenset[Lane] = frozenset()  # the last read's
    covered: frozenset[int] = field(default_factory=frozenset)  # its buckets
    # Up to when it holds every schedule of those buckets of the lanes it
    # did not skip: its own bound, or when full its last schedule's due time.
    bound: datetime | None = None

    def read(
        self,
        crowded: Mapping[int, tuple[int, Sequence[Doc]]],
        slow: frozenset[Lane],
        now: datetime,
        monotonic: float,
    ) -> PastRead | None:
        """The read to make now, if any. ``crowded``: bucket -> (token, its
        view's schedules) of the full views; ``slow``: the slow lanes
        (``slow_lanes``)."""
        if self.pending:
            return None
        lanes = self._lanes(crowded, slow, now)
        if not lanes:
            self._at, self._every, self.covered = None, 0.0, frozenset()
            return None
        if monotonic < self._next_at(lanes, crowded, now):
            return None
        skipping = frozenset().union(*lanes.values())
        tokens = {b: crowded[b][0] for b in sorted(lanes)}
        until = now + timedelta(seconds=self.longest + self.refresh)
        self.pending = True
        return PastRead(tokens, until, self.limit, skipping)

    def learned(self, read: PastRead, docs: Sequence[Doc], missed: bool, monotonic: float) -> None:
        """A read came back with ``docs``, some of which the last read should
        have found (``missed``: a hint lost, or never sent): look less often
        while reads find nothing they should not have (what is new past the
        last one's bound is time moving on; each reads ahead as far as the
        next). A full read did not reach its own bound, so the next comes a
        refresh before its last schedule falls due, and at once when all it
        brought has been taken (``_more``)."""
        full = len(docs) >= read.limit
        self.bound = _due(docs[-1]) if full else read.until
        room = self.longest
        if full:
            read_at = read.until - timedelta(seconds=self.longest + self.refresh)
            room = (self.bound - read_at).total_seconds() - self.refresh
        every = min(2 * (self._every or self.refresh), self.longest, room)
        self._every = self.refresh if missed else max(self.refresh, every)
        self._at, self._full, self.pending = monotonic, full, False
        self.skipped, self.covered = read.skipping, frozenset(read.tokens)

    def failed(self, monotonic: float) -> None:
        """The read failed: the next comes when this one's successor would."""
        self._at, self.pending = monotonic, False

    def covers(self, doc: Doc) -> bool:
        """Whether the last read would have returned ``doc``: in a bucket it
        covered, of a lane it did not skip, due by its bound."""
        return (
            self.bound is not None
            and int(doc["bucket"]) in self.covered
            and lane(doc) not in self.skipped
            and _due(doc) <= self.bound
        )

    def hinted(self) -> None:
        """A schedule falls due in a crowded bucket: read at the next interval."""
        self._every = 0.0

    def next_at(
        self,
        crowded: Mapping[int, tuple[int, Sequence[Doc]]],
        slow: frozenset[Lane],
        now: datetime,
    ) -> float | None:
        """The monotonic time of the next read (-inf: now); None: none wanted
        (nor while one is out: its answer wakes the poller)."""
        if self.pending:
            return None
        lanes = self._lanes(crowded, slow, now)
        return self._next_at(lanes, crowded, now) if lanes else None

    @staticmethod
    def _lanes(
        crowded: Mapping[int, tuple[int, Sequence[Doc]]], slow: frozenset[Lane], now: datetime
    ) -> dict[int, frozenset[Lane]]:
        """bucket -> the slow lanes due in its view, of the views with any."""
        return {b: found for b, (_, docs) in crowded.items() if (found := _due_in(docs, slow, now))}

    def _next_at(
        self,
        lanes: Mapping[int, frozenset[Lane]],
        crowded: Mapping[int, tuple[int, Sequence[Doc]]],
        now: datetime,
    ) -> float:
        if self._at is None or self._more(crowded, now):
            return float("-inf")
        # Buckets newly crowded, or a lane no longer skipped: what they hold
        # behind their views has not been read. Still a refresh apart, so a
        # lane going in and out of slow costs a read per interval at most.
        skipping = frozenset().union(*lanes.values())
        newly = not set(lanes) <= self.covered or not skipping >= self.skipped
        return self._at + (self.refresh if newly else self._every or self.refresh)

    def _more(self, crowded: Mapping[int, tuple[int, Sequence[Doc]]], now: datetime) -> bool:
        """The last read was full and all it brought has been taken (the
        views hold only due work of the lanes it skipped; work read ahead
        waits for its time, so the same read is not made again meanwhile)."""
        return self._full and all(
            _due(d) <= now and lane(d) in self.skipped
            for bucket, (_, docs) in crowded.items()
            if bucket in self.covered
            for d in docs
        )


def slow_lanes(
    full_views: Iterable[Sequence[Doc]],
    due_work: Iterable[Doc],
    now: datetime,
    stalled: Callable[[Doc], bool] | None,
) -> frozenset[Lane]:
    """The lanes that go slowly or not at all: of ``due_work`` (every
    view's), whatever is ``stalled`` (a host with its circuit open, Kafka
    while the broker is down); and the hosts whose due calls make up more
    than half of a full view (of ``full_views``' schedules): a backlog a
    bound at a time, or a hung host's. Not a host that merely has calls
    due, in many views or at its bound: a fast one does, most of the time,
    and its later calls behind another's backlog would go unread (the
    isolation bench)."""
    # One schedule of each lane asks: whether a lane is stalled is the
    # lane's (a circuit, the broker), and a backlog is thousands of them.
    first: dict[Lane, Doc] = {}
    for doc in due_work:
        if _due(doc) <= now:
            first.setdefault(lane(doc), doc)
    stopped = {found for found, doc in first.items() if stalled is not None and stalled(doc)}
    crowding: set[Lane] = set()
    for docs in full_views:
        calls: dict[Lane, int] = {}
        for doc in docs:
            if doc.get("http") and _due(doc) <= now:
                host = lane(doc)
                calls[host] = calls.get(host, 0) + 1
        crowding.update(host for host, count in calls.items() if 2 * count > len(docs))
    return frozenset(stopped | crowding)


def _due_in(docs: Iterable[Doc], lanes: frozenset[Lane], now: datetime) -> frozenset[Lane]:
    """Which of ``lanes`` have work due in ``docs``."""
    if not lanes:
        return frozenset()
    found: set[Lane] = set()
    for doc in docs:
        if (this := lane(doc)) in lanes and _due(doc) <= now:
            found.add(this)
    return frozenset(found)


def _due(doc: Doc) -> datetime:
    return aware(doc["dueAt"])
