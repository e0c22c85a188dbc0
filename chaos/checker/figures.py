"""What a run's result reports beside its invariants, failing no run: the
tallies of what the load did and the topic got, and the broker's reuse of
offsets. Pure: no IO, no clock."""

from __future__ import annotations

from chaos.checker.finding import Finding
from chaos.checker.model import facts
from chaos.checker.units import by_unit, delivered
from chaos.history import HTTP, OCCURRENCE, History, Topic


def tally(history: History, topic: Topic) -> Finding:
    """How many units were accepted, cancelled, changed by each verb,
    delivered (and of those, how many nobody accepted, and how many by
    HTTP), and how many of the accepted are occurrences of a recurring
    schedule."""
    known = facts(history)
    changes = known.changes
    units = set(by_unit(delivered(topic)))
    by_http = {d.schedule_id for d in delivered(topic) if d.sink == HTTP}
    return Finding(
        "tally",
        figures={
            "accepted": len(known.accepted),
            "cancelled": len(known.cancelled),
            "bulk_cancelled": len(changes.bulk_cancelled),
            "bulk_paused": len(changes.bulk_paused),
            # Paused on their own (a unit a bulk pause took has one span more).
            "paused": sum(
                len(spans) > (u in changes.bulk_paused) for u, spans in changes.paused.items()
            ),
            "resumed": len(changes.resumed),
            # (One a bulk cancel took while it was paused is counted there.)
            "still_paused": len(
                changes.still_paused() - set(changes.bulk_cancelled) - set(changes.bulk_paused)
            ),
            "rescheduled": len(changes.moved),
            "delivered": len(units),
            "delivered_http": len(by_http),
            "unknown_deliveries": len(units - set(known.accepted)),
            "occurrences": sum(1 for u in known.accepted if OCCURRENCE in u),
        },
    )


def offsets_reused(history: History, topic: Topic) -> Finding:
    """Offsets reused: a partition:offset the reader was served twice with
    different records (a unit or a value digest apart; reading one record
    twice is no reuse). Kafka never gives one offset to two records; a
    broker that does has overwritten one of them, so an acknowledged record
    may be gone before anybody read it. Not an invariant of this system (a
    broker fault), so it fails no run: it is the evidence that tells a
    record the broker dropped from one the scheduler never sent. The
    embedded durable broker does it under concurrent producers (Tansu 0.6
    over SeaweedFS: its offsets are taken with conditional writes to the
    object store)."""
    first: dict[tuple[int, int], tuple[str, str | None]] = {}
    reused: set[tuple[int, int]] = set()
    for delivery in delivered(topic):
        if delivery.partition is None or delivery.offset is None:
            continue
        where = (delivery.partition, delivery.offset)
        if first.setdefault(where, (delivery.schedule_id, delivery.digest)) != (
            delivery.schedule_id,
            delivery.digest,
        ):
            reused.add(where)
    return Finding(
        "offsets_reused", tuple(f"{partition}:{offset}" for partition, offset in sorted(reused))
    )
