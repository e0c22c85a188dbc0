"""What the API answers and takes, as typed, frozen dataclasses.

Each field is its member on the wire in snake case (``execute_at`` is
``executeAt``); ``decode`` and ``encode`` go by that, and the conformance
test reads it against the OpenAPI document the node serves, so a member
the server adds and the client lacks fails CI. A member the client does
not know yet is kept all the same: every model read from an answer keeps
the answer in ``raw``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

M = TypeVar("M")


# Marks a field that is the client's own, not a member on the wire.
LOCAL = {"local": True}


def camel(name: str) -> str:
    """The member on the wire of an attribute: ``execute_at`` -> ``executeAt``."""
    first, *rest = name.split("_")
    return first + "".join(part.title() for part in rest)


def wire_names(cls: type) -> dict[str, str]:
    """attribute -> member on the wire, for a model class."""
    return {f.name: camel(f.name) for f in dataclasses.fields(cls) if not f.metadata.get("local")}


def format_time(when: datetime | str) -> str:
    """RFC 3339 in UTC to the millisecond, as the API writes times; a string
    is passed as given (the node judges it). A naive datetime is taken as UTC."""
    if isinstance(when, str):
        return when
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def format_duration(value: timedelta | str) -> str:
    """An ISO 8601 duration of a fixed length (``PT1.5S``); a string as given."""
    if isinstance(value, str):
        return value
    millis = round(value.total_seconds() * 1000)
    if millis <= 0:
        raise ValueError("a duration must be positive")
    seconds, rest = divmod(millis, 1000)
    return f"PT{seconds}.{rest:03d}S" if rest else f"PT{seconds}S"


def _options(annotation: Any) -> tuple[Any, ...]:
    """The types an annotation allows: ``X | None`` is (X, None)."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    return typing.get_args(annotation) if union else (annotation,)


def _decode_value(annotation: Any, value: Any) -> Any:
    """A member's JSON value as the annotation's type: models, lists of
    them and times; anything else as it came."""
    for option in _options(annotation):
        if dataclasses.is_dataclass(option) and isinstance(value, Mapping):
            return decode(option, value)  # type: ignore[arg-type]
        if typing.get_origin(option) is list and isinstance(value, list):
            [item] = typing.get_args(option)
            return [_decode_value(item, v) for v in value]
        if option is datetime and isinstance(value, str):
            return parse_time(value)
    return value


def decode(cls: type[M], data: Mapping[str, Any]) -> M:
    """A model from an answer's object: members it lacks take their
    defaults, members the model lacks stay in ``raw``."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for name, member in wire_names(cls).items():
        if member in data:
            values[name] = _decode_value(hints[name], data[member])
    if "raw" in hints:
        values["raw"] = dict(data)
    return cls(**values)


def encode(value: Any) -> Any:
    """A request's value as JSON: models by their wire names (fields left
    None are left out), datetimes and timedeltas as the API writes them."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = wire_names(type(value))
        return {
            names[f.name]: encode(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if f.name in names and getattr(value, f.name) is not None
        }
    if isinstance(value, datetime):
        return format_time(value)
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, Mapping):
        return {k: encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    return value


# -- what a schedule holds -------------------------------------------------------


@dataclass(frozen=True)
class HttpTarget:
    """Deliver by an HTTP request instead of a Kafka record."""

    url: str = ""
    method: str | None = None  # POST (the default), PUT or PATCH
    headers: dict[str, str] | None = None
    timeout: timedelta | str | None = None  # at most PT60S


@dataclass(frozen=True)
class Recurrence:
    """Exactly one of ``every`` and ``cron``."""

    every: timedelta | str | None = None
    cron: str | None = None
    time_zone: str | None = None  # IANA, cron only
    start: datetime | None = None
    end: datetime | None = None
    misfire: str | None = None  # fire_once, fire_all or skip
    max_catch_up: int | None = None


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int | None = None
    initial_backoff: timedelta | str | None = None
    max_backoff: timedelta | str | None = None


@dataclass(frozen=True)
class FlowControl:
    """At most ``rate`` starts per ``period`` and ``parallelism`` in flight, per key."""

    key: str = ""
    rate: int | None = None
    period: timedelta | str | None = None
    parallelism: int | None = None


@dataclass(frozen=True)
class Occurrence:
    execute_at: datetime | None = None
    outcome: str | None = None  # delivered, failed or skipped
    at: datetime | None = None
    attempts: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class Schedule:
    """A schedule as the node showed it, with the ETag of that answer.

    ``version`` (and ``etag``, the same quoted) is what ``patch`` sends as
    If-Match when given this object: the change is made only if nobody
    changed the schedule since this answer."""

    id: str = ""
    tenant: str | None = None
    topic: str | None = None
    http: HttpTarget | None = None
    execute_at: datetime | None = None
    bucket: int | None = None
    status: str | None = None
    version: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    expire_after: str | None = None
    deadline: datetime | None = None
    paused_at: datetime | None = None
    cancelled_at: datetime | None = None
    expired_at: datetime | None = None
    triggered_at: datetime | None = None
    attempts: int = 0
    next_attempt_at: datetime | None = None
    delivered_at: datetime | None = None
    last_error: str | None = None
    key: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    created_at: datetime | None = None
    request_id: str | None = None
    traceparent: str | None = None
    payload: Any = None
    payload_base64: str | None = None
    payload_bytes: int | None = None
    retry: RetryPolicy | None = None
    flow_control: FlowControl | None = None
    priority: int | None = None
    recurrence: Recurrence | None = None
    next_execute_at: datetime | None = None
    occurrences: int | None = None
    skipped_occurrences: int | None = None
    last_occurrences: list[Occurrence] | None = None
    # Of the answer, not of the body: its ETag header ('"3"'), None if it had none.
    etag: str | None = field(default=None, compare=False, metadata=LOCAL)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False, metadata=LOCAL)

    @property
    def if_match(self) -> str | None:
        """The If-Match that names this version: the ETag, else the version quoted."""
        if self.etag is not None:
            return self.etag
        return None if self.version is None else f'"{self.version}"'


# -- answers of other routes -----------------------------------------------------


@dataclass(frozen=True)
class Page:
    """One page of a listing; ``next`` is the cursor of the page after (None: the last)."""

    schedules: list[Schedule] = field(default_factory=list)
    next: str | None = None
    counts: dict[str, int] | None = None
    counts_capped: list[str] | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False, metadata=LOCAL)


@dataclass(frozen=True)
class Attempt:
    at: datetime | None = None
    execute_at: datetime | None = None
    attempt: int | None = None
    outcome: str | None = None
    node: str | None = None
    token: int | None = None
    error: str | None = None
    request_id: str | None = None


@dataclass(frozen=True)
class History:
    id: str = ""
    retention_seconds: float | None = None
    per_schedule: int | None = None
    history: list[Attempt] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False, metadata=LOCAL)


@dataclass(frozen=True)
class BulkResult:
    """One call of a verb by selector; call again while ``more``."""

    matched: int = 0
    changed: int = 0
    more: bool = False
    dry_run: bool | None = None
    cancelled: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False, metadata=LOCAL)


@dataclass(frozen=True)
class BatchError:
    code: str = ""
    message: str = ""
    field: str | None = None


@dataclass(frozen=True)
class BatchItem:
    """One item's answer: what a single create of it would have answered."""

    index: int = 0
    status: int = 0
    schedule: Schedule | None = None
    error: BatchError | None = None


@dataclass(frozen=True)
class BatchResult:
    created: int = 0
    existing: int = 0
    rejected: int = 0
    results: list[BatchItem] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False, metadata=LOCAL)


@dataclass(frozen=True)
class Health:
    """/healthz or /readyz: ``ok`` is the 200, ``body`` says which part is not."""

    ok: bool
    status: int
    body: dict[str, Any]
