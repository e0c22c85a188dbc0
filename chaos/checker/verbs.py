"""The invariants of the verbs of issue 19 (a DELETE, a bulk cancel, a
pause and its resume, a PATCH of executeAt or of the destination): nothing
goes out after a verb said it would not, nor where a PATCH said it would
not go. Pure: no IO, no clock."""

from __future__ import annotations

from collections.abc import Sequence

from chaos.checker.finding import Finding
from chaos.checker.model import facts
from chaos.checker.units import ANSWER_TOLERANCE, by_unit, carries, delivered
from chaos.history import Delivery, History, Topic


def cancelled_delivered(history: History, topic: Topic) -> Finding:
    """Cancelled but delivered: a DELETE that answered 200 and a record
    anyway, or a record published (by its timestamp) after the 200 of the
    bulk cancel (``POST /v1/schedules:cancel``) that took the schedule. A
    bulk cancel answers only a count, so which schedules it took the runner
    asks after the run (their status, CANCELLED); a record from before the
    200 is one the schedule had out before it went back to PENDING (a dead
    owner's publish, redone), not a breach. A bulk-cancelled schedule is not
    lost."""
    known = facts(history)
    units = by_unit(delivered(topic))
    after_bulk = {
        unit
        for unit, answered in known.changes.bulk_cancelled.items()
        if any(d.at > answered + ANSWER_TOLERANCE for d in units.get(unit, ()))
    }
    deleted = known.cancelled & set(units)
    return Finding("cancelled_delivered", tuple(sorted(deleted | after_bulk)))


def paused_delivered(history: History, topic: Topic) -> Finding:
    """Delivered while paused: a record published after a pause's 200 and
    before its resume was asked (or at all after it, when it was never
    resumed). A schedule still paused at the end is owed nothing (not lost);
    a resumed one is owed its delivery again, and its lateness counts from
    the resume's answer, not from its executeAt."""
    units = by_unit(delivered(topic))
    return Finding(
        "paused_delivered",
        tuple(
            sorted(
                unit
                for unit, spans in facts(history).changes.paused.items()
                if any(
                    _inside(d.at, start, end) for d in units.get(unit, ()) for start, end in spans
                )
            )
        ),
    )


def rescheduled_wrong_time(history: History, topic: Topic) -> Finding:
    """Rescheduled at the wrong time: a PATCH moved the schedule's
    executeAt, and a record carries (header ``execute-at``) a time it was
    moved off, published after the 200 of the PATCH that moved it off, or a
    time it never had. A rescheduled schedule is delivered (else lost) only
    by a record carrying its last executeAt (either of its last two when its
    last PATCH has no known outcome), and judged early or late against the
    time the record carries."""
    changes = facts(history).changes
    units = by_unit(delivered(topic))
    return Finding(
        "rescheduled_wrong_time",
        tuple(
            sorted(
                unit
                for unit, times in changes.moved.items()
                if any(_wrong_time(d, times, changes.in_force(unit)) for d in units.get(unit, ()))
            )
        ),
    )


def wrong_destination(history: History, topic: Topic) -> Finding:
    """Delivered at the wrong destination: a copy at a sink the schedule
    never had (a schedule for the receiver in the topic, or the other way
    round), or at one a PATCH switched it off, sent after that PATCH's 200.
    A switched schedule is delivered (else lost) only at the destination in
    force (either of its last two when its last switch has no known
    outcome)."""
    destinations = facts(history).destinations
    wrong = set()
    for delivery in delivered(topic):
        had = destinations.sinks.get(delivery.schedule)
        in_force = destinations.in_force(delivery.schedule)
        if had and in_force and _wrong_sink(delivery, had, in_force):
            wrong.add(delivery.schedule_id)
    return Finding("wrong_destination", tuple(sorted(wrong)))


def _wrong_sink(
    delivery: Delivery, had: Sequence[tuple[str, float | None]], in_force: Sequence[str]
) -> bool:
    """A copy at a sink its schedule never had, or at one a PATCH had
    switched it off before the copy was sent."""
    if delivery.sink in in_force:
        return False
    there = [i for i, (sink, _) in enumerate(had) if sink == delivery.sink]
    if not there or there[-1] + 1 >= len(had):
        return True
    switched_off = had[there[-1] + 1][1]
    return switched_off is None or delivery.at > switched_off + ANSWER_TOLERANCE


def _inside(at: float, start: float, end: float | None) -> bool:
    """Whether a record stamped ``at`` was published while the schedule was
    paused: after the pause's 200, before its resume was sent."""
    return start + ANSWER_TOLERANCE < at and (end is None or at < end - ANSWER_TOLERANCE)


def _wrong_time(
    delivery: Delivery, times: Sequence[tuple[float, float | None]], in_force: Sequence[float]
) -> bool:
    """A record of a moved unit carrying a time it never had, or one a PATCH
    had moved it off before the record was published."""
    if carries(delivery, in_force):
        return False
    had = [i for i, (t, _) in enumerate(times) if carries(delivery, [t])]
    if not had or had[-1] + 1 >= len(times):
        return True
    moved_off = times[had[-1] + 1][1]
    return moved_off is None or delivery.at > moved_off + ANSWER_TOLERANCE
