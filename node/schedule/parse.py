"""Parsing a request into a ``NewSchedule``: bytes in, a validated schedule
or a ``ValidationFailed`` naming the field out.

Pure: nothing here touches the store, so bad input can never change anything.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from node.errors import PayloadTooLarge, ValidationFailed
from node.schedule.model import (
    DEFAULT_TENANT,
    MAX_HEADER_BYTES,
    MAX_HEADERS,
    MAX_KEY_BYTES,
    RESERVED_HEADERS,
    Limits,
    NewSchedule,
    is_client_id,
    is_header_name,
    is_tenant_name,
    is_topic,
)
from node.schedule.recurrence import Recurrence, parse_recurrence
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


# The deepest nesting of arrays and objects a request body may have: far
# more than any schedule needs, far less than the interpreter's recursion
# limit (about 1,000), which every recursive walk of the value would hit.
MAX_DEPTH = 64
# UTF-16 surrogates: in a str only when a JSON body escaped one alone
# ("\ud800"); no encoder takes them (UTF-8 for the store, Kafka, the log).
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# How one is written in JSON text (the only way: a body is decoded strictly);
# a body without any needs no look at its strings.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SIMPLE_NAME = re.compile(r"[A-Za-z0-9_$-]{1,64}")


def validate_tenant(tenant: object, field: str = "tenant") -> str:
    if not isinstance(tenant, str) or not is_tenant_name(tenant):
        raise ValidationFailed("tenant must be 1-64 characters of [A-Za-z0-9._-]", field)
    return tenant


def validate_id(schedule_id: object, field: str = "id") -> str:
    """A schedule id as a caller writes it, in a body or in a path."""
    if not isinstance(schedule_id, str) or not is_client_id(schedule_id):
        raise ValidationFailed("id must be 1-128 characters of [A-Za-z0-9._:-]", field)
    return schedule_id


def validate_topic(topic: object, field: str = "topic") -> str:
    if not isinstance(topic, str) or not is_topic(topic):
        raise ValidationFailed(
            f"{field} must be 1-249 characters of [A-Za-z0-9._-] and not '.' or '..'", field
        )
    return topic


def parse_json(body: bytes) -> Any:
    """A request body as JSON: UTF-8 (RFC 8259; a BOM is let pass), no NaN
    or Infinity, no string holding a lone surrogate, at most MAX_DEPTH levels
    of arrays and objects. Raises ValidationFailed: a 400 naming the
    top-level member at fault, never an error deeper in (an encoder's, the
    interpreter's)."""
    try:
        text = body.decode("utf-8-sig")
        data = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:  # nested past the interpreter's limit
        raise ValidationFailed(
            f"body nests arrays and objects deeper than {MAX_DEPTH} levels"
        ) from None
    except UnicodeDecodeError as exc:
        raise ValidationFailed(f"body is not UTF-8: {exc.reason} at byte {exc.start}") from None
    except ValueError as exc:  # JSONDecodeError, NaN, too many digits
        raise ValidationFailed(f"body is not valid JSON: {exc}") from None
    check_json(data, strings=_SURROGATE_ESCAPE.search(text) is not None)
    return data


def check_json(data: Any, *, strings: bool = True) -> None:
    """Refuse a decoded JSON value nested deeper than MAX_DEPTH or, unless
    ``strings`` is false, holding a lone surrogate (in a string or a member
    name). Walks without recursion, and only into containers when it need
    not look at strings."""
    # (value, depth of the containers around it, its path from the root)
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(data, 0, ())]
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                _refuse_surrogate(path)
            continue
        if not isinstance(value, dict | list):  # a number, true, false, null
            continue
        if depth >= MAX_DEPTH:
            field = _top_field(path)
            where = f" (in {field!r})" if field else ""
            raise ValidationFailed(
                f"body nests arrays and objects deeper than {MAX_DEPTH} levels{where}", field
            )
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if strings and isinstance(key, str) and _SURROGATE.search(key):
                _refuse_surrogate(path, member_name=True)
            if isinstance(item, dict | list) or (strings and isinstance(item, str)):
                stack.append((item, depth + 1, (*path, key)))


def _refuse_surrogate(path: tuple[str | int, ...], *, member_name: bool = False) -> None:
    what = "a member name in" if member_name else "a string at"
    raise ValidationFailed(
        f"{what} {_json_path(path)} holds a lone UTF-16 surrogate (\\ud800-\\udfff): "
        "not text, and not storable",
        _top_field(path),
    )


def _top_field(path: tuple[str | int, ...]) -> str | None:
    """The top-level member a fault is in: the field an error names."""
    return path[0] if path and isinstance(path[0], str) else None


def _json_path(path: tuple[str | int, ...]) -> str:
    """``$.payload.items[2]``: where in the body (member names quoted when odd)."""
    text = "$"
    for step in path:
        if isinstance(step, int):
            text += f"[{step}]"
        elif _SIMPLE_NAME.fullmatch(step):
            text += f".{step}"
        else:
            text += f"[{json.dumps(step)}]"
    return text


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
    schedule_id = validate_id(data["id"]) if client_id else uuid.uuid4().hex

    tenant = scope(validate_tenant(data["tenant"]) if "tenant" in data else None)

    if "topic" not in data:
        raise ValidationFailed("topic is required", "topic")
    topic = validate_topic(data["topic"])

    if ("executeAt" in data) == ("recurrence" in data):
        raise ValidationFailed("exactly one of executeAt or recurrence is required", "executeAt")
    recurrence, recurrence_request = None, None
    if "recurrence" in data:
        recurrence, execute_at = _parse_recurrence(data["recurrence"], now)
        recurrence_request = json.dumps(data["recurrence"], sort_keys=True)
        when_field = "recurrence"
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
    if key is not None and (
        not isinstance(key, str) or len(key.encode()) > MAX_KEY_BYTES or "\x00" in key
    ):
        raise ValidationFailed(
            f"key must be a string of at most {MAX_KEY_BYTES} bytes, without NUL", "key"
        )

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


def _parse_recurrence(request: object, now: datetime) -> tuple[Recurrence, datetime]:
    """The recurrence and its first occurrence."""
    try:
        recurrence = parse_recurrence(request, now)
        first = recurrence.first(now)
    except OverflowError:  # a start, end or step past year 9999 (or before 1)
        raise ValidationFailed(
            "recurrence reaches out of the range of dates", "recurrence"
        ) from None
    if first is None:  # parse_recurrence refuses a chain with no occurrence
        raise ValidationFailed("recurrence has no occurrence", "recurrence")
    return recurrence, first


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
        if not is_header_name(name):
            raise ValidationFailed(
                f"header name {name!r} is not 1-256 characters of printable ASCII without "
                "'.' and not starting with '$'",
                "headers",
            )
        if not isinstance(value, str) or "\x00" in value:
            raise ValidationFailed(f"header {name!r} must be a string without NUL", "headers")
        if name.lower() in RESERVED_HEADERS:
            raise ValidationFailed(f"header {name!r} is set by the scheduler", "headers")
        size += len(name) + len(value.encode())
    if size > MAX_HEADER_BYTES:
        raise ValidationFailed(f"headers exceed {MAX_HEADER_BYTES} bytes", "headers")
    return dict(headers)
