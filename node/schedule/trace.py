"""A request's id, from the POST that made a schedule to the record or call
it became (docs/observability.md).

Every API call has a request id: the caller's ``X-Request-ID``, else the
trace id of its W3C ``traceparent``, else one made here. The answer echoes
it, every log line of the call carries it, and a create or PATCH stores it on
the schedule (``requestId``, and ``traceparent`` when one was given), so each
delivery carries it on: a Kafka header ``request-id`` and an HTTP header
``x-request-id`` (the name proxies and web frameworks already log), with
``traceparent`` beside it. Its history records carry it too.

Pure: no IO. The id goes into log lines and into headers of requests this
node makes, so it is held to visible ASCII (no space, CR or LF: nothing can
be smuggled into a header or a log line) and a bounded length.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any

from node.errors import ValidationFailed

REQUEST_ID_HEADER = "X-Request-ID"
TRACEPARENT_HEADER = "traceparent"
MAX_REQUEST_ID = 128
# Visible ASCII only (0x21 to 0x7e).
_REQUEST_ID = re.compile(rf"[\x21-\x7e]{{1,{MAX_REQUEST_ID}}}")
# W3C Trace Context, version-format "00": version-traceid-parentid-flags. A
# later version may append fields after a dash; its first four parse alike.
_TRACEPARENT = re.compile(
    r"(?P<version>[0-9a-f]{2})-(?P<trace>[0-9a-f]{32})-(?P<parent>[0-9a-f]{16})"
    r"-(?P<flags>[0-9a-f]{2})(?P<rest>-[\x21-\x7e]*)?"
)
_ZERO_TRACE = "0" * 32
_ZERO_PARENT = "0" * 16

# The schedule's fields, and the headers a delivery carries them in.
REQUEST_ID_FIELD = "requestId"
TRACEPARENT_FIELD = "traceparent"
KAFKA_REQUEST_ID = "request-id"
HTTP_REQUEST_ID = "x-request-id"
# Headers a caller may not set on a schedule: the delivery's own win.
TRACE_HEADERS = frozenset({KAFKA_REQUEST_ID, HTTP_REQUEST_ID, TRACEPARENT_HEADER})


@dataclass(frozen=True)
class RequestTrace:
    request_id: str
    traceparent: str | None = None  # as the caller sent it, when valid

    def fields(self) -> dict[str, str]:
        """What a create or PATCH stores on the schedule."""
        stored = {REQUEST_ID_FIELD: self.request_id}
        if self.traceparent is not None:
            stored[TRACEPARENT_FIELD] = self.traceparent
        return stored


def new_request_id() -> str:
    """32 hex digits: the shape of a W3C trace id, so tools that index trace
    ids take it as one."""
    return secrets.token_hex(16)


def request_trace(request_id: str | None, traceparent: str | None) -> RequestTrace:
    """The trace of a call from its headers. A malformed ``X-Request-ID`` is
    refused (the caller chose it and can fix it); a malformed
    ``traceparent`` is ignored, as W3C Trace Context asks."""
    parent = valid_traceparent(traceparent)
    if request_id is not None:
        if not _REQUEST_ID.fullmatch(request_id):
            raise ValidationFailed(
                f"{REQUEST_ID_HEADER} must be 1 to {MAX_REQUEST_ID} visible ASCII characters "
                "(no spaces)",
                REQUEST_ID_HEADER,
            )
        return RequestTrace(request_id, parent)
    if parent is not None:
        return RequestTrace(parent.split("-")[1], parent)
    return RequestTrace(new_request_id())


def valid_traceparent(value: str | None) -> str | None:
    """``value`` as this node passes it on if it is a valid W3C
    ``traceparent``, else None. A later version's is passed on as version 00
    of its first four fields, as the standard asks of a version-00 reader."""
    if value is None or len(value) > 512:
        return None
    found = _TRACEPARENT.fullmatch(value.strip())
    if found is None or found["version"] == "ff":
        return None
    if found["version"] == "00" and found["rest"]:
        return None  # version 00 has exactly four fields
    if found["trace"] == _ZERO_TRACE or found["parent"] == _ZERO_PARENT:
        return None
    return f"00-{found['trace']}-{found['parent']}-{found['flags']}"


def delivery_headers(doc: dict[str, Any], request_id_header: str) -> list[tuple[str, str]]:
    """The trace headers of a delivery of ``doc`` (none for a schedule stored
    before request ids were)."""
    headers: list[tuple[str, str]] = []
    request_id = doc.get(REQUEST_ID_FIELD)
    if isinstance(request_id, str):
        headers.append((request_id_header, request_id))
    traceparent = doc.get(TRACEPARENT_FIELD)
    if isinstance(traceparent, str):
        headers.append((TRACEPARENT_HEADER, traceparent))
    return headers
