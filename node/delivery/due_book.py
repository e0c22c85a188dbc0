"""What this node knows of the due work in each bucket it holds: the seed's
"actor-like approach and caching" (seeds/000), so that a node reads only
its own buckets, and of those only the ones that need it.

Each held bucket keeps a view: the PENDING schedules its last read returned
(due already, or within the look-ahead), when that read was, and whether it
returned its limit (then more is waiting behind it). A round reads a bucket
only when

* its view is missing: the bucket was just gained, or was marked stale (a
  hint of work due before the bucket's next read, a claim that failed);
* its cached due work ran out and its last read was full: more is due;
* its view is older than the refresh interval and holds nothing due yet:
  other nodes accept schedules for every bucket, and the hint they send for
  one due soon may have been lost, so a lost hint costs at most a refresh
  interval of lateness, never a delivery;
* its view is older than the refresh interval and all its due work is
  held back (the poller may not claim it yet: a host at its bound, the
  broker down), and the view holds every schedule due up to its bound: it
  is read for what lies after that bound only, so the work held back is
  not read again every time, and other work in the bucket is still found in
  time (a whole read every WHOLE_READ_EVERY refreshes finds what a lost
  hint did not tell of, due before the bound).
* its view is full and its due work is of lanes that go slowly or not at
  all (``lane``: an HTTP host, which goes at most HTTP_MAX_PER_HOST calls
  at a time, or waits on its circuit; Kafka while the broker is down): the
  due work of other lanes (other hosts, Kafka) may wait behind that
  backlog, so the bucket is read past those lanes (``Read.skipping``): at
  once, then again a refresh interval later (doubling, up to
  WHOLE_READ_EVERY intervals, while such reads find nothing; each reads
  ahead as far as the next), or at once when the last one was full and
  what it brought has been taken. So a host draining a backlog, at its
  bound or with its circuit open never holds up another host or a topic
  in the same bucket, and the backlog in front is not read again until it
  has gone (the view empties and is read whole).

Everything else costs the store nothing: a bucket with cached due work is
served from the cache, an idle one is read once a refresh interval whatever
the backlog of other buckets or of the future. A read returns a bucket's
PENDING schedules due by its ``until``, from the earliest, so it replaces
the view (a schedule claimed or cancelled since is simply not returned).

Pure: no IO and no clock reads; times are passed in (wall time for due
times, monotonic seconds for when a read happened).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from node.schedule.destination import is_http, lane
from node.schedule.times import aware

Doc = dict[str, Any]

# A view whose due work is held back is read for what lies past its bound,
# and read whole once in this many refresh intervals (see the docstring).
WHOLE_READ_EVERY = 10


@dataclass(frozen=True)
class Read:
    """Read ``bucket``'s PENDING schedules due by ``until``, at most ``limit``."""

    bucket: int
    token: int
    until: datetime
    limit: int
    # Only what is due after this: the view holds everything due up to it,
    # and what is read is added to the view rather than replacing it.
    after: datetime | None = None
    # None of these lanes (``lane``: hosts, None for Kafka): the view is full
    # of their work, held back; what is read is added to it.
    skipping: frozenset[str | None] = frozenset()


@dataclass
class _View:
    token: int
    docs: list[Doc] = field(default_factory=list)  # read and not yet taken, earliest first
    read_at: float | None = None  # monotonic; None: read it before anything else
    until: datetime | None = None  # the last read's bound
    full: bool = False  # the last read returned its limit
    whole_at: float | None = None  # monotonic: the last read of everything due
    past_at: float | None = None  # monotonic: the last read past the slow lanes
    past_full: bool = False  # that read returned its limit: more is behind
    past_lanes: frozenset[str | None] = frozenset()  # the lanes it skipped
    past_every: float = 0.0  # seconds to the next such read (0: the refresh interval)


class DueBook:
    def __init__(self, *, refresh: float, budget: int, min_read: int = 16) -> None:
        # Seconds after which an idle bucket is read again (POLL_INTERVAL).
        self.refresh = refresh
        # Most schedules held in views at once, over all buckets: a backlog
        # is read a few batches at a time, not whole into memory.
        self.budget = budget
        self.min_read = min_read
        self._views: dict[int, _View] = {}

    # -- what the node holds ------------------------------------------------------

    def sync(self, tokens: Mapping[int, int]) -> set[int]:
        """Follow the leases: forget buckets no longer held, start a missing
        view for those gained (or taken again under a new token). Returns the
        buckets gained."""
        for bucket in [b for b in self._views if b not in tokens]:
            del self._views[bucket]
        gained = set()
        for bucket, token in tokens.items():
            view = self._views.get(bucket)
            if view is None or view.token != token:
                self._views[bucket] = _View(token)
                gained.add(bucket)
        return gained

    # -- what to read, and what was read -------------------------------------------

    def reads(
        self,
        now: datetime,
        monotonic: float,
        lookahead: float,
        held: Callable[[Doc], bool] | None = None,
    ) -> list[Read]:
        """The buckets this round must read (see the module docstring).
        ``lookahead`` must be at least the refresh interval: a schedule due
        after a view's bound is then read by a refresh before it is due.
        ``held``: due work the poller may not claim yet (it is not work in
        hand: its bucket is refreshed as if idle)."""
        until = now + timedelta(seconds=lookahead)
        wanted = [
            (bucket, view)
            for bucket, view in sorted(self._views.items())
            if self._needs_read(view, now, monotonic, held)
        ]
        if not wanted:
            return []
        # What the reads replace is not counted: the budget is shared by what
        # stays cached elsewhere and what these reads bring.
        reading = {bucket for bucket, _ in wanted}
        kept = sum(len(v.docs) for b, v in self._views.items() if b not in reading)
        limit = max(self.min_read, max(0, self.budget - kept) // len(wanted))
        return [
            self._read(bucket, view, now, monotonic, until, limit, held) for bucket, view in wanted
        ]

    def learned(self, read: Read, docs: Sequence[Doc], monotonic: float) -> None:
        """A read came back: it is the bucket's view now."""
        view = self._views.get(read.bucket)
        if view is None or view.token != read.token:
            return  # lost or retaken meanwhile: what was read is not ours to use
        if read.skipping:
            # Beside the backlog in front: the view stays full, its bound and
            # its whole read as they were.
            known = {d["_id"] for d in view.docs}
            found = [d for d in docs if d["_id"] not in known]
            view.docs = sorted([*view.docs, *found], key=_due)
            view.past_at, view.past_lanes = monotonic, read.skipping
            view.past_full = len(docs) >= read.limit
            # Found nothing: look less often (what is accepted meanwhile is
            # hinted, and each read reads ahead as far as the next).
            every = self._past_every(view)
            view.past_every = self.refresh if found else min(2 * every, self._past_most)
            return
        view.past_at, view.past_full, view.past_every = None, False, 0.0
        if read.after is not None:
            known = {d["_id"] for d in view.docs}
            docs = [*view.docs, *(d for d in docs if d["_id"] not in known)]
        else:
            view.whole_at = monotonic
        view.docs = sorted(docs, key=_due)
        view.read_at = monotonic
        view.until = read.until
        view.full = len(docs) >= read.limit

    def stale(self, buckets: Iterable[int]) -> None:
        """Read these again before anything else."""
        for bucket in buckets:
            view = self._views.get(bucket)
            if view is not None:
                view.read_at = None

    # -- what the rest of the node tells ----------------------------------------------

    def hint(self, bucket: int, due_at: datetime) -> bool:
        """A schedule of ``bucket`` falls due at ``due_at``: True when the view
        would not have seen it in time (it is then read at once)."""
        view = self._views.get(bucket)
        if view is None:
            return False
        if view.read_at is None:
            return True  # read first thing anyway
        if view.until is not None and due_at > view.until:
            return False  # after the view's bound: a refresh reads it before it is due
        view.read_at = None
        return True

    def accepted(self, doc: Doc) -> bool:
        """This node stored ``doc``: add it to its bucket's view when the view
        covers its due time (no read needed). True when held here."""
        view = self._views.get(int(doc["bucket"]))
        if view is None:
            return False
        covered = view.read_at is not None and view.until is not None and _due(doc) <= view.until
        # A read may have returned it already (it landed before the read).
        if covered and all(d["_id"] != doc["_id"] for d in view.docs):
            view.docs.append(doc)
            view.docs.sort(key=_due)
        return True

    # -- the round ------------------------------------------------------------------

    def due(self, now: datetime) -> list[Doc]:
        """Every cached schedule due by ``now``, earliest first."""
        pool = [d for view in self._views.values() for d in view.docs if _due(d) <= now]
        return sorted(pool, key=_due)

    def taken(self, docs: Iterable[Doc]) -> None:
        """These were claimed, or tried: out of the views (what a failed
        claim left is read again when its bucket's view is)."""
        by_bucket: dict[int, set[str]] = {}
        for doc in docs:
            by_bucket.setdefault(int(doc["bucket"]), set()).add(str(doc["_id"]))
        for bucket, ids in by_bucket.items():
            view = self._views.get(bucket)
            if view is not None:
                view.docs = [d for d in view.docs if str(d["_id"]) not in ids]

    def hiding(self, now: datetime) -> list[int]:
        """The buckets that may hold schedules due by ``now`` that their views
        do not: a full view whose schedules are all due. Other tenants' due
        work may wait there behind one tenant's backlog. A full view whose
        last schedule is due later holds every schedule of its bucket due by
        ``now`` (a read returns the earliest first), so it hides nothing: a
        backlog in the future, or work read ahead, costs no lookup."""
        return sorted(
            bucket
            for bucket, view in self._views.items()
            if view.full and view.docs and _due(view.docs[-1]) <= now
        )

    def frontier(self) -> datetime | None:
        """The latest due time up to which the book holds every due schedule
        of every bucket: a full view knows nothing after its last schedule.
        None: no view is full, the book holds all of it."""
        return min(
            (_due(view.docs[-1]) for view in self._views.values() if view.full and view.docs),
            default=None,
        )

    def next_due(self, held: Callable[[Doc], bool] | None = None) -> datetime | None:
        """The earliest cached due time (of what is not ``held`` back: due
        work the poller may not claim yet, which an event wakes it for)."""
        if held is None:
            return min(
                (_due(view.docs[0]) for view in self._views.values() if view.docs), default=None
            )
        return min(
            (_due(d) for view in self._views.values() for d in view.docs if not held(d)),
            default=None,
        )

    def next_read(
        self, now: datetime | None = None, held: Callable[[Doc], bool] | None = None
    ) -> float | None:
        """The monotonic time the next refresh of an idle bucket falls due
        (a missing view: now, that is the earliest time there is). Given
        ``now``, a view with due work in hand (not ``held``) is not idle: it
        is read again once that work is taken."""
        times = [self._next_read_of(view, now, held) for view in self._views.values()]
        return min((t for t in times if t != float("inf")), default=None)

    def held(self) -> dict[int, int]:
        return {bucket: view.token for bucket, view in self._views.items()}

    # -- inside ---------------------------------------------------------------------

    @property
    def _past_most(self) -> float:
        return WHOLE_READ_EVERY * self.refresh

    def _past_every(self, view: _View) -> float:
        return view.past_every or self.refresh

    def _read(
        self,
        bucket: int,
        view: _View,
        now: datetime,
        monotonic: float,
        until: datetime,
        limit: int,
        held: Callable[[Doc], bool] | None,
    ) -> Read:
        lanes = _slow_lanes(view, now, held)
        # A view marked stale (a hint, a failed claim) is read whole first.
        if view.read_at is not None and lanes:
            # As far ahead as the next read past them, at the longest.
            ahead = now + timedelta(seconds=self._past_most + self.refresh)
            return Read(bucket, view.token, max(until, ahead), limit, skipping=lanes)
        return Read(bucket, view.token, until, limit, self._read_after(view, now, monotonic, held))

    def _past_read_at(self, view: _View, now: datetime) -> float:
        """When ``view``, full of slow lanes' work, is read past them next."""
        if view.past_at is None or _more_past(view, now):
            return float("-inf")
        return view.past_at + self._past_every(view)

    def _next_read_of(
        self, view: _View, now: datetime | None, held: Callable[[Doc], bool] | None
    ) -> float:
        """When ``view`` is read next (inf: once the work in it is taken)."""
        if view.read_at is None:
            return float("-inf")
        if now is None:
            return view.read_at + self.refresh
        if _slow_lanes(view, now, held):
            return self._past_read_at(view, now)
        if _in_hand(view, now, held) or (view.full and _holds_due(view, now)):
            return float("inf")
        return view.read_at + self.refresh

    def _read_after(
        self,
        view: _View,
        now: datetime,
        monotonic: float,
        held: Callable[[Doc], bool] | None,
    ) -> datetime | None:
        """Where a refresh of ``view`` may start: after its bound, when it
        holds due work held back and everything up to that bound, and was
        read whole lately (None: read it whole)."""
        holding = held is not None and _holds_due(view, now)
        # A view marked stale (a hint, a failed claim) is read whole.
        if not holding or view.full or view.read_at is None or view.whole_at is None:
            return None
        if monotonic - view.whole_at >= WHOLE_READ_EVERY * self.refresh:
            return None
        return view.until

    def _needs_read(
        self,
        view: _View,
        now: datetime,
        monotonic: float,
        held: Callable[[Doc], bool] | None = None,
    ) -> bool:
        if view.read_at is None:
            return True
        if _slow_lanes(view, now, held):
            # A backlog of slow lanes in front: other lanes' work may be behind.
            return monotonic >= self._past_read_at(view, now)
        if _in_hand(view, now, held):
            return False  # work in hand: deliver it first
        if view.full and _holds_due(view, now):
            return False  # a backlog behind it: read on once the work in front is taken
        if view.full and not view.docs:
            return True  # the backlog behind the last read
        return monotonic - view.read_at >= self.refresh


def _due(doc: Doc) -> datetime:
    return aware(doc["dueAt"])


def _holds_due(view: _View, now: datetime) -> bool:
    return any(_due(d) <= now for d in view.docs)


def _slow_lanes(
    view: _View, now: datetime, held: Callable[[Doc], bool] | None
) -> frozenset[str | None]:
    """Of a full view's due work, the lanes that go slowly or not at all:
    HTTP hosts (a bounded number of calls at a time), and whatever is held
    back (``held``: Kafka while the broker is down). Empty when the view is
    not full: it then holds every lane's due work up to its bound."""
    if not view.full:
        return frozenset()
    return frozenset(
        lane(d)
        for d in view.docs
        if _due(d) <= now and (is_http(d) or (held is not None and held(d)))
    )


def _more_past(view: _View, now: datetime) -> bool:
    """Whether more of other lanes' due work waits past the slow lanes: the
    last read past them was full, and all it brought has been taken (the
    view holds only due work of the lanes it skipped; work read ahead waits
    for its time, so the same read is not made again meanwhile)."""
    return view.past_full and all(_due(d) <= now and lane(d) in view.past_lanes for d in view.docs)


def _in_hand(view: _View, now: datetime, held: Callable[[Doc], bool] | None) -> bool:
    """Whether a view holds due work the poller may claim now."""
    return any(_due(d) <= now and (held is None or not held(d)) for d in view.docs)
