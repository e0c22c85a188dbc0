"""The types the schedule store's contract speaks (``node/store/__init__.py``
describes the contract itself): what a claim hands to delivery, and what
delivery hands back for the store to write.

Pure data, no pymongo: ``node/delivery/outcomes.py`` builds ``Completion``s
in virtual time with nothing but these.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from node.schedule.model import Status
from node.schedule.times import aware


@dataclass(frozen=True)
class Claimed:
    """A schedule this node now holds IN_FLIGHT under ``token`` (the document
    as read before the claim; the claim itself incremented its counters)."""

    doc: dict[str, Any]
    token: int

    @property
    def id(self) -> str:
        return str(self.doc["_id"])

    @property
    def bucket(self) -> int:
        return int(self.doc["bucket"])

    @property
    def run(self) -> int:
        return int(self.doc.get("runs", 0)) + 1

    @property
    def recurring(self) -> bool:
        return bool(self.doc.get("recurrence"))

    @property
    def triggered(self) -> bool:
        """An extra occurrence of a recurring schedule, asked for by a trigger."""
        return self.recurring and self.doc.get("triggeredAt") is not None

    @property
    def execute_at(self) -> datetime:
        """The time this attempt is for: the occurrence, or the trigger's."""
        return aware(self.doc["triggeredAt"] if self.triggered else self.doc["executeAt"])

    @property
    def attempt(self) -> int:
        # The claim incremented attempts in the store; the fetched copy is older.
        return int(self.doc.get("attempts", 0)) + 1


class Outcome(enum.StrEnum):
    """What became of one attempt (also the history record's ``outcome``)."""

    DELIVERED = "delivered"
    RETRYING = "retrying"
    FAILED = "failed"
    SKIPPED = "skipped"
    EXPIRED = "expired"


@dataclass(frozen=True)
class Occurrence:
    """How one occurrence of a recurring schedule ended, and where its chain
    goes next (``next_at`` None: the chain is over)."""

    execute_at: datetime
    next_at: datetime | None
    late_streak: int
    skipped: int  # later occurrences jumped over without delivery


@dataclass(frozen=True)
class Completion:
    """What a claimed schedule becomes, as delivery decided it. The store
    writes it only where ``claimed.token`` still holds the schedule."""

    claimed: Claimed
    outcome: Outcome
    status: Status  # PENDING again (a retry, the next occurrence) or final
    at: datetime
    error: str | None = None
    due_at: datetime | None = None  # PENDING: when it is due again
    occurrence: Occurrence | None = None  # recurring schedules only
    # An extra (triggered) occurrence of a recurring schedule is over: the
    # chain is due again at ``due_at``, its own next occurrence.
    extra: bool = False
