"""What the verbs make of a stored schedule (node/schedule/changes.py), in
virtual time: no store, no clock."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from node.errors import InvalidState, ScheduleInFlight, ValidationFailed
from node.schedule import changes
from node.schedule.model import Limits
from node.schedule.parse import parse_patch
from node.schedule.recurrence import Recurrence
from node.store import statements
from node.store.contract import Claimed

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
LIMITS = Limits(max_payload_bytes=1024, horizon=timedelta(days=366))


def doc(status: str = "PENDING", **extra: Any) -> dict[str, Any]:
    return {"_id": "s", "bucket": 1, "status": status, "executeAt": NOW, "dueAt": NOW,
            "attempts": 2, "version": 3, **extra}  # fmt: skip


def chain(**extra: Any) -> dict[str, Any]:
    every = Recurrence(every=timedelta(hours=1), start=NOW)
    return doc(recurrence=every.to_document(), occurrences=4, **extra)


def verbs() -> list[Callable[[dict[str, Any]], Any]]:
    """PATCH (of the key), pause, resume and trigger, each on a document."""
    patch = parse_patch({"key": "k"}, LIMITS, NOW)
    return [
        lambda d: changes.patch(d, patch, NOW),
        lambda d: changes.pause(d, NOW),
        lambda d: changes.resume(d, NOW),
        lambda d: changes.trigger(d, NOW),
    ]


def test_every_verb_refuses_a_schedule_in_flight_as_retriable() -> None:
    for verb in verbs():
        with pytest.raises(ScheduleInFlight) as refused:
            verb(doc("IN_FLIGHT"))
        assert refused.value.retry_after == 1


@pytest.mark.parametrize("status", ["DELIVERED", "CANCELLED", "EXPIRED", "DELIVERY_FAILED"])
def test_an_ended_schedule_cannot_be_changed_paused_resumed_or_triggered(status: str) -> None:
    for verb in verbs():
        with pytest.raises(InvalidState):
            verb(doc(status))


def test_a_new_execute_at_resets_attempts_moves_the_deadline_and_wakes_only_if_pending() -> None:
    later = NOW + timedelta(hours=2)
    patch = parse_patch({"executeAt": "2030-01-01T14:00:00Z"}, LIMITS, NOW)
    change = changes.patch(doc(expireAfterMs=60_000), patch, NOW)
    assert change.set == {
        "executeAt": later, "dueAt": later, "attempts": 0,
        "expireAfterMs": 60_000, "deadline": later + timedelta(minutes=1),
    }  # fmt: skip
    assert change.due_at == later
    assert changes.patch(doc("PAUSED"), patch, NOW).due_at is None  # paused: never due


def test_clearing_and_setting_fields_and_turning_a_chain_into_a_one_shot() -> None:
    patch = parse_patch(
        {"executeAt": "2030-01-01T13:00:00Z", "key": None, "labels": {}, "retry": None},
        LIMITS,
        NOW,
    )
    change = changes.patch(chain(key="k", labels=["a=1"], retry={"maxAttempts": 2}), patch, NOW)
    assert change.unset == {"recurrence", "triggeredAt", "key", "labels", "retry"}
    labelled = changes.patch(doc(), parse_patch({"labels": {"b": "2", "a": "1"}}, LIMITS, NOW), NOW)
    assert labelled.set == {"labels": ["a=1", "b=2"]}


def test_a_new_recurrence_drops_a_pending_trigger() -> None:
    """Triggered, then given a new recurrence before the trigger ran: the
    chain is due at its new first occurrence, published once as itself
    (with triggeredAt kept, the claim would publish it as the extra
    occurrence, then due at the same time again, publish it twice)."""
    triggered = chain(triggeredAt=NOW, dueAt=NOW)
    patch = parse_patch({"recurrence": {"every": "PT30M"}}, LIMITS, NOW)
    change = changes.patch(triggered, patch, NOW)
    assert "triggeredAt" in change.unset
    after = {**triggered, **change.set}
    for name in change.unset:
        after.pop(name, None)
    assert Claimed(after, token=1).triggered is False
    assert after["dueAt"] == after["executeAt"] == NOW + timedelta(minutes=30)


def test_expire_after_belongs_to_one_shots() -> None:
    with pytest.raises(ValidationFailed) as refused:
        changes.patch(chain(), parse_patch({"expireAfter": "PT5M"}, LIMITS, NOW), NOW)
    assert refused.value.field == "expireAfter"
    with pytest.raises(ValidationFailed):  # a one-shot with a deadline cannot start recurring
        changes.patch(
            doc(expireAfterMs=1000),
            parse_patch({"recurrence": {"every": "PT1H"}}, LIMITS, NOW),
            NOW,
        )
    cleared = changes.patch(
        doc(expireAfterMs=1000, deadline=NOW),
        parse_patch({"recurrence": {"every": "PT1H"}, "expireAfter": None}, LIMITS, NOW),
        NOW,
    )
    assert {"expireAfterMs", "deadline"} <= cleared.unset


def test_pause_and_resume_are_idempotent_and_resume_past_the_deadline_expires() -> None:
    assert changes.pause(doc("PAUSED"), NOW) is None
    assert changes.resume(doc("PENDING"), NOW) is None
    resumed = changes.resume(doc("PAUSED", dueAt=NOW - timedelta(hours=1)), NOW)
    assert resumed is not None
    assert (resumed.set, resumed.due_at) == ({"status": "PENDING"}, NOW - timedelta(hours=1))
    late = changes.resume(doc("PAUSED", deadline=NOW - timedelta(seconds=1)), NOW)
    assert late is not None and late.set == {"status": "EXPIRED", "expiredAt": NOW}
    assert late.due_at is None


def test_trigger_moves_a_one_shot_and_gives_a_chain_an_extra_occurrence() -> None:
    one_shot = changes.trigger(doc(executeAt=NOW + timedelta(days=1), expireAfterMs=5000), NOW)
    deadline = NOW + timedelta(seconds=5)
    assert one_shot.set == {"executeAt": NOW, "dueAt": NOW, "attempts": 0,
                            "expireAfterMs": 5000, "deadline": deadline}  # fmt: skip
    extra = changes.trigger(chain(executeAt=NOW + timedelta(hours=1)), NOW)
    assert extra.set == {"triggeredAt": NOW, "dueAt": NOW, "attempts": 0}
    assert "executeAt" not in extra.set  # the chain's next occurrence stays
    with pytest.raises(InvalidState):
        changes.trigger(doc("PAUSED"), NOW)


def test_redrive_takes_only_a_failed_schedule_and_keeps_it_from_retention() -> None:
    redriven = changes.redrive(doc("DELIVERY_FAILED", expireAt=NOW), NOW)
    assert redriven.set == {"status": "PENDING", "dueAt": NOW, "attempts": 0}
    assert redriven.unset == {"expireAt"} and redriven.due_at == NOW
    for status in ("PENDING", "PAUSED", "DELIVERED", "CANCELLED", "EXPIRED"):
        with pytest.raises(InvalidState):
            changes.redrive(doc(status), NOW)


def test_a_bulk_verb_writes_what_it_takes_under_the_version_read_and_skips_the_rest() -> None:
    """``statements.bulk_changes``: one conditional write per match the verb
    takes, none for a match that moved since the read (in flight, ended),
    and the earliest due time of each bucket it makes PENDING."""
    later = NOW + timedelta(minutes=1)
    found = [
        doc("PAUSED", _id="a", bucket=1, dueAt=later),
        doc("PAUSED", _id="b", bucket=1),
        doc("IN_FLIGHT", _id="c", bucket=2),  # claimed after the read
        doc("PENDING", _id="d", bucket=3),  # resumed already: nothing to write
        doc("PAUSED", _id="e", bucket=4, deadline=NOW - timedelta(seconds=1), expireAfterMs=1),
    ]
    resume = changes.BULK_VERBS["resume"]
    due: dict[int, datetime] = {}
    writes = statements.bulk_changes(found, resume, NOW, 8, timedelta(days=7), due)
    conditions = [condition for condition, _ in writes]
    assert [(c["_id"], c["status"], c["version"]) for c in conditions] == [
        ("a", "PAUSED", 3), ("b", "PAUSED", 3), ("e", "PAUSED", 3)
    ]  # fmt: skip
    assert [update["$set"]["status"] for _, update in writes] == ["PENDING", "PENDING", "EXPIRED"]
    assert all(update["$inc"] == {"version": 1} for _, update in writes)
    assert due == {1: NOW}  # the expired one is due nowhere
    assert statements.bulk_left(resume, stopped=False) == []
    assert statements.bulk_left(changes.BULK_VERBS["pause"], stopped=False) == ["IN_FLIGHT"]
    assert statements.bulk_left(resume, stopped=True) == ["PAUSED"]
