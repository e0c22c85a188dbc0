"""What a settled history says the cluster owes, as the invariants read it:
the ledgers a run used to keep in dicts, each a query over the ops. Pure.

* ``accepted``: unit -> the executeAt it is owed at (a one-shot schedule's
  create that took, moved by every PATCH that took; each occurrence of a
  recurring schedule whose create took);
* ``cancelled``: the DELETEs that took (a 200, or settled so);
* ``changes``: what the verbs did besides DELETEs (``Changes``);
* ``destinations``: where each schedule is to be delivered, the topic or
  the receiver, and where a PATCH switched it (``Destinations``);
* the fault windows, from the nemesis's events and the observer's stalls.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from chaos import history as ops
from chaos.faults.kinds import (
    BROKER_FAULTS,
    CLUSTER_FAULTS,
    NOT_FAULTS,
    RECEIVER_FAULTS,
    RECOVERY_ALLOWANCE,
    receiver_recovery,
)
from chaos.history import HTTP, KAFKA, Call, History, occurrence

# Lateness past this, of a unit due outside every fault's intended window,
# fails a run: outside the faults, deliveries run well under a second late
# (docs/chaos.md), and inside one a hand-over takes detection plus a lease.
LATE_OUTSIDE_WINDOWS = 10.0
# How the load's verbs are named in the count of their answers.
VERB_NAMES = {
    ops.PATCH: "PATCH",
    ops.PAUSE: "pause",
    ops.RESUME: "resume",
    ops.BULK_CANCEL: "bulk cancel",
    ops.BULK_PAUSE: "bulk pause",
}


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
    DELETEs. Times are epoch seconds of the runner's clock, each when the
    call answered (or, for a call settled after the run, when the load gave
    up on the answer).

    ``bulk_cancelled``: unit -> when the bulk cancel that took it answered;
    ``paused``: unit -> its pauses, each (when the pause answered 200, when
    its resume was sent, or None: never resumed), a bulk pause's that took
    it too (answered when the group's last call did: never resumed);
    ``bulk_paused``: unit -> when the bulk pause that took it answered;
    ``resumed``: unit -> when its resume answered (lateness counts from there);
    ``moved``: unit -> every executeAt it had, in order, each with when the
    ops.PATCH that set it answered (None for the first, as created); the last is
    the one in force;
    ``unsure``: moved units whose last ops.PATCH has no known outcome: their last
    two times are both acceptable."""

    bulk_cancelled: Mapping[str, float] = field(default_factory=dict)
    paused: Mapping[str, Sequence[tuple[float, float | None]]] = field(default_factory=dict)
    resumed: Mapping[str, float] = field(default_factory=dict)
    moved: Mapping[str, Sequence[tuple[float, float | None]]] = field(default_factory=dict)
    unsure: frozenset[str] = frozenset()
    bulk_paused: Mapping[str, float] = field(default_factory=dict)

    def still_paused(self) -> set[str]:
        return {u for u, spans in self.paused.items() if any(end is None for _, end in spans)}

    def in_force(self, unit: str) -> list[float]:
        """The executeAt values a record of a moved unit may carry."""
        times = [at for at, _ in self.moved[unit]]
        return times[-2:] if unit in self.unsure else times[-1:]


@dataclass(frozen=True)
class Destinations:
    """Where each schedule goes: schedule -> every sink it had (``KAFKA``,
    ``HTTP``), in order, each with when the PATCH that switched it there
    answered (None for the first, as created); the last is the one in
    force. ``unsure``: schedules whose last switch has no known outcome:
    either of their last two sinks may get them."""

    sinks: Mapping[str, Sequence[tuple[str, float | None]]] = field(default_factory=dict)
    unsure: frozenset[str] = frozenset()

    def in_force(self, schedule: str) -> list[str] | None:
        """The sinks a delivery of ``schedule`` may arrive at (None: the
        history does not say where it goes, so either)."""
        had = self.sinks.get(schedule)
        if not had:
            return None
        sinks = [sink for sink, _ in had]
        return sinks[-2:] if schedule in self.unsure else sinks[-1:]


@dataclass(frozen=True)
class Faults:
    """The windows the faults open (epoch seconds).

    ``windows``: each fault's, from a poll interval before it to the
    recovery allowance after it ends (lateness is reported inside each);
    ``intended``: what each fault is meant to cost, outside which no unit
    may be LATE_OUTSIDE_WINDOWS late (its hand-over, or all of it when
    nobody can work; broker stalls most nodes saw);
    ``receiver_intended``: the same, of the receiver's faults, for the
    units delivered by HTTP only (while one lasts no node can deliver
    them, and after it the circuits the failures opened wait up to their
    longest cooldown before they try again);
    ``broker``: the broker's pauses, crashes, cuts and stalls any node saw,
    inside which a producer may resend a batch the broker had stored;
    ``receiver``: the receiver's faults, inside which a request it took
    may come again under the same claim;
    ``store_crashes``: each database kill, from the kill to the restart."""

    windows: tuple[Window, ...] = ()
    intended: tuple[Window, ...] = ()
    broker: tuple[Window, ...] = ()
    store_crashes: tuple[Window, ...] = ()
    receiver: tuple[Window, ...] = ()
    receiver_intended: tuple[Window, ...] = ()

    def destination(self, sink: str) -> tuple[Window, ...]:
        """The faults of the sink a copy arrived at: the broker's or the receiver's."""
        return self.receiver if sink == HTTP else self.broker

    def intended_for(self, sink: str) -> tuple[Window, ...]:
        """The intended windows that excuse a unit delivered at ``sink``."""
        return self.intended + self.receiver_intended if sink == HTTP else self.intended


@dataclass(frozen=True)
class Facts:
    accepted: Mapping[str, float]
    cancelled: frozenset[str]
    changes: Changes
    faults: Faults
    buckets: int
    destinations: Destinations = Destinations()


# Each history's facts, with the length of the history they were worked
# out from: ops appended since (the observer's, after the run) mean anew.
_FACTS: weakref.WeakKeyDictionary[History, tuple[int, Facts]] = weakref.WeakKeyDictionary()


def facts(history: History) -> Facts:
    """The history's facts, worked out once for as long as it does not grow."""
    known = _FACTS.get(history)
    if known is None or known[0] != len(history):
        known = _FACTS[history] = (
            len(history),
            Facts(
                accepted=accepted(history),
                cancelled=frozenset(history.took(ops.CANCEL)),
                changes=changes(history),
                faults=faults(history),
                buckets=int(history.meta.get("buckets", 256)),
                destinations=destinations(history),
            ),
        )
    return known[1]


def accepted(history: History) -> dict[str, float]:
    owed: dict[str, float] = {}
    for call in history.calls(ops.CREATE, ops.PATCH):
        if call.type != ops.OK:
            continue
        recurrence = call.get("recurrence")
        if recurrence is not None:
            owed.update(occurrences(call.schedule, recurrence))
        elif call.get("executeAt") is not None:  # (not a switch of destination only)
            owed[call.schedule] = float(call["executeAt"])
    return owed


def occurrences(schedule_id: str, recurrence: Mapping[str, Any]) -> dict[str, float]:
    """Each occurrence of a recurring schedule, ``start`` to ``end`` (iso
    times to the millisecond) every ``every`` seconds."""
    when = datetime.fromisoformat(recurrence["start"])
    end = datetime.fromisoformat(recurrence["end"])
    step = timedelta(seconds=float(recurrence["every"]))
    units = {}
    while when <= end:
        text = when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        units[occurrence(schedule_id, text)] = when.timestamp()
        when += step
    return units


def changes(history: History) -> Changes:
    moved: dict[str, list[tuple[float, float | None]]] = {}
    unsure: set[str] = set()
    created: dict[str, float] = {}
    for call in history.calls(ops.CREATE, ops.PATCH):
        if call.f == ops.CREATE:
            if call.type == ops.OK and call.get("executeAt") is not None:
                created[call.schedule] = float(call["executeAt"])
            continue
        if call.get("executeAt") is None:
            continue  # a switch of destination only (``destinations``)
        if call.type == ops.OK or call.type == ops.INFO:
            times = moved.setdefault(call.schedule, [(created[call.schedule], None)])
            times.append((float(call["executeAt"]), call.ended))
        if call.type == ops.INFO:  # no outcome known: either time may go out
            unsure.add(call.schedule)
    taken = {
        unit: call.ended for call in history.calls(ops.BULK_CANCEL) for unit in call.get("took", ())
    }
    paused, resumed = _pauses(history)
    bulk_paused = {
        unit: call.ended for call in history.calls(ops.BULK_PAUSE) for unit in call.get("took", ())
    }
    for unit, answered in bulk_paused.items():
        # Never resumed; a unit it took may have been paused and resumed on
        # its own before (settle: one still paused on its own it never took).
        paused.setdefault(unit, []).append((answered, None))
    return Changes(taken, paused, resumed, moved, frozenset(unsure), bulk_paused)


def destinations(history: History) -> Destinations:
    """Each schedule's sinks: the one its create named (``sink``, the topic
    when it says none), then each a PATCH switched it to, as ``changes``
    moves its time."""
    sinks: dict[str, list[tuple[str, float | None]]] = {}
    unsure: set[str] = set()
    for call in history.calls(ops.CREATE, ops.PATCH):
        if call.f == ops.CREATE:
            if call.type == ops.OK:
                sinks[call.schedule] = [(str(call.get("sink", KAFKA)), None)]
            continue
        if call.get("sink") is None or call.schedule not in sinks:
            continue
        if call.type in (ops.OK, ops.INFO):
            sinks[call.schedule].append((str(call["sink"]), call.ended))
        if call.type == ops.INFO:
            unsure.add(call.schedule)
        elif call.type == ops.OK:  # a later switch that took decides where it goes
            unsure.discard(call.schedule)
    return Destinations(sinks, frozenset(unsure))


def _pauses(
    history: History,
) -> tuple[dict[str, list[tuple[float, float | None]]], dict[str, float]]:
    resumes = {call.schedule: call for call in history.calls(ops.RESUME)}
    paused: dict[str, list[tuple[float, float | None]]] = {}
    resumed: dict[str, float] = {}
    for call in history.calls(ops.PAUSE):
        if call.type != ops.OK:
            continue
        resume = resumes.get(call.schedule)
        end = None if resume is None or _still_paused(resume) else resume.invoke.at
        paused[call.schedule] = [(call.ended, end)]
        if resume is not None and resume.type == ops.OK:
            resumed[call.schedule] = resume.ended
    return paused, resumed


def _still_paused(resume: Call) -> bool:
    return resume.type != ops.OK and resume.done_value.get("settled") == "PAUSED"


def expected(history: History) -> set[str]:
    """The units the topic must get (for the run's wait, before the last
    settling): accepted, and neither cancelled, bulk-cancelled, still paused
    nor under a cancel or a pause whose outcome is unknown."""
    known = facts(history)
    doubt = {c.schedule for c in history.calls(ops.CANCEL, ops.PAUSE) if c.type == ops.INFO}
    return (
        set(known.accepted)
        - known.cancelled
        - set(known.changes.bulk_cancelled)
        - known.changes.still_paused()
        - doubt
    )


# -- the fault windows ------------------------------------------------------------


def events(history: History) -> list[dict[str, Any]]:
    """The nemesis's events as the report shows them, each with what later
    notes added, in time order; each fault's with the index of its window."""
    by_op: dict[int, dict[str, Any]] = {}
    for op in history.events(ops.NEMESIS):
        if op.f == ops.NOTE:
            by_op[int(op.value["of"])].update({k: v for k, v in op.value.items() if k != "of"})
        else:
            by_op[op.index] = dict(op.value)
    ordered = sorted(by_op.values(), key=lambda e: float(e["at"]))
    for index, event in enumerate(e for e in ordered if _is_fault(e)):
        event["window"] = index
    return ordered


def _is_fault(event: Mapping[str, Any]) -> bool:
    return "skipped" not in event and event["do"] not in NOT_FAULTS


def faults(history: History) -> Faults:
    started = history.started
    windows: list[Window] = []
    intended: list[Window] = []
    broker: list[Window] = []
    crashes: list[Window] = []
    receiver: list[Window] = []
    receiver_intended: list[Window] = []
    for event in filter(_is_fault, events(history)):
        at, lasting, label = started + event["at"], event["lasting"], event["step"]
        # From a poll interval before (work already due when it hit) to the
        # recovery allowance after the fault ends.
        window = Window(label, at - 1.0, at + lasting + RECOVERY_ALLOWANCE)
        windows.append(window)
        if event["do"] in RECEIVER_FAULTS:
            receiver.append(window)
            # Nobody can deliver by HTTP while it lasts; a 503's last
            # answer asked for Retry-After more; then the circuits' cooldown
            # and the backlog's drain.
            waited = lasting + float(event.get("retry_after", 0)) + receiver_recovery(lasting)
            receiver_intended.append(Window(label, at - LATE_OUTSIDE_WINDOWS, at + waited))
            continue
        # What the fault is meant to cost: while it lasts when nobody can do
        # the work (the servers down for all), else the time the others take
        # to take the work over. It opens LATE_OUTSIDE_WINDOWS before the
        # fault: a unit due less than that before may still be in flight
        # when it hits (a round of the embedded store can take seconds)
        # without being that late yet, and then the fault is what makes it so.
        # (A fault of one node whose work no other can take while it lasts
        # says so, ``unshared``: the simulation's, ``chaos/sim/run.py``.)
        cost = lasting if event["do"] in CLUSTER_FAULTS or event.get("unshared") else 0.0
        intended.append(Window(label, at - LATE_OUTSIDE_WINDOWS, at + cost + RECOVERY_ALLOWANCE))
        if event["do"] in BROKER_FAULTS:
            broker.append(window)
        if event["do"] == "crash-store":
            crashes.append(Window(label, at, at + lasting))
    # The observer notes each spell twice over: those any node saw, which
    # explain a resend, and those most nodes saw, which nobody could work
    # through (``chaos.observe.note_stalls``).
    for op in history.events(ops.OBSERVER, ops.BROKER_STALL):
        stall = Window(op.value["label"], op.value["start"], op.value["end"])
        (intended if op.value["most"] else broker).append(stall)
    return Faults(
        tuple(windows),
        tuple(intended),
        tuple(broker),
        tuple(crashes),
        tuple(receiver),
        tuple(receiver_intended),
    )


# -- what the run's summary counts ---------------------------------------------------


def verb_answers(history: History) -> dict[str, int]:
    """Each verb's answers, as ``pause 409 in_flight``."""
    counted: Counter[str] = Counter()
    for call in history.calls(*VERB_NAMES):
        status, code = call.get("status"), call.get("code")
        counted[f"{VERB_NAMES[call.f]} {status or 'no answer'}{f' {code}' if code else ''}"] += 1
        if call.get("neither"):
            counted["PATCH settled at neither time"] += 1
    return dict(sorted(counted.items()))


def refusals(history: History) -> Counter[str]:
    """Why each create that never took was refused (its last answer)."""
    return Counter(str(c.get("error")) for c in history.calls(ops.CREATE) if c.type != ops.OK)


def bulk_calls(history: History) -> list[dict[str, Any]]:
    """Each bulk verb's calls: the verb, its group, when it began, what its
    answers said, and how many it changed (a cancel's: cancelled)."""
    calls: dict[str, dict[str, Any]] = {}
    for call in history.calls(ops.BULK_CANCEL, ops.BULK_PAUSE):
        entry = calls.setdefault(
            call["group"],
            {
                "verb": call.f,
                "group": call["group"],
                "at": round(call.invoke.at - history.started, 2),
                "changed": 0,
                "answers": [],
            },
        )
        entry["answers"].append(call.get("status"))
        if call.type == ops.OK:
            entry["changed"] += int(call.get("changed", call.get("cancelled")) or 0)
    return list(calls.values())


def unsettled(history: History) -> int:
    """Calls whose outcome no node could settle after the run."""
    # An unknown PATCH counts among the unsure (either time may go out).
    unknown = sum(1 for call in history.calls(ops.CANCEL, ops.PAUSE, ops.RESUME) if call.unknown)
    return unknown + len(facts(history).changes.unsure)


def chains(history: History) -> list[str]:
    return [
        c.schedule for c in history.calls(ops.CREATE) if c.type == ops.OK and c.get("recurrence")
    ]
