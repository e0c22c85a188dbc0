"""The documents of ``schedules``: what a new schedule is stored as, and the
indexes that serve every query on them (DESIGN.md "Mongo").

This is the one place a schedule becomes a document; the store's queries
and writes (``schedules.py``) read and change these fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pymongo import ASCENDING

from node.schedule.model import NewSchedule, Status
from ring import bucket_for


def schedule_document(new: NewSchedule, bucket_count: int, now: datetime) -> dict[str, Any]:
    """The stored form of a new schedule."""
    doc = _base_document(new, bucket_count, now)
    if new.retry is not None:
        doc["retry"] = new.retry.to_document()
    if new.recurrence is not None:
        # executeAt is the occurrence due next; completing it writes the one
        # after (node/delivery/outcomes.py), so the chain lives in one document.
        doc["recurrence"] = new.recurrence.to_document()
        doc["occurrences"] = 0
        doc["skippedOccurrences"] = 0
        doc["lateStreak"] = 0
        doc["recent"] = []
    return doc


def _base_document(new: NewSchedule, bucket_count: int, now: datetime) -> dict[str, Any]:
    return {
        "_id": new.storage_id,
        "tenant": new.tenant,
        "topic": new.topic,
        "executeAt": new.execute_at,
        # dueAt is when the poller next looks at it: executeAt at first,
        # later the time of the next retry. executeAt never changes.
        "dueAt": new.execute_at,
        # The id the caller knows, whatever its tenant (DESIGN.md's bucket formula).
        "bucket": bucket_for(new.id, bucket_count),
        "status": Status.PENDING.value,
        # 0 is below every lease token, so any owner may claim it first.
        "token": 0,
        "attempts": 0,
        "payload": new.payload,
        "payloadFormat": new.payload_format,
        "key": new.key,
        "headers": new.headers,
        "fingerprint": new.fingerprint(),
        "createdAt": now,
        "deliveredAt": None,
        "lastError": None,
    }


@dataclass(frozen=True)
class IndexSpec:
    name: str
    keys: list[tuple[str, int]]
    only_status: str | None = None  # a partial index over one status

    @property
    def options(self) -> dict[str, Any]:
        if self.only_status is None:
            return {}
        return {"partialFilterExpression": {"status": self.only_status}}


# Every status change rewrites the index entries of the document, so each
# index holds only the schedules its query looks for: a delivered schedule
# (the bulk of the collection) sits in the _id and tenant indexes alone, a
# claim moves a schedule from the two PENDING indexes to the IN_FLIGHT one
# and completing it takes it out of that (half the index writes of full
# indexes on status, measured on the embedded server).
INDEXES = [
    # The due window: a range over PENDING schedules by due time, with cost
    # proportional to the window whatever the collection size.
    IndexSpec("due_pending", [("dueAt", ASCENDING)], Status.PENDING.value),
    # Per bucket: exact for a node that owns few buckets while the window
    # holds other nodes' backlog.
    IndexSpec(
        "due_pending_by_bucket", [("bucket", ASCENDING), ("dueAt", ASCENDING)], Status.PENDING.value
    ),
    # Work a former owner left mid-batch (recover_in_flight).
    IndexSpec("in_flight", [("status", ASCENDING)], Status.IN_FLIGHT.value),
    # GET /v1/schedules pages by tenant in _id order; a status filter is
    # applied to the page, so status changes do not move this entry.
    IndexSpec("by_tenant_id", [("tenant", ASCENDING), ("_id", ASCENDING)]),
    # A tenant's PENDING count (its max-pending quota), and its oldest due
    # work when another tenant's backlog fills the due window (fair polling).
    IndexSpec(
        "due_pending_by_tenant", [("tenant", ASCENDING), ("dueAt", ASCENDING)], Status.PENDING.value
    ),
]
# Indexes of earlier versions, dropped at start-up: full indexes on status.
SUPERSEDED_INDEXES = ("due", "due_by_bucket", "by_tenant")
