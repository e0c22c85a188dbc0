"""What the sinks got (the topic's records and the receiver's requests,
one stream) as the units the invariants judge, and what each unit is owed
by the history's facts. Pure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from chaos.checker.model import Facts
from chaos.history import OCCURRENCE, Delivery, Topic

# Record timestamps are milliseconds of the store's clock as the publishing
# node reads it (the same host's clock here, which executeAt is written
# with; a node's own wall clock may be set off, CHAOS_CLOCK_SKEW): anything
# sooner than this before executeAt is early.
EARLY_TOLERANCE = 0.002
# A record stamped later than a verb's 200 (the runner's clock) by more than
# this was published after the verb took effect. The record's timestamp is
# the publishing node's reading of the store's clock, which is the runner's
# host clock here give or take its estimate's error (milliseconds).
ANSWER_TOLERANCE = 0.05
# executeAt values are whole milliseconds: two this close are one time.
SAME_TIME = 0.0005


def delivered(topic: Topic) -> list[Delivery]:
    """One record read twice (a reader that fetched an offset again, or the
    live reader and the fresh one at the end) is one delivery, not a
    duplicate: the same unit and bytes at the same offset."""
    seen: set[tuple[str, str | None, int | None, int | None]] = set()
    kept: list[Delivery] = []
    for delivery in (*topic.deliveries, *topic.replayed):
        if delivery.partition is not None and delivery.offset is not None:
            if delivery.record in seen:
                continue
            seen.add(delivery.record)
        kept.append(delivery)
    return kept


def by_unit(deliveries: Iterable[Delivery]) -> dict[str, list[Delivery]]:
    units: dict[str, list[Delivery]] = defaultdict(list)
    for delivery in deliveries:
        units[delivery.schedule_id].append(delivery)
    return units


def owed(known: Facts, units: dict[str, list[Delivery]]) -> dict[str, list[Delivery]]:
    """The copies that count as each unit's delivery: a moved unit's carry
    a time in force, and every unit's arrived where it is to go (a switched
    one's at the destination in force: a copy at one it was switched off
    delivers nothing the schedule is owed)."""
    counted: dict[str, list[Delivery]] = {}
    for unit, copies in units.items():
        if unit in known.changes.moved:
            in_force = known.changes.in_force(unit)
            copies = [d for d in copies if carries(d, in_force)]
        sinks = known.destinations.in_force(unit.partition(OCCURRENCE)[0])
        if sinks is not None:
            copies = [d for d in copies if d.sink in sinks]
        if copies:
            counted[unit] = copies
    return counted


def due(known: Facts, delivery: Delivery) -> float:
    """The time a record is judged against: the one it carries, for a
    moved unit (whose accepted time is only its last)."""
    if delivery.schedule_id in known.changes.moved and delivery.execute_at is not None:
        return delivery.execute_at
    return known.accepted[delivery.schedule_id]


def carries(delivery: Delivery, times: Sequence[float]) -> bool:
    """Whether the record carries one of ``times`` (a record whose header was
    not noted is taken to)."""
    carried = delivery.execute_at
    return carried is None or any(abs(carried - t) <= SAME_TIME for t in times)
