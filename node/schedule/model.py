"""Schedules: the request a caller sends, its validation, and the Mongo
document it becomes (DESIGN.md "Contracts").

Validation is pure: bytes in, a ``NewSchedule`` or a ``ValidationFailed``
naming the field out. Nothing here touches the store, so bad input can never
change anything.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from node.errors import ValidationFailed
from node.schedule.recurrence import Recurrence, parse_recurrence
from node.schedule.retry import DEFAULT_POLICY, RetryPolicy, parse_retry
from node.schedule.times import format_time, parse_time
from node.tenants.model import DEFAULT_TENANT, TENANT_NAME
from ring import bucket_for


class Status(enum.StrEnum):
    PENDING = "PENDING"
    IN_FLIGHT = "IN_FLIGHT"
    DELIVERED = "DELIVERED"
    DELIVERY_FAILED = "DELIVERY_FAILED"
    CANCELLED = "CANCELLED"


# Headers the scheduler sets on every record; a caller may not forge them.
RESERVED_HEADERS = frozenset({"schedule-id", "execute-at", "fence-token", "tenant", "attempt"})

_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# Stored ids are "tenant/id" ('/' is in neither alphabet), so that one
# tenant's ids never collide with, or reveal, another's.
_TENANT_SEPARATOR = "/"
# Kafka's legal topic characters and length (kafka.common.internals.Topic).
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_ALLOWED_FIELDS = frozenset(
    {
        "id",
        "topic",
        "executeAt",
        "recurrence",
        "payload",
        "payloadBase64",
        "key",
        "headers",
        "tenant",
        "retry",
    }
)
# A recurring schedule keeps its last few occurrences (GET shows them); the
# full record of every attempt is its history (node/history.py).
RECENT_OCCURRENCES = 10
MAX_KEY_BYTES = 1024
MAX_HEADERS = 64
MAX_HEADER_BYTES = 8 * 1024


@dataclass(frozen=True, kw_only=True)
class Limits:
    max_payload_bytes: int
    horizon: timedelta
    retry: RetryPolicy = DEFAULT_POLICY  # the node's, completing a partial "retry"


@dataclass(frozen=True, kw_only=True)
class NewSchedule:
    """A validated request to schedule one message."""

    id: str
    client_id: bool  # the caller chose the id (idempotency key)
    tenant: str
    topic: str
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
        canonical = json.dumps(parts, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def storage_id(self) -> str:
        return storage_id(self.tenant, self.id)

    def to_document(self, bucket_count: int, now: datetime) -> dict[str, Any]:
        doc = self._base_document(bucket_count, now)
        if self.retry is not None:
            doc["retry"] = self.retry.to_document()
        if self.recurrence is not None:
            # executeAt is the occurrence due next; completing it writes the
            # one after (node/store.py), so the chain lives in one document.
            doc["recurrence"] = self.recurrence.to_document()
            doc["occurrences"] = 0
            doc["skippedOccurrences"] = 0
            doc["lateStreak"] = 0
            doc["recent"] = []
        return doc

    def _base_document(self, bucket_count: int, now: datetime) -> dict[str, Any]:
        return {
            "_id": self.storage_id,
            "tenant": self.tenant,
            "topic": self.topic,
            "executeAt": self.execute_at,
            # dueAt is when the poller next looks at it: executeAt at first,
            # later the time of the next retry. executeAt never changes.
            "dueAt": self.execute_at,
            # The id the caller knows, whatever its tenant (DESIGN.md's bucket formula).
            "bucket": bucket_for(self.id, bucket_count),
            "status": Status.PENDING.value,
            # 0 is below every lease token, so any owner may claim it first.
            "token": 0,
            "attempts": 0,
            "payload": self.payload,
            "payloadFormat": self.payload_format,
            "key": self.key,
            "headers": self.headers,
            "fingerprint": self.fingerprint(),
            "createdAt": now,
            "deliveredAt": None,
            "lastError": None,
        }


def storage_id(tenant: str, schedule_id: str) -> str:
    """The document ``_id`` of a tenant's schedule. The default tenant's ids
    are stored as they are, as before tenants existed."""
    if tenant == DEFAULT_TENANT:
        return schedule_id
    return f"{tenant}{_TENANT_SEPARATOR}{schedule_id}"


def public_id(document_id: str) -> str:
    """The id the tenant knows, from a document ``_id``."""
    return document_id.rpartition(_TENANT_SEPARATOR)[2]


def validate_tenant(tenant: object, field: str = "tenant") -> str:
    if not isinstance(tenant, str) or not TENANT_NAME.match(tenant):
        raise ValidationFailed("tenant must be 1-64 characters of [A-Za-z0-9._-]", field)
    return tenant


def validate_topic(topic: object, field: str = "topic") -> str:
    if not isinstance(topic, str) or not _TOPIC.match(topic) or topic in {".", ".."}:
        raise ValidationFailed(
            f"{field} must be 1-249 characters of [A-Za-z0-9._-] and not '.' or '..'", field
        )
    return topic


def parse_json(body: bytes) -> Any:
    """A request body as JSON (no NaN or Infinity). Raises ValidationFailed."""
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise ValidationFailed(f"body is not valid JSON: {exc}") from None


# Which tenant a call acts for, given the ``tenant`` it names (None if it
# names none); raises when the caller may not act for it (node/auth.py).
TenantScope = Callable[[str | None], str]


def any_tenant(requested: str | None) -> str:
    return requested or DEFAULT_TENANT


def parse_new_schedule(
    body: bytes, limits: Limits, now: datetime, scope: TenantScope = any_tenant
) -> NewSchedule:
    """Validate a POST /v1/schedules body. Raises ValidationFailed on any fault."""
    return parse_schedule_object(parse_json(body), limits, now, scope)


def parse_schedule_object(
    data: Any, limits: Limits, now: datetime, scope: TenantScope = any_tenant
) -> NewSchedule:
    """Validate one schedule as decoded JSON (a POST body, or one batch item)."""
    if not isinstance(data, dict):
        raise ValidationFailed("body must be a JSON object")
    unknown = sorted(set(data) - _ALLOWED_FIELDS)
    if unknown:
        raise ValidationFailed(f"unknown field {unknown[0]!r}", unknown[0])

    client_id = "id" in data
    schedule_id = data.get("id")
    if client_id:
        if not isinstance(schedule_id, str) or not _ID.match(schedule_id):
            raise ValidationFailed("id must be 1-128 characters of [A-Za-z0-9._:-]", "id")
    else:
        schedule_id = uuid.uuid4().hex

    tenant = scope(validate_tenant(data["tenant"]) if "tenant" in data else None)

    if "topic" not in data:
        raise ValidationFailed("topic is required", "topic")
    topic = validate_topic(data["topic"])

    if ("executeAt" in data) == ("recurrence" in data):
        raise ValidationFailed("exactly one of executeAt or recurrence is required", "executeAt")
    recurrence, recurrence_request = None, None
    if "recurrence" in data:
        recurrence = parse_recurrence(data["recurrence"], now)
        recurrence_request = json.dumps(data["recurrence"], sort_keys=True)
        first = recurrence.first(now)
        if first is None:  # parse_recurrence refuses a chain with no occurrence
            raise ValidationFailed("recurrence has no occurrence", "recurrence")
        execute_at, when_field = first, "recurrence"
    else:
        execute_at, when_field = parse_time(data["executeAt"], "executeAt"), "executeAt"
    if execute_at - now > limits.horizon:
        raise ValidationFailed(
            f"the first occurrence is beyond the horizon of "
            f"{limits.horizon.total_seconds():g} s from now",
            when_field,
        )
    retry = parse_retry(data["retry"], limits.retry) if "retry" in data else None

    payload, payload_format = _parse_payload(data, limits)

    key = data.get("key")
    if key is not None and (not isinstance(key, str) or len(key.encode()) > MAX_KEY_BYTES):
        raise ValidationFailed(f"key must be a string of at most {MAX_KEY_BYTES} bytes", "key")

    headers = _parse_headers(data.get("headers", {}))
    return NewSchedule(
        id=schedule_id,
        client_id=client_id,
        tenant=tenant,
        topic=topic,
        execute_at=execute_at,
        payload=payload,
        payload_format=payload_format,
        key=key,
        headers=headers,
        recurrence=recurrence,
        recurrence_request=recurrence_request,
        retry=retry,
    )


def _reject_constant(name: str) -> None:
    # NaN and Infinity are not JSON (RFC 8259); Python's parser accepts them.
    raise ValueError(f"{name} is not a JSON value")


def _parse_payload(data: dict[str, Any], limits: Limits) -> tuple[bytes, str]:
    has_json, has_b64 = "payload" in data, "payloadBase64" in data
    if has_json == has_b64:
        raise ValidationFailed("exactly one of payload or payloadBase64 is required", "payload")
    if has_json:
        field = "payload"
        payload = json.dumps(data["payload"], separators=(",", ":"), ensure_ascii=False).encode()
        payload_format = "json"
    else:
        field = "payloadBase64"
        text = data["payloadBase64"]
        if not isinstance(text, str):
            raise ValidationFailed("payloadBase64 must be a base64 string", field)
        try:
            payload = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise ValidationFailed("payloadBase64 is not valid base64", field) from None
        payload_format = "base64"
    if len(payload) > limits.max_payload_bytes:
        raise ValidationFailed(
            f"payload is {len(payload)} bytes, over the limit of {limits.max_payload_bytes}",
            field,
            status=413,
        )
    return payload, payload_format


def _parse_headers(headers: object) -> dict[str, str]:
    if not isinstance(headers, dict):
        raise ValidationFailed("headers must be an object of string values", "headers")
    if len(headers) > MAX_HEADERS:
        raise ValidationFailed(f"at most {MAX_HEADERS} headers are allowed", "headers")
    size = 0
    for name, value in headers.items():
        if not name or not isinstance(value, str):
            raise ValidationFailed("headers must map non-empty names to strings", "headers")
        if name.lower() in RESERVED_HEADERS:
            raise ValidationFailed(f"header {name!r} is set by the scheduler", "headers")
        size += len(name.encode()) + len(value.encode())
    if size > MAX_HEADER_BYTES:
        raise ValidationFailed(f"headers exceed {MAX_HEADER_BYTES} bytes", "headers")
    return dict(headers)


def _recurrence_view(doc: dict[str, Any]) -> dict[str, Any]:
    live = doc["status"] in {Status.PENDING.value, Status.IN_FLIGHT.value}
    return {
        "recurrence": Recurrence.from_document(doc["recurrence"]).to_view(),
        # executeAt is the occurrence under way or due next; none once ended.
        "nextExecuteAt": format_time(doc["executeAt"]) if live else None,
        "occurrences": doc.get("occurrences", 0),
        "skippedOccurrences": doc.get("skippedOccurrences", 0),
        "lastOccurrences": [
            {
                "executeAt": format_time(o["executeAt"]),
                "outcome": o["outcome"],
                "at": format_time(o["at"]),
                "attempts": o.get("attempts", 0),
                "error": o.get("error"),
            }
            for o in reversed(doc.get("recent") or [])
        ],
    }


def public_view(doc: dict[str, Any]) -> dict[str, Any]:
    """The schedule as the API shows it."""
    view: dict[str, Any] = {
        "id": public_id(doc["_id"]),
        "tenant": doc["tenant"],
        "topic": doc["topic"],
        "executeAt": format_time(doc["executeAt"]),
        "bucket": doc["bucket"],
        "status": doc["status"],
        "attempts": doc.get("attempts", 0),
        "deliveredAt": format_time(doc.get("deliveredAt")),
        "lastError": doc.get("lastError"),
        "key": doc.get("key"),
        "headers": doc.get("headers") or {},
        "createdAt": format_time(doc.get("createdAt")),
    }
    if doc["status"] == Status.PENDING.value and doc.get("dueAt") != doc["executeAt"]:
        view["nextAttemptAt"] = format_time(doc.get("dueAt"))
    if doc.get("retry"):
        view["retry"] = RetryPolicy.from_document(doc["retry"]).to_view()
    if doc.get("recurrence"):
        view.update(_recurrence_view(doc))
    payload = bytes(doc.get("payload", b""))
    if doc.get("payloadFormat") == "json":
        view["payload"] = json.loads(payload)
    else:
        view["payloadBase64"] = base64.b64encode(payload).decode()
    return view
