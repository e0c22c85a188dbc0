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

Whose trouble a failure was (``sinks/contract.Trouble``) decides the rest:

* the destination's outage (the broker unreachable, timed out, no leader,
  not enough replicas) spends no attempt: the claim is put back as it was;
  an HTTP endpoint that asks to wait (429 or 503 with Retry-After, or a
  circuit open on its host) is due again when it said, its attempt given
  back (DEFERRED), while the occurrence is less than ``outage_bound`` late;
  past that each wait spends an attempt like a retry, so an endpoint down
  for days ends its schedules;
* a retry (a record too large, a topic refused, an HTTP 408/425/429/5xx, a
  refused connection, a timeout) spends one, as in the table;
* refused for good (any other 4xx, an address the egress policy refuses,
  no signing secret) ends the occurrence at once, whatever attempts are
  left, dead-lettered like an exhausted one.

A claimed batch is decided in two calls: ``plan`` before publishing (what
ends unpublished: expired, skipped) and ``decide`` after (each result to a
completion, or to a put-back).

Attempts are counted per occurrence; the policy is the schedule's own
``retry`` or else the node's (``MAX_ATTEMPTS``, ``RETRY_BACKOFF``,
``RETRY_BACKOFF_MAX``).
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime

from node.delivery.sink import Failed, Trouble
from node.schedule.changes import is_expired
from node.schedule.model import Status
from node.schedule.recurrence import Recurrence
from node.schedule.retry import RetryPolicy, policy_of
from node.schedule.times import aware
from node.store.contract import Claimed, Completion, Occurrence, Outcome

# The lastError of an EXPIRED schedule one of whose attempts was in flight
# when its owner stopped (docs/operations.md, "Deadlines").
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
    # How late an HTTP delivery may get waiting on its destination without
    # spending attempts (HTTP_OUTAGE_BOUND).
    outage_bound: timedelta = timedelta(days=1)

    def plan(self, claimed: Sequence[Claimed], now: datetime) -> Plan:
        """Before publishing: what ends here unpublished (past its deadline,
        a missed occurrence to skip) and what is published."""
        publish: list[Claimed] = []
        ended: list[Completion] = []
        for claim in claimed:
            if self.should_expire(claim, now):
                ended.append(self.expired(claim, now))
            elif self.should_skip(claim, now):
                ended.append(self.skipped(claim, now))
            else:
                publish.append(claim)
        return Plan(publish, ended)

    def trouble(self, claimed: Claimed, failure: Failed, now: datetime) -> Trouble:
        """Whose trouble a failure counts as: a destination's wait past the
        outage bound is a retry (it spends an attempt)."""
        waiting = failure.trouble == Trouble.DESTINATION and failure.wait is not None
        if waiting and now - claimed.execute_at > self.outage_bound:
            return Trouble.RETRY
        return failure.trouble

    def ends(self, claimed: Claimed, failure: Failed, now: datetime) -> bool:
        """Whether this failure ends the occurrence (its dead letter is sent
        before ``decide``)."""
        trouble = self.trouble(claimed, failure, now)
        return trouble == Trouble.REFUSED or (trouble == Trouble.RETRY and self.exhausted(claimed))

    def decide(
        self,
        published: Sequence[Claimed],
        results: Sequence[Failed | None],
        now: datetime,
        dead_letters_unsent: Collection[str] = (),
    ) -> Decided:
        """After publishing: each result to a completion, or to a put-back
        (the broker's outage). ``dead_letters_unsent``: ids whose dead letter
        did not go out (they keep retrying rather than end without one)."""
        decided = Decided([], [], [], [])
        for claim, failure in zip(published, results, strict=True):
            if failure is None:
                decided.done.append(self.delivered(claim, now))
                continue
            trouble = self.trouble(claim, failure, now)
            if trouble == Trouble.DESTINATION and failure.wait is None:
                decided.put_back.append(claim)
            elif trouble == Trouble.DESTINATION:
                due_at = now + timedelta(seconds=failure.wait or 0.0)
                decided.deferred.append(
                    Completion(claim, Outcome.DEFERRED, Status.PENDING, now, failure.error, due_at)
                )
            else:
                unsent = claim.id in dead_letters_unsent
                final = trouble == Trouble.REFUSED
                decided.failed.append(
                    self.failed(claim, failure.error, now, dead_letter_failed=unsent, final=final)
                )
        return decided

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
        self,
        claimed: Claimed,
        error: str,
        now: datetime,
        *,
        dead_letter_failed: bool = False,
        final: bool = False,
    ) -> Completion:
        """A failed publish: retried after a backoff, or final past the limit
        or when ``final`` (refused for good), unless its dead-letter record
        could not be published either: it then keeps retrying, so it never
        ends without a record."""
        policy = policy_of(claimed.doc, self.retry)
        if (not final and not policy.exhausted(claimed.attempt)) or dead_letter_failed:
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


@dataclass(frozen=True)
class Plan:
    """A claimed batch before publishing."""

    publish: list[Claimed]
    ended: list[Completion]  # EXPIRED, or a skipped occurrence: never published


@dataclass(frozen=True)
class Decided:
    """What a published batch's schedules become, decided before any is written."""

    done: list[Completion]  # delivered
    failed: list[Completion]  # an attempt spent: retried, or ended failed
    deferred: list[Completion]  # the destination asked to wait: no attempt spent
    put_back: list[Claimed]  # the broker's outage: PENDING as it was


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
