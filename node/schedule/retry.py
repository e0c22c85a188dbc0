"""Retry policy: how often and how soon a failed publish is tried again.

The node's settings (MAX_ATTEMPTS, RETRY_BACKOFF, RETRY_BACKOFF_MAX) are the
default; a schedule may bring its own (``"retry": {"maxAttempts": 10,
"initialBackoff": "PT5S", "maxBackoff": "PT10M"}``), stored with it so every
owner applies the same one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from node.errors import ValidationFailed
from node.schedule.times import format_duration, parse_duration

MAX_ATTEMPTS_LIMIT = 100
MAX_BACKOFF_LIMIT = timedelta(days=1)
_FIELDS = frozenset({"maxAttempts", "initialBackoff", "maxBackoff"})


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int
    backoff: timedelta
    backoff_max: timedelta

    def exhausted(self, attempt: int) -> bool:
        """Whether ``attempt`` (1 for the first) was the last one allowed."""
        return attempt >= self.max_attempts

    def delay(self, attempt: int, rng: random.Random) -> timedelta:
        """Exponential backoff with jitter (AWS Architecture Blog, "Exponential
        Backoff and Jitter"): half fixed, half random, so a failed batch's
        retries spread out yet never come sooner than half the step."""
        ceiling = min(self.backoff_max, self.backoff * (2 ** max(attempt - 1, 0)))
        jittered: timedelta = ceiling * (0.5 + rng.random() / 2)
        return jittered

    def to_document(self) -> dict[str, int]:
        return {
            "maxAttempts": self.max_attempts,
            "backoffMs": self.backoff // timedelta(milliseconds=1),
            "backoffMaxMs": self.backoff_max // timedelta(milliseconds=1),
        }

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> RetryPolicy:
        return cls(
            max_attempts=int(doc["maxAttempts"]),
            backoff=timedelta(milliseconds=doc["backoffMs"]),
            backoff_max=timedelta(milliseconds=doc["backoffMaxMs"]),
        )

    def to_view(self) -> dict[str, Any]:
        return {
            "maxAttempts": self.max_attempts,
            "initialBackoff": format_duration(self.backoff),
            "maxBackoff": format_duration(self.backoff_max),
        }


def parse_retry(data: object, default: RetryPolicy) -> RetryPolicy:
    """A schedule's ``retry`` object; absent fields take the node's defaults."""
    if not isinstance(data, dict):
        raise ValidationFailed("retry must be an object", "retry")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise ValidationFailed(f"unknown field {unknown[0]!r} in retry", f"retry.{unknown[0]}")
    attempts = data.get("maxAttempts", default.max_attempts)
    if not isinstance(attempts, int) or isinstance(attempts, bool):
        raise ValidationFailed("retry.maxAttempts must be an integer", "retry.maxAttempts")
    if not 1 <= attempts <= MAX_ATTEMPTS_LIMIT:
        raise ValidationFailed(
            f"retry.maxAttempts must be from 1 to {MAX_ATTEMPTS_LIMIT}", "retry.maxAttempts"
        )
    backoff = default.backoff
    if "initialBackoff" in data:
        backoff = parse_duration(data["initialBackoff"], "retry.initialBackoff")
    backoff_max = max(default.backoff_max, backoff)
    if "maxBackoff" in data:
        backoff_max = parse_duration(data["maxBackoff"], "retry.maxBackoff")
    if backoff_max > MAX_BACKOFF_LIMIT:
        raise ValidationFailed("retry.maxBackoff must be at most P1D", "retry.maxBackoff")
    if backoff_max < backoff:
        raise ValidationFailed(
            "retry.maxBackoff must not be below retry.initialBackoff", "retry.maxBackoff"
        )
    return RetryPolicy(max_attempts=attempts, backoff=backoff, backoff_max=backoff_max)


def policy_of(doc: dict[str, Any], default: RetryPolicy) -> RetryPolicy:
    """The policy a stored schedule runs under."""
    stored = doc.get("retry")
    return RetryPolicy.from_document(stored) if stored else default


# The settings' defaults (MAX_ATTEMPTS, RETRY_BACKOFF, RETRY_BACKOFF_MAX).
DEFAULT_POLICY = RetryPolicy(
    max_attempts=5, backoff=timedelta(seconds=1), backoff_max=timedelta(seconds=60)
)
