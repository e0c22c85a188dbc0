"""What each claimed schedule becomes: the delivery rules, in one place.

Rule 1: every decision about what a claimed schedule becomes (delivered,
retried at T, DELIVERY_FAILED, its next occurrence, skipped) lives in this
file. The store writes what these functions return, behind the fence.

Rule 2: no IO and no clock reads; ``now`` is passed in, and so is the
randomness of the backoff (an ``rng``), so every rule is tested in virtual
time.

| what happened                     | one-shot            | recurring                          |
| --------------------------------- | ------------------- | ---------------------------------- |
| published                         | DELIVERED           | next occurrence PENDING (recorded  |
|                                   |                     | delivered); DELIVERED at the end   |
| publish failed, attempts left     | PENDING at now +    | the same occurrence PENDING at     |
|                                   | backoff             | now + backoff                      |
| publish failed, no attempts left  | DELIVERY_FAILED     | next occurrence (recorded failed); |
|                                   |                     | DELIVERY_FAILED at the end         |
| missed, misfire policy ``skip``   | -                   | next occurrence (recorded skipped) |
| no attempts left, and the         | PENDING at now +    | the same occurrence PENDING at     |
| dead-letter publish failed too    | backoff             | now + backoff                      |
| past its deadline (expireAfter)   | EXPIRED, unpublished| -                                  |
|                                   | (says so if an      |                                    |
|                                   | attempt was in      |                                    |
|                                   | flight at a crash)  |                                    |
| an extra occurrence (a trigger)   | -                   | published, retried or failed as    |
| published, or failed for good     |                     | any; then the chain goes on, due   |
|                                   |                     | at its own next occurrence         |

A publish the broker could not take (unreachable, timed out, no leader, not
enough replicas) is not a failure of the schedule and spends no attempt: the
poller puts it back as it was (``node/delivery/poller.py``). Only a
record's own fault (too large, a topic the broker refuses) counts here.

Attempts are counted per occurrence; the policy is the schedule's own
``retry`` or else the node's (``MAX_ATTEMPTS``, ``RETRY_BACKOFF``,
``RETRY_BACKOFF_MAX``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime

from node.delivery.sinks.contract import Failed, Trouble
from node.schedule.changes import is_expired
from node.schedule.model import Status
from node.schedule.recurrence import Recurrence
from node.schedule.retry import RetryPolicy, policy_of
from node.schedule.times import aware
from node.store.contract import Claimed, Completion, Occurrence, Outcome

# The lastError of an EXPIRED schedule one of whose attempts was in flight
# when its owner stopped (README, "Deadlines").
RECOVERED_EXPIRY = (
    "expired after a recovery: an earlier attempt was in flight when its owner stopped, "
    "and may have been published before the deadline"
)


@dataclass(frozen=True)
class Rules:
    retry: RetryPolicy  # the node's policy, for schedules without their own
    # How late an occurrence of a recurring schedule may run before it counts
    # as missed and its misfire policy applies (MISFIRE_THRESHOLD).
    misfire_threshold: timedelta
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def should_skip(self, claimed: Claimed, now: datetime) -> bool:
        """An occurrence too late to publish under the ``skip`` misfire policy
        (an extra one, triggered, was asked for now: never skipped)."""
        return (
            claimed.recurring
            and not claimed.triggered
            and _recurrence(claimed).should_skip(
                aware(claimed.doc["executeAt"]), now, self.misfire_threshold
            )
        )

    def should_expire(self, claimed: Claimed, now: datetime) -> bool:
        """A one-shot past its deadline (``expireAfter``): not published."""
        return is_expired(claimed.doc, now)

    def expired(self, claimed: Claimed, now: datetime) -> Completion:
        """Not published now. One that was recovered (an attempt in flight
        when its owner stopped, before the deadline) may have reached the
        topic then, unmarked: it says so rather than claim it never went."""
        error = RECOVERED_EXPIRY if claimed.doc.get("recovered") else None
        return Completion(claimed, Outcome.EXPIRED, Status.EXPIRED, now, error=error)

    def exhausted(self, claimed: Claimed) -> bool:
        """Whether this attempt was the last its retry policy allows."""
        return policy_of(claimed.doc, self.retry).exhausted(claimed.attempt)

    def delivered(self, claimed: Claimed, now: datetime) -> Completion:
        if claimed.triggered:
            return self._extra_over(claimed, Outcome.DELIVERED, now)
        if claimed.recurring:
            return self._next_occurrence(claimed, Outcome.DELIVERED, now)
        return Completion(claimed, Outcome.DELIVERED, Status.DELIVERED, now)

    def skipped(self, claimed: Claimed, now: datetime) -> Completion:
        return self._next_occurrence(claimed, Outcome.SKIPPED, now)

    def failed(
        self, claimed: Claimed, error: str, now: datetime, *, dead_letter_failed: bool = False
    ) -> Completion:
        """A failed publish: retried after a backoff, or final past the limit
        (unless its dead-letter record could not be published either: it
        then keeps retrying, so it never ends without a record)."""
        policy = policy_of(claimed.doc, self.retry)
        if not policy.exhausted(claimed.attempt) or dead_letter_failed:
            due_at = now + policy.delay(claimed.attempt, self.rng)
            return Completion(
                claimed, Outcome.RETRYING, Status.PENDING, now, error=error, due_at=due_at
            )
        if claimed.triggered:
            return self._extra_over(claimed, Outcome.FAILED, now, error)
        if claimed.recurring:
            return self._next_occurrence(claimed, Outcome.FAILED, now, error)
        return Completion(claimed, Outcome.FAILED, Status.DELIVERY_FAILED, now, error=error)

    def _extra_over(
        self, claimed: Claimed, outcome: Outcome, now: datetime, error: str | None = None
    ) -> Completion:
        """A triggered occurrence is over: the chain is due at the occurrence
        it was waiting for, unchanged."""
        due_at = aware(claimed.doc["executeAt"])
        return Completion(
            claimed, outcome, Status.PENDING, now, error=error, due_at=due_at, extra=True
        )

    def _next_occurrence(
        self, claimed: Claimed, outcome: Outcome, now: datetime, error: str | None = None
    ) -> Completion:
        """An occurrence is over: record it, and move the chain to its next
        occurrence (under its misfire policy) or end it."""
        current = aware(claimed.doc["executeAt"])
        late_streak = int(claimed.doc.get("lateStreak", 0))
        advance = _recurrence(claimed).advance(current, now, late_streak, self.misfire_threshold)
        if advance.next_at is not None:
            status = Status.PENDING
        else:  # the chain is over: its last outcome is its status
            status = Status.DELIVERY_FAILED if outcome == Outcome.FAILED else Status.DELIVERED
        occurrence = Occurrence(
            execute_at=current,
            next_at=advance.next_at,
            late_streak=advance.late_streak,
            skipped=advance.skipped,
        )
        return Completion(claimed, outcome, status, now, error=error, occurrence=occurrence)


def _recurrence(claimed: Claimed) -> Recurrence:
    return Recurrence.from_document(claimed.doc["recurrence"])


# -- what an HTTP answer means ---------------------------------------------------

# Answers that say "not now": the same request may succeed later. The rest
# of 4xx say the request itself is wrong, and it ends at once.
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
# Answers whose Retry-After is an outage to wait out (no attempt spent).
WAIT_STATUSES = frozenset({429, 503})
# The shortest wait a Retry-After is taken for: "0" must not make a loop.
MIN_WAIT = 1.0
# How much of a response's body lastError and the history keep.
EXCERPT_CHARS = 200


def http_result(
    status: int, retry_after: str | None, body: bytes, now: datetime, max_wait: float
) -> Failed | None:
    """What an HTTP answer makes of a delivery: None (2xx, delivered), a
    wait without spending an attempt (429 or 503 with a Retry-After, capped
    at ``max_wait``), a retry (408, 425, 429, 5xx), or the end (any other
    status: the request itself is wrong; a 3xx too: redirects are not
    followed, so the URL must name the final endpoint)."""
    if 200 <= status < 300:
        return None
    error = f"HTTP {status}: {excerpt(body)}".rstrip(": ")
    if status in WAIT_STATUSES and retry_after is not None:
        wait = retry_after_seconds(retry_after, now)
        if wait is not None:
            return Failed(error, Trouble.DESTINATION, min(max(wait, MIN_WAIT), max_wait))
    if status in RETRY_STATUSES or status >= 500:
        return Failed(error, Trouble.RETRY)
    if 300 <= status < 400:
        return Failed(f"{error} (redirects are not followed)", Trouble.REFUSED)
    return Failed(error, Trouble.REFUSED)


def retry_after_seconds(value: str, now: datetime) -> float | None:
    """A Retry-After header (RFC 9110: delay-seconds or an HTTP-date) as
    seconds from ``now``; None when it is neither."""
    text = value.strip()
    if text.isdigit():
        return float(int(text[:9]))
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - now).total_seconds())


def excerpt(body: bytes) -> str:
    """A response body as one bounded line of text."""
    text = body[: EXCERPT_CHARS * 4].decode("utf-8", "replace")
    return " ".join(text.split())[:EXCERPT_CHARS]
