"""The documents of ``schedules``: what a new schedule is stored as, its
bucket, and the indexes that serve every query on them (DESIGN.md "Mongo").

This is the one place a schedule becomes a document; the store's queries
and writes (``schedules.py``) read and change these fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pymongo import ASCENDING

from node.schedule.changes import expiry_fields
from node.schedule.model import DEFAULT_PRIORITY, NewSchedule, Status, label_pairs, public_id
from node.schedule.payload import payload_fields
from ring import bucket_for


def schedule_document(new: NewSchedule, bucket_count: int, now: datetime) -> dict[str, Any]:
    """The stored form of a new schedule."""
    doc = _base_document(new, bucket_count, now)
    if new.retry is not None:
        doc["retry"] = new.retry.to_document()
    # Absent rather than null when unset: the indexes that find schedules by
    # key or label are partial on the field existing, so a schedule without
    # one costs them nothing.
    if new.key is not None:
        doc["key"] = new.key
    if new.labels:
        doc["labels"] = label_pairs(new.labels)
    if new.http is not None:
        # An http target in place of a topic (absent, not null: a listing by
        # topic never meets it, and by_tenant_host holds only these).
        del doc["topic"]
        doc["http"] = new.http.to_document()
    if new.priority != DEFAULT_PRIORITY:
        doc["priority"] = new.priority
    flow = new.flow_control or new.tenant_flow
    if flow is not None:
        doc["flow"] = flow.to_document()
    if new.trace is not None:  # the call that made it, carried on by each delivery
        doc.update(new.trace.fields())
    if new.expire_after is not None:
        doc.update(expiry_fields(new.execute_at, new.expire_after))
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
        # Inline when small, in a field of its own when large (payload.py).
        **payload_fields(new.payload)[0],
        "payloadFormat": new.payload_format,
        "headers": new.headers,
        "fingerprint": new.fingerprint(),
        "createdAt": now,
        "deliveredAt": None,
        "lastError": None,
        # Every write to the document adds one (API or delivery): the ETag,
        # and the condition of every read-modify-write of the API.
        "version": 1,
    }


def version_filter(version: int) -> Any:
    """The filter value matching a document at ``version`` (0: none stored)."""
    return version if version else None


def bucket_of(stored_id: str, bucket_count: int) -> int:
    """The bucket of a stored schedule: the id its tenant knows, hashed
    (DESIGN.md's formula), so that every write on one schedule can name its
    bucket without reading it first."""
    return bucket_for(public_id(stored_id), bucket_count)


@dataclass(frozen=True)
class IndexSpec:
    name: str
    keys: list[tuple[str, int]]
    options: dict[str, Any] = field(default_factory=dict)


# Each query the node makes is served by one of these, bounded on every
# field it filters on; each is equality fields first, then one range (the
# order a real MongoDB bounds and sorts by, and the only order the embedded
# SecantusDB bounds at all: it never uses a partial index whose key holds
# the filter field, nor a range after a second operator). Few of them: every
# status change rewrites every index entry of the document.
INDEXES = [
    # A bucket's due work, from the earliest (the owner's reads, one bucket
    # at a time), and what it left in flight (recovery): bounded on bucket,
    # status and due time, and on a sharded cluster targeted by the bucket.
    IndexSpec(
        "bucket_status_due", [("bucket", ASCENDING), ("status", ASCENDING), ("dueAt", ASCENDING)]
    ),
    # A bucket's due work past a backlog held back (a host at its bound or
    # with its circuit open, Kafka while the broker is down): the same with
    # each lane's entries apart (``http.host``; null for Kafka), so a read
    # skipping some lanes walks only the others.
    IndexSpec(
        "bucket_status_host_due",
        [
            ("bucket", ASCENDING),
            ("status", ASCENDING),
            ("http.host", ASCENDING),
            ("dueAt", ASCENDING),
        ],
    ),
    # A tenant's PENDING count (its quota), and its earliest due work in this
    # node's buckets when another tenant's backlog fills a view (fair
    # delivery): one range per bucket, merged by due time.
    IndexSpec(
        "tenant_status_bucket_due",
        [("tenant", ASCENDING), ("status", ASCENDING), ("bucket", ASCENDING), ("dueAt", ASCENDING)],
    ),
    # GET /v1/schedules pages by tenant in _id order, and a bulk cancel by id
    # prefix reads one range of it.
    IndexSpec("by_tenant_id", [("tenant", ASCENDING), ("_id", ASCENDING)]),
    # A listing (or bulk cancel) by label, key or topic: one equality range
    # each, in _id order, whatever else the filter holds. Status is not in
    # these keys, so delivery never rewrites their entries; key and labels
    # are partial, so a schedule without them has no entry at all.
    IndexSpec(
        "by_tenant_label",
        [("tenant", ASCENDING), ("labels", ASCENDING), ("_id", ASCENDING)],
        {"partialFilterExpression": {"labels": {"$exists": True}}},
    ),
    IndexSpec(
        "by_tenant_key",
        [("tenant", ASCENDING), ("key", ASCENDING), ("_id", ASCENDING)],
        {"partialFilterExpression": {"key": {"$exists": True}}},
    ),
    IndexSpec("by_tenant_topic", [("tenant", ASCENDING), ("topic", ASCENDING), ("_id", ASCENDING)]),
    # A listing by an http target's host: partial, so Kafka schedules cost
    # it nothing.
    IndexSpec(
        "by_tenant_host",
        [("tenant", ASCENDING), ("http.host", ASCENDING), ("_id", ASCENDING)],
        {"partialFilterExpression": {"http.host": {"$exists": True}}},
    ),
    # A listing by due window or status, in due order. No status in the key:
    # with it, a real MongoDB would move this entry at the claim and at the
    # mark of every record; dueAt moves only on a retry, an occurrence or a
    # PATCH. A status is applied within the due range, and counts per status
    # come from tenant_status_bucket_due. (The embedded SecantusDB rewrites
    # every index entry of a document on any update, so there these four
    # listing indexes cost on every claim and mark too: docs/api.md, "Changing a
    # schedule".)
    IndexSpec("by_tenant_due", [("tenant", ASCENDING), ("dueAt", ASCENDING), ("_id", ASCENDING)]),
    # Retention: a schedule that has ended carries expireAt, and MongoDB's
    # TTL monitor removes it then (documents without it are never removed).
    IndexSpec("expire", [("expireAt", ASCENDING)], {"expireAfterSeconds": 0}),
]
# Indexes of earlier versions, dropped at start-up.
SUPERSEDED_INDEXES = (
    "due", "due_by_bucket", "by_tenant",  # full indexes on status
    "due_pending", "due_pending_by_bucket", "in_flight", "due_pending_by_tenant",  # partial ones
    "tenant_status_due", "by_tenant_status_due",
)  # fmt: skip
