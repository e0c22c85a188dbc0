"""What the sync and async clients share, with no IO: each route as a
``Call`` to send, each answer parsed, and the retry policy's decisions.
``Client`` and ``AsyncClient`` only send and wait."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import hmac
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, Literal, TypedDict
from urllib.parse import quote

from bucket_scheduler_client.errors import ApiError, error_for
from bucket_scheduler_client.models import (
    FlowControl,
    HttpTarget,
    Recurrence,
    RetryPolicy,
    Schedule,
    decode,
    encode,
)

# -- what the calls take ------------------------------------------------------------


class NewSchedule(TypedDict, total=False):
    """A create's fields (the API's NewSchedule, by attribute name)."""

    id: str  # made for you when absent: a retried create is then the same create
    topic: str
    http: HttpTarget | Mapping[str, Any]
    execute_at: datetime | str
    recurrence: Recurrence | Mapping[str, Any]
    retry: RetryPolicy | Mapping[str, Any]
    payload: Any
    payload_base64: str
    key: str
    headers: Mapping[str, str]
    labels: Mapping[str, str]
    expire_after: timedelta | str
    flow_control: FlowControl | Mapping[str, Any]
    priority: int
    tenant: str


class SchedulePatch(TypedDict, total=False):
    """A PATCH's fields: only those given change; None clears key, labels,
    retry, expire_after and flow_control."""

    topic: str
    http: HttpTarget | Mapping[str, Any]
    execute_at: datetime | str
    recurrence: Recurrence | Mapping[str, Any]
    payload: Any
    payload_base64: str
    headers: Mapping[str, str]
    key: str | None
    labels: Mapping[str, str] | None
    retry: RetryPolicy | Mapping[str, Any] | None
    expire_after: timedelta | str | None
    flow_control: FlowControl | Mapping[str, Any] | None
    priority: int


class Selector(TypedDict, total=False):
    """Which schedules a verb by selector changes: at least one of labels,
    key, id_prefix, topic and host."""

    labels: Mapping[str, str]
    key: str
    id_prefix: str
    topic: str
    host: str
    destination: Literal["kafka", "http"]
    status: str | Sequence[str]
    due_before: datetime | str
    tenant: str


class ListFilters(TypedDict, total=False):
    """A listing's filters; ``label`` is ``"name=value"``, several of them,
    or a mapping of names to values."""

    status: str
    label: str | Sequence[str] | Mapping[str, str]
    topic: str
    host: str
    destination: Literal["kafka", "http"]
    key: str
    due_after: datetime | str
    due_before: datetime | str
    view: Literal["basic", "full"]
    tenant: str


# attribute -> member on the wire, for each of the above.
CREATE_FIELDS = {
    "id": "id",
    "topic": "topic",
    "http": "http",
    "execute_at": "executeAt",
    "recurrence": "recurrence",
    "retry": "retry",
    "payload": "payload",
    "payload_base64": "payloadBase64",
    "key": "key",
    "headers": "headers",
    "labels": "labels",
    "expire_after": "expireAfter",
    "flow_control": "flowControl",
    "priority": "priority",
    "tenant": "tenant",
}
PATCH_FIELDS = {name: CREATE_FIELDS[name] for name in SchedulePatch.__annotations__}
SELECTOR_FIELDS = {
    "labels": "labels",
    "key": "key",
    "id_prefix": "idPrefix",
    "topic": "topic",
    "host": "host",
    "destination": "destination",
    "status": "status",
    "due_before": "dueBefore",
    "tenant": "tenant",
    "dry_run": "dryRun",  # bulk()'s own argument
}
# In the order they are sent (labels first, then the others, then paging).
LIST_PARAMETERS = {
    "tenant": "tenant",
    "label": "label",
    "status": "status",
    "topic": "topic",
    "host": "host",
    "destination": "destination",
    "key": "key",
    "due_after": "dueAfter",
    "due_before": "dueBefore",
    "view": "view",
    "limit": "limit",
    "after": "after",
    "counts": "counts",
}
VERBS = ("pause", "resume", "trigger", "retry")
BULK_VERBS = ("cancel", "pause", "resume", "retry")

# Every route of the API, and the client method that calls it (the
# conformance test holds this to the OpenAPI document).
ROUTES: dict[tuple[str, str], str] = {
    ("post", "/v1/schedules"): "create",
    ("get", "/v1/schedules"): "list",
    ("post", "/v1/schedules:batch"): "create_batch",
    **{("post", f"/v1/schedules:{verb}"): "bulk" for verb in BULK_VERBS},
    ("get", "/v1/schedules/{schedule_id}"): "get",
    ("patch", "/v1/schedules/{schedule_id}"): "patch",
    ("delete", "/v1/schedules/{schedule_id}"): "cancel",
    **{("post", f"/v1/schedules/{{schedule_id}}:{verb}"): verb for verb in VERBS},
    ("get", "/v1/schedules/{schedule_id}/history"): "history",
    ("get", "/v1/cluster"): "cluster",
    ("get", "/v1/cluster/backlog"): "backlog",
    ("get", "/v1/cluster/counts"): "counts",
    ("post", "/v1/internal/wake"): "wake",
    ("post", "/v1/admin/drain"): "drain",
    ("put", "/v1/chaos/partition"): "partition",
    ("get", "/v1/openapi.json"): "openapi",
    ("get", "/"): "console",
    ("get", "/console.js"): "console_file",
    ("get", "/console.css"): "console_file",
    ("get", "/healthz"): "healthz",
    ("get", "/readyz"): "readyz",
    ("get", "/metrics"): "metrics",
}


# The operator console's files besides its page (``GET /``).
CONSOLE_FILES = ("console.js", "console.css")


def new_id() -> str:
    """An id for a create that names none: random, so a create sent again
    (after a 503, or no answer) is the same create, not a second schedule."""
    return f"c-{uuid.uuid4().hex}"


def _wire_object(fields: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for name, value in fields.items():
        if name not in names:
            raise TypeError(f"unknown field {name!r}")
        body[names[name]] = encode(value)
    return body


def create_body(fields: Mapping[str, Any]) -> dict[str, Any]:
    body = _wire_object(fields, CREATE_FIELDS)
    body.setdefault("id", new_id())
    return body


def patch_body(fields: Mapping[str, Any]) -> dict[str, Any]:
    if not fields:
        raise TypeError("patch needs at least one field to change")
    return _wire_object(fields, PATCH_FIELDS)


def selector_body(fields: Mapping[str, Any]) -> dict[str, Any]:
    return _wire_object({k: v for k, v in fields.items() if v is not None}, SELECTOR_FIELDS)


def list_query(filters: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A listing's query, in LIST_PARAMETERS' order."""
    unknown = set(filters) - set(LIST_PARAMETERS)
    if unknown:
        raise TypeError(f"unknown filter {sorted(unknown)[0]!r}")
    query: list[tuple[str, str]] = []
    for name, parameter in LIST_PARAMETERS.items():
        value = filters.get(name)
        if value is None or value is False:
            continue
        if name == "label":
            query.extend(("label", pair) for pair in _labels(value))
        elif value is True:
            query.append((parameter, "true"))
        else:
            query.append((parameter, str(encode(value))))
    return query


def _labels(value: str | Sequence[str] | Mapping[str, str]) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [f"{name}={text}" for name, text in value.items()]
    return list(value)


# -- a call, and its answer ---------------------------------------------------------


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    query: list[tuple[str, str]] = field(default_factory=list)
    body: Any = None  # JSON, or None for no body
    headers: dict[str, str] = field(default_factory=dict)
    content: bytes | None = None  # raw bytes instead of JSON

    def payload(self) -> bytes | None:
        if self.content is not None:
            return self.content
        return None if self.body is None else json.dumps(self.body).encode()


def schedule_path(schedule: Schedule | str, suffix: str = "") -> str:
    schedule_id = schedule.id if isinstance(schedule, Schedule) else schedule
    return f"/v1/schedules/{quote(schedule_id, safe='')}{suffix}"


def if_match_header(value: int | str | None) -> dict[str, str]:
    """If-Match from a version (3), an ETag ('"3"') or ``*``; None: no header."""
    if value is None:
        return {}
    if isinstance(value, int):
        return {"If-Match": f'"{value}"'}
    return {"If-Match": value}


def tenant_query(tenant: str | None) -> list[tuple[str, str]]:
    return [] if tenant is None else [("tenant", tenant)]


def wake_call(bucket: int, due_at: datetime | str, sender: str | None, sent_at: datetime | str,
              cluster_key: bytes | None) -> Call:  # fmt: skip
    """The hint between nodes, signed when the cluster has keys."""
    body: dict[str, Any] = {"bucket": bucket, "dueAt": encode(due_at), "sentAt": encode(sent_at)}
    if sender is not None:
        body["from"] = sender
    content = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if cluster_key is not None:
        digest = hmac.new(cluster_key, content, hashlib.sha256).hexdigest()
        headers["X-Scheduler-Signature"] = f"sha256={digest}"
    return Call("POST", "/v1/internal/wake", content=content, headers=headers)


def retry_after_seconds(header: str | None, now: datetime | None = None) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP date (RFC 9110 10.2.3)."""
    if header is None:
        return None
    text = header.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if now is None:
        return None
    return max(0.0, (when - now).total_seconds())


def json_of(content: bytes) -> Any:
    try:
        return json.loads(content) if content else None
    except ValueError:
        return None


def refusal(status: int, headers: Mapping[str, str], content: bytes) -> ApiError:
    return error_for(
        status,
        json_of(content),
        retry_after=retry_after_seconds(headers.get("retry-after"), datetime.now(UTC)),
        request_id=headers.get("x-request-id"),
    )


def schedule_of(headers: Mapping[str, str], data: Any) -> Schedule:
    schedule = decode(Schedule, data if isinstance(data, Mapping) else {})
    etag = headers.get("etag")
    return schedule if etag is None else dataclasses.replace(schedule, etag=etag)


# -- retries ------------------------------------------------------------------------


@dataclass(frozen=True)
class Retry:
    """When a call is sent again: on a 503 or a 429 (the node or the tenant
    asks to wait) and when the connection could not be made (nothing was
    sent), ``attempts`` calls in all at most.

    The wait is the answer's ``Retry-After`` when it has one, else
    ``backoff`` doubling up to ``max_backoff``. A Retry-After longer than
    ``max_wait`` is not waited out: the error is raised then, with its
    ``retry_after``, for the caller to decide."""

    attempts: int = 4
    backoff: float = 0.25
    max_backoff: float = 4.0
    max_wait: float = 30.0
    statuses: frozenset[int] = frozenset({429, 503})

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts counts the first call: at least 1")

    def delay(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before call ``attempt + 1`` (``attempt`` from 1);
        None: do not call again."""
        if attempt >= self.attempts:
            return None
        if retry_after is not None:
            return retry_after if retry_after <= self.max_wait else None
        return float(min(self.max_backoff, self.backoff * 2 ** (attempt - 1)))

    def wait_after(self, attempt: int, error: ApiError) -> float | None:
        """The wait after a refusal, None if it is not retried."""
        if error.status not in self.statuses:
            return None
        return self.delay(attempt, error.retry_after)


NO_RETRY = Retry(attempts=1)


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {} if not api_key else {"Authorization": f"Bearer {api_key}"}


# -- each route as a call -----------------------------------------------------------


class Version(enum.Enum):
    """``patch``'s default If-Match: the version of the schedule object given."""

    OF_SCHEDULE = "of the schedule given"


OF_SCHEDULE = Version.OF_SCHEDULE
IfMatch = int | str | None


def patch_if_match(schedule: Schedule | str, if_match: IfMatch | Version) -> IfMatch:
    if isinstance(if_match, Version):
        return schedule.if_match if isinstance(schedule, Schedule) else None
    return if_match


def batch_body(items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {"schedules": [create_body(item) for item in items]}


def list_call(
    tenant: str | None,
    filters: Mapping[str, Any],
    limit: int | None,
    after: str | None,
    counts: bool,
) -> Call:
    merged = {"tenant": tenant, **filters, "limit": limit, "after": after, "counts": counts}
    return Call("GET", "/v1/schedules", query=list_query(merged))


def bulk_call(verb: str, selector: Mapping[str, Any], dry_run: bool) -> Call:
    if verb not in BULK_VERBS:
        raise ValueError(f"a verb by selector is one of {', '.join(BULK_VERBS)}")
    body = selector_body({**selector, "dry_run": dry_run or None})
    return Call("POST", f"/v1/schedules:{verb}", body=body)
