"""The HTTP request a schedule with an ``http`` target becomes (DESIGN.md
"HTTP delivery"), and how it is signed: the HTTP twin of ``record.py``.

Body: the payload bytes (a JSON payload as UTF-8 JSON, ``content-type:
application/json``; a base64 one as ``application/octet-stream``). Headers:
the caller's ``http.headers``, then the scheduler's: ``schedule-id``,
``execute-at``, ``fence-token``, ``attempt``, ``tenant``, the request id
(``x-request-id``) and ``traceparent`` of the call that made or last changed
it (``trace.py``), and Standard Webhooks signing:

* ``webhook-id``: the same for every attempt of one occurrence (a receiver
  drops repeats by it); a digest of the schedule, its life and the time
  the occurrence is for;
* ``webhook-timestamp``: seconds since the epoch, when sent;
* ``webhook-signature``: ``v1,`` + base64 HMAC-SHA256 of
  ``{webhook-id}.{webhook-timestamp}.{body}`` under each valid secret
  (space separated: two during a rotation);
* ``fence-signature``: the same, of ``{webhook-id}.{webhook-timestamp}.``
  followed by the signed header set ``schedule-id``, ``execute-at``,
  ``fence-token``, ``attempt``, ``tenant`` (their values joined by ``.``):
  a receiver that checks it may trust the fence token, and refuse a
  delivery whose token is lower than one it already took for the schedule
  (a stale owner's).

Pure: no IO, no clock (the timestamp is passed in).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from node.schedule.destination import FENCE_SIGNED
from node.schedule.model import public_id
from node.schedule.payload import payload_of
from node.schedule.times import format_time
from node.schedule.trace import HTTP_REQUEST_ID, delivery_headers

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
CONTENT_TYPES = {"json": "application/json", "base64": "application/octet-stream"}


@dataclass(frozen=True)
class HttpCall:
    """One delivery attempt as an HTTP request, not yet signed."""

    url: str
    method: str
    headers: list[tuple[str, str]]  # the caller's, then the scheduler's
    body: bytes
    timeout: float  # seconds, for the whole request
    tenant: str
    webhook_id: str
    # The operator's own URL (the dead-letter URL), not a tenant's: the
    # egress policy does not apply to it.
    trusted: bool = False

    def header(self, name: str) -> str | None:
        return next((v for n, v in self.headers if n == name), None)


def build_call(doc: dict[str, Any], token: int, attempt: int) -> HttpCall:
    """The request for one attempt of ``doc`` (its ``http`` target) under
    the fence ``token``."""
    target = doc["http"]
    schedule_id = public_id(str(doc["_id"]))
    # An extra occurrence of a recurring schedule (a trigger) is for the
    # time it was asked for; its chain's executeAt is the next occurrence.
    triggered = doc.get("triggeredAt") if doc.get("recurrence") else None
    execute_at = format_time(triggered if triggered is not None else doc["executeAt"]) or ""
    tenant = str(doc["tenant"])
    own = [
        ("schedule-id", schedule_id),
        ("execute-at", execute_at),
        ("fence-token", str(token)),
        ("attempt", str(attempt)),
        ("tenant", tenant),
        ("content-type", CONTENT_TYPES.get(str(doc.get("payloadFormat")), CONTENT_TYPES["json"])),
        *delivery_headers(doc, HTTP_REQUEST_ID),
    ]
    created = format_time(doc.get("createdAt")) or ""
    return HttpCall(
        url=str(target["url"]),
        method=str(target.get("method", "POST")),
        headers=[*(target.get("headers") or {}).items(), *own],
        body=payload_of(doc),
        timeout=float(target.get("timeout", 10.0)),
        tenant=tenant,
        webhook_id=webhook_id(str(doc["_id"]), created, execute_at),
    )


def webhook_id(stored_id: str, created: str, execute_at: str) -> str:
    """The same for every attempt of one occurrence of one life of a
    schedule (an id used again after its schedule ended is another life)."""
    digest = hashlib.sha256(f"{stored_id}\x00{created}\x00{execute_at}".encode()).hexdigest()
    return f"msg_{digest[:32]}"


def signed_headers(call: HttpCall, keys: Sequence[bytes], timestamp: int) -> list[tuple[str, str]]:
    """The signing headers of ``call`` sent at ``timestamp``, one signature
    per key (newest first)."""
    prefix = f"{call.webhook_id}.{timestamp}.".encode()
    fenced = ".".join(call.header(name) or "" for name in FENCE_SIGNED).encode()
    return [
        ("webhook-id", call.webhook_id),
        ("webhook-timestamp", str(timestamp)),
        ("webhook-signature", " ".join(_sign(key, prefix + call.body) for key in keys)),
        ("fence-signature", " ".join(_sign(key, prefix + fenced) for key in keys)),
    ]


def _sign(key: bytes, content: bytes) -> str:
    digest = hmac.new(key, content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def new_secret() -> str:
    """A signing secret as Standard Webhooks writes one: ``whsec_`` + base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_`` secret. Raises ValueError if malformed."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"a signing secret starts with {SECRET_PREFIX!r}")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except ValueError:
        raise ValueError("a signing secret is whsec_ followed by base64") from None
    if not 24 <= len(key) <= 64:
        raise ValueError("a signing secret holds 24 to 64 bytes")
    return key
