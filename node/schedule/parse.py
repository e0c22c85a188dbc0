"""Parsing a request into a ``NewSchedule``: bytes in, a validated schedule
or a ``ValidationFailed`` naming the field out.

Pure: nothing here touches the store, so bad input can never change anything.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from node.errors import PayloadTooLarge, ValidationFailed
from node.schedule.model import (
    DEFAULT_TENANT,
    ID_PATTERN,
    MAX_HEADER_BYTES,
    MAX_HEADERS,
    MAX_KEY_BYTES,
    RESERVED_HEADERS,
    TENANT_NAME,
    Limits,
    NewSchedule,
    is_topic,
)
from node.schedule.recurrence import parse_recurrence
from node.schedule.retry import parse_retry
from node.schedule.times import parse_time

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


def validate_tenant(tenant: object, field: str = "tenant") -> str:
    if not isinstance(tenant, str) or not TENANT_NAME.match(tenant):
        raise ValidationFailed("tenant must be 1-64 characters of [A-Za-z0-9._-]", field)
    return tenant


def validate_topic(topic: object, field: str = "topic") -> str:
    if not isinstance(topic, str) or not is_topic(topic):
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
# names none); raises when the caller may not act for it (node/api/auth.py).
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
        if not isinstance(schedule_id, str) or not ID_PATTERN.match(schedule_id):
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
        raise PayloadTooLarge(
            f"payload is {len(payload)} bytes, over the limit of {limits.max_payload_bytes}",
            field,
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
