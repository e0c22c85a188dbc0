"""Duplicates: units delivered more than once. Each duplicated unit gets one
kind, with the copies and the fault that explain it as evidence:

- ``owner_change``: copies under different fencing tokens. A new owner
  delivered again what the old one had in flight when it died, slept or
  lost its lease;
- ``retried_publish``: one token, different attempts. The owner's publish
  was reported failed (timed out) though the broker had stored it (or the
  receiver had taken the request: it answered after the node's timeout,
  or died before its answer went out), or its completion write was lost,
  and it sent it again on a later attempt;
- ``across_store_crash``: one (token, attempt), the copies on both sides
  of a database crash: the first sent before the database came back (a
  claim acknowledged just before the kill is published as it lands, or
  while the database is down), a later one after the kill. A claim is
  acknowledged before it is journaled (losing one only means delivering
  again; marks are journaled first), so after the crash the owner claims
  the same schedule again with the same token and attempt number;
- ``deferred_publish``: one (token, attempt), sent again later (another
  record timestamp), every earlier send inside a fault of the sink it
  arrived at: a broker fault (paused, crashed or cut off by the runner, or
  stalled on its own while the nodes' /readyz said so: the observer's
  broker stalls), or for a request a receiver fault. The destination
  stored the record (took the request) but its answer was lost to the
  fault; the node took that for the destination's trouble, which spends
  no attempt (the claim is undone, the schedule back to PENDING: a broker
  that did not answer, or the probe of an open circuit that timed out),
  and sent it again under the same attempt once the destination answered
  (never within DEFERRED_MIN_GAP: the first send had to fail first, and a
  send stored and never answered fails by a timeout or a restart);
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
hidden by an owner change of the same unit. Pure: no IO, no clock.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from chaos.checker.finding import Finding
from chaos.checker.model import Faults, Window, facts
from chaos.checker.units import by_unit, delivered
from chaos.history import Delivery, History, Topic

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
                    "sink": c.sink,
                }
                for c in self.copies
            ],
        }


def duplicates(history: History, topic: Topic) -> Finding:
    """Delivered more than once: each duplicated unit's kind (the module
    docstring), counted by kind and listed with its copies, failures first.
    The units under one claim (``same_claim``) break the invariant."""
    faults = facts(history).faults
    found = [
        explain(unit, copies, faults)
        for unit, copies in sorted(by_unit(delivered(topic)).items())
        if len(copies) > 1
    ]
    by_kind = Counter(d.kind for d in found)
    # Failures first, then the kinds that needed a fault to explain them.
    listed = sorted(found, key=lambda d: (-KINDS.index(d.kind), d.unit))
    return Finding(
        "duplicates_same_claim",
        tuple(d.unit for d in found if d.kind == SAME_CLAIM),
        {
            "duplicates": len(found),
            "duplicates_by_kind": {kind: by_kind[kind] for kind in KINDS},
            "duplicates_explained": [d.as_dict() for d in listed[:EXPLAINED_LIMIT]],
            "duplicates_across_store_crash": by_kind[ACROSS_STORE_CRASH],
        },
    )


def explain(unit: str, copies: Sequence[Delivery], faults: Faults) -> Duplicate:
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
        for finding in _one_claim(claim, faults)
    ]
    if not found:
        tokens = {c.token for c in copies}
        found = [(RETRIED_PUBLISH if len(tokens) < len(copies) else OWNER_CHANGE, None)]
    kind, window = max(found, key=lambda finding: KINDS.index(finding[0]))
    return Duplicate(unit, kind, window, tuple(sorted(copies, key=lambda c: c.at)))


# One send of a claim: when (the record's timestamp, or when the receiver
# read the request), the digest of what it carried, and the sink it reached.
Send = tuple[float, str | None, str]


def _one_claim(claim: Sequence[Delivery], faults: Faults) -> Iterable[tuple[str, str | None]]:
    """What explains several copies under one (token, attempt): a kind and
    the fault's label for each repeat found."""
    # One send is one batch: its copies share the value and the CreateTime
    # the producer stamped when it made the batch (not when it sent it).
    sends: dict[Send, int] = Counter((c.at, c.digest, c.sink) for c in claim)
    for (at, digest, sink), copies in sends.items():
        if copies > 1:
            fault = _first(w for w in faults.destination(sink) if w.holds(at)) if digest else None
            yield (PRODUCER_RETRY, fault.label) if fault else (SAME_CLAIM, None)
    if len(sends) > 1:
        yield _sent_again(sorted(sends, key=lambda send: send[0]), faults)


def _sent_again(sends: Sequence[Send], faults: Faults) -> tuple[str, str | None]:
    """Separate sends of one claim, in time order: the claim was made
    again, which a database crash between them explains (its
    acknowledgement was lost), or a fault of its destination during every
    send but the last (the destination's silence spent no attempt: the
    same claim sent again)."""
    times = [at for at, _, _ in sends]
    crash = _first(c for c in faults.store_crashes if c.start <= times[-1] and times[0] <= c.end)
    if crash:
        return ACROSS_STORE_CRASH, crash.label
    during = [
        _first(w for w in faults.destination(sink) if w.holds(at)) for at, _, sink in sends[:-1]
    ]
    if _deferred(times, during, {digest for _, digest, _ in sends}):
        return DEFERRED_PUBLISH, during[0].label if during[0] else None
    return SAME_CLAIM, None


def _deferred(
    times: Sequence[float], faults: Sequence[Window | None], digests: set[str | None]
) -> bool:
    """One record (one digest, recorded) sent again, every send but the
    last inside a fault of its destination, no two sends closer than
    DEFERRED_MIN_GAP."""
    return (
        all(faults)
        and None not in digests
        and len(digests) == 1
        and min(b - a for a, b in pairwise(times)) >= DEFERRED_MIN_GAP
    )


def _first(windows: Iterable[Window]) -> Window | None:
    return next(iter(windows), None)
