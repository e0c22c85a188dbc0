"""Verify an HTTP delivery: Standard Webhooks signing, and the scheduler's
``fence-signature``.

The node signs each request it delivers (``node/schedule/webhook.py``):

* ``webhook-signature``: ``v1,`` + base64 HMAC-SHA256 of
  ``{webhook-id}.{webhook-timestamp}.{body}`` under the tenant's secret
  (``whsec_`` + base64 key), several space separated during a rotation;
* ``fence-signature``: the same over ``{webhook-id}.{webhook-timestamp}.``
  and the values of ``schedule-id``, ``execute-at``, ``fence-token``,
  ``attempt`` and ``tenant`` joined by ``.``: a receiver that checks it may
  trust the fence token, and refuse a delivery whose token is lower than
  one it already took for the schedule (a stale owner's).

A timestamp further than ``tolerance`` from the receiver's clock is refused
(a replayed request), as Standard Webhooks asks.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

SECRET_PREFIX = "whsec_"
# The headers the fence signature covers, in order.
FENCE_SIGNED = ("schedule-id", "execute-at", "fence-token", "attempt", "tenant")
DEFAULT_TOLERANCE = 300.0  # seconds, as Standard Webhooks' libraries


class WebhookVerificationError(Exception):
    """The request is not one the scheduler signed with this secret, or is too old."""


@dataclass(frozen=True)
class Delivery:
    """A verified delivery: who it is for, and its fence."""

    webhook_id: str
    timestamp: int
    schedule_id: str | None
    execute_at: str | None
    fence_token: int | None  # None: the fence signature was not checked
    attempt: int | None
    tenant: str | None


def secret_key(secret: str | bytes) -> bytes:
    """The HMAC key of a ``whsec_`` secret (raw bytes are taken as the key)."""
    if isinstance(secret, bytes):
        return secret
    text = secret.removeprefix(SECRET_PREFIX)
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise ValueError("a signing secret is whsec_ followed by base64") from None


def _sign(key: bytes, content: bytes) -> str:
    return base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()


def _matches(keys: Sequence[bytes], content: bytes, header: str) -> bool:
    """Whether any ``v1,`` signature in ``header`` is ``content``'s under any key."""
    given = [part.split(",", 1)[1] for part in header.split() if part.startswith("v1,")]
    for key in keys:
        expected = _sign(key, content)
        if any(hmac.compare_digest(expected, signature) for signature in given):
            return True
    return False


class Verifier:
    """Checks deliveries signed with ``secrets`` (several during a rotation).

    ``verify(headers, body)`` returns the ``Delivery`` or raises
    ``WebhookVerificationError``. ``fence=True`` (the default) also
    requires a valid ``fence-signature``, so that ``fence_token`` can be
    trusted. ``clock`` gives the receiver's time (seconds since the epoch)."""

    def __init__(
        self,
        *secrets: str | bytes,
        tolerance: float = DEFAULT_TOLERANCE,
        fence: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not secrets:
            raise ValueError("name at least one secret")
        self.keys = [secret_key(s) for s in secrets]
        self.tolerance = tolerance
        self.fence = fence
        self.clock = clock

    def verify(self, headers: Mapping[str, str], body: bytes) -> Delivery:
        lower = {name.lower(): value for name, value in headers.items()}
        webhook_id = lower.get("webhook-id")
        stamp = lower.get("webhook-timestamp")
        signature = lower.get("webhook-signature")
        if not webhook_id or not stamp or not signature:
            raise WebhookVerificationError("missing webhook-id, -timestamp or -signature")
        try:
            timestamp = int(stamp)
        except ValueError:
            raise WebhookVerificationError("webhook-timestamp is not an integer") from None
        if abs(self.clock() - timestamp) > self.tolerance:
            raise WebhookVerificationError("webhook-timestamp is outside the tolerance")
        prefix = f"{webhook_id}.{timestamp}.".encode()
        if not _matches(self.keys, prefix + body, signature):
            raise WebhookVerificationError("no webhook-signature matches")
        token: int | None = None
        if self.fence:
            fenced = ".".join(lower.get(name, "") for name in FENCE_SIGNED).encode()
            if not _matches(self.keys, prefix + fenced, lower.get("fence-signature", "")):
                raise WebhookVerificationError("no fence-signature matches")
            token = _integer(lower.get("fence-token"))
        return Delivery(
            webhook_id=webhook_id,
            timestamp=timestamp,
            schedule_id=lower.get("schedule-id"),
            execute_at=lower.get("execute-at"),
            fence_token=token,
            attempt=_integer(lower.get("attempt")),
            tenant=lower.get("tenant"),
        )


def _integer(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def verify(
    secret: str | bytes,
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    fence: bool = True,
) -> Delivery:
    """``Verifier(secret).verify(headers, body)``."""
    return Verifier(secret, tolerance=tolerance, fence=fence).verify(headers, body)
