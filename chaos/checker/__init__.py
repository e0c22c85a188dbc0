"""The invariants of a chaos run, judged from what the load generator was
told (201s, cancellations) and what Kafka received. Pure: no IO, no clock.

* lost: accepted, not cancelled (by a DELETE or a bulk cancel) nor still
  paused at the end, never delivered (a rescheduled one: never by a record
  carrying its last executeAt);
* early: delivered before its executeAt, by the record's timestamp (which
  the node stamps with its estimate of the store's clock, not its own wall
  clock, so a node whose clock is off is judged like any other) or, where
  recorded, by when the runner received it (``Delivery.received``, the
  runner's own clock, the one executeAt was written with): a record read
  before it was due was sent early, whatever any node's clock says;
* cancelled but delivered: a DELETE that answered 200 and a record anyway,
  or a record published (by its timestamp) after the 200 of the bulk cancel
  (``POST /v1/schedules:cancel``) that took the schedule. A bulk cancel
  answers only a count, so which schedules it took the runner asks after
  the run (their status, CANCELLED); a record from before the 200 is one
  the schedule had out before it went back to PENDING (a dead owner's
  publish, redone), not a breach. A bulk-cancelled schedule is not lost;
* delivered while paused: a record published after a pause's 200 and
  before its resume was asked (or at all after it, when it was never
  resumed). A schedule still paused at the end is owed nothing (not lost);
  a resumed one is owed its delivery again, and its lateness counts from
  the resume's answer, not from its executeAt;
* rescheduled at the wrong time: a PATCH moved the schedule's executeAt,
  and a record carries (header ``execute-at``) a time it was moved off,
  published after the 200 of the PATCH that moved it off, or a time it never
  had. A rescheduled schedule is delivered (else lost) only by a record
  carrying its last executeAt (either of its last two when its last PATCH
  has no known outcome), and judged early or late against the time the
  record carries;
* duplicates: delivered more than once. Each duplicated unit gets one kind,
  with the copies and the fault that explain it as evidence:

  - ``owner_change``: copies under different fencing tokens. A new owner
    delivered again what the old one had in flight when it died, slept or
    lost its lease;
  - ``retried_publish``: one token, different attempts. The owner's publish
    was reported failed (timed out) though the broker had stored it, or its
    completion write was lost, and it published again on a later attempt;
  - ``across_store_crash``: one (token, attempt), the copies on both sides
    of a database crash: the first sent before the database came back (a
    claim acknowledged just before the kill is published as it lands, or
    while the database is down), a later one after the kill. A claim is
    acknowledged before it is journaled (losing one only means delivering
    again; marks are journaled first), so after the crash the owner claims
    the same schedule again with the same token and attempt number;
  - ``deferred_publish``: one (token, attempt), sent again later (another
    record timestamp), every earlier send inside a broker fault (paused,
    crashed or cut off by the runner, or stalled on its own while the nodes'
    /readyz said so: ``chaos.runner.broker_stalls``). The broker stored the
    record but its answer was lost to the fault; the node took that for the
    broker's trouble, which spends no attempt (the claim is undone, the
    schedule back to PENDING), and published it again under the same attempt
    once the broker answered (never within DEFERRED_MIN_GAP: the first send
    had to fail first, and a record the broker stored and never answered
    fails by a timeout or the broker's restart);
  - ``producer_retry``: one (token, attempt), copies with the same value
    digest and the same record timestamp, that timestamp inside a broker
    fault (paused, crashed or cut off). The producer resent a request whose
    first copy the stalled broker appended after all: the resend carries the
    very batch, CreateTime included, and the embedded broker has no
    idempotent producer to drop it. A second publish would have taken a new
    timestamp when it was sent;
  - ``same_claim``: anything else under one (token, attempt): two owners
    claiming with one token, which the fence exists to prevent. A failure.

  A unit with repeats of several kinds counts once, as the kind that needs
  the most evidence (``KINDS``, last wins): a same-claim repeat is never
  hidden by an owner change of the same unit;
* stale claims: a delivery under token t of a schedule that fell due (at
  the execute-at its record carries, where noted: a rescheduled one had
  others) after a newer token t' of its bucket had already delivered
  something. Claims take only due schedules, so t claimed it while t' held
  the bucket: two live owners, the double claim the fence exists to
  prevent. (A former
  owner finishing a batch it claimed before losing the lease delivers only
  schedules due before the new owner's first delivery: never flagged.)
* vanished: seen in the topic during the run, gone when a fresh reader
  reads it again at the end (the broker lost an acknowledged record);
* offsets reused: a partition:offset the reader was served twice with
  different records. Kafka never gives one offset to two records; a broker
  that does has overwritten one of them, so an acknowledged record may be
  gone before anybody read it. Not an invariant of this system (a broker
  fault), so it fails no run: it is the evidence that tells a record the
  broker dropped from one the scheduler never sent. The embedded durable
  broker does it under concurrent producers (Tansu 0.6 over SeaweedFS: its
  offsets are taken with conditional writes to the object store);
* lateness (first delivery - executeAt) overall and inside each fault's
  window, from the fault to the end of its recovery allowance;
* late outside the windows: a unit due outside every fault's intended
  window and delivered more than LATE_OUTSIDE_WINDOWS late. A fault's
  intended window is its detection and hand-over (the recovery allowance)
  when other nodes can take its work (a node killed, paused, isolated, cut
  from the store or the broker), and its whole length when nobody can (the
  database or the broker down for all); it opens LATE_OUTSIDE_WINDOWS
  before the fault (a unit due earlier and that late was late before the
  fault hit). A 60 s broker cut of one node left its share a minute late,
  and only this fails such a run.

A recurring schedule is judged occurrence by occurrence: each is a unit of
its own, ``<id>@<execute-at>``, expected once like a one-shot schedule (so a
missing occurrence is lost, a repeated one a duplicate to explain), and an
occurrence nobody expected (off the chain's grid, or past its end) is an
``unexpected_occurrence``: a chain that doubled or drifted.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from chaos.lab.stats import percentile
from ring import bucket_for

# Between a recurring schedule's id and an occurrence's time in a unit's
# name; ids cannot contain it.
OCCURRENCE = "@"

# Record timestamps are milliseconds of the store's clock as the publishing
# node reads it (the same host's clock here, which executeAt is written
# with; a node's own wall clock may be set off, CHAOS_CLOCK_SKEW): anything
# sooner than this before executeAt is early.
EARLY_TOLERANCE = 0.002

# The kinds of duplicate (see the module docstring), in the order of the
# evidence each needs: a unit with repeats of several kinds is counted as
# the last of them, so the one that fails a run is never hidden.
OWNER_CHANGE = "owner_change"
RETRIED_PUBLISH = "retried_publish"
ACROSS_STORE_CRASH = "across_store_crash"
DEFERRED_PUBLISH = "deferred_publish"
PRODUCER_RETRY = "producer_retry"
SAME_CLAIM = "same_claim"
KINDS = (
    OWNER_CHANGE,
    RETRIED_PUBLISH,
    ACROSS_STORE_CRASH,
    DEFERRED_PUBLISH,
    PRODUCER_RETRY,
    SAME_CLAIM,
)
# The least time between two sends of one claim that a broker fault can
# explain as a deferred publish (see the module docstring).
DEFERRED_MIN_GAP = 0.5
# Duplicated units listed with their copies in a result, failures first.
EXPLAINED_LIMIT = 50
# A record stamped later than a verb's 200 (the runner's clock) by more than
# this was published after the verb took effect. The record's timestamp is
# the publishing node's reading of the store's clock, which is the runner's
# host clock here give or take its estimate's error (milliseconds).
ANSWER_TOLERANCE = 0.05
# executeAt values are whole milliseconds: two this close are one time.
SAME_TIME = 0.0005
# Lateness past this, of a unit due outside every fault's intended window,
# fails a run: outside the faults, deliveries run well under a second late
# (README, "Chaos"), and inside one a hand-over takes detection plus a lease.
LATE_OUTSIDE_WINDOWS = 10.0


@dataclass(frozen=True)
class Delivery:
    schedule_id: str  # the unit: a schedule, or one occurrence of a recurring one
    token: int
    attempt: int
    at: float  # epoch seconds (the Kafka record timestamp)
    # What the record carried and where the broker put it: the evidence that
    # tells a producer's resend of one batch from a second publish. None
    # when not recorded (such a repeat is never explained as a resend).
    digest: str | None = None  # of the record value
    partition: int | None = None
    offset: int | None = None
    # When the runner read it (epoch seconds, its own clock); None: not noted.
    received: float | None = None
    # The record's execute-at header (epoch seconds); None: not noted.
    execute_at: float | None = None

    @property
    def schedule(self) -> str:
        return self.schedule_id.partition(OCCURRENCE)[0]


def occurrence(schedule_id: str, execute_at: str) -> str:
    """The unit name of one occurrence of a recurring schedule."""
    return f"{schedule_id}{OCCURRENCE}{execute_at}"


@dataclass(frozen=True)
class Window:
    label: str
    start: float  # epoch seconds
    end: float

    def holds(self, at: float) -> bool:
        return self.start <= at <= self.end


@dataclass(frozen=True)
class Changes:
    """What the load did to its schedules after creating them, besides the
    DELETEs (``cancelled``): the verbs of issue 19. Times are epoch seconds
    of the runner's clock, each when the call answered (or, for a call whose
    outcome the runner settled after the run, when it gave up on the answer).

    ``bulk_cancelled``: unit -> when the bulk cancel that took it answered;
    ``paused``: unit -> its pauses, each (when the pause answered 200, when
    its resume was sent, or None: never resumed);
    ``resumed``: unit -> when its resume answered (lateness counts from there);
    ``moved``: unit -> every executeAt it had, in order, each with when the
    PATCH that set it answered (None for the first, as created); the last is
    the one in force;
    ``unsure``: moved units whose last PATCH has no known outcome: their last
    two times are both acceptable."""

    bulk_cancelled: Mapping[str, float] = field(default_factory=dict)
    paused: Mapping[str, Sequence[tuple[float, float | None]]] = field(default_factory=dict)
    resumed: Mapping[str, float] = field(default_factory=dict)
    moved: Mapping[str, Sequence[tuple[float, float | None]]] = field(default_factory=dict)
    unsure: frozenset[str] = frozenset()

    def still_paused(self) -> set[str]:
        return {u for u, spans in self.paused.items() if any(end is None for _, end in spans)}

    def in_force(self, unit: str) -> list[float]:
        """The executeAt values a record of a moved unit may carry."""
        times = [at for at, _ in self.moved[unit]]
        return times[-2:] if unit in self.unsure else times[-1:]


@dataclass(frozen=True)
class Duplicate:
    """A unit delivered more than once, the kind of its repeat, and the
    label of the fault that explains it (producer_retry, across_store_crash)."""

    unit: str
    kind: str
    window: str | None
    copies: tuple[Delivery, ...]  # in timestamp order

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.unit,
            "kind": self.kind,
            "window": self.window,
            "copies": [
                {
                    "token": c.token,
                    "attempt": c.attempt,
                    "at": round(c.at, 3),
                    "digest": c.digest,
                    "partition": c.partition,
                    "offset": c.offset,
                }
                for c in self.copies
            ],
        }


def check(
    accepted: Mapping[str, float],
    cancelled: set[str],
    deliveries: Sequence[Delivery],
    windows: Sequence[Window] = (),
    *,
    buckets: int = 256,
    kept: set[str] | None = None,
    store_crashes: Sequence[float | Window] = (),
    broker_faults: Sequence[Window] = (),
    changes: Changes | None = None,
    intended: Sequence[Window] | None = None,
) -> dict[str, Any]:
    """``accepted``: schedule id -> executeAt (epoch seconds; a moved one's
    last); ``changes``: what the verbs did besides DELETEs; ``buckets``:
    the cluster's bucket count, to tell each schedule's bucket; ``kept``:
    the ids a fresh reader found in the topic at the end (None: not read);
    ``store_crashes``: when the database was killed (epoch seconds, or a
    window whose start is the kill and whose label names it);
    ``broker_faults``: the windows of the broker's pauses, crashes and cuts,
    inside which a producer may have resent a batch the broker had stored;
    ``intended``: each fault's intended window (the module docstring; None:
    ``windows``), outside which no unit may be LATE_OUTSIDE_WINDOWS late."""
    deliveries = _once_each(deliveries)
    by_id: dict[str, list[Delivery]] = defaultdict(list)
    for delivery in deliveries:
        by_id[delivery.schedule_id].append(delivery)
    changes = changes or Changes()

    def due(d: Delivery) -> float:
        """The time a record is judged against: the one it carries, for a
        moved unit (whose accepted time is only its last)."""
        if d.schedule_id in changes.moved and d.execute_at is not None:
            return d.execute_at
        return accepted[d.schedule_id]

    # The copies that count as the unit's delivery: a moved unit's carry a
    # time in force.
    owed: dict[str, list[Delivery]] = {}
    for unit, copies in by_id.items():
        if unit in changes.moved:
            copies = [d for d in copies if _carries(d, changes.in_force(unit))]
        if copies:
            owed[unit] = copies
    still_paused = changes.still_paused()
    lost = sorted(
        set(accepted) - cancelled - set(changes.bulk_cancelled) - still_paused - set(owed)
    )
    cancelled_delivered = sorted(
        (cancelled & set(by_id))
        | {
            unit
            for unit, answered in changes.bulk_cancelled.items()
            if any(d.at > answered + ANSWER_TOLERANCE for d in by_id.get(unit, ()))
        }
    )
    paused_delivered = sorted(
        unit
        for unit, spans in changes.paused.items()
        if any(_inside(d.at, start, end) for d in by_id.get(unit, ()) for start, end in spans)
    )
    wrong_time = sorted(
        unit
        for unit, times in changes.moved.items()
        if any(_wrong_time(d, times, changes.in_force(unit)) for d in by_id.get(unit, ()))
    )
    crashes = [_as_window(crash) for crash in store_crashes]
    duplicates = [
        _explain(unit, copies, broker_faults, crashes)
        for unit, copies in sorted(by_id.items())
        if len(copies) > 1
    ]
    by_kind = Counter(d.kind for d in duplicates)
    same_claim = [d.unit for d in duplicates if d.kind == SAME_CLAIM]
    # Failures first, then the kinds that needed a fault to explain them.
    listed = sorted(duplicates, key=lambda d: (-KINDS.index(d.kind), d.unit))
    lateness: list[tuple[float, float]] = []  # (executeAt, lateness)
    late_units: list[str] = []  # the unit of each lateness
    early: list[str] = []
    early_received: list[str] = []
    for schedule_id in accepted:
        if schedule_id in owed:
            copies = owed[schedule_id]
            if any(d.at < due(d) - EARLY_TOLERANCE for d in copies):
                early.append(schedule_id)
            if any(
                d.received is not None and d.received < due(d) - EARLY_TOLERANCE for d in copies
            ):
                early_received.append(schedule_id)
            first = min(copies, key=lambda d: d.at)
            # A resumed schedule was not to go out before its resume.
            since = max(due(first), changes.resumed.get(schedule_id, due(first)))
            lateness.append((since, max(0.0, first.at - since)))
            late_units.append(schedule_id)
    stale = _stale_claims(accepted, deliveries, buckets)
    vanished = sorted(set(by_id) - kept) if kept is not None else []
    reused = _offsets_reused(deliveries)
    outside = [late for due, late in lateness if not any(w.start <= due <= w.end for w in windows)]
    impact = windows if intended is None else intended
    late_outside = sorted(
        unit
        for unit, (due_at, late) in zip(late_units, lateness, strict=True)
        if late > LATE_OUTSIDE_WINDOWS and not any(w.holds(due_at) for w in impact)
    )
    return {
        "accepted": len(accepted),
        "cancelled": len(cancelled),
        "bulk_cancelled": len(changes.bulk_cancelled),
        "paused": len(changes.paused),
        "resumed": len(changes.resumed),
        # (One a bulk cancel took while it was paused is counted there.)
        "still_paused": len(still_paused - set(changes.bulk_cancelled)),
        "rescheduled": len(changes.moved),
        "delivered": len(by_id),
        **_counted("lost", lost),
        **_counted("cancelled_delivered", cancelled_delivered),
        **_counted("paused_delivered", paused_delivered),
        **_counted("rescheduled_wrong_time", wrong_time),
        **_counted("early", sorted(early)),
        **_counted("early_received", sorted(early_received)),
        "duplicates": len(duplicates),
        "duplicates_by_kind": {kind: by_kind[kind] for kind in KINDS},
        "duplicates_explained": [d.as_dict() for d in listed[:EXPLAINED_LIMIT]],
        **_counted("duplicates_same_claim", same_claim),
        "duplicates_across_store_crash": by_kind[ACROSS_STORE_CRASH],
        **_counted("vanished", vanished),
        **_counted("offsets_reused", reused),
        **_counted("stale_claims", stale),
        "unknown_deliveries": len(set(by_id) - set(accepted)),
        **_counted(
            "unexpected_occurrences",
            sorted(u for u in set(by_id) - set(accepted) if OCCURRENCE in u),
        ),
        "occurrences": sum(1 for u in accepted if OCCURRENCE in u),
        "lateness_s": _summary([late for _, late in lateness]),
        "lateness_outside_windows_s": _summary(outside),
        **_counted("late_outside_windows", late_outside),
        "lateness_points": sorted([round(due, 3), round(late, 4)] for due, late in lateness),
        "windows": [
            {
                "label": w.label,
                "start": w.start,
                "end": w.end,
                "lateness_s": _summary([late for due, late in lateness if w.start <= due <= w.end]),
            }
            for w in windows
        ],
    }


def passed(result: Mapping[str, Any]) -> bool:
    """The invariants that must hold whatever the faults (and, where a run
    judged them, its floods of garbage gossip: ``garbage_failures``; where
    it read the store at the end, the schedules still IN_FLIGHT then:
    ``stranded``, held by no round and owed a delivery or a mark for good;
    where it named the faults' intended windows, ``late_outside_windows``)."""
    return all(
        result[key] == 0
        for key in (
            "lost",
            "early",
            "cancelled_delivered",
            "paused_delivered",
            "rescheduled_wrong_time",
            "duplicates_same_claim",
            "stale_claims",
            "vanished",
            "unexpected_occurrences",
        )
    ) and all(
        result.get(key, 0) == 0
        for key in ("early_received", "garbage_failures", "stranded", "late_outside_windows")
    )


def _explain(
    unit: str,
    copies: Sequence[Delivery],
    broker_faults: Sequence[Window],
    store_crashes: Sequence[Window],
) -> Duplicate:
    """The kind of one unit's repeat: each claim (token, attempt) delivered
    more than once is judged on its own; without one, the copies differ in
    token (a new owner) or only in attempt (the same owner again)."""
    claims: dict[tuple[int, int], list[Delivery]] = defaultdict(list)
    for copy in copies:
        claims[(copy.token, copy.attempt)].append(copy)
    found = [
        finding
        for claim in claims.values()
        if len(claim) > 1
        for finding in _one_claim(claim, broker_faults, store_crashes)
    ]
    if not found:
        tokens = {c.token for c in copies}
        found = [(RETRIED_PUBLISH if len(tokens) < len(copies) else OWNER_CHANGE, None)]
    kind, window = max(found, key=lambda finding: KINDS.index(finding[0]))
    return Duplicate(unit, kind, window, tuple(sorted(copies, key=lambda c: c.at)))


def _one_claim(
    claim: Sequence[Delivery],
    broker_faults: Sequence[Window],
    store_crashes: Sequence[Window],
) -> Iterable[tuple[str, str | None]]:
    """What explains several copies under one (token, attempt): a kind and
    the fault's label for each repeat found."""
    # One send is one batch: its copies share the value and the CreateTime
    # the producer stamped when it made the batch (not when it sent it).
    sends: dict[tuple[float, str | None], int] = Counter((c.at, c.digest) for c in claim)
    for (at, digest), copies in sends.items():
        if copies > 1:
            fault = _first(w for w in broker_faults if w.holds(at)) if digest else None
            yield (PRODUCER_RETRY, fault.label) if fault else (SAME_CLAIM, None)
    if len(sends) > 1:
        # Separate sends of one claim: the claim was made again, which a
        # database crash between them explains (its acknowledgement was
        # lost), or a broker fault during every send but the last (the
        # broker's silence spent no attempt: the same claim published again).
        times = sorted(at for at, _ in sends)
        crash = _first(c for c in store_crashes if c.start <= times[-1] and times[0] <= c.end)
        faults = [_first(w for w in broker_faults if w.holds(at)) for at in times[:-1]]
        digests = {digest for _, digest in sends}
        if crash:
            yield ACROSS_STORE_CRASH, crash.label
        elif (
            all(faults)
            and None not in digests
            and len(digests) == 1
            and min(b - a for a, b in pairwise(times)) >= DEFERRED_MIN_GAP
        ):
            yield DEFERRED_PUBLISH, faults[0].label if faults[0] else None
        else:
            yield SAME_CLAIM, None


def _carries(delivery: Delivery, times: Sequence[float]) -> bool:
    """Whether the record carries one of ``times`` (a record whose header was
    not noted is taken to)."""
    carried = delivery.execute_at
    return carried is None or any(abs(carried - t) <= SAME_TIME for t in times)


def _inside(at: float, start: float, end: float | None) -> bool:
    """Whether a record stamped ``at`` was published while the schedule was
    paused: after the pause's 200, before its resume was sent."""
    return start + ANSWER_TOLERANCE < at and (end is None or at < end - ANSWER_TOLERANCE)


def _wrong_time(
    delivery: Delivery, times: Sequence[tuple[float, float | None]], in_force: Sequence[float]
) -> bool:
    """A record of a moved unit carrying a time it never had, or one a PATCH
    had moved it off before the record was published."""
    if _carries(delivery, in_force):
        return False
    had = [i for i, (t, _) in enumerate(times) if _carries(delivery, [t])]
    if not had or had[-1] + 1 >= len(times):
        return True
    moved_off = times[had[-1] + 1][1]
    return moved_off is None or delivery.at > moved_off + ANSWER_TOLERANCE


def _first(windows: Iterable[Window]) -> Window | None:
    return next(iter(windows), None)


def _as_window(crash: float | Window) -> Window:
    if isinstance(crash, Window):
        return crash
    return Window(f"database crash at {crash:.3f}", crash, crash)


def _once_each(deliveries: Sequence[Delivery]) -> list[Delivery]:
    """One record read twice (a reader that fetched an offset again) is one
    delivery, not a duplicate: the same unit and bytes at the same offset."""
    seen: set[tuple[str, str | None, int, int]] = set()
    kept: list[Delivery] = []
    for delivery in deliveries:
        if delivery.partition is not None and delivery.offset is not None:
            key = (delivery.schedule_id, delivery.digest, delivery.partition, delivery.offset)
            if key in seen:
                continue
            seen.add(key)
        kept.append(delivery)
    return kept


def _offsets_reused(deliveries: Iterable[Delivery]) -> list[str]:
    """The partition:offset positions served with two different records (a
    unit or a value digest apart). Reading one record twice is no reuse."""
    first: dict[tuple[int, int], tuple[str, str | None]] = {}
    reused: set[tuple[int, int]] = set()
    for delivery in deliveries:
        if delivery.partition is None or delivery.offset is None:
            continue
        where = (delivery.partition, delivery.offset)
        if first.setdefault(where, (delivery.schedule_id, delivery.digest)) != (
            delivery.schedule_id,
            delivery.digest,
        ):
            reused.add(where)
    return [f"{partition}:{offset}" for partition, offset in sorted(reused)]


def _counted(name: str, ids: list[str]) -> dict[str, Any]:
    """How many, and the first few ids to look up."""
    return {name: len(ids), f"{name}_ids": ids[:20]}


def _stale_claims(
    accepted: Mapping[str, float], deliveries: Sequence[Delivery], buckets: int
) -> list[str]:
    first_by_token: dict[tuple[int, int], float] = {}  # (bucket, token) -> first delivery
    for d in deliveries:
        key = (bucket_for(d.schedule, buckets), d.token)
        first_by_token[key] = min(d.at, first_by_token.get(key, d.at))
    by_bucket: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for (bucket, token), first in first_by_token.items():
        by_bucket[bucket].append((token, first))
    stale = set()
    for d in deliveries:
        due = accepted.get(d.schedule_id)
        if due is None:
            continue
        if d.execute_at is not None:
            # The time the record was claimed for: a rescheduled schedule's
            # accepted time is only its last.
            due = d.execute_at
        newer = by_bucket[bucket_for(d.schedule, buckets)]
        if any(t > d.token and first < due - EARLY_TOLERANCE for t, first in newer):
            stale.add(d.schedule_id)
    return sorted(stale)


def _summary(values: list[float]) -> dict[str, float | int]:
    return {
        "count": len(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values) if values else float("nan"),
    }
