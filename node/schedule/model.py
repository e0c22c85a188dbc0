"""What a schedule is: its statuses, a validated request for one, its ids,
and the limits a request is held to (DESIGN.md "Contracts").

Pure: no IO, no clock. Parsing a request lives in ``parse.py``, the document
it is stored as in ``node/store/documents.py``, and the API's view of a stored
one in ``node/api/views.py``.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from node.schedule.destination import HttpTarget
from node.schedule.egress import EgressPolicy
from node.schedule.flow import FlowControl
from node.schedule.recurrence import Recurrence
from node.schedule.retry import DEFAULT_POLICY, RetryPolicy
from node.schedule.trace import TRACE_HEADERS, RequestTrace


class Status(enum.StrEnum):
    PENDING = "PENDING"
    PAUSED = "PAUSED"  # never due; PENDING again on resume
    IN_FLIGHT = "IN_FLIGHT"
    DELIVERED = "DELIVERED"
    DELIVERY_FAILED = "DELIVERY_FAILED"
    CANCELLED = "CANCELLED"
    EXPIRED = "EXPIRED"  # a one-shot not published by its deadline, and never will be


# What the API may still change, pause or cancel: no owner holds these.
CHANGEABLE = frozenset({Status.PENDING, Status.PAUSED})
# The statuses a schedule ends in: the write that sets one sets expireAt.
FINAL = frozenset({Status.DELIVERED, Status.DELIVERY_FAILED, Status.CANCELLED, Status.EXPIRED})


# Headers the scheduler sets on every record; a caller may not forge them.
RESERVED_HEADERS = frozenset(
    {"schedule-id", "execute-at", "fence-token", "tenant", "attempt", *TRACE_HEADERS}
)

# The patterns are written as JSON Schema (ECMA 262) reads them, for the
# OpenAPI document; in Python, use them with ``fullmatch`` (the helpers below):
# ``match`` lets ``$`` match before a trailing newline, so "a\n" would pass.
# A client id (the idempotency key), in a body or in a path.
ID_PATTERN = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# Kafka's legal topic characters and length (kafka.common.internals.Topic).
TOPIC_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
TENANT_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
# A caller's record header name: 1-256 characters of printable ASCII but '.'
# (no space, no control character), not starting with '$'. The store keeps
# headers as a sub-document whose field names must not hold NUL, and '$' and
# '.' there make field names MongoDB's operators misread.
HEADER_NAME = re.compile(r"^[\x21-\x23\x25-\x2d\x2f-\x7e][\x21-\x2d\x2f-\x7e]{0,255}$")
DEFAULT_TENANT = "default"
# Stored ids are "tenant/id" ('/' is in neither alphabet), so that one
# tenant's ids never collide with, or reveal, another's.
_TENANT_SEPARATOR = "/"
# A recurring schedule keeps its last few occurrences (GET shows them); the
# full record of every attempt is its history (node/store/history.py).
RECENT_OCCURRENCES = 10
MAX_KEY_BYTES = 1024
# Priority: ten levels, 9 first, 5 unless a schedule says (and then not
# stored: a schedule stored before priorities existed is a 5 too). Ten and
# not three names: a team that needs a level between two has one, and a
# digit sorts as it reads; more would be a ranking no round could honour.
PRIORITIES = range(10)
DEFAULT_PRIORITY = 5
MAX_HEADERS = 64
MAX_HEADER_BYTES = 8 * 1024
# Labels: a small map a caller finds and cancels its schedules by. Names
# cannot hold '=': the store keeps each label as one "name=value" string
# (documents.py), which an index serves by equality.
MAX_LABELS = 16
LABEL_NAME = re.compile(r"^[A-Za-z0-9._/-]{1,63}$")
MAX_LABEL_VALUE_BYTES = 128


NO_RANGES_ALLOWED = EgressPolicy()


@dataclass(frozen=True, kw_only=True)
class Limits:
    max_payload_bytes: int
    horizon: timedelta
    retry: RetryPolicy = DEFAULT_POLICY  # the node's, completing a partial "retry"
    # Where an http target may point (HTTP_TARGETS_ALLOW).
    egress: EgressPolicy = NO_RANGES_ALLOWED


@dataclass(frozen=True, kw_only=True)
class NewSchedule:
    """A validated request to schedule one message."""

    id: str
    client_id: bool  # the caller chose the id (idempotency key)
    tenant: str
    # The destination: exactly one of a Kafka topic or an HTTP target.
    topic: str | None
    execute_at: datetime  # UTC, millisecond precision (what BSON stores)
    payload: bytes
    payload_format: str  # "json" or "base64": how GET shows it back
    key: str | None
    headers: dict[str, str]
    recurrence: Recurrence | None = None
    # The recurrence as the caller wrote it: its first occurrence (and an
    # interval's anchor) depend on when it arrived, a repeat must still match.
    recurrence_request: str | None = None
    retry: RetryPolicy | None = None
    labels: dict[str, str] = field(default_factory=dict)
    # A one-shot not published by execute_at + expire_after is EXPIRED instead.
    expire_after: timedelta | None = None
    http: HttpTarget | None = None
    flow_control: FlowControl | None = None
    priority: int = DEFAULT_PRIORITY
    # The tenant's default delivery rate, where the request names no flow
    # control: stored as its limit, but no part of the request (a repeat
    # after the default changed is still the same request).
    tenant_flow: FlowControl | None = None
    # The call's request id (and traceparent): stored, carried by every
    # delivery, no part of the request (a retried POST has another id).
    trace: RequestTrace | None = None

    @property
    def destination(self) -> str:
        """What a tenant's prefixes are checked against: the topic, or the URL."""
        return self.http.url if self.http is not None else str(self.topic)

    def fingerprint(self) -> str:
        """A digest of everything but the id: the same id with another body is a 409."""
        parts: list[Any] = [
            self.tenant,
            self.topic,
            self.recurrence_request or self.execute_at.isoformat(),
            base64.b64encode(self.payload).decode(),
            self.payload_format,
            self.key,
            sorted(self.headers.items()),
        ]
        if self.retry is not None:  # appended: one-shot digests stay what they were
            parts.append(self.retry.to_document())
        if self.labels or self.expire_after is not None:  # appended, likewise
            parts.append(sorted(self.labels.items()))
            parts.append(None if self.expire_after is None else self.expire_after.total_seconds())
        if self.http is not None:  # appended, likewise
            parts.append(self.http.fingerprint())
        if self.flow_control is not None:  # appended, likewise
            parts.append(self.flow_control.to_document())
        if self.priority != DEFAULT_PRIORITY:  # appended, likewise
            parts.append(["priority", self.priority])
        canonical = json.dumps(parts, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def storage_id(self) -> str:
        return storage_id(self.tenant, self.id)


def storage_id(tenant: str, schedule_id: str) -> str:
    """The document ``_id`` of a tenant's schedule. The default tenant's ids
    are stored as they are, as before tenants existed."""
    if tenant == DEFAULT_TENANT:
        return schedule_id
    return f"{tenant}{_TENANT_SEPARATOR}{schedule_id}"


def is_storage_id(text: str) -> bool:
    """A document ``_id`` that ``storage_id`` can return (a list cursor holds one)."""
    tenant, separator, schedule_id = text.rpartition(_TENANT_SEPARATOR)
    if not separator:
        return is_client_id(text)
    return tenant != DEFAULT_TENANT and is_tenant_name(tenant) and is_client_id(schedule_id)


def tenant_of(document_id: str) -> str:
    """The tenant a document ``_id`` belongs to."""
    return document_id.rpartition(_TENANT_SEPARATOR)[0] or DEFAULT_TENANT


def public_id(document_id: str) -> str:
    """The id the tenant knows, from a document ``_id``."""
    return document_id.rpartition(_TENANT_SEPARATOR)[2]


def is_topic(name: str) -> bool:
    """A legal Kafka topic name."""
    return bool(TOPIC_PATTERN.fullmatch(name)) and name not in {".", ".."}


def is_client_id(text: str) -> bool:
    """A legal schedule id: what a caller may send as ``id`` or in a path."""
    return bool(ID_PATTERN.fullmatch(text))


def is_tenant_name(text: str) -> bool:
    return bool(TENANT_NAME.fullmatch(text))


def is_header_name(text: str) -> bool:
    return bool(HEADER_NAME.fullmatch(text))


def is_label_name(text: str) -> bool:
    return bool(LABEL_NAME.fullmatch(text))


def label_pairs(labels: dict[str, str]) -> list[str]:
    """Labels as the store keeps them: "name=value" strings, sorted."""
    return sorted(f"{name}={value}" for name, value in labels.items())


def priority_of(doc: dict[str, Any]) -> int:
    """A stored schedule's priority (absent: the default)."""
    return int(doc.get("priority", DEFAULT_PRIORITY))


def labels_of(pairs: list[str] | None) -> dict[str, str]:
    """The map ``label_pairs`` was made from (a name holds no '=')."""
    return dict(pair.split("=", 1) for pair in pairs or [])
