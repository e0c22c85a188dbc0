"""What a claimed schedule becomes (node/delivery/outcomes.py), in virtual
time: no store, no broker, no clock."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from node.delivery.outcomes import RECOVERED_EXPIRY, Rules
from node.schedule.model import Status
from node.schedule.recurrence import Misfire, Recurrence
from node.schedule.retry import RetryPolicy
from node.store.contract import Claimed, Outcome

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
POLICY = RetryPolicy(
    max_attempts=3, backoff=timedelta(seconds=10), backoff_max=timedelta(seconds=60)
)
RULES = Rules(POLICY, misfire_threshold=timedelta(seconds=60), rng=random.Random(7))


def one_shot(attempts: int = 0, **extra: Any) -> Claimed:
    doc = {"_id": "s", "bucket": 1, "executeAt": NOW, "attempts": attempts, **extra}
    return Claimed(doc, token=4)


def recurring(
    execute_at: datetime, attempts: int = 0, misfire: Misfire = Misfire.FIRE_ONCE, **extra: Any
) -> Claimed:
    rec = Recurrence(every=timedelta(minutes=1), start=NOW - timedelta(hours=1), misfire=misfire)
    doc = {
        "_id": "r",
        "bucket": 1,
        "executeAt": execute_at,
        "attempts": attempts,
        "recurrence": rec.to_document(),
        "lateStreak": 0,
        **extra,
    }
    return Claimed(doc, token=4)


def test_a_published_one_shot_is_delivered() -> None:
    done = RULES.delivered(one_shot(), NOW)
    assert (done.outcome, done.status, done.at) == (Outcome.DELIVERED, Status.DELIVERED, NOW)
    assert done.due_at is None and done.occurrence is None and done.error is None


def test_a_failed_publish_with_attempts_left_is_retried_after_a_jittered_backoff() -> None:
    first = RULES.failed(one_shot(attempts=0), "broker said no", NOW)
    assert (first.outcome, first.status, first.error) == (
        Outcome.RETRYING,
        Status.PENDING,
        "broker said no",
    )
    assert first.due_at is not None
    # Between half and all of the first step (10 s).
    assert timedelta(seconds=5) <= first.due_at - NOW <= timedelta(seconds=10)
    second = RULES.failed(one_shot(attempts=1), "again", NOW)
    assert second.due_at is not None
    assert timedelta(seconds=10) <= second.due_at - NOW <= timedelta(seconds=20)


def test_the_last_attempt_fails_the_one_shot_for_good() -> None:
    claimed = one_shot(attempts=2)  # this is attempt 3 of 3
    assert RULES.exhausted(claimed)
    done = RULES.failed(claimed, "no", NOW)
    assert (done.outcome, done.status, done.due_at) == (
        Outcome.FAILED,
        Status.DELIVERY_FAILED,
        None,
    )


def test_a_schedule_s_own_policy_wins_over_the_node_s() -> None:
    own = RetryPolicy(max_attempts=1, backoff=timedelta(seconds=1), backoff_max=timedelta(1))
    claimed = one_shot(retry=own.to_document())
    assert RULES.exhausted(claimed)
    assert RULES.failed(claimed, "no", NOW).status == Status.DELIVERY_FAILED
    assert not RULES.exhausted(one_shot())


def test_a_delivered_occurrence_moves_the_chain_to_the_next() -> None:
    done = RULES.delivered(recurring(NOW), NOW + timedelta(seconds=1))
    assert (done.outcome, done.status) == (Outcome.DELIVERED, Status.PENDING)
    assert done.occurrence is not None
    assert done.occurrence.execute_at == NOW
    assert done.occurrence.next_at == NOW + timedelta(minutes=1)
    assert done.occurrence.skipped == 0


def test_a_failed_retry_of_an_occurrence_keeps_the_occurrence() -> None:
    done = RULES.failed(recurring(NOW), "no", NOW)
    assert (done.outcome, done.status, done.occurrence) == (Outcome.RETRYING, Status.PENDING, None)


def test_an_exhausted_occurrence_is_recorded_failed_and_the_chain_goes_on() -> None:
    done = RULES.failed(recurring(NOW, attempts=2), "no", NOW)
    assert (done.outcome, done.status) == (Outcome.FAILED, Status.PENDING)
    assert done.occurrence is not None and done.occurrence.next_at == NOW + timedelta(minutes=1)


def test_the_chain_s_last_occurrence_ends_it_with_its_outcome_as_status() -> None:
    end = {"end": NOW + timedelta(seconds=30)}
    last = recurring(NOW, attempts=2)
    last.doc["recurrence"] = {**last.doc["recurrence"], **end}
    failed = RULES.failed(last, "no", NOW)
    assert (failed.status, failed.occurrence and failed.occurrence.next_at) == (
        Status.DELIVERY_FAILED,
        None,
    )
    delivered = RULES.delivered(Claimed({**last.doc, "attempts": 0}, 4), NOW)
    assert delivered.status == Status.DELIVERED


def test_only_a_missed_occurrence_under_skip_is_skipped() -> None:
    late = NOW + timedelta(minutes=5)  # 5 minutes late: past the 60 s threshold
    assert RULES.should_skip(recurring(NOW, misfire=Misfire.SKIP), late)
    assert not RULES.should_skip(recurring(NOW, misfire=Misfire.SKIP), NOW + timedelta(seconds=5))
    assert not RULES.should_skip(recurring(NOW, misfire=Misfire.FIRE_ONCE), late)
    assert not RULES.should_skip(one_shot(), late)
    skipped = RULES.skipped(recurring(NOW, misfire=Misfire.SKIP), late)
    assert (skipped.outcome, skipped.status) == (Outcome.SKIPPED, Status.PENDING)
    # On to the first occurrence not yet missed (12:04, within the threshold
    # of 12:05); the three between were jumped over.
    assert skipped.occurrence is not None
    assert skipped.occurrence.next_at == NOW + timedelta(minutes=4)
    assert skipped.occurrence.skipped == 3


# -- expiry and triggered occurrences ------------------------------------------------


def test_a_one_shot_expires_only_past_its_deadline_and_a_recurring_one_never() -> None:
    deadline = NOW + timedelta(seconds=30)
    assert not RULES.should_expire(one_shot(deadline=deadline), deadline)
    assert RULES.should_expire(one_shot(deadline=deadline), deadline + timedelta(milliseconds=1))
    assert not RULES.should_expire(one_shot(), NOW + timedelta(days=9))
    assert not RULES.should_expire(recurring(NOW, deadline=deadline), NOW + timedelta(days=1))
    ended = RULES.expired(one_shot(deadline=deadline), NOW + timedelta(minutes=1))
    assert (ended.outcome, ended.status, ended.error) == (Outcome.EXPIRED, Status.EXPIRED, None)


def test_an_expired_one_shot_that_was_recovered_says_it_may_have_been_published() -> None:
    """Its owner stopped between publishing it and marking it; the next
    owner recovered it past the deadline. EXPIRED must not claim it never
    went out: its lastError says an earlier attempt may have."""
    deadline = NOW + timedelta(seconds=30)
    recovered = one_shot(attempts=1, deadline=deadline, recovered=True)
    ended = RULES.expired(recovered, NOW + timedelta(minutes=1))
    assert ended.status == Status.EXPIRED
    assert ended.error == RECOVERED_EXPIRY and "may have been published" in ended.error


def test_a_triggered_occurrence_is_never_skipped_and_leaves_its_chain_where_it_was() -> None:
    waiting_for = NOW - timedelta(hours=1)  # a chain far behind, under the skip policy
    triggered = recurring(waiting_for, misfire=Misfire.SKIP, triggeredAt=NOW)
    assert triggered.triggered and triggered.execute_at == NOW
    assert not RULES.should_skip(triggered, NOW)
    assert RULES.should_skip(recurring(waiting_for, misfire=Misfire.SKIP), NOW)
    done = RULES.delivered(triggered, NOW)
    assert (done.status, done.due_at, done.extra, done.occurrence) == (
        Status.PENDING,
        waiting_for,
        True,
        None,
    )
    failed = RULES.failed(recurring(waiting_for, attempts=2, triggeredAt=NOW), "no", NOW)
    assert (failed.outcome, failed.status, failed.due_at, failed.extra) == (
        Outcome.FAILED,
        Status.PENDING,
        waiting_for,
        True,
    )
    retried = RULES.failed(recurring(waiting_for, attempts=0, triggeredAt=NOW), "no", NOW)
    assert (retried.outcome, retried.extra) == (Outcome.RETRYING, False)
