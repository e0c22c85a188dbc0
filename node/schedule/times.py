"""Times as the API writes them: RFC 3339 with an explicit offset in,
UTC with milliseconds and a Z out (what BSON dates hold)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from node.errors import ValidationFailed

# RFC 3339 date-time: a 'T' (or space-free 't') separator and an explicit offset.
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")


def parse_time(text: object, field: str) -> datetime:
    if not isinstance(text, str) or not _RFC3339.match(text):
        raise ValidationFailed(
            f"{field} must be an RFC 3339 time with an offset, like 2030-01-02T03:04:05Z", field
        )
    try:
        parsed = datetime.fromisoformat(text.upper().replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValidationFailed(f"{field} is not a valid time: {exc}", field) from None
    parsed = parsed.astimezone(UTC)
    # BSON dates hold milliseconds; keep what is stored and what is compared equal.
    return parsed.replace(microsecond=parsed.microsecond // 1000 * 1000)


def format_time(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:  # pymongo returns naive UTC unless tz_aware
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def aware(value: datetime) -> datetime:
    """A stored time as an aware UTC datetime (pymongo returns naive UTC
    unless the client is tz_aware)."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
