"""The invariants of a chaos run, judged from its history (what the load
was told: 201s, cancellations, the verbs' answers; what the nemesis broke
and when) and what the sinks got: the topic's records and the receiver's
requests, one stream keyed by unit. Pure: no IO, no clock.

One function per invariant, each ``(history, topic) -> Finding``, composed
the way Jepsen's ``checker/compose`` runs named checkers side by side:
``check`` maps ``INVARIANTS`` (and the ``FIGURES`` that fail no run) over
one history and merges their findings into the run's result, which
``passed`` judges. Each invariant's docstring says what it counts:

* ``lost``, ``early``, ``early_received``, ``stale_claims``, ``vanished``,
  ``unexpected_occurrences`` (``invariants.py``);
* ``delivery_failed``: given up on, but not refused by the receiver
  (``invariants.py``);
* ``cancelled_delivered``, ``paused_delivered``, ``rescheduled_wrong_time``,
  ``wrong_destination``: what the verbs said would not go out, or not
  there (``verbs.py``);
* ``duplicates``: delivered more than once, each unit's repeat told apart
  by kind; only a repeat under one claim fails (``duplicates.py``);
* ``late_outside_windows``, and the lateness figures (``lateness.py``);
  the simulation judges ``late_past_windows`` too;
* the tallies and ``offsets_reused``, which fail no run (``figures.py``).

A recurring schedule is judged occurrence by occurrence: each is a unit of
its own, ``<id>@<execute-at>``, expected once like a one-shot schedule (so a
missing occurrence is lost, a repeated one a duplicate to explain), and an
occurrence nobody expected (off the chain's grid, or past its end) is an
``unexpected_occurrence``: a chain that doubled or drifted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from chaos.checker.duplicates import (
    ACROSS_STORE_CRASH,
    DEFERRED_PUBLISH,
    KINDS,
    OWNER_CHANGE,
    PRODUCER_RETRY,
    RETRIED_PUBLISH,
    SAME_CLAIM,
    duplicates,
)
from chaos.checker.figures import offsets_reused, tally
from chaos.checker.finding import Finding
from chaos.checker.flow import over_flow_rate
from chaos.checker.invariants import (
    delivery_failed,
    early,
    early_received,
    lost,
    stale_claims,
    unexpected_occurrences,
    vanished,
)
from chaos.checker.lateness import late_outside_windows, late_past_windows, lateness
from chaos.checker.model import LATE_OUTSIDE_WINDOWS, Changes, Window
from chaos.checker.units import SAME_TIME
from chaos.checker.verbs import (
    cancelled_delivered,
    paused_delivered,
    rescheduled_wrong_time,
    wrong_destination,
)
from chaos.history import Delivery, History, Topic, occurrence

Checker = Callable[[History, Topic], Finding]

# What fails a run when its finding names any unit.
INVARIANTS: tuple[Checker, ...] = (
    lost,
    cancelled_delivered,
    paused_delivered,
    rescheduled_wrong_time,
    wrong_destination,
    early,
    early_received,
    duplicates,
    vanished,
    stale_claims,
    unexpected_occurrences,
    late_outside_windows,
    delivery_failed,
    over_flow_rate,
)
# What the result reports beside them, failing no run.
FIGURES: tuple[Checker, ...] = (tally, offsets_reused, lateness)

__all__ = [
    "ACROSS_STORE_CRASH",
    "DEFERRED_PUBLISH",
    "FIGURES",
    "INVARIANTS",
    "KINDS",
    "LATE_OUTSIDE_WINDOWS",
    "MUST_HOLD",
    "OWNER_CHANGE",
    "PRODUCER_RETRY",
    "RETRIED_PUBLISH",
    "SAME_CLAIM",
    "SAME_TIME",
    "Changes",
    "Delivery",
    "Finding",
    "Topic",
    "Window",
    "check",
    "late_past_windows",
    "occurrence",
    "passed",
]


def check(
    history: History,
    topic: Topic,
    invariants: Sequence[Checker] = INVARIANTS,
    *,
    figures: Sequence[Checker] = FIGURES,
) -> dict[str, Any]:
    """Every finding of ``invariants`` and ``figures`` over one settled
    history and what the topic got, merged into one result: each
    invariant's count and first ids, and the figures' keys."""
    result: dict[str, Any] = {}
    for judge in (*figures, *invariants):
        result.update(judge(history, topic).result())
    return result


# The counts that must be 0 whatever the faults (``passed``).
MUST_HOLD = (
    "lost",
    "early",
    "cancelled_delivered",
    "paused_delivered",
    "rescheduled_wrong_time",
    "duplicates_same_claim",
    "stale_claims",
    "vanished",
    "unexpected_occurrences",
    "early_received",
    "garbage_failures",
    "stranded",
    "late_outside_windows",
    "late_past_windows",
    "wrong_destination",
    "delivery_failed",
    "bad_signatures",
    "over_flow_rate",
)


def passed(result: Mapping[str, Any]) -> bool:
    """The invariants that must hold whatever the faults (and, where a run
    judged them, its floods of garbage gossip: ``garbage_failures``; where
    it read the store at the end, the schedules still IN_FLIGHT then:
    ``stranded``, held by no round and owed a delivery or a mark for good;
    where it named the faults' intended windows, ``late_outside_windows``
    (and, in the simulation, ``late_past_windows``);
    where its receiver checked the signatures, ``bad_signatures``).
    An invariant the check did not run has nothing to say."""
    return all(result.get(key, 0) == 0 for key in MUST_HOLD)
