"""What the API's verbs make of a stored schedule: PATCH, pause, resume,
trigger and retry (redrive), in one place.

Pure: each takes the document as read and ``now``, and returns the
``Change`` to write, or None when there is nothing to write, or raises
(``ScheduleInFlight``, ``InvalidState``, ``ValidationFailed``). The store
writes a change only where the schedule is still at the status and version
it was read at (``ScheduleStore.change``), so a verb and a claim never both
apply: the claim moves the schedule to IN_FLIGHT and a new version, and the
verb's write then matches nothing and is judged again on what is stored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from node.errors import InvalidState, ScheduleInFlight, ValidationFailed
from node.schedule.model import CHANGEABLE, DEFAULT_PRIORITY, Status, label_pairs, public_id
from node.schedule.parse import Patch, headers_on_http
from node.schedule.payload import payload_fields
from node.schedule.times import aware
from node.schedule.trace import TRACEPARENT_FIELD, RequestTrace

_MS = timedelta(milliseconds=1)


@dataclass(frozen=True)
class Change:
    """Fields to set and to remove in one write; ``due_at``: when the
    schedule is due after it, if it is PENDING then (the owner is woken)."""

    set: dict[str, Any]
    unset: frozenset[str] = field(default_factory=frozenset)
    due_at: datetime | None = None

    @property
    def status(self) -> Status | None:
        value = self.set.get("status")
        return None if value is None else Status(value)


def traced(change: Change | None, trace: RequestTrace) -> Change | None:
    """``change`` stamped with the request id (and traceparent) of the call
    that made it: the schedule's deliveries then carry the latest call's."""
    if change is None:
        return None
    unset = change.unset if trace.traceparent else change.unset | {TRACEPARENT_FIELD}
    return replace(change, set={**change.set, **trace.fields()}, unset=unset)


def version_of(doc: dict[str, Any]) -> int:
    """A document's version; 0 for one written before versions existed."""
    return int(doc.get("version") or 0)


def expiry_fields(execute_at: datetime, expire_after: timedelta) -> dict[str, Any]:
    """A one-shot's expiry: the duration the caller gave, and the deadline it
    makes from the time the schedule is due."""
    return {"expireAfterMs": expire_after // _MS, "deadline": execute_at + expire_after}


def is_expired(doc: dict[str, Any], now: datetime) -> bool:
    """A one-shot past its deadline: it must not be published any more."""
    deadline = doc.get("deadline")
    return not doc.get("recurrence") and deadline is not None and now > aware(deadline)


def patch(doc: dict[str, Any], request: Patch, now: datetime) -> Change:
    """PATCH: change what the request names of a PENDING or PAUSED schedule.

    A new ``executeAt`` makes it a one-shot due then (a recurring one stops
    recurring); a new ``recurrence`` makes it recurring from its first
    occurrence after ``now``. Either starts its attempts afresh and moves
    its deadline with it."""
    _require(doc, CHANGEABLE, "changed")
    sets: dict[str, Any] = {}
    unsets: set[str] = set()
    execute_at, recurring = _patch_time(doc, request, now, sets, unsets)
    _patch_expiry(doc, request, execute_at, recurring, sets, unsets)
    _patch_content(request, sets, unsets)
    _patch_destination(doc, request, sets, unsets)
    pending = doc["status"] == Status.PENDING.value
    due_at = sets.get("dueAt") if pending else None
    return Change(sets, frozenset(unsets), due_at)


def _patch_time(
    doc: dict[str, Any], request: Patch, now: datetime, sets: dict[str, Any], unsets: set[str]
) -> tuple[datetime | None, bool]:
    """Add what a new ``executeAt`` or ``recurrence`` changes. Returns when
    the schedule is due after the change (None: no new time) and whether it
    is recurring then."""
    recurring = bool(doc.get("recurrence"))
    execute_at: datetime | None = None
    if request.execute_at is not None:
        execute_at = request.execute_at
        if recurring:
            unsets.update({"recurrence", "triggeredAt"})
            recurring = False
    if request.recurrence is not None:
        first = request.recurrence.first(now)
        if first is None:
            raise ValidationFailed("recurrence has no occurrence after now", "recurrence")
        execute_at = first
        sets["recurrence"] = request.recurrence.to_document()
        sets["lateStreak"] = 0
        # The new chain starts at its first occurrence: a trigger still
        # pending would publish that occurrence once as the extra one and
        # once more as itself.
        unsets.add("triggeredAt")
        if not recurring:
            sets.update(occurrences=0, skippedOccurrences=0, recent=[])
            recurring = True
    if execute_at is not None:
        sets.update(executeAt=execute_at, dueAt=execute_at, attempts=0)
    return execute_at, recurring


def _patch_expiry(
    doc: dict[str, Any],
    request: Patch,
    execute_at: datetime | None,
    recurring: bool,
    sets: dict[str, Any],
    unsets: set[str],
) -> None:
    """Add the expiry after the change: the one the request names, else the
    stored one moved with a new time; a one-shot's only."""
    stored_expiry = doc.get("expireAfterMs")
    expire_after = (
        request.expire_after
        if "expireAfter" in request.named
        else (None if stored_expiry is None else int(stored_expiry) * _MS)
    )
    if expire_after is not None:
        if recurring:
            raise ValidationFailed(
                "expireAfter applies to one-shot schedules only: clear it "
                "(expireAfter: null) to make this one recurring",
                "expireAfter",
            )
        sets.update(expiry_fields(execute_at or aware(doc["executeAt"]), expire_after))
    elif stored_expiry is not None:
        unsets.update({"expireAfterMs", "deadline"})


def _patch_content(request: Patch, sets: dict[str, Any], unsets: set[str]) -> None:
    """Add what the request sets or clears of the message and its labels."""
    named = request.named
    if request.payload is not None:
        payload, sets["payloadFormat"] = request.payload
        stored, elsewhere = payload_fields(payload)
        sets.update(stored)
        unsets.update(elsewhere)
    _set_or_clear(sets, unsets, "key", named, request.key)
    if request.headers is not None:
        sets["headers"] = request.headers
    retry = None if request.retry is None else request.retry.to_document()
    _set_or_clear(sets, unsets, "retry", named, retry)
    labels = label_pairs(request.labels) if request.labels else None
    _set_or_clear(sets, unsets, "labels", named, labels)
    if request.priority is not None:
        if request.priority == DEFAULT_PRIORITY:
            unsets.add("priority")
        else:
            sets["priority"] = request.priority
    flow = None if request.flow_control is None else request.flow_control.to_document()
    _set_or_clear(sets, unsets, "flow", named, flow, field="flowControl")


def _patch_destination(
    doc: dict[str, Any], request: Patch, sets: dict[str, Any], unsets: set[str]
) -> None:
    """Add a new destination: a topic or an http target replaces the other.
    Record headers belong to a Kafka record: a schedule going to an http
    target must have none (its own go in ``http.headers``)."""
    if request.topic is not None:
        sets["topic"] = request.topic
        unsets.add("http")
    if request.http is not None:
        sets["http"] = request.http.to_document()
        unsets.add("topic")
    to_http = request.http is not None or (request.topic is None and bool(doc.get("http")))
    headers = sets["headers"] if "headers" in sets else doc.get("headers")
    if to_http and headers:
        raise headers_on_http()


def pause(doc: dict[str, Any], now: datetime) -> Change | None:
    """PENDING -> PAUSED: never due until resumed. Paused already: nothing."""
    if doc["status"] == Status.PAUSED.value:
        return None
    _require(doc, {Status.PENDING}, "paused")
    return Change({"status": Status.PAUSED.value, "pausedAt": now})


def resume(doc: dict[str, Any], now: datetime) -> Change | None:
    """PAUSED -> PENDING, its times as they were: an occurrence missed while
    paused is then handled by its misfire policy, a one-shot past its time
    is due at once, and one past its deadline ends EXPIRED here."""
    if doc["status"] == Status.PENDING.value:
        return None  # resumed already
    _require(doc, {Status.PAUSED}, "resumed")
    if is_expired(doc, now):
        return Change({"status": Status.EXPIRED.value, "expiredAt": now})
    return Change({"status": Status.PENDING.value}, due_at=aware(doc["dueAt"]))


def trigger(doc: dict[str, Any], now: datetime) -> Change:
    """Due now. A one-shot moves to now (attempts and deadline afresh); a
    recurring one gets an extra occurrence now, published with ``now`` as
    its execute-at, after which its chain goes on where it was."""
    if doc["status"] == Status.PAUSED.value:
        raise InvalidState(
            f"schedule {public_id(str(doc['_id']))!r} is PAUSED: resume it first", "status"
        )
    _require(doc, {Status.PENDING}, "triggered")
    if doc.get("recurrence"):
        return Change({"triggeredAt": now, "dueAt": now, "attempts": 0}, due_at=now)
    sets: dict[str, Any] = {"executeAt": now, "dueAt": now, "attempts": 0}
    if doc.get("expireAfterMs") is not None:
        sets.update(expiry_fields(now, int(doc["expireAfterMs"]) * _MS))
    return Change(sets, due_at=now)


def redrive(doc: dict[str, Any], now: datetime) -> Change:
    """DELIVERY_FAILED -> PENDING, due now with fresh attempts (and a fresh
    deadline); no longer to be removed by retention."""
    _require(doc, {Status.DELIVERY_FAILED}, "retried")
    sets: dict[str, Any] = {"status": Status.PENDING.value, "dueAt": now, "attempts": 0}
    if doc.get("expireAfterMs") is not None:
        sets.update(expiry_fields(now, int(doc["expireAfterMs"]) * _MS))
    return Change(sets, frozenset({"expireAt"}), due_at=now)


def cancel(doc: dict[str, Any], now: datetime) -> Change:
    """PENDING or PAUSED -> CANCELLED (a bulk cancel's change; the single
    cancel writes the same with a condition of its own:
    ``statements.cancellable``)."""
    _require(doc, CHANGEABLE, "cancelled")
    return Change({"status": Status.CANCELLED.value, "cancelledAt": now})


@dataclass(frozen=True)
class BulkVerb:
    """A verb applied to every schedule a selector matches
    (``POST /v1/schedules:<name>``)."""

    name: str
    done: str  # what the log says of a schedule it changed
    # The statuses it changes; ``decide`` makes a change of each.
    statuses: tuple[str, ...]
    decide: Callable[[dict[str, Any], datetime], Change | None]
    # A match in one of these keeps the verb from being done (``more``): a
    # schedule in flight may still be delivered, and a recurring one comes
    # back PENDING after it; the caller calls again until none is.
    unsettled: tuple[str, ...] = ()


_IN_FLIGHT = (Status.IN_FLIGHT.value,)
BULK_VERBS = {
    verb.name: verb
    for verb in (
        BulkVerb("cancel", "cancelled", (Status.PAUSED.value, Status.PENDING.value), cancel,
                 _IN_FLIGHT),
        BulkVerb("pause", "paused", (Status.PENDING.value,), pause, _IN_FLIGHT),
        BulkVerb("resume", "resumed", (Status.PAUSED.value,), resume),
        BulkVerb("retry", "redriven", (Status.DELIVERY_FAILED.value,), redrive),
    )
}  # fmt: skip


def _set_or_clear(
    sets: dict[str, Any],
    unsets: set[str],
    name: str,
    named: frozenset[str],
    value: Any,
    *,
    field: str | None = None,
) -> None:
    """Set or clear the stored ``name`` when the request names ``field``
    (the same name unless the API's differs)."""
    if (field or name) not in named:
        return
    if value is None:
        unsets.add(name)
    else:
        sets[name] = value


def _require(doc: dict[str, Any], allowed: set[Status] | frozenset[Status], verb: str) -> None:
    status = doc["status"]
    if Status(status) in allowed:
        return
    schedule_id = public_id(str(doc["_id"]))
    if status == Status.IN_FLIGHT.value:
        raise ScheduleInFlight(
            f"schedule {schedule_id!r} is being delivered; try again in a moment",
            "status",
            retry_after=1,
        )
    wanted = " or ".join(sorted(s.value for s in allowed))
    raise InvalidState(
        f"schedule {schedule_id!r} is {status}; only a {wanted} schedule can be {verb}", "status"
    )
