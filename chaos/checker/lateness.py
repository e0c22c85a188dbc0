"""How late each unit went out, overall and by fault, and the invariant
that nothing is late where no fault meant it to be. Pure: no IO, no clock."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from itertools import pairwise
from typing import NamedTuple

from chaos.checker.finding import Finding
from chaos.checker.model import LATE_OUTSIDE_WINDOWS, Window, facts
from chaos.checker.units import by_unit, delivered, due, owed
from chaos.history import OCCURRENCE, History, Topic
from chaos.lab.stats import percentile


class Delay(NamedTuple):
    unit: str
    since: float  # when it was owed: its executeAt, or its resume's answer
    late: float  # seconds, its first copy after ``since`` (0 when before)
    sink: str  # where that copy arrived
    # Of ``late``, the seconds it waited on the occurrence before it (a
    # recurring schedule's occurrences go out one after another).
    held: float = 0.0

    @property
    def free(self) -> float:
        """When it could go: owed, and its previous occurrence out."""
        return self.since + self.held


def delays(history: History, topic: Topic) -> list[Delay]:
    """Each delivered unit's lateness, from its first copy."""
    known = facts(history)
    firsts = {
        unit: min(copies, key=lambda d: d.at)
        for unit, copies in owed(known, by_unit(delivered(topic))).items()
        if unit in known.accepted
    }
    previous = _previous_occurrences(known.accepted)
    found = []
    for unit, first in firsts.items():
        # A resumed schedule was not to go out before its resume.
        since = max(due(known, first), known.changes.resumed.get(unit, due(known, first)))
        late = max(0.0, first.at - since)
        before = firsts.get(previous.get(unit, ""))
        held = min(late, max(0.0, before.at - since)) if before is not None else 0.0
        found.append(Delay(unit, since, late, first.sink, held))
    return found


def _previous_occurrences(accepted: Mapping[str, float]) -> dict[str, str]:
    """Each occurrence of a recurring schedule -> the one due before it."""
    chains: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for unit, due_at in accepted.items():
        if OCCURRENCE in unit:
            chains[unit.partition(OCCURRENCE)[0]].append((due_at, unit))
    return {
        later: earlier
        for ticks in chains.values()
        for (_, earlier), (_, later) in pairwise(sorted(ticks))
    }


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
    nothing.

    An occurrence of a recurring schedule goes out only after the one
    before it: what it waited on that one is the earlier one's lateness,
    not its own (after an outage a chain replays its missed occurrences
    one by one, fire_all, well past the outage). It is judged by the rest,
    from when it could go."""
    faults = facts(history).faults
    return Finding(
        "late_outside_windows",
        tuple(
            sorted(
                d.unit
                for d in delays(history, topic)
                if d.late - d.held > LATE_OUTSIDE_WINDOWS
                and not any(w.holds(d.free) for w in faults.intended_for(d.sink))
            )
        ),
    )


def late_past_windows(history: History, topic: Topic) -> Finding:
    """Late past its windows: a unit due inside faults' intended windows may
    be late while they last, not for good. Its first copy comes no more than
    LATE_OUTSIDE_WINDOWS after the end of the windows that hold its due time
    (and of any window overlapping those, one after another: a fault that
    strikes while the last one's work is still being handed over). Work
    left to a safety net (a claim never put back, a mark a crash lost,
    found by the sweep of stranded claims minutes later) fails it.
    Judged by the simulation (``chaos/sim/``), whose windows are exact."""
    faults = facts(history).faults
    late = []
    for delay in delays(history, topic):
        end = _windows_end(faults.intended_for(delay.sink), delay.free)
        if end is not None and delay.free + delay.late - delay.held > end + LATE_OUTSIDE_WINDOWS:
            late.append(delay.unit)
    return Finding("late_past_windows", tuple(sorted(late)))


def _windows_end(windows: tuple[Window, ...], at: float) -> float | None:
    """The end of the windows holding ``at`` and of those overlapping them
    in turn (None: no window holds it)."""
    holding = [w for w in windows if w.holds(at)]
    if not holding:
        return None
    end = max(w.end for w in holding)
    for window in sorted(windows, key=lambda w: w.start):
        if window.start <= end:
            end = max(end, window.end)
    return end


def summary(values: list[float]) -> dict[str, float | int]:
    return {
        "count": len(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values) if values else float("nan"),
    }
