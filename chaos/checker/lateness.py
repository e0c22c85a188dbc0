"""How late each unit went out, overall and by fault, and the invariant
that nothing is late where no fault meant it to be. Pure: no IO, no clock."""

from __future__ import annotations

from typing import NamedTuple

from chaos.checker.finding import Finding
from chaos.checker.model import LATE_OUTSIDE_WINDOWS, facts
from chaos.checker.units import by_unit, delivered, due, owed
from chaos.history import History, Topic
from chaos.lab.stats import percentile


class Delay(NamedTuple):
    unit: str
    since: float  # when it was owed: its executeAt, or its resume's answer
    late: float  # seconds, its first copy after ``since`` (0 when before)
    sink: str  # where that copy arrived


def delays(history: History, topic: Topic) -> list[Delay]:
    """Each delivered unit's lateness, from its first copy."""
    known = facts(history)
    found = []
    for unit, copies in owed(known, by_unit(delivered(topic))).items():
        if unit not in known.accepted:
            continue
        first = min(copies, key=lambda d: d.at)
        # A resumed schedule was not to go out before its resume.
        since = max(due(known, first), known.changes.resumed.get(unit, due(known, first)))
        found.append(Delay(unit, since, max(0.0, first.at - since), first.sink))
    return found


def lateness(history: History, topic: Topic) -> Finding:
    """Lateness (first delivery - executeAt) overall and inside each fault's
    window, from the fault to the end of its recovery allowance; and outside
    every window."""
    windows = facts(history).faults.windows
    found = delays(history, topic)
    outside = [d.late for d in found if not any(w.holds(d.since) for w in windows)]
    return Finding(
        "lateness",
        figures={
            "lateness_s": summary([d.late for d in found]),
            "lateness_outside_windows_s": summary(outside),
            "lateness_points": sorted([round(d.since, 3), round(d.late, 4)] for d in found),
            "windows": [
                {
                    "label": w.label,
                    "start": w.start,
                    "end": w.end,
                    "lateness_s": summary([d.late for d in found if w.holds(d.since)]),
                }
                for w in windows
            ],
        },
    )


def late_outside_windows(history: History, topic: Topic) -> Finding:
    """Late outside the windows: a unit due outside every fault's intended
    window and delivered more than LATE_OUTSIDE_WINDOWS late. A fault's
    intended window is its detection and hand-over (the recovery allowance)
    when other nodes can take its work (a node killed, paused, isolated, cut
    from the store or the broker), and its whole length when nobody can (the
    database or the broker down for all); it opens LATE_OUTSIDE_WINDOWS
    before the fault (a unit due earlier and that late was late before the
    fault hit). A 60 s broker cut of one node left its share a minute late,
    and only this fails such a run. The receiver's faults excuse the units
    delivered by HTTP only, for as long as they last and the circuits they
    opened take to try again; a unit delivered to the topic owes them
    nothing."""
    faults = facts(history).faults
    return Finding(
        "late_outside_windows",
        tuple(
            sorted(
                d.unit
                for d in delays(history, topic)
                if d.late > LATE_OUTSIDE_WINDOWS
                and not any(w.holds(d.since) for w in faults.intended_for(d.sink))
            )
        ),
    )


def summary(values: list[float]) -> dict[str, float | int]:
    return {
        "count": len(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values) if values else float("nan"),
    }
