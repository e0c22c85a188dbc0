"""The due work hidden behind slow lanes, one read per node.

A bucket's view holds its earliest due schedules, at most a read's limit.
When that is a backlog of one HTTP host (which goes at most
HTTP_MAX_PER_HOST calls at a time, and not at all while its circuit is
open) or of Kafka records while the broker is down, the records and other
hosts' calls due behind it in the same bucket would wait until the backlog
has drained. A *lane* is what a due schedule waits on (``lane``: its host,
or None for Kafka); a full view whose due work includes a slow lane is
*crowded*.

So the node reads, in one statement for all its crowded buckets, their
PENDING schedules due soon but those of the slow lanes (``PastRead``: one
index range per bucket and lane gap, ``bucket_status_host_due``), and adds
what it finds to the views. When: at once for buckets newly crowded or a
hint into a crowded bucket, else once a refresh interval, doubling up to
WHOLE_READ_EVERY intervals while such reads find nothing (each reads ahead
as far as the next, so what falls due meanwhile is in hand in time), and at
once again when the last read was full and all it brought has been taken.
Its cost is one read per node per interval at most, whatever the number of
buckets or the size of the backlogs, and what it walks is work the node
takes next, never the backlog it skips.

Pure: no IO and no clock reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from node.schedule.destination import is_http, lane
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
    skipped: frozenset[Lane] = frozenset()  # the last read's
    covered: frozenset[int] = field(default_factory=frozenset)  # its buckets
    # Up to when it holds every schedule of those buckets of the lanes it
    # did not skip: its own bound, or when full its last schedule's due time.
    bound: datetime | None = None

    def read(
        self,
        crowded: Mapping[int, tuple[int, Sequence[Doc]]],
        now: datetime,
        monotonic: float,
        held: Callable[[Doc], bool] | None,
    ) -> PastRead | None:
        """The read to make now, if any. ``crowded``: bucket -> (token, its
        view's schedules) of the full views; ``held``: due work the poller
        may not claim yet."""
        slow = {
            b: lanes for b, (_, docs) in crowded.items() if (lanes := slow_lanes(docs, now, held))
        }
        if not slow:
            self._at, self._every, self.covered = None, 0.0, frozenset()
            return None
        if self._at is not None and not self._more(crowded, now):
            newly = not set(slow) <= self.covered
            every = self.refresh if newly else self._every or self.refresh
            if monotonic < self._at + every:
                return None
        tokens = {b: crowded[b][0] for b in sorted(slow)}
        skipping = frozenset().union(*slow.values())
        until = now + timedelta(seconds=self.longest + self.refresh)
        return PastRead(tokens, until, self.limit, skipping)

    def learned(
        self, read: PastRead, docs: Sequence[Doc], found_new: bool, monotonic: float
    ) -> None:
        """A read came back with ``docs``, some new to the views
        (``found_new``): look less often while they find nothing. A full
        read did not reach its own bound, so the next must come before what
        lies past it falls due: no backing off then, though it found only
        what an earlier read had (read ahead, and not yet due)."""
        every = self._every or self.refresh
        full = len(docs) >= read.limit
        self._every = self.refresh if found_new or full else min(2 * every, self.longest)
        self._at, self._full = monotonic, full
        self.skipped, self.covered = read.skipping, frozenset(read.tokens)
        self.bound = _due(docs[-1]) if self._full else read.until

    def hinted(self) -> None:
        """A schedule falls due in a crowded bucket: read at the next interval."""
        self._every = 0.0

    def next_at(
        self,
        crowded: Mapping[int, tuple[int, Sequence[Doc]]],
        now: datetime,
        held: Callable[[Doc], bool] | None,
    ) -> float | None:
        """The monotonic time of the next read (-inf: now); None: none wanted."""
        if not any(slow_lanes(docs, now, held) for _, docs in crowded.values()):
            return None
        if self._at is None or self._more(crowded, now):
            return float("-inf")
        return self._at + (self._every or self.refresh)

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
    docs: Iterable[Doc], now: datetime, held: Callable[[Doc], bool] | None
) -> frozenset[Lane]:
    """Of a full view's due work, the lanes that go slowly or not at all:
    HTTP hosts, and whatever is held back (Kafka while the broker is down)."""
    return frozenset(
        lane(d) for d in docs if _due(d) <= now and (is_http(d) or (held is not None and held(d)))
    )


def _due(doc: Doc) -> datetime:
    return aware(doc["dueAt"])
