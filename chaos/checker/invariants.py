"""The invariants of what the sinks got against what the history says the
cluster owes: nothing lost, nothing early, no claim under a stale token, no
record gone, no occurrence nobody expected, no schedule given up on that
no receiver refused. Pure: no IO, no clock."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from chaos.checker.finding import Finding
from chaos.checker.model import facts
from chaos.checker.units import EARLY_TOLERANCE, by_unit, delivered, due, owed
from chaos.history import DELIVERY_FAILED, KAFKA, OBSERVER, OCCURRENCE, Delivery, History, Topic
from ring import bucket_for


def lost(history: History, topic: Topic) -> Finding:
    """Accepted, not cancelled (by a DELETE or a bulk cancel) nor still
    paused at the end, nor refused for good by the receiver (a 4xx it was
    told to answer: given up on, as asked), never delivered (a rescheduled
    one: never with its last executeAt; a switched one: never at the
    destination in force)."""
    known = facts(history)
    changes = known.changes
    missing = (
        set(known.accepted)
        - known.cancelled
        - set(changes.bulk_cancelled)
        - changes.still_paused()
        - topic.refused
        - set(owed(known, by_unit(delivered(topic))))
    )
    return Finding("lost", tuple(sorted(missing)))


def early(history: History, topic: Topic) -> Finding:
    """Delivered before its executeAt, by the record's timestamp (which the
    node stamps with its estimate of the store's clock, not its own wall
    clock, so a node whose clock is off is judged like any other)."""
    return _sent_before_due("early", history, topic, lambda d: d.at)


def early_received(history: History, topic: Topic) -> Finding:
    """Delivered before its executeAt by when the runner received it
    (``Delivery.received``, the runner's own clock, the one executeAt was
    written with), where recorded: a record read before it was due was sent
    early, whatever any node's clock says."""
    return _sent_before_due("early_received", history, topic, lambda d: d.received)


def _sent_before_due(
    name: str, history: History, topic: Topic, stamp: Callable[[Delivery], float | None]
) -> Finding:
    """The units a copy of which is ``stamp``ed before it was due."""
    known = facts(history)
    units = owed(known, by_unit(delivered(topic)))
    return Finding(
        name,
        tuple(
            sorted(
                unit
                for unit, copies in units.items()
                if unit in known.accepted
                and any(_before(stamp(d), due(known, d) - EARLY_TOLERANCE) for d in copies)
            )
        ),
    )


def _before(at: float | None, bound: float) -> bool:
    return at is not None and at < bound


def stale_claims(history: History, topic: Topic) -> Finding:
    """A delivery under token t of a schedule that fell due (at the
    execute-at its record carries, where noted: a rescheduled one had
    others) after a newer token t' of its bucket had already delivered
    something. Claims take only due schedules, so t claimed it while t' held
    the bucket: two live owners, the double claim the fence exists to
    prevent. (A former owner finishing a batch it claimed before losing the
    lease delivers only schedules due before the new owner's first
    delivery: never flagged.)"""
    known = facts(history)
    deliveries = delivered(topic)
    first_by_token: dict[tuple[int, int], float] = {}  # (bucket, token) -> first delivery
    for d in deliveries:
        key = (bucket_for(d.schedule, known.buckets), d.token)
        first_by_token[key] = min(d.at, first_by_token.get(key, d.at))
    by_bucket: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for (bucket, token), first in first_by_token.items():
        by_bucket[bucket].append((token, first))
    stale = set()
    for d in deliveries:
        due_at = known.accepted.get(d.schedule_id)
        if due_at is None:
            continue
        if d.execute_at is not None:
            # The time the record was claimed for: a rescheduled schedule's
            # accepted time is only its last.
            due_at = d.execute_at
        newer = by_bucket[bucket_for(d.schedule, known.buckets)]
        if any(t > d.token and first < due_at - EARLY_TOLERANCE for t, first in newer):
            stale.add(d.schedule_id)
    return Finding("stale_claims", tuple(sorted(stale)))


def vanished(history: History, topic: Topic) -> Finding:
    """Seen in the topic during the run, gone when a fresh reader reads it
    again at the end (the broker lost an acknowledged record). Of the topic
    only: what the receiver took is in its log for good."""
    if topic.kept is None:
        return Finding("vanished", ())
    records = [d for d in delivered(topic) if d.sink == KAFKA]
    return Finding("vanished", tuple(sorted(set(by_unit(records)) - topic.kept)))


def delivery_failed(history: History, topic: Topic) -> Finding:
    """Given up on: a schedule the store held DELIVERY_FAILED at the end
    (the observer's ops), unless the receiver refused a request of it for
    good (a 4xx it was told to answer, which ends a schedule at once, as
    the contract says). Nothing else in a run may end one: a broker or a
    receiver asking to wait spends no attempt, and a receiver's failures
    (down, timing out) spend one each only until a node's circuit to it
    opens (five in a row), which then holds its calls without spending
    any: no schedule runs out of its attempts in a run's faults."""
    failed = {str(op.value["id"]) for op in history.events(OBSERVER, DELIVERY_FAILED)}
    refused = {unit.partition(OCCURRENCE)[0] for unit in topic.refused}
    return Finding(
        "delivery_failed",
        tuple(sorted(failed - refused)),
        {"delivery_failed_refused": len(failed & refused)},
    )


def unexpected_occurrences(history: History, topic: Topic) -> Finding:
    """An occurrence of a recurring schedule nobody expected (off the
    chain's grid, or past its end): a chain that doubled or drifted."""
    unknown = set(by_unit(delivered(topic))) - set(facts(history).accepted)
    return Finding("unexpected_occurrences", tuple(sorted(u for u in unknown if OCCURRENCE in u)))
