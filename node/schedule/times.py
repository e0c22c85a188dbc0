"""Times and durations as the API writes them: RFC 3339 with an explicit
offset in, UTC with milliseconds and a Z out (what BSON dates hold); ISO 8601
durations of fixed length; and the node's wall clock at that precision."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from node.errors import ValidationFailed

# RFC 3339 date-time: a 'T' (or space-free 't') separator and an explicit offset.
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")
# ISO-8601 durations, the subset with a fixed length: weeks alone, or days and
# a time part. Hand-written because isodate would parse years and months into
# calendar Durations, which are rejected anyway (that is what cron is for).
_WEEKS = re.compile(r"^P(\d{1,9})W$")
_DURATION = re.compile(
    r"^P(?:(\d{1,9})D)?(?:T(?:(\d{1,9})H)?(?:(\d{1,9})M)?(?:(\d{1,9})(?:\.(\d{1,3}))?S)?)?$"
)
_CALENDAR_UNITS = re.compile(r"^P\d+[YM]")


# A date-time as RFC 3339 writes it but for the offset: the usual mistake.
_NAIVE = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?$")


def parse_time(text: object, field: str) -> datetime:
    if not isinstance(text, str) or not _RFC3339.fullmatch(text):
        if isinstance(text, str) and _NAIVE.fullmatch(text):
            # The caller's own time with an offset, not a made-up example
            # (one far off would then fail the horizon).
            fixed = text.replace(" ", "T")
            raise ValidationFailed(
                f"{field} has no offset: write {fixed}Z for UTC, or {fixed}+01:00 and the like",
                field,
            )
        raise ValidationFailed(
            f"{field} must be an RFC 3339 time with an offset: YYYY-MM-DDTHH:MM:SSZ for UTC, "
            "or ending +HH:MM or -HH:MM",
            field,
        )
    try:
        parsed = datetime.fromisoformat(text.upper().replace("Z", "+00:00"))
        # 0001-01-01T00:00:00+01:00 is a valid time that leaves datetime's range once UTC.
        parsed = parsed.astimezone(UTC)
    except ValueError as exc:
        raise ValidationFailed(f"{field} is not a valid time: {exc}", field) from None
    except OverflowError:
        raise ValidationFailed(f"{field} is out of range once made UTC", field) from None
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


# Chaos testing only (CHAOS_CLOCK_SKEW): this process's wall clock, off by
# this much, as a host's clock can be. Never set in production.
_skew = timedelta(0)


def skew_wall_clock(seconds: float) -> None:
    """Make ``utcnow`` run ``seconds`` off (chaos testing only)."""
    global _skew
    _skew = timedelta(seconds=seconds)


def utcnow() -> datetime:
    """Wall-clock now, truncated to what BSON stores."""
    now = datetime.now(UTC) + _skew
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


# -- durations ----------------------------------------------------------------


def parse_duration(text: object, field: str) -> timedelta:
    """A positive ISO-8601 duration of fixed length: ``PnW`` or
    ``P[nD][T[nH][nM][n[.fff]S]]``. Years and months have no fixed length and
    are rejected."""
    if not isinstance(text, str):
        raise ValidationFailed(f"{field} must be an ISO-8601 duration like PT15M", field)
    if _CALENDAR_UNITS.match(text):
        raise ValidationFailed(
            f"{field} cannot use years or months (they have no fixed length); "
            "use cron for calendar schedules",
            field,
        )
    try:
        if weeks := _WEEKS.fullmatch(text):
            value = timedelta(weeks=int(weeks.group(1)))
        elif (parts := _DURATION.fullmatch(text)) and text not in {"P", "PT"} and text[-1] != "T":
            days, hours, minutes, seconds, fraction = parts.groups()
            value = timedelta(
                days=int(days or 0),
                hours=int(hours or 0),
                minutes=int(minutes or 0),
                seconds=int(seconds or 0),
                milliseconds=int((fraction or "0").ljust(3, "0")),
            )
        else:
            raise ValidationFailed(
                f"{field} must be an ISO-8601 duration like PT15M, P1DT2H or P2W", field
            )
    except OverflowError:
        raise ValidationFailed(f"{field} is too large", field) from None
    if value <= timedelta(0):
        raise ValidationFailed(f"{field} must be longer than zero", field)
    return value


def format_duration(value: timedelta) -> str:
    """The ISO-8601 form ``parse_duration`` reads back: PT15M, P1DT2H, PT0.5S."""
    if value < timedelta(0):
        raise ValueError("negative duration")
    seconds = value.seconds
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    millis = value.microseconds // 1000
    text = "P"
    if value.days:
        text += f"{value.days}D"
    clock = ""
    if hours:
        clock += f"{hours}H"
    if minutes:
        clock += f"{minutes}M"
    if seconds or millis:
        clock += f"{seconds}.{millis:03d}".rstrip("0").rstrip(".") + "S"
    if clock:
        text += "T" + clock
    return text if text != "P" else "PT0S"
