"""Where a schedule is delivered: a Kafka ``topic``, or an ``http`` target
(DESIGN.md "HTTP delivery"). A schedule names exactly one.

``http``: ``{"url": "https://...", "method": "POST" | "PUT" | "PATCH",
"headers": {...}, "timeout": "PT10S"}``; method POST and timeout 10 s by
default, the timeout at most 60 s. The URL passes the egress policy as far
as the URL alone shows (``egress.check_url``); the addresses its host
resolves to are checked at every attempt.

Pure: no IO.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from node.errors import ValidationFailed
from node.schedule.egress import EgressPolicy, check_url
from node.schedule.times import format_duration, parse_duration
from node.schedule.trace import TRACE_HEADERS

# The signed header set, in the order its values are signed.
FENCE_SIGNED = ("schedule-id", "execute-at", "fence-token", "attempt", "tenant")
# Headers the scheduler sets on a request: a caller may not set them.
SCHEDULER_HEADERS = frozenset(
    {
        *FENCE_SIGNED,
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "fence-signature",
        "content-type",
        *TRACE_HEADERS,
    }
)
METHODS = ("POST", "PUT", "PATCH")
DEFAULT_TIMEOUT = timedelta(seconds=10)
MAX_TIMEOUT = timedelta(seconds=60)
MAX_HTTP_HEADERS = 32
MAX_HTTP_HEADER_BYTES = 8 * 1024
_FIELDS = frozenset({"url", "method", "headers", "timeout"})
# An HTTP header name (RFC 9110 token) and value (visible ASCII and spaces:
# no CR or LF, so no header can be smuggled into the request).
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")
_VALUE = re.compile(r"^[\x20-\x7e\t]*$")
# Headers the connection owns, or a proxy would read: never a caller's.
_TRANSPORT_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "proxy-authorization",
        "proxy-connection",
    }
)


@dataclass(frozen=True)
class HttpTarget:
    url: str
    host: str  # lower case: what a listing filters on
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)
    timeout: timedelta = DEFAULT_TIMEOUT

    def to_document(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "host": self.host,
            "method": self.method,
            "headers": dict(self.headers),
            "timeout": self.timeout.total_seconds(),
        }

    def fingerprint(self) -> list[Any]:
        return [self.url, self.method, sorted(self.headers.items()), self.timeout.total_seconds()]


def http_view(stored: dict[str, Any]) -> dict[str, Any]:
    """An ``http`` target as the API shows it."""
    return {
        "url": stored["url"],
        "method": stored.get("method", "POST"),
        "headers": stored.get("headers") or {},
        "timeout": format_duration(timedelta(seconds=float(stored.get("timeout", 10.0)))),
    }


def parse_http(value: object, policy: EgressPolicy) -> HttpTarget:
    """An ``http`` member of a request. Raises ValidationFailed naming the
    field at fault (``http``, ``http.url``, ...)."""
    if not isinstance(value, dict):
        raise ValidationFailed("http must be an object with a url", "http")
    unknown = sorted(set(value) - _FIELDS)
    if unknown:
        raise ValidationFailed(f"unknown field http.{unknown[0]}", f"http.{unknown[0]}")
    if "url" not in value:
        raise ValidationFailed("http.url is required", "http.url")
    target = check_url(value["url"], policy)
    method = value.get("method", "POST")
    if method not in METHODS:
        raise ValidationFailed(f"http.method must be one of {', '.join(METHODS)}", "http.method")
    timeout = DEFAULT_TIMEOUT
    if "timeout" in value:
        timeout = parse_duration(value["timeout"], "http.timeout")
        if timeout > MAX_TIMEOUT:
            raise ValidationFailed("http.timeout must be at most PT60S", "http.timeout")
    return HttpTarget(
        url=target.url,
        host=target.host,
        method=method,
        headers=_parse_headers(value.get("headers", {})),
        timeout=timeout,
    )


def _parse_headers(headers: object) -> dict[str, str]:
    field_name = "http.headers"
    if not isinstance(headers, dict):
        raise ValidationFailed("http.headers must be an object of string values", field_name)
    if len(headers) > MAX_HTTP_HEADERS:
        raise ValidationFailed(f"at most {MAX_HTTP_HEADERS} http.headers", field_name)
    size = 0
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name):
            raise ValidationFailed(f"http header name {name!r} is not an HTTP token", field_name)
        if not isinstance(value, str) or not _VALUE.fullmatch(value):
            raise ValidationFailed(
                f"http header {name!r} must be a string of printable ASCII (no CR, LF or NUL)",
                field_name,
            )
        lower = name.lower()
        if lower in SCHEDULER_HEADERS or lower.startswith("webhook-"):
            raise ValidationFailed(f"http header {name!r} is set by the scheduler", field_name)
        if lower in _TRANSPORT_HEADERS:
            raise ValidationFailed(f"http header {name!r} belongs to the connection", field_name)
        size += len(name) + len(value)
    if size > MAX_HTTP_HEADER_BYTES:
        raise ValidationFailed(f"http.headers exceed {MAX_HTTP_HEADER_BYTES} bytes", field_name)
    return dict(headers)


def is_http(doc: dict[str, Any]) -> bool:
    """A stored schedule delivered by HTTP (else to its Kafka topic)."""
    return bool(doc.get("http"))


def http_host(doc: dict[str, Any]) -> str:
    """A stored HTTP schedule's host: what per-host bounds count by."""
    return str(doc["http"].get("host") or "")


def lane(doc: dict[str, Any]) -> str | None:
    """What a due schedule waits on when it is held back: its HTTP host, or
    None for a Kafka schedule (the broker). The store reads a bucket's due
    work past the lanes held back (``http.host`` is null for Kafka)."""
    # Asked of every schedule in a node's views several times a round: one
    # lookup, not three calls.
    http = doc.get("http")
    return str(http.get("host") or "") if http else None
