"""Recurring schedules: the "recurrence" object of a request, its validation,
the document it becomes, and the arithmetic of its occurrences.

Everything here is pure: no IO and no clock reads, the current time is always
passed in. All datetimes in and out are aware UTC with millisecond precision
(what BSON stores), so what is computed and what is stored compare equal.

Two kinds:

* ``every``: a fixed elapsed time (ISO-8601 duration). Occurrences are
  ``start + k * every`` for k >= 0, computed in integer milliseconds, so they
  ignore DST and any occurrence is O(1) to find.
* ``cron``: a 5-field cron expression evaluated in an IANA zone by cronsim,
  which follows Debian (Vixie) cron across DST switches:

  - Fixed-time jobs (neither the minute nor the hour field starts with ``*``)
    follow local wall time: "0 9 * * *" stays at 09:00 local, so its UTC
    instant moves by an hour at a switch. A time inside the spring-forward gap
    fires once at the first valid instant after the gap ("30 2 * * *" in
    Europe/Berlin on 2026-03-29 fires at 03:00 CEST, 01:00Z). A time the
    fall-back repeats fires once, at its first (summer-time) instance.
  - Jobs whose minute or hour field starts with ``*`` (``30 * * * *``,
    ``*/15 * * * *``) follow real elapsed time: both 02:30s of a fall-back day
    fire, and spring-forward goes 01:30 CET -> 03:30 CEST, one real hour.

  What this module adds to cronsim: it never returns an occurrence at or before
  the instant searched from (cronsim searches in wall time, so from the second
  pass through a repeated hour it can answer the first pass), it applies
  start/end, it rejects 6-field (seconds) expressions, and it bounds the
  counting of occurrences skipped after an outage.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, available_timezones

from cronsim import CronSim, CronSimError

from node.errors import ValidationFailed
from node.schedule.times import format_duration, format_time, parse_duration, parse_time

DEFAULT_TIME_ZONE = "UTC"
DEFAULT_MAX_CATCH_UP = 10
MAX_CATCH_UP_LIMIT = 1000
MIN_EVERY = timedelta(seconds=1)
# Past this an interval is not a recurring job any more, and the grid
# arithmetic would run off the end of the datetime range.
MAX_EVERY = timedelta(days=3660)
MAX_CRON_LENGTH = 200
# Counting the occurrences an outage jumped over walks cron one occurrence at a
# time; past this many the count is reported as this number (a year of
# "* * * * *" is half a million steps, and the exact figure is not worth it).
SKIPPED_COUNT_CAP = 10_000

_FIELDS = frozenset({"every", "cron", "timeZone", "start", "end", "misfire", "maxCatchUp"})
_MS = timedelta(milliseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Misfire(enum.StrEnum):
    """What to do with occurrences missed by more than the misfire threshold."""

    FIRE_ONCE = "fire_once"  # deliver the late one, then jump to the present
    FIRE_ALL = "fire_all"  # deliver up to maxCatchUp late ones, then jump
    SKIP = "skip"  # deliver none of them, jump to the present


@dataclass(frozen=True)
class Advance:
    """Where a chain goes after an occurrence completes.

    ``next_at`` is None when the chain has ended. ``late_streak`` is stored with
    ``next_at`` and passed back to the next ``advance``. ``skipped`` counts the
    occurrences jumped over without being delivered (capped for cron).
    """

    next_at: datetime | None
    late_streak: int
    skipped: int


def is_misfired(execute_at: datetime, now: datetime, threshold: timedelta) -> bool:
    """Whether an occurrence is missed: later than the threshold, not just late."""
    return _utc_ms(now) - _utc_ms(execute_at) > threshold


@dataclass(frozen=True, kw_only=True)
class Recurrence:
    every: timedelta | None = None
    cron: str | None = None
    time_zone: str = DEFAULT_TIME_ZONE
    start: datetime | None = None
    end: datetime | None = None
    misfire: Misfire = Misfire.FIRE_ONCE
    max_catch_up: int = DEFAULT_MAX_CATCH_UP

    def __post_init__(self) -> None:
        if (self.every is None) == (self.cron is None):
            raise ValueError("a Recurrence has exactly one of every and cron")

    # -- documents ---------------------------------------------------------

    def to_document(self) -> dict[str, Any]:
        """The BSON form: the interval as integer milliseconds, times as datetimes."""
        doc: dict[str, Any] = {}
        if self.every is not None:
            doc["everyMs"] = self.every // _MS
        if self.cron is not None:
            doc["cron"] = self.cron
            doc["timeZone"] = self.time_zone
        doc["start"] = self.start
        doc["end"] = self.end
        doc["misfire"] = self.misfire.value
        doc["maxCatchUp"] = self.max_catch_up
        return doc

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> Recurrence:
        every_ms = doc.get("everyMs")
        start = doc.get("start")
        end = doc.get("end")
        return cls(
            every=None if every_ms is None else timedelta(milliseconds=every_ms),
            cron=doc.get("cron"),
            time_zone=doc.get("timeZone", DEFAULT_TIME_ZONE),
            start=None if start is None else _utc_ms(start),
            end=None if end is None else _utc_ms(end),
            misfire=Misfire(doc.get("misfire", Misfire.FIRE_ONCE.value)),
            max_catch_up=doc.get("maxCatchUp", DEFAULT_MAX_CATCH_UP),
        )

    def to_view(self) -> dict[str, Any]:
        """The API form: the request's keys with defaults filled in.

        It is itself a valid request (timeZone only with cron, maxCatchUp only
        with fire_all), so a caller can send back what it was shown.
        """
        view: dict[str, Any] = {}
        if self.every is not None:
            view["every"] = format_duration(self.every)
        if self.cron is not None:
            view["cron"] = self.cron
            view["timeZone"] = self.time_zone
        if self.start is not None:
            view["start"] = format_time(self.start)
        if self.end is not None:
            view["end"] = format_time(self.end)
        view["misfire"] = self.misfire.value
        if self.misfire is Misfire.FIRE_ALL:
            view["maxCatchUp"] = self.max_catch_up
        return view

    # -- occurrences -------------------------------------------------------

    def first(self, now: datetime) -> datetime | None:
        """The first occurrence at or after ``now`` (None if past ``end``).

        Interval: the first ``start + k * every`` >= now; without a start the
        grid is anchored at ``now + every`` (``parse_recurrence`` stores that
        anchor as ``start``). Cron: the first match >= max(now, start); a match
        at exactly ``now`` counts, it is simply due at once.
        """
        now = _utc_ms(now)
        if self.every is not None:
            anchor = self.start if self.start is not None else now + self.every
            return self._grid_at_or_after(anchor, now)
        floor = now if self.start is None or self.start < now else self.start
        return self._cron_at_or_after(floor)

    def after(self, t: datetime) -> datetime | None:
        """The next occurrence strictly after ``t`` (None if past ``end``).

        Without a stored start an interval has no grid; it then runs ``every``
        after ``t``.
        """
        t = _utc_ms(t)
        if self.every is not None:
            anchor = self.start if self.start is not None else t + self.every
            return self._grid_at_or_after(anchor, t + _MS)
        return self._cron_at_or_after(t + _MS)

    def advance(
        self, current: datetime, now: datetime, late_streak: int, threshold: timedelta
    ) -> Advance:
        """The occurrence after ``current``, which completed (delivered, failed
        for good, or skipped) at ``now``.

        The next occurrence n is missed when ``now - n > threshold``; lateness
        within the threshold is ordinary and n is kept. A missed n is kept under
        fire_all while the streak allows; otherwise, and under fire_once and
        skip, the chain jumps to the first occurrence >= ``now - threshold``,
        counting the ones jumped over in ``skipped``.

        ``late_streak`` is how many occurrences before ``current`` were kept
        late in a row; ``current`` itself counts toward maxCatchUp, so after an
        outage at most maxCatchUp occurrences fire late (with maxCatchUp 1 only
        ``current``). A fresh chain, or one back on time, has 0.
        """
        current = _utc_ms(current)
        now = _utc_ms(now)
        n = self.after(current)
        if n is None:
            return Advance(next_at=None, late_streak=0, skipped=0)
        if not is_misfired(n, now, threshold):
            return Advance(next_at=n, late_streak=0, skipped=0)
        if self.misfire is Misfire.FIRE_ALL and late_streak < self.max_catch_up - 1:
            return Advance(next_at=n, late_streak=late_streak + 1, skipped=0)
        cutoff = now - threshold
        if self.every is not None:
            # n is on the grid (with or without a stored start), so anchor there.
            target = self._grid_at_or_after(n, cutoff)
            return Advance(next_at=target, late_streak=0, skipped=self._grid_count(n, cutoff))
        return Advance(
            next_at=self._cron_at_or_after(cutoff),
            late_streak=0,
            skipped=self._cron_count(n, cutoff),
        )

    def should_skip(self, execute_at: datetime, now: datetime, threshold: timedelta) -> bool:
        """Whether the skip policy drops this occurrence instead of delivering it."""
        return self.misfire is Misfire.SKIP and is_misfired(execute_at, now, threshold)

    # -- interval arithmetic (integer milliseconds, O(1)) ------------------

    def _grid_at_or_after(self, anchor: datetime, x: datetime) -> datetime | None:
        assert self.every is not None
        step = self.every // _MS
        offset = _to_ms(x) - _to_ms(anchor)
        k = 0 if offset <= 0 else -(-offset // step)  # ceiling division
        found = _from_ms(_to_ms(anchor) + k * step)
        if found is None or (self.end is not None and found > self.end):
            return None
        return found

    def _grid_count(self, n: datetime, cutoff: datetime) -> int:
        """Occurrences in [n, cutoff) that are not past ``end``; n is on the grid."""
        assert self.every is not None
        step = self.every // _MS
        count = -(-(_to_ms(cutoff) - _to_ms(n)) // step)
        if self.end is not None:
            count = min(count, (_to_ms(self.end) - _to_ms(n)) // step + 1)
        return max(count, 0)

    # -- cron --------------------------------------------------------------

    def _cron_at_or_after(self, x: datetime) -> datetime | None:
        if self.start is not None and x < self.start:
            x = self.start
        return next(self._cron_after(x - _MS), None)

    def _cron_count(self, n: datetime, cutoff: datetime) -> int:
        """Occurrences in [n, cutoff), at most SKIPPED_COUNT_CAP; n is one."""
        count = 1
        for occurrence in self._cron_after(n):
            if occurrence >= cutoff or count >= SKIPPED_COUNT_CAP:
                break
            count += 1
        return count

    def _cron_after(self, t: datetime) -> Iterator[datetime]:
        """Cron matches strictly after ``t``, ascending, up to ``end``."""
        assert self.cron is not None
        matches = CronSim(self.cron, t.astimezone(_zone(self.time_zone)))
        last = t
        while True:
            try:
                local = next(matches)
            except (StopIteration, OverflowError, ValueError):
                return  # no match within 50 years, or past year 9999
            instant = local.astimezone(UTC)
            # cronsim walks fixed-time jobs in wall time: searching from the
            # second 02:10 of a fall-back night it answers the first 02:30,
            # which is before t. That one has already fired; keep going.
            if instant <= last:
                continue
            if self.end is not None and instant > self.end:
                return
            last = instant
            yield instant


# -- validation ---------------------------------------------------------------


def parse_recurrence(data: object, now: datetime) -> Recurrence:
    """The validated ``recurrence`` object of a request. Raises ValidationFailed
    naming ``recurrence.<key>``.

    An interval without a start gets ``start = now + every``, so the stored
    document carries its own grid.
    """
    fields = _recurrence_fields(data)
    now = _utc_ms(now)
    every, cron, time_zone = _parse_kind(fields)
    start, end = _parse_window(fields)
    misfire = _parse_misfire(fields)
    max_catch_up = _parse_max_catch_up(fields, misfire)
    if every is not None and start is None:
        start = now + every
    recurrence = Recurrence(
        every=every,
        cron=cron,
        time_zone=time_zone,
        start=start,
        end=end,
        misfire=misfire,
        max_catch_up=max_catch_up,
    )
    if recurrence.first(now) is None:
        field = "recurrence.end" if end is not None else "recurrence.cron"
        raise ValidationFailed("recurrence has no occurrence from now on", field)
    return recurrence


def _recurrence_fields(data: object) -> dict[str, Any]:
    """The object, if it names only known fields and exactly one of every and cron."""
    if not isinstance(data, dict):
        raise ValidationFailed("recurrence must be an object", "recurrence")
    for key in sorted(data, key=str):
        if key not in _FIELDS:
            raise ValidationFailed(f"recurrence.{key} is not a known field", f"recurrence.{key}")
    if "every" in data and "cron" in data:
        raise ValidationFailed(
            "recurrence takes exactly one of every and cron, not both", "recurrence.cron"
        )
    if "every" not in data and "cron" not in data:
        raise ValidationFailed("recurrence needs one of every or cron", "recurrence")
    return data


def _parse_kind(data: dict[str, Any]) -> tuple[timedelta | None, str | None, str]:
    """(every, cron, timeZone): an interval has no time zone of its own."""
    if "every" in data:
        every = _parse_every(data["every"])
        if "timeZone" in data:
            raise ValidationFailed(
                "recurrence.timeZone only applies to cron (every is elapsed time)",
                "recurrence.timeZone",
            )
        return every, None, DEFAULT_TIME_ZONE
    time_zone = _parse_time_zone(data.get("timeZone", DEFAULT_TIME_ZONE))
    return None, _parse_cron(data["cron"]), time_zone


def _parse_window(data: dict[str, Any]) -> tuple[datetime | None, datetime | None]:
    """(start, end), either absent."""
    start = parse_time(data["start"], "recurrence.start") if "start" in data else None
    end = parse_time(data["end"], "recurrence.end") if "end" in data else None
    if start is not None and end is not None and end <= start:
        raise ValidationFailed("recurrence.end must be after recurrence.start", "recurrence.end")
    return start, end


def _parse_misfire(data: dict[str, Any]) -> Misfire:
    misfire_text = data.get("misfire", Misfire.FIRE_ONCE.value)
    if misfire_text not in {m.value for m in Misfire}:
        raise ValidationFailed(
            "recurrence.misfire must be one of fire_once, fire_all, skip", "recurrence.misfire"
        )
    return Misfire(misfire_text)


def _parse_max_catch_up(data: dict[str, Any], misfire: Misfire) -> int:
    if "maxCatchUp" not in data:
        return DEFAULT_MAX_CATCH_UP
    if misfire is not Misfire.FIRE_ALL:
        raise ValidationFailed(
            "recurrence.maxCatchUp only applies with misfire fire_all",
            "recurrence.maxCatchUp",
        )
    max_catch_up = data["maxCatchUp"]
    if (
        not isinstance(max_catch_up, int)
        or isinstance(max_catch_up, bool)
        or not 1 <= max_catch_up <= MAX_CATCH_UP_LIMIT
    ):
        raise ValidationFailed(
            f"recurrence.maxCatchUp must be an integer from 1 to {MAX_CATCH_UP_LIMIT}",
            "recurrence.maxCatchUp",
        )
    return max_catch_up


def _parse_every(value: object) -> timedelta:
    every = parse_duration(value, "recurrence.every")
    if every < MIN_EVERY:
        raise ValidationFailed("recurrence.every must be at least 1 second", "recurrence.every")
    if every > MAX_EVERY:
        raise ValidationFailed(
            f"recurrence.every must be at most P{MAX_EVERY.days}D", "recurrence.every"
        )
    return every


def _parse_cron(value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_CRON_LENGTH:
        raise ValidationFailed(
            f"recurrence.cron must be a cron expression of at most {MAX_CRON_LENGTH} characters",
            "recurrence.cron",
        )
    # cronsim also reads a 6-field form with seconds, which Debian cron (and
    # its DST behaviour) does not have.
    if len(value.split()) != 5:
        raise ValidationFailed(
            "recurrence.cron must have 5 fields: minute hour day-of-month month day-of-week",
            "recurrence.cron",
        )
    try:
        CronSim(value, datetime(2000, 1, 1, tzinfo=UTC))
    except (CronSimError, ValueError) as exc:
        raise ValidationFailed(
            f"recurrence.cron is not a valid cron expression: {exc}", "recurrence.cron"
        ) from None
    return value


def _parse_time_zone(value: object) -> str:
    if not isinstance(value, str) or value not in _known_zones():
        raise ValidationFailed(
            "recurrence.timeZone must be an IANA time zone like Europe/Berlin",
            "recurrence.timeZone",
        )
    return value


@lru_cache(maxsize=1)
def _known_zones() -> frozenset[str]:
    # The listed IANA names only (ZoneInfo() alone opens any file under the
    # zoneinfo path), less "localtime": that is the host's zone, and the nodes
    # of a cluster must agree on what a schedule means.
    return frozenset(available_timezones()) - {"localtime"}


def _zone(key: str) -> tzinfo:
    # cronsim skips its DST handling for datetime.UTC, which has none to do.
    return UTC if key == "UTC" else ZoneInfo(key)


# -- time helpers -------------------------------------------------------------


def _utc_ms(value: datetime) -> datetime:
    """Aware UTC, truncated to milliseconds; naive is taken as UTC (pymongo)."""
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def _to_ms(value: datetime) -> int:
    return (value - _EPOCH) // _MS


def _from_ms(millis: int) -> datetime | None:
    try:
        return _EPOCH + timedelta(milliseconds=millis)
    except OverflowError:  # past year 9999: no such occurrence
        return None
