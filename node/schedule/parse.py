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
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from node.errors import PayloadTooLarge, ValidationFailed
from node.schedule.destination import HttpTarget, parse_http
from node.schedule.flow import FlowControl, parse_flow_control
from node.schedule.model import (
    DEFAULT_PRIORITY,
    DEFAULT_TENANT,
    MAX_HEADER_BYTES,
    MAX_HEADERS,
    MAX_KEY_BYTES,
    MAX_LABEL_VALUE_BYTES,
    MAX_LABELS,
    PRIORITIES,
    RESERVED_HEADERS,
    Limits,
    NewSchedule,
    is_client_id,
    is_header_name,
    is_label_name,
    is_tenant_name,
    is_topic,
)
from node.schedule.recurrence import Recurrence, parse_recurrence
from node.schedule.retry import RetryPolicy, parse_retry
from node.schedule.times import parse_duration, parse_time

_ALLOWED_FIELDS = frozenset(
    {
        "id",
        "topic",
        "http",
        "executeAt",
        "recurrence",
        "payload",
        "payloadBase64",
        "key",
        "headers",
        "tenant",
        "retry",
        "labels",
        "expireAfter",
        "flowControl",
        "priority",
    }
)
# What PATCH may change: all but the schedule's identity (its destination
# may switch between a topic and an http target).
PATCHABLE_FIELDS = _ALLOWED_FIELDS - {"id", "tenant"}
# Of those, the ones null clears.
CLEARABLE_FIELDS = frozenset({"key", "retry", "labels", "expireAfter", "flowControl"})
# The longest expireAfter: as far as the horizon lets a schedule be anyway.
MAX_EXPIRE_AFTER = timedelta(days=3650)


# The deepest nesting of arrays and objects a request body may have: far
# more than any schedule needs, far less than the interpreter's recursion
# limit (about 1,000), which every recursive walk of the value would hit.
MAX_DEPTH = 64
# The most JSON values (and member names) one body may hold. Each costs
# the interpreter some 60 bytes once parsed, the body one byte or more: 16
# MiB of nested empty arrays ("[[],[],...") was 5.6 million lists, a
# gigabyte and a second of parsing. A batch of 1,000 schedules with a few
# hundred values each stays far below.
MAX_JSON_VALUES = 250_000
# A JSON string, escapes and all (written unrolled: one pass per string).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
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
    of arrays and objects and MAX_JSON_VALUES values. Raises ValidationFailed:
    a 400 naming the top-level member at fault (a 413 for too many values),
    never an error deeper in (an encoder's, the interpreter's)."""
    if json_values(body) > MAX_JSON_VALUES:
        raise PayloadTooLarge(f"body holds more than {MAX_JSON_VALUES} JSON values")
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


def json_values(body: bytes) -> int:
    """At least as many as the values and member names ``body`` would parse
    to, counted before parsing: every one but the first follows a ',' or
    opens with '[' or '{' (a member name counts twice; so what). Commas and
    brackets inside strings are counted only while the total is high
    enough to matter: then the strings are taken out and it is counted
    again. Milliseconds for 16 MiB, in C."""
    rough = _structure(body)
    if rough <= MAX_JSON_VALUES:
        return rough
    return _structure(_JSON_STRING.sub(b'""', body))


def _structure(body: bytes) -> int:
    return body.count(b",") + body.count(b"[") + body.count(b"{") + 1


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

    topic, http = _parse_destination(data, limits)

    if ("executeAt" in data) == ("recurrence" in data):
        raise ValidationFailed("exactly one of executeAt or recurrence is required", "executeAt")
    recurrence, recurrence_request = None, None
    if "recurrence" in data:
        recurrence, execute_at = _parse_recurrence(data["recurrence"], now)
        recurrence_request = json.dumps(data["recurrence"], sort_keys=True)
        when_field = "recurrence"
    else:
        execute_at, when_field = parse_time(data["executeAt"], "executeAt"), "executeAt"
    _within_horizon(execute_at, now, limits, when_field)
    retry = parse_retry(data["retry"], limits.retry) if "retry" in data else None
    flow = parse_flow_control(data["flowControl"]) if "flowControl" in data else None
    priority = parse_priority(data["priority"]) if "priority" in data else DEFAULT_PRIORITY

    payload, payload_format = _parse_payload(data, limits)
    key = _parse_key(data.get("key"))
    headers = _parse_headers(data.get("headers", {}))
    if http is not None and headers:
        raise headers_on_http()
    labels = parse_labels(data.get("labels", {}))
    expire_after = None
    if "expireAfter" in data:
        if recurrence is not None:
            raise _expire_after_on_recurring()
        expire_after = parse_expire_after(data["expireAfter"])
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
        labels=labels,
        expire_after=expire_after,
        http=http,
        flow_control=flow,
        priority=priority,
    )


def _parse_destination(
    data: dict[str, Any], limits: Limits
) -> tuple[str | None, HttpTarget | None]:
    """The one destination a schedule names: a Kafka topic or an http target."""
    if ("topic" in data) == ("http" in data):
        raise ValidationFailed("exactly one of topic or http is required", "topic")
    if "http" in data:
        return None, parse_http(data["http"], limits.egress)
    return validate_topic(data["topic"]), None


def headers_on_http() -> ValidationFailed:
    return ValidationFailed(
        "headers are a Kafka record's; an http target's go in http.headers", "headers"
    )


def _within_horizon(execute_at: datetime, now: datetime, limits: Limits, field: str) -> None:
    if execute_at - now > limits.horizon:
        raise ValidationFailed(
            f"the first occurrence is beyond the horizon of "
            f"{limits.horizon.total_seconds():g} s from now",
            field,
        )


def _parse_key(key: object) -> str | None:
    if key is not None and (
        not isinstance(key, str) or len(key.encode()) > MAX_KEY_BYTES or "\x00" in key
    ):
        raise ValidationFailed(
            f"key must be a string of at most {MAX_KEY_BYTES} bytes, without NUL", "key"
        )
    return key


def parse_priority(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value not in PRIORITIES:
        raise ValidationFailed(
            f"priority must be an integer from {PRIORITIES[0]} to {PRIORITIES[-1]} "
            f"({PRIORITIES[-1]} first; default {DEFAULT_PRIORITY})",
            "priority",
        )
    return value


def parse_labels(labels: object, field: str = "labels") -> dict[str, str]:
    """A label map: at most MAX_LABELS names of LABEL_NAME, string values of
    at most MAX_LABEL_VALUE_BYTES without NUL."""
    if not isinstance(labels, dict):
        raise ValidationFailed(f"{field} must be an object of string values", field)
    if len(labels) > MAX_LABELS:
        raise ValidationFailed(f"at most {MAX_LABELS} labels are allowed", field)
    for name, value in labels.items():
        check_label(name, value, field)
    return dict(labels)


def check_label(name: object, value: object, field: str = "labels") -> None:
    if not isinstance(name, str) or not is_label_name(name):
        raise ValidationFailed(
            f"label name {name!r} is not 1-63 characters of [A-Za-z0-9._/-]", field
        )
    if not isinstance(value, str) or "\x00" in value or len(value.encode()) > MAX_LABEL_VALUE_BYTES:
        raise ValidationFailed(
            f"label {name!r} must be a string of at most {MAX_LABEL_VALUE_BYTES} bytes without NUL",
            field,
        )


def parse_expire_after(value: object) -> timedelta:
    expire_after = parse_duration(value, "expireAfter")
    if expire_after > MAX_EXPIRE_AFTER:
        raise ValidationFailed(
            f"expireAfter must be at most P{MAX_EXPIRE_AFTER.days}D", "expireAfter"
        )
    return expire_after


def _expire_after_on_recurring() -> ValidationFailed:
    return ValidationFailed(
        "expireAfter applies to one-shot schedules only (a recurring one's misfire "
        "policy decides what a late occurrence does)",
        "expireAfter",
    )


@dataclass(frozen=True, kw_only=True)
class Patch:
    """A validated PATCH body: only what it names changes. ``None`` in a
    clearable field means "clear it"; a field not named keeps its value."""

    named: frozenset[str]
    execute_at: datetime | None = None
    recurrence: Recurrence | None = None
    payload: tuple[bytes, str] | None = None  # (bytes, "json" | "base64")
    key: str | None = None
    headers: dict[str, str] | None = None
    retry: RetryPolicy | None = None
    labels: dict[str, str] | None = None
    expire_after: timedelta | None = None
    flow_control: FlowControl | None = None
    priority: int | None = None
    # A new destination: one of them (naming it switches from the other).
    topic: str | None = None
    http: HttpTarget | None = None


def parse_patch(data: Any, limits: Limits, now: datetime) -> Patch:
    """Validate a PATCH /v1/schedules/{id} body. What it asks of the stored
    schedule (its status, one-shot or recurring) is judged against the
    schedule itself (``node/schedule/changes.py``)."""
    _check_patch_fields(data)
    fields = {**_parse_patch_time(data, limits, now), **_parse_patch_content(data, limits)}
    return Patch(named=frozenset(data), **fields)


def _check_patch_fields(data: Any) -> None:
    """Refuse a body that is not an object, names no field or one that cannot
    be changed, clears one that cannot be cleared, or names two that exclude
    each other."""
    if not isinstance(data, dict):
        raise ValidationFailed("body must be a JSON object")
    unknown = sorted(set(data) - PATCHABLE_FIELDS)
    if unknown:
        raise ValidationFailed(
            f"field {unknown[0]!r} cannot be changed (or does not exist)", unknown[0]
        )
    if not data:
        raise ValidationFailed("nothing to change: name at least one field")
    for name in sorted(set(data) - CLEARABLE_FIELDS):
        if data[name] is None:
            raise ValidationFailed(f"{name} cannot be cleared", name)
    if "executeAt" in data and "recurrence" in data:
        raise ValidationFailed("at most one of executeAt or recurrence", "executeAt")
    if "payload" in data and "payloadBase64" in data:
        raise ValidationFailed("at most one of payload or payloadBase64", "payload")
    if "topic" in data and "http" in data:
        raise ValidationFailed("at most one of topic or http", "topic")


def _parse_patch_time(data: dict[str, Any], limits: Limits, now: datetime) -> dict[str, Any]:
    """A new ``executeAt`` or ``recurrence``, as Patch fields."""
    fields: dict[str, Any] = {}
    if "executeAt" in data:
        fields["execute_at"] = parse_time(data["executeAt"], "executeAt")
        _within_horizon(fields["execute_at"], now, limits, "executeAt")
    if "recurrence" in data:
        fields["recurrence"], first = _parse_recurrence(data["recurrence"], now)
        _within_horizon(first, now, limits, "recurrence")
        if data.get("expireAfter") is not None:
            raise _expire_after_on_recurring()
    return fields


def _parse_patch_content(data: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """The rest of what the body sets, as Patch fields."""
    fields: dict[str, Any] = {}
    if "payload" in data or "payloadBase64" in data:
        fields["payload"] = _parse_payload(data, limits)
    if data.get("key") is not None:
        fields["key"] = _parse_key(data["key"])
    if "headers" in data:
        fields["headers"] = _parse_headers(data["headers"])
    if data.get("retry") is not None:
        fields["retry"] = parse_retry(data["retry"], limits.retry)
    if data.get("labels") is not None:
        fields["labels"] = parse_labels(data["labels"])
    if data.get("expireAfter") is not None:
        fields["expire_after"] = parse_expire_after(data["expireAfter"])
    if data.get("flowControl") is not None:
        fields["flow_control"] = parse_flow_control(data["flowControl"])
    if "priority" in data:
        fields["priority"] = parse_priority(data["priority"])
    if "topic" in data:
        fields["topic"] = validate_topic(data["topic"])
    if "http" in data:
        fields["http"] = parse_http(data["http"], limits.egress)
    return fields


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
