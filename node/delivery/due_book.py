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
* it is quiet (the store's change feed was open through its last read,
  ``due_feed.py``, and that read came back short: it holds everything due
  up to its bound, QUIET_READ_AHEAD refresh intervals ahead) and what it
  must learn next is within a refresh interval (and it was read at least
  one ago): the bound itself, or, when that read found nothing, the next
  due time its peek learned (``Schedules.next_due``), either lowered by
  what was told since. Everything that could make work due sooner (another
  node's insert, a resume, a retry) is told by the feed, so a bucket with
  nothing due costs no read until then;
* it is not quiet (no feed), is older than the refresh interval and holds
  nothing due yet: other nodes accept schedules for every bucket, and the
  hint they send for one due soon may have been lost, so a lost hint costs
  at most a refresh interval of lateness, never a delivery;
* its view is older than the refresh interval and all its due work is
  held back (the poller may not claim it yet: a host at its bound, the
  broker down), and the view holds every schedule due up to its bound: it
  is read for what lies after that bound only, so the work held back is
  not read again every time, and other work in the bucket is still found in
  time (a whole read every WHOLE_READ_EVERY refreshes finds what a lost
  hint did not tell of, due before the bound).
  A full view whose due work is all held back is not read: the backlog
  behind it waits until the work in front is taken (as a tenant's would,
  but that tenants are asked for their own, and other lanes are read past
  it: ``past_lanes.py``, whose finds a view keeps apart, ``behind``).

Everything else costs the store nothing: a bucket with cached due work is
served from the cache, an idle one is read once before its next due time
(with the feed) or once a refresh interval (without), whatever the backlog
of other buckets or of the future. A read returns a bucket's
PENDING schedules due by its ``until``, from the earliest, so it replaces
the view (a schedule claimed or cancelled since is simply not returned).

Pure: no IO and no clock reads; times are passed in (wall time for due
times, monotonic seconds for when a read happened).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from node.delivery.past_lanes import PastLanes, PastRead, slow_lanes
from node.delivery.routes import Lane, Route, Routes, held_routes
from node.delivery.routes import due_at as _due
from node.schedule.destination import lane
from node.schedule.model import DEFAULT_PRIORITY, priority_of

Doc = dict[str, Any]

# A view whose due work is held back is read for what lies past its bound,
# and read whole once in this many refresh intervals (see the docstring).
WHOLE_READ_EVERY = 10
# With the change feed open, a read looks this many refresh intervals ahead:
# a minute at the default. The feed tells of anything sooner, so what a read
# finds stays in the view until due; 1,000 schedules spread over 20 s were
# read 0.5 times a record at 60, 1.3 at 10 (one node; 1.5 and 2.2 with three:
# python -m bench delivery's spread, 2026-11-27).
QUIET_READ_AHEAD = 60
# Most buckets one round reads: a node holding 4,096 buckets, each with work
# due at once, read them all before its first claim (3.3 s on the embedded
# store, whose reads are 0.8 ms each: the first record went out 3.8 s late,
# 0.7 s at 256 buckets; python -m bench scale's burst, 2026-11-27). At the
# default B = 256 a node never holds more.
READS_PER_ROUND = 256
# A bound brought down to just before a schedule the view has not read.
_JUST_BEFORE = timedelta(microseconds=1)
# How many ids of schedules this node took lately, and of those it wrote back
# to PENDING lately, a change feed's news is checked against: an insert is
# told after its claim at times (due at once, stored here and taken before
# the feed told it), and this node's own write after it told the book itself.
RECENT = 4096

_V = TypeVar("_V")


class _Recent(Generic[_V]):
    """The last ``size`` ids noted, each with what was noted of it; the
    oldest is forgotten first."""

    def __init__(self, size: int = RECENT) -> None:
        self.size = size
        self._noted: dict[str, _V] = {}

    def note(self, key: str, value: _V) -> None:
        self._noted.pop(key, None)  # the latest last
        self._noted[key] = value
        if len(self._noted) > self.size:
            del self._noted[next(iter(self._noted))]

    def __contains__(self, key: str) -> bool:
        return key in self._noted

    def pop(self, key: str) -> _V | None:
        """What was noted of ``key`` (None: nothing), forgotten."""
        return self._noted.pop(key, None)

    def forget(self, which: Callable[[_V], bool] | None = None) -> None:
        """Forget what ``which`` says of (default: everything)."""
        if which is None:
            self._noted.clear()
            return
        for key in [k for k, value in self._noted.items() if which(value)]:
            del self._noted[key]


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
    # Made while the change feed was open (``DueBook.watch``): when it finds
    # nothing (a whole read), ask when the bucket's next schedule after
    # ``until`` is due (``Schedules.next_due``), and the view goes quiet
    # until then. ``epoch``: the feed's, when the read was made.
    peek: bool = False
    epoch: int = 0


@dataclass(frozen=True)
class Outlook:
    """What a held bucket's view knows of its PENDING schedules, for the
    metrics (``DueBook.outlook``; ``due_outlook.py``)."""

    token: int
    # The due times of the schedules the view holds, earliest first.
    due_times: tuple[datetime, ...]
    # More is due than the view holds: it is full (its read returned its
    # limit) and all it holds is due, or it holds nothing more (all taken).
    # A read returns the earliest first, so a full view whose last schedule
    # is due later holds every schedule due before that: not truncated.
    truncated: bool
    # Schedules of the bucket taken since the view began (claimed, or
    # tried), under this token.
    taken: int


@dataclass
class _View:
    token: int
    read_at: float | None = None  # monotonic; None: read it before anything else
    until: datetime | None = None  # the last read's bound
    full: bool = False  # the last read returned its limit
    whole_at: float | None = None  # monotonic: the last read of everything due
    # Quiet: the change feed was open from before the last read until now,
    # which came back short and said when the bucket's next schedule after
    # ``until`` is due (``next_at``; None: none). Anything sooner is told
    # (``DueBook.hint``), so the view needs no read before next_at.
    quiet: bool = False
    next_at: datetime | None = None
    # A read of it is out: what hints tell meanwhile is applied once it is
    # back (the read may or may not have seen the write).
    reading_until: datetime | None = None  # that read's bound
    hinted_within: bool = False  # a hint due within the read's bound
    hinted_after: datetime | None = None  # the earliest hint due after it
    taken: int = 0  # schedules of the bucket taken since the view began
    _docs: list[Doc] = field(default_factory=list)
    _behind: list[Doc] = field(default_factory=list)
    _routes: Routes | None = None  # of both, built when asked after a change
    _ids: frozenset[str] | None = None  # of both, likewise

    @property
    def docs(self) -> list[Doc]:
        """Read and not yet taken, earliest first (never changed in place)."""
        return self._docs

    @docs.setter
    def docs(self, docs: list[Doc]) -> None:
        self._docs, self._routes, self._ids = docs, None, None

    @property
    def behind(self) -> list[Doc]:
        """What a read past the slow lanes found here (``past_lanes.py``), due
        after everything in ``docs`` of a full view, earliest first."""
        return self._behind

    @behind.setter
    def behind(self, docs: list[Doc]) -> None:
        self._behind, self._routes, self._ids = docs, None, None

    def all_docs(self) -> list[Doc]:
        return [*self._docs, *self._behind]

    def ids(self) -> frozenset[str]:
        """The ids of all of it: what the change feed tells of every insert
        is looked up in (a scan of a view of hundreds per event, each of a
        busy cluster's inserts in a held bucket), built once a change."""
        if self._ids is None:
            self._ids = frozenset(d["_id"] for d in self.all_docs())
        return self._ids

    def routes(self) -> Routes:
        """All of it by route (``routes.py``): what a round asks of every view."""
        if self._routes is None:
            self._routes = Routes(self.all_docs())
        return self._routes


class DueBook:
    def __init__(self, *, refresh: float, budget: int, min_read: int = 16) -> None:
        # Seconds after which an idle bucket is read again (POLL_INTERVAL).
        self.refresh = refresh
        # Most schedules held in views at once, over all buckets: a backlog
        # is read a few batches at a time, not whole into memory.
        self.budget = budget
        self.min_read = min_read
        self._views: dict[int, _View] = {}
        # Whether the store's change feed is open (``watch``), and how many
        # times it opened or broke: a view is quiet only under the feed that
        # was open when it was read.
        self.watched = False
        self._epoch = 0
        # The ids this node took lately: a change feed tells of its own
        # inserts too, and one told after it was taken is not new work.
        self._recently_taken: _Recent[None] = _Recent()
        # What this node wrote back to PENDING lately and told the book itself
        # (a retry, a next occurrence, a put-back): id -> (bucket, the due time
        # the write set; None: it left it). The feed's news of that write is
        # no news (``news``).
        self._written: _Recent[tuple[int, datetime | None]] = _Recent()
        self.past = PastLanes(refresh, WHOLE_READ_EVERY * refresh, limit=max(min_read, budget // 4))
        # What was taken while a read past the slow lanes was out: it may
        # come back in that read's answer, and is not to be taken again.
        self._taken_meanwhile: set[str] = set()

    # -- what the node holds ------------------------------------------------------

    def sync(self, tokens: Mapping[int, int]) -> set[int]:
        """Follow the leases: forget buckets no longer held, start a missing
        view for those gained (or taken again under a new token). Returns the
        buckets gained."""
        lost = {b for b in self._views if b not in tokens}
        for bucket in lost:
            del self._views[bucket]
        gained = set()
        for bucket, token in tokens.items():
            view = self._views.get(bucket)
            if view is None or view.token != token:
                self._views[bucket] = _View(token)
                gained.add(bucket)
        if moved := lost | gained:
            # A write under the token lost may have matched nothing: no news
            # of it will come to be taken for it.
            self._written.forget(lambda written: written[0] in moved)
        return gained

    def watch(self, open_: bool) -> None:
        """The store's change feed opened (every view is read again: what was
        written before it opened was not told) or broke (no view is quiet:
        each is refreshed once a refresh interval, as without a feed)."""
        self.watched = open_
        self._epoch += 1
        self._written.forget()  # a feed opened afresh tells nothing written before
        for view in self._views.values():
            view.quiet = False
            if open_:
                view.read_at = None

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
        # With the feed open a read looks further ahead: what it finds stays
        # in the view (told of anything sooner), read again only near its
        # bound, so a bucket with a little work costs a read per stretch, not
        # a read a refresh (the budget still bounds what views hold).
        ahead = lookahead * (QUIET_READ_AHEAD if self.watched else 1)
        until = now + timedelta(seconds=ahead)
        blocked = self._held_routes(held)
        wanted = [
            (bucket, view)
            for bucket, view in self._views.items()
            if self._needs_read(view, now, monotonic, blocked)
        ]
        if not wanted:
            return []
        # The round claims nothing before its reads are back: at most
        # READS_PER_ROUND of them, those waiting longest first (never read,
        # then least lately read), so a burst across thousands of buckets
        # starts going out after a few hundred reads, not all of them. The
        # rest stay wanted: ``next_read`` is then now, and the next round
        # reads on.
        wanted = sorted(wanted, key=_read_order)[:READS_PER_ROUND]
        # What the reads replace is not counted: the budget is shared by what
        # stays cached elsewhere and what these reads bring.
        reading = {bucket for bucket, _ in wanted}
        kept = sum(len(v.docs) for b, v in self._views.items() if b not in reading)
        limit = max(self.min_read, max(0, self.budget - kept) // len(wanted))
        for _, view in wanted:
            view.reading_until, view.hinted_within, view.hinted_after = until, False, None
        return [
            Read(
                bucket,
                view.token,
                until,
                limit,
                self._read_after(view, now, monotonic, held),
                peek=self.watched,
                epoch=self._epoch,
            )
            for bucket, view in wanted
        ]

    def learned(
        self,
        read: Read,
        docs: Sequence[Doc],
        monotonic: float,
        next_at: datetime | None = None,
        *,
        peeked: bool = False,
    ) -> None:
        """A read came back: it is the bucket's view now. ``peeked``: its
        peek was asked (``Read.peek``, when it found nothing) and answered
        ``next_at``."""
        view = self._views.get(read.bucket)
        if view is None or view.token != read.token:
            return  # lost or retaken meanwhile: what was read is not ours to use
        view.reading_until = None
        if read.after is not None:
            known = {d["_id"] for d in view.docs}
            docs = [*view.docs, *(d for d in docs if d["_id"] not in known)]
        else:
            view.whole_at = monotonic
        view.docs = sorted(docs, key=_due)
        read_now = {d["_id"] for d in view.docs}
        view.behind = [d for d in view.behind if d["_id"] not in read_now]
        view.read_at = monotonic
        view.until = read.until
        view.full = len(docs) >= read.limit
        self._settle_quiet(view, read, next_at if peeked else None, peeked)

    def _settle_quiet(
        self, view: _View, read: Read, next_at: datetime | None, peeked: bool
    ) -> None:
        """Whether a view just read is quiet (it read everything due up to its
        bound, and the feed was open throughout), and until when: the next
        due time after the bound when the read found nothing (its peek),
        else the bound itself (read again just before it passes). With what
        was told while the read was out (which it may not have seen) on top."""
        view.quiet = (
            read.peek
            and read.after is None
            and not view.full
            and read.epoch == self._epoch
            and self.watched
            and (peeked or bool(view.docs))
        )
        view.next_at = (next_at if peeked else read.until) if view.quiet else None
        if view.hinted_within:
            view.read_at = None
        elif view.hinted_after is not None and view.quiet:
            view.next_at = _earliest(view.next_at, view.hinted_after)

    def past_read(
        self, now: datetime, monotonic: float, stalled: Callable[[Doc], bool] | None = None
    ) -> PastRead | None:
        """The read past the slow lanes to make now, if any; its answer must
        come back (``learned_past``, ``past_failed``) before the next.
        ``stalled``: due work that goes nowhere for now (``slow_lanes``)."""
        if self.past.pending:
            return None  # its answer first (and the lanes are not worked out for nothing)
        read = self.past.read(self._crowded(), self._slow(now, stalled), now, monotonic)
        if read is not None:
            self._taken_meanwhile = set()
        return read

    def learned_past(self, read: PastRead, docs: Sequence[Doc], monotonic: float) -> None:
        """A read past the slow lanes came back: each schedule joins what
        its view has behind (of the views still held under that token, and
        not taken while the read was out)."""
        missed = False
        for doc in docs:
            view = self._views.get(int(doc["bucket"]))
            if view is None or view.token != read.tokens.get(int(doc["bucket"])):
                continue
            if doc["_id"] in self._taken_meanwhile:
                continue
            if doc["_id"] not in view.ids():
                view.behind = sorted([*view.behind, doc], key=_due)
                missed = missed or self.past.covers(doc)
        self._taken_meanwhile = set()
        self.past.learned(read, docs, missed, monotonic)

    def past_failed(self, monotonic: float) -> None:
        self._taken_meanwhile = set()
        self.past.failed(monotonic)

    def stale(self, buckets: Iterable[int]) -> None:
        """Read these again before anything else."""
        for bucket in buckets:
            view = self._views.get(bucket)
            if view is not None:
                view.read_at = None

    # -- what the rest of the node tells ----------------------------------------------

    def hint(self, bucket: int, due_at: datetime | None, now: datetime | None = None) -> bool:
        """A schedule of ``bucket`` falls due at ``due_at`` (None: not said,
        take it as due now): True when the view would not have seen it in
        time (it is then read at once). ``now``: what is due later than a
        refresh from it does not hurry the read past the slow lanes."""
        view = self._views.get(bucket)
        if view is None:
            return False
        if view.reading_until is not None:
            self._told_while_reading(view, due_at)
        if view.read_at is None:
            return True  # read first thing anyway
        soon = now is None or due_at is None or due_at <= now + timedelta(seconds=self.refresh)
        if view.full and soon:
            # It may be behind a slow lane's backlog. (Not what is due later:
            # the change feed tells of every insert, and each would undo the
            # back-off of the reads past the slow lanes.)
            self.past.hinted()
        if due_at is not None and view.until is not None and due_at > view.until:
            # After the view's bound: a quiet view reads again before it is
            # due; another is refreshed in time anyway.
            if view.quiet:
                view.next_at = _earliest(view.next_at, due_at)
            return False
        if due_at is not None and view.quiet and not soon:
            # Within the bound but not due soon: the view still holds all
            # that falls due before it (the feed tells of anything sooner),
            # so its bound comes down to it and it is read a refresh before,
            # with whatever else arrives by then: a bucket being stored into
            # for work due in seconds is not read again every round, each
            # read returning all it held so far.
            view.until = _earliest(view.until, due_at - _JUST_BEFORE)
            view.next_at = _earliest(view.next_at, due_at)
            return False
        view.read_at = None
        return True

    def news(
        self, bucket: int, schedule_id: str, due_at: datetime | None, *, inserted: bool
    ) -> bool:
        """Whether the change feed's news of a write (``contract.DueChange``)
        is news, to be told as a ``hint``. Not: a schedule just stored that
        its bucket's view holds, or that was taken lately; nor the write this
        node made itself (``wrote``), whose hint it gave already, told once
        with the due time it wrote (another write of the same id since, a
        PATCH moving it, is news: and whatever else of that id is told
        meanwhile, the next is news too)."""
        if inserted:
            view = self._views.get(bucket)
            return not (
                schedule_id in self._recently_taken
                or (view is not None and schedule_id in view.ids())
            )
        written = self._written.pop(schedule_id)
        return written is None or written != (bucket, due_at)

    def wrote(self, bucket: int, schedule_id: str, due_at: datetime | None) -> None:
        """This node is writing ``schedule_id`` back to PENDING, due at
        ``due_at`` (None: the write leaves its due time as it was), and tells
        the book of it itself (``hint``, ``stale``) once written: the change
        feed's news of that write (``news``) costs no read of its own. Before
        the write, as its news may come before the write's answer."""
        self._written.note(schedule_id, (bucket, _as_stored(due_at)))

    def unwritten(self, schedule_ids: Iterable[str]) -> None:
        """Those writes failed (``wrote``): they may have been applied or not,
        and their news is news again."""
        for schedule_id in schedule_ids:
            self._written.pop(schedule_id)

    @staticmethod
    def _told_while_reading(view: _View, due_at: datetime | None) -> None:
        """Kept for when the read out comes back (it may not see the write)."""
        assert view.reading_until is not None
        if due_at is None or due_at <= view.reading_until:
            view.hinted_within = True
        else:
            view.hinted_after = _earliest(view.hinted_after, due_at)

    def accepted(self, doc: Doc) -> bool:
        """This node stored ``doc``: add it to its bucket's view when the view
        covers its due time (no read needed). True when held here."""
        view = self._views.get(int(doc["bucket"]))
        if view is None:
            return False
        if doc["_id"] in view.ids():
            return True  # a read returned it already (it landed before the read)
        covered = view.read_at is not None and view.until is not None and _due(doc) <= view.until
        # A full view holds its bucket's earliest schedules: the new one joins
        # them only where it does not pass a schedule left unread.
        if covered and (not view.full or (view.docs and _due(doc) <= _due(view.docs[-1]))):
            view.docs = sorted([*view.docs, doc], key=_due)
        elif view.full and (self.past.covers(doc) or priority_of(doc) > DEFAULT_PRIORITY):
            # Behind a slow lane's backlog, where the last read past it would
            # have found it: with what that read found, no read needed. (Due
            # after its bound, the next read finds it in time: each reads
            # ahead as far as the next; of a lane skipped, it waits with
            # that lane's backlog.) Above the default priority, it waits
            # behind no backlog: in hand at once, a round takes it first.
            view.behind = sorted([*view.behind, doc], key=_due)
        return True

    def hides(self, bucket: int, due_at: datetime | None) -> bool:
        """Whether ``bucket``'s view is full and a schedule due at ``due_at``
        falls past it (a read would not bring it before the work ahead of
        it is taken)."""
        view = self._views.get(bucket)
        return (
            view is not None
            and view.full
            # Emptied by the rounds since its read: a backlog still behind it.
            and (not view.docs or due_at is None or due_at > _due(view.docs[-1]))
        )

    def urgent(self, doc: Doc) -> None:
        """A schedule above the default priority that its full view hides,
        read by id: in hand at once, ahead of the backlog."""
        view = self._views.get(int(doc["bucket"]))
        if view is not None and doc["_id"] not in view.ids():
            view.behind = sorted([*view.behind, doc], key=_due)

    # -- the round ------------------------------------------------------------------

    def due(self, now: datetime, held: Callable[[Doc], bool] | None = None) -> list[Doc]:
        """Every cached schedule due by ``now`` but what is ``held`` back,
        earliest first (``held`` is asked once per route: ``routes.py``)."""
        blocked = self._held_routes(held)
        pool = [d for view in self._views.values() for d in view.routes().due(now, blocked)]
        return sorted(pool, key=_due)

    def due_flow_keys(self, now: datetime) -> set[str]:
        """The flow keys (as routes name them) with work due by ``now``."""
        return {
            found[2]
            for view in self._views.values()
            for found, _doc in view.routes().due_heads(now)
            if found[2] is not None
        }

    def taken(self, docs: Iterable[Doc]) -> None:
        """These were claimed, or tried: out of the views (what a failed
        claim left is read again when its bucket's view is)."""
        by_bucket: dict[int, set[str]] = {}
        for doc in docs:
            by_bucket.setdefault(int(doc["bucket"]), set()).add(str(doc["_id"]))
            self._recently_taken.note(str(doc["_id"]), None)
        for bucket, ids in by_bucket.items():
            if self.past.pending:
                self._taken_meanwhile |= ids
            view = self._views.get(bucket)
            if view is not None:
                view.taken += len(ids)
                view.docs = [d for d in view.docs if str(d["_id"]) not in ids]
                view.behind = [d for d in view.behind if str(d["_id"]) not in ids]

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

    def tenants(self, buckets: Iterable[int]) -> set[str]:
        """The tenants with schedules in these buckets' views (due or not,
        held back or not)."""
        return {
            tenant
            for bucket in buckets
            if (view := self._views.get(bucket)) is not None
            for tenant in view.routes().tenants
        }

    def in_order(self, pool: Iterable[Doc]) -> list[Doc]:
        """Of ``pool``, what no unread schedule was due before: a full view
        knows nothing of its bucket after its last schedule, but for what
        reads past the slow lanes found (the earliest of their lanes, then)
        and the lanes the last one did not skip, which it knows up to that
        read's bound (``PastLanes.bound``)."""
        covered = self.past.covered
        fronts = [
            (bucket in covered, _due(view.docs[-1]))
            for bucket, view in self._views.items()
            if view.full and view.docs
        ]
        front = min((due for past, due in fronts if not past), default=None)
        slow_front = min((due for past, due in fronts if past), default=None)
        bound = self.past.bound
        found = {d["_id"] for view in self._views.values() for d in view.behind}

        def known(doc: Doc) -> bool:
            if priority_of(doc) > DEFAULT_PRIORITY:
                return True  # urgent: it passes what is unread (``urgent``)
            due = _due(doc)
            if front is not None and due > front:
                return False
            if slow_front is None or due <= slow_front or doc["_id"] in found:
                return True
            return lane(doc) not in self.past.skipped and bound is not None and due <= bound

        return [doc for doc in pool if known(doc)]

    def next_due(
        self, held: Callable[[Doc], bool] | None = None, *, ordered: bool = False
    ) -> datetime | None:
        """The earliest cached due time (of what is not ``held`` back: due
        work the poller may not claim yet, which an event wakes it for; with
        ``ordered``, of what ``in_order`` lets go: a round taken plainly
        oldest first waits on nothing it would not take)."""
        blocked = self._held_routes(held)
        if not ordered:
            earliest = (view.routes().earliest(blocked) for view in self._views.values())
            return min((due for due in earliest if due is not None), default=None)
        docs = [d for view in self._views.values() for d in view.routes().unheld(blocked)]
        return min((_due(d) for d in self.in_order(docs)), default=None)

    def next_read(
        self,
        now: datetime | None = None,
        held: Callable[[Doc], bool] | None = None,
        stalled: Callable[[Doc], bool] | None = None,
        monotonic: float | None = None,
    ) -> float | None:
        """The monotonic time the next refresh of an idle bucket falls due
        (a missing view, or a full one all taken: now, that is the earliest
        time there is), or the next read past the slow lanes. Given
        ``now``, a view with due work in hand (not ``held``) is not idle: it
        is read again once that work is taken. A quiet view (given ``now``
        and ``monotonic``) is read a refresh interval before its next due
        time, and never when it knows of none."""
        blocked = self._held_routes(held)
        times = [
            self._read_time(view, now, monotonic)
            for view in self._views.values()
            if now is None
            or view.read_at is None
            or not (view.routes().in_hand(now, blocked) or (view.full and _holds_due(view, now)))
        ]
        past = (
            None
            if now is None or self.past.pending
            else self.past.next_at(self._crowded(), self._slow(now, stalled), now)
        )
        known = [t for t in times if t is not None]
        return min([*known, *([] if past is None else [past])], default=None)

    def _read_time(
        self, view: _View, now: datetime | None, monotonic: float | None
    ) -> float | None:
        if view.read_at is None or (view.full and not view.docs):
            return float("-inf")
        if view.quiet and now is not None and monotonic is not None:
            if view.next_at is None:
                return None
            ahead = (view.next_at - now).total_seconds() - self.refresh
            return max(view.read_at + self.refresh, monotonic + max(0.0, ahead))
        return view.read_at + self.refresh

    def held(self) -> dict[int, int]:
        return {bucket: view.token for bucket, view in self._views.items()}

    def outlook(self, tokens: Mapping[int, int], now: datetime) -> dict[int, Outlook]:
        """What each view held under ``tokens`` (the leases usable now)
        knows of its bucket at ``now``. A bucket lost, or taken again under
        another token before a round followed the leases (``sync``), is left
        out at once; a view not read yet knows of nothing."""
        found = {}
        for bucket, token in tokens.items():
            view = self._views.get(bucket)
            if view is None or view.token != token:
                continue
            truncated = view.full and not (view.docs and _due(view.docs[-1]) > now)
            due_times = tuple(sorted(_due(doc) for doc in view.all_docs()))
            found[bucket] = Outlook(token, due_times, truncated, view.taken)
        return found

    def taken_from(self, bucket: int, token: int) -> int | None:
        """``Outlook.taken`` of ``bucket`` now (None: no view under ``token``)."""
        view = self._views.get(bucket)
        return None if view is None or view.token != token else view.taken

    # -- inside ---------------------------------------------------------------------

    def _crowded(self) -> dict[int, tuple[int, Routes]]:
        """bucket -> (token, schedules by route) of the full views: those a
        slow lane's backlog may fill."""
        return {
            bucket: (view.token, view.routes())
            for bucket, view in sorted(self._views.items())
            if view.full and view.read_at is not None and view.docs
        }

    def _slow(self, now: datetime, stalled: Callable[[Doc], bool] | None) -> frozenset[Lane]:
        full = [
            (view.routes(), len(view.docs))
            for view in self._views.values()
            if view.full and view.docs
        ]
        every = [view.routes() for view in self._views.values()]
        return slow_lanes(full, every, now, stalled)

    def _held_routes(self, held: Callable[[Doc], bool] | None) -> frozenset[Route]:
        return held_routes((view.routes() for view in self._views.values()), held)

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
        holding = _holds_due(view, now) and (held is not None or view.routes().calls_due(now))
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
        blocked: frozenset[Route],
    ) -> bool:
        if view.read_at is None:
            return True
        if view.routes().in_hand(now, blocked):
            return False  # work in hand: deliver it first
        if view.full and _holds_due(view, now):
            return False  # held back, a backlog behind it: read on once it is taken
        if view.full and not view.docs:
            return True  # the backlog behind the last read
        refreshed = monotonic - view.read_at >= self.refresh
        if view.quiet:
            # Told of anything sooner: read once the next due time is within
            # a refresh interval (the look-ahead of every read), and no more
            # often than a refresh (the next due time is after the last
            # read's bound, so that read's refresh is in time for it).
            soon = now + timedelta(seconds=self.refresh)
            return view.next_at is not None and view.next_at <= soon and refreshed
        return refreshed


def _read_order(wanted: tuple[int, _View]) -> tuple[bool, float, int]:
    """Never read first, then the least lately read; by bucket on a tie."""
    bucket, view = wanted
    return (view.read_at is not None, view.read_at or 0.0, bucket)


def _as_stored(at: datetime | None) -> datetime | None:
    """A time as the store keeps it, and its change feed tells it: to the
    millisecond (BSON's precision)."""
    return None if at is None else at.replace(microsecond=at.microsecond // 1000 * 1000)


def _earliest(a: datetime | None, b: datetime) -> datetime:
    return b if a is None or b < a else a


def _holds_due(view: _View, now: datetime) -> bool:
    return bool(view.docs) and _due(view.docs[0]) <= now
