"""node.recurrence: validation, documents, occurrences across DST, misfires.

Deterministic: every "now" is a literal, nothing reads the clock.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from node.errors import ValidationFailed
from node.schedule.recurrence import (
    SKIPPED_COUNT_CAP,
    Advance,
    Misfire,
    Recurrence,
    is_misfired,
    parse_recurrence,
)
from node.schedule.times import format_duration, parse_duration

NOW = datetime(2026, 1, 1, 0, 0, tzinfo=UTC)
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
THRESHOLD = timedelta(seconds=60)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, sec: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, sec, tzinfo=UTC)


def cron(expr: str, zone: str = "UTC", **extra: Any) -> Recurrence:
    return Recurrence(cron=expr, time_zone=zone, **extra)


def run(rec: Recurrence, since: datetime, until: datetime) -> list[datetime]:
    """The occurrences in (since, until], by chaining after()."""
    found: list[datetime] = []
    t = rec.after(since)
    while t is not None and t <= until:
        found.append(t)
        t = rec.after(t)
    return found


def local(times: list[datetime], zone: ZoneInfo) -> list[str]:
    return [t.astimezone(zone).strftime("%m-%d %H:%M %Z") for t in times]


# -- durations ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("PT15M", timedelta(minutes=15)),
        ("P1DT2H", timedelta(days=1, hours=2)),
        ("PT0.5S", timedelta(milliseconds=500)),
        ("PT1.25S", timedelta(seconds=1, milliseconds=250)),
        ("PT90S", timedelta(seconds=90)),
        ("P2W", timedelta(days=14)),
        ("P1D", timedelta(days=1)),
        ("PT1H2M3.004S", timedelta(hours=1, minutes=2, seconds=3, milliseconds=4)),
    ],
)
def test_parse_duration(text: str, value: timedelta) -> None:
    assert parse_duration(text, "f") == value
    assert parse_duration(format_duration(value), "f") == value


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(minutes=15), "PT15M"),
        (timedelta(days=1, hours=2), "P1DT2H"),
        (timedelta(milliseconds=500), "PT0.5S"),
        (timedelta(seconds=90), "PT1M30S"),
        (timedelta(days=14), "P14D"),
        (timedelta(seconds=1, milliseconds=250), "PT1.25S"),
        (timedelta(0), "PT0S"),
    ],
)
def test_format_duration(value: timedelta, text: str) -> None:
    assert format_duration(value) == text


@pytest.mark.parametrize(
    "text",
    # "P1D\n": a regex's $ matches before a final newline; the parser must not.
    [
        "",
        "P",
        "PT",
        "P1DT",
        "15M",
        "PT1.2345S",
        "-PT1M",
        "P1W2D",
        "pt1m",
        "PT1,5S",
        "P1D\n",
        15,
        None,
    ],
)
def test_parse_duration_rejects_malformed(text: object) -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_duration(text, "recurrence.every")
    assert caught.value.field == "recurrence.every"


@pytest.mark.parametrize("text", ["P1M", "P1Y", "P1Y2M", "P3M1D"])
def test_parse_duration_points_calendar_units_at_cron(text: str) -> None:
    with pytest.raises(ValidationFailed, match="use cron"):
        parse_duration(text, "recurrence.every")


def test_parse_duration_must_be_positive() -> None:
    with pytest.raises(ValidationFailed, match="longer than zero"):
        parse_duration("PT0S", "f")


def test_parse_duration_overflow_is_a_validation_error() -> None:
    with pytest.raises(ValidationFailed, match="too large"):
        parse_duration("P999999999W", "f")


# -- parsing and validation ---------------------------------------------------


def test_interval_without_start_is_anchored_at_now_plus_every() -> None:
    rec = parse_recurrence({"every": "PT15M"}, NOW)
    assert rec.every == timedelta(minutes=15)
    assert rec.start == NOW + timedelta(minutes=15)
    assert rec.first(NOW) == NOW + timedelta(minutes=15)
    assert rec.to_view() == {
        "every": "PT15M",
        "start": "2026-01-01T00:15:00.000Z",
        "misfire": "fire_once",
    }


def test_now_is_truncated_to_milliseconds() -> None:
    rec = parse_recurrence({"every": "PT1S"}, NOW + timedelta(microseconds=1999))
    assert rec.start == NOW + timedelta(seconds=1, milliseconds=1)


def test_cron_defaults() -> None:
    rec = parse_recurrence({"cron": "0 9 * * 1-5"}, NOW)
    assert rec == Recurrence(cron="0 9 * * 1-5")
    assert rec.time_zone == "UTC"
    assert rec.misfire is Misfire.FIRE_ONCE
    assert rec.max_catch_up == 10
    assert rec.to_view() == {"cron": "0 9 * * 1-5", "timeZone": "UTC", "misfire": "fire_once"}


def test_full_cron_request() -> None:
    data = {
        "cron": "0 9 * * 1-5",
        "timeZone": "Europe/Berlin",
        "start": "2026-02-01T00:00:00+01:00",
        "end": "2026-12-31T00:00:00Z",
        "misfire": "fire_all",
        "maxCatchUp": 3,
    }
    rec = parse_recurrence(data, NOW)
    assert rec.start == utc(2026, 1, 31, 23, 0)
    assert rec.max_catch_up == 3
    assert rec.to_view() == {
        **data,
        "start": "2026-01-31T23:00:00.000Z",
        "end": "2026-12-31T00:00:00.000Z",
    }


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ("PT15M", "recurrence"),
        ({}, "recurrence"),
        ({"every": "PT15M", "cron": "* * * * *"}, "recurrence.cron"),
        ({"every": "P1M"}, "recurrence.every"),
        ({"every": "PT0S"}, "recurrence.every"),
        ({"every": "PT0.5S"}, "recurrence.every"),
        ({"every": "P9999D"}, "recurrence.every"),
        ({"every": 900}, "recurrence.every"),
        ({"cron": "61 * * * *"}, "recurrence.cron"),
        ({"cron": "* * * *"}, "recurrence.cron"),
        ({"cron": "0 * * * * *"}, "recurrence.cron"),  # seconds field: not Debian cron
        ({"cron": "0 0 31 2 *"}, "recurrence.cron"),
        ({"cron": "@daily"}, "recurrence.cron"),
        ({"cron": 5}, "recurrence.cron"),
        ({"cron": "* * * * *", "timeZone": "Mars/Olympus"}, "recurrence.timeZone"),
        ({"cron": "* * * * *", "timeZone": "localtime"}, "recurrence.timeZone"),
        ({"cron": "* * * * *", "timeZone": "../etc/passwd"}, "recurrence.timeZone"),
        ({"cron": "* * * * *", "timeZone": ""}, "recurrence.timeZone"),
        ({"every": "PT1H", "timeZone": "Europe/Berlin"}, "recurrence.timeZone"),
        ({"every": "PT1H", "maxCatchUp": 3}, "recurrence.maxCatchUp"),
        ({"every": "PT1H", "misfire": "fire_once", "maxCatchUp": 3}, "recurrence.maxCatchUp"),
        ({"every": "PT1H", "misfire": "fire_all", "maxCatchUp": 0}, "recurrence.maxCatchUp"),
        ({"every": "PT1H", "misfire": "fire_all", "maxCatchUp": 1001}, "recurrence.maxCatchUp"),
        ({"every": "PT1H", "misfire": "fire_all", "maxCatchUp": True}, "recurrence.maxCatchUp"),
        ({"every": "PT1H", "misfire": "fire_all", "maxCatchUp": 2.0}, "recurrence.maxCatchUp"),
        ({"every": "PT1H", "misfire": "later"}, "recurrence.misfire"),
        ({"every": "PT1H", "interval": "PT1H"}, "recurrence.interval"),
        ({"every": "PT1H", "start": "tomorrow"}, "recurrence.start"),
        ({"every": "PT1H", "end": "2026-01-01T00:00:00"}, "recurrence.end"),
        (
            {"every": "PT1H", "start": "2026-02-01T00:00:00Z", "end": "2026-01-01T00:00:00Z"},
            "recurrence.end",
        ),
        (
            {"every": "PT1H", "start": "2026-02-01T00:00:00Z", "end": "2026-02-01T00:00:00Z"},
            "recurrence.end",
        ),
        # Valid on its own, but over before it starts: no occurrence at all.
        ({"every": "PT1H", "end": "2026-01-01T00:30:00Z"}, "recurrence.end"),
        ({"cron": "0 9 * * *", "end": "2025-12-01T00:00:00Z"}, "recurrence.end"),
    ],
)
def test_validation_names_the_field(data: object, field: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_recurrence(data, NOW)
    assert caught.value.field == field
    assert caught.value.status == 400
    assert caught.value.message


def test_missing_kind_message() -> None:
    with pytest.raises(ValidationFailed, match="one of every or cron"):
        parse_recurrence({"start": "2026-02-01T00:00:00Z"}, NOW)


def test_the_view_is_a_request_for_the_same_recurrence() -> None:
    for data in (
        {"every": "PT15M"},
        {"every": "P1DT2H", "misfire": "fire_all", "end": "2027-01-01T00:00:00Z"},
        {"cron": "*/5 * * * *", "timeZone": "America/New_York", "misfire": "skip"},
    ):
        rec = parse_recurrence(data, NOW)
        assert parse_recurrence(rec.to_view(), NOW + timedelta(days=3)) == rec


# -- documents ----------------------------------------------------------------


def test_document_round_trip() -> None:
    for rec in (
        parse_recurrence({"every": "PT1.5S"}, NOW),
        parse_recurrence(
            {
                "cron": "0 9 * * 1-5",
                "timeZone": "Europe/Berlin",
                "start": "2026-02-01T00:00:00.123Z",
                "end": "2026-12-31T00:00:00Z",
                "misfire": "fire_all",
                "maxCatchUp": 7,
            },
            NOW,
        ),
    ):
        assert Recurrence.from_document(rec.to_document()) == rec


def test_document_shape() -> None:
    rec = parse_recurrence({"every": "PT1.5S", "misfire": "skip"}, NOW)
    assert rec.to_document() == {
        "everyMs": 1500,
        "start": NOW + timedelta(milliseconds=1500),
        "end": None,
        "misfire": "skip",
        "maxCatchUp": 10,
    }


def test_document_from_pymongo_naive_datetimes() -> None:
    rec = parse_recurrence({"cron": "0 9 * * *", "start": "2026-02-01T00:00:00Z"}, NOW)
    doc = rec.to_document()
    doc["start"] = datetime(2026, 2, 1)  # pymongo without tz_aware
    assert Recurrence.from_document(doc) == rec


def test_recurrence_needs_exactly_one_kind() -> None:
    with pytest.raises(ValueError):
        Recurrence()
    with pytest.raises(ValueError):
        Recurrence(every=timedelta(hours=1), cron="* * * * *")


# -- interval occurrences -----------------------------------------------------


def test_interval_start_in_the_past_lands_on_the_grid() -> None:
    rec = parse_recurrence({"every": "PT15M", "start": "2025-12-31T23:00:00Z"}, NOW)
    assert rec.first(utc(2026, 1, 1, 1, 7)) == utc(2026, 1, 1, 1, 15)
    assert rec.first(utc(2026, 1, 1, 1, 15)) == utc(2026, 1, 1, 1, 15)  # on the grid: due now
    assert rec.after(utc(2026, 1, 1, 1, 15)) == utc(2026, 1, 1, 1, 30)
    assert rec.after(utc(2026, 1, 1, 1, 15, 0) - timedelta(milliseconds=1)) == utc(
        2026, 1, 1, 1, 15
    )


def test_interval_start_in_the_future_is_the_first_occurrence() -> None:
    rec = parse_recurrence({"every": "PT1H", "start": "2026-01-05T10:00:00Z"}, NOW)
    assert rec.first(NOW) == utc(2026, 1, 5, 10)
    assert rec.after(NOW) == utc(2026, 1, 5, 10)


def test_interval_is_arithmetic_a_year_later() -> None:
    rec = parse_recurrence({"every": "PT7S", "start": "2026-01-01T00:00:00Z"}, NOW)
    later = utc(2027, 1, 1)  # 31_536_000 s = 4_505_142 * 7 + 6
    assert rec.after(later) == later + timedelta(seconds=1)


def test_interval_ignores_dst() -> None:
    # Midnight Berlin time before the spring-forward night.
    start = datetime(2026, 3, 29, 0, 0, tzinfo=BERLIN).astimezone(UTC)
    rec = Recurrence(every=timedelta(hours=1), start=start)
    times = run(rec, start - timedelta(seconds=1), start + timedelta(hours=4))
    assert {b - a for a, b in pairwise(times)} == {timedelta(hours=1)}
    assert local(times, BERLIN) == [
        "03-29 00:00 CET",
        "03-29 01:00 CET",
        "03-29 03:00 CEST",
        "03-29 04:00 CEST",
        "03-29 05:00 CEST",
    ]


def test_interval_end_is_inclusive_and_then_the_chain_ends() -> None:
    rec = parse_recurrence(
        {"every": "PT1H", "start": "2026-01-01T00:00:00Z", "end": "2026-01-01T03:00:00Z"}, NOW
    )
    assert run(rec, NOW - timedelta(seconds=1), utc(2030, 1, 1)) == [
        utc(2026, 1, 1, h) for h in range(4)
    ]
    assert rec.after(utc(2026, 1, 1, 3)) is None
    assert rec.first(utc(2026, 1, 1, 3, 0, 1)) is None


def test_interval_without_stored_start_runs_every_after_the_last() -> None:
    rec = Recurrence(every=timedelta(minutes=5))
    assert rec.after(utc(2026, 1, 1, 0, 1)) == utc(2026, 1, 1, 0, 6)


# -- cron occurrences ---------------------------------------------------------


def test_cron_first_is_at_or_after_now_and_start() -> None:
    rec = cron("0 9 * * *")
    assert rec.first(utc(2026, 1, 1, 9)) == utc(2026, 1, 1, 9)  # due exactly now
    assert rec.first(utc(2026, 1, 1, 9, 0, 0) + timedelta(milliseconds=1)) == utc(2026, 1, 2, 9)
    assert rec.after(utc(2026, 1, 1, 9)) == utc(2026, 1, 2, 9)
    started = cron("0 9 * * *", start=utc(2026, 3, 1, 9))
    assert started.first(NOW) == utc(2026, 3, 1, 9)
    assert started.after(NOW) == utc(2026, 3, 1, 9)


def test_cron_in_a_zone() -> None:
    rec = parse_recurrence({"cron": "0 9 * * 1-5", "timeZone": "Europe/Berlin"}, NOW)
    # 2026-01-01 is a Thursday; 09:00 CET is 08:00Z.
    assert run(rec, NOW, utc(2026, 1, 6, 12)) == [
        utc(2026, 1, 1, 8),
        utc(2026, 1, 2, 8),
        utc(2026, 1, 5, 8),
        utc(2026, 1, 6, 8),
    ]


def test_cron_end_is_honoured() -> None:
    rec = cron("0 * * * *", end=utc(2026, 1, 1, 2, 30))
    assert run(rec, NOW, utc(2030, 1, 1)) == [utc(2026, 1, 1, 1), utc(2026, 1, 1, 2)]
    assert rec.first(utc(2026, 1, 1, 2, 1)) is None


def test_berlin_spring_forward_fixed_time_fires_once_after_the_gap() -> None:
    rec = cron("30 2 * * *", "Europe/Berlin")
    times = run(rec, utc(2026, 3, 27), utc(2026, 3, 31))
    # 02:30 does not exist on 03-29: it fires once, at the first instant after the gap.
    assert local(times, BERLIN) == [
        "03-27 02:30 CET",
        "03-28 02:30 CET",
        "03-29 03:00 CEST",
        "03-30 02:30 CEST",
    ]
    assert times[2] == utc(2026, 3, 29, 1, 0)


def test_berlin_fall_back_fixed_time_fires_once_at_the_first_instance() -> None:
    rec = cron("30 2 * * *", "Europe/Berlin")
    times = run(rec, utc(2026, 10, 23), utc(2026, 10, 27))
    assert local(times, BERLIN) == [
        "10-23 02:30 CEST",
        "10-24 02:30 CEST",
        "10-25 02:30 CEST",
        "10-26 02:30 CET",
    ]
    assert times[2] == utc(2026, 10, 25, 0, 30)


def test_fall_back_never_answers_an_instant_before_the_search() -> None:
    # 02:10 CET is the second pass through 02:xx; 02:30 CEST is an hour behind us.
    second_pass = datetime(2026, 10, 25, 2, 10, tzinfo=BERLIN, fold=1).astimezone(UTC)
    assert second_pass == utc(2026, 10, 25, 1, 10)
    rec = cron("30 2 * * *", "Europe/Berlin")
    assert rec.after(second_pass) == utc(2026, 10, 26, 1, 30)
    assert rec.first(second_pass) == utc(2026, 10, 26, 1, 30)
    # A wildcard-hour job does have an occurrence left in the second pass.
    assert cron("30 * * * *", "Europe/Berlin").after(second_pass) == utc(2026, 10, 25, 1, 30)


def test_berlin_hourly_follows_real_time_on_fall_back() -> None:
    rec = cron("30 * * * *", "Europe/Berlin")
    times = run(rec, utc(2026, 10, 24, 22), utc(2026, 10, 25, 3))
    assert local(times, BERLIN) == [
        "10-25 00:30 CEST",
        "10-25 01:30 CEST",
        "10-25 02:30 CEST",
        "10-25 02:30 CET",
        "10-25 03:30 CET",
    ]
    assert {b - a for a, b in pairwise(times)} == {timedelta(hours=1)}


def test_berlin_hourly_follows_real_time_on_spring_forward() -> None:
    rec = cron("30 * * * *", "Europe/Berlin")
    times = run(rec, utc(2026, 3, 28, 23), utc(2026, 3, 29, 3, 30))
    assert local(times, BERLIN) == [
        "03-29 00:30 CET",
        "03-29 01:30 CET",
        "03-29 03:30 CEST",
        "03-29 04:30 CEST",
        "03-29 05:30 CEST",
    ]
    assert {b - a for a, b in pairwise(times)} == {timedelta(hours=1)}


def test_berlin_quarter_hourly_runs_both_passes_of_the_repeated_hour() -> None:
    rec = cron("*/15 * * * *", "Europe/Berlin")
    times = run(rec, utc(2026, 10, 24, 23, 50), utc(2026, 10, 25, 2))
    assert len(times) == 9  # 00:00Z .. 02:00Z: eight in the two passes of 02:xx, then 03:00
    assert {b - a for a, b in pairwise(times)} == {timedelta(minutes=15)}
    assert local(times, BERLIN)[3:5] == ["10-25 02:45 CEST", "10-25 02:00 CET"]


def test_daily_keeps_local_wall_time_across_both_switches() -> None:
    rec = cron("0 9 * * *", "Europe/Berlin")
    spring = run(rec, utc(2026, 3, 28), utc(2026, 3, 30, 12))
    assert spring == [utc(2026, 3, 28, 8), utc(2026, 3, 29, 7), utc(2026, 3, 30, 7)]
    autumn = run(rec, utc(2026, 10, 24), utc(2026, 10, 26, 12))
    assert autumn == [utc(2026, 10, 24, 7), utc(2026, 10, 25, 8), utc(2026, 10, 26, 8)]
    assert set(local(spring + autumn, BERLIN)) == {
        f"{d} 09:00 {z}"
        for d, z in [
            ("03-28", "CET"),
            ("03-29", "CEST"),
            ("03-30", "CEST"),
            ("10-24", "CEST"),
            ("10-25", "CET"),
            ("10-26", "CET"),
        ]
    }


def test_new_york_switch_days() -> None:
    # 2026-03-08: 02:00 EST -> 03:00 EDT. 2026-11-01: 02:00 EDT -> 01:00 EST.
    gap = run(cron("30 2 * * *", "America/New_York"), utc(2026, 3, 7), utc(2026, 3, 9, 12))
    assert local(gap, NEW_YORK) == ["03-07 02:30 EST", "03-08 03:00 EDT", "03-09 02:30 EDT"]
    assert gap[1] == utc(2026, 3, 8, 7)
    repeat = run(cron("30 1 * * *", "America/New_York"), utc(2026, 10, 31), utc(2026, 11, 2, 12))
    assert local(repeat, NEW_YORK) == ["10-31 01:30 EDT", "11-01 01:30 EDT", "11-02 01:30 EST"]
    assert repeat[1] == utc(2026, 11, 1, 5, 30)
    hourly = run(
        cron("30 * * * *", "America/New_York"), utc(2026, 11, 1, 4), utc(2026, 11, 1, 7, 30)
    )
    assert local(hourly, NEW_YORK) == [
        "11-01 00:30 EDT",
        "11-01 01:30 EDT",
        "11-01 01:30 EST",
        "11-01 02:30 EST",
    ]


# -- misfires -----------------------------------------------------------------


def quarter_hourly(**extra: Any) -> Recurrence:
    return Recurrence(every=timedelta(minutes=15), start=NOW, **extra)


def test_is_misfired_is_strictly_past_the_threshold() -> None:
    assert not is_misfired(NOW, NOW + THRESHOLD, THRESHOLD)
    assert is_misfired(NOW, NOW + THRESHOLD + timedelta(milliseconds=1), THRESHOLD)
    assert not is_misfired(NOW, NOW - timedelta(hours=1), THRESHOLD)


def test_on_time_chain_advances_to_the_next_occurrence() -> None:
    rec = quarter_hourly()
    assert rec.advance(NOW, NOW + timedelta(milliseconds=20), 0, THRESHOLD) == Advance(
        next_at=utc(2026, 1, 1, 0, 15), late_streak=0, skipped=0
    )


def test_slight_lateness_is_not_a_misfire() -> None:
    # Every second, each completing 300 ms after it was due, then a run 1.3 s
    # behind: the next occurrence is already 300 ms late, which is under the
    # threshold, so nothing is skipped.
    rec = Recurrence(every=timedelta(seconds=1), start=NOW, misfire=Misfire.SKIP)
    threshold = timedelta(seconds=1)
    current, delivered = NOW, [NOW]
    for _ in range(100):
        step = rec.advance(current, current + timedelta(milliseconds=300), 0, threshold)
        assert step.skipped == 0
        assert step.next_at is not None
        current = step.next_at
        delivered.append(current)
    assert delivered == [NOW + timedelta(seconds=k) for k in range(101)]
    behind = rec.advance(NOW, NOW + timedelta(milliseconds=1300), 0, threshold)
    assert behind == Advance(next_at=NOW + timedelta(seconds=1), late_streak=0, skipped=0)
    assert not rec.should_skip(
        NOW + timedelta(seconds=1), NOW + timedelta(milliseconds=1300), threshold
    )


def test_fire_once_after_a_three_hour_outage() -> None:
    rec = quarter_hourly()
    now = utc(2026, 1, 1, 3, 0, 7)  # back at 03:00:07; the 00:00 one fired late just now
    step = rec.advance(NOW, now, 0, THRESHOLD)
    # Jumped over 00:15 .. 02:45 (eleven); 03:00 is within the threshold of now.
    assert step == Advance(next_at=utc(2026, 1, 1, 3), late_streak=0, skipped=11)


def test_fire_once_jump_target_may_be_in_the_future() -> None:
    rec = quarter_hourly()
    step = rec.advance(NOW, utc(2026, 1, 1, 3, 5), 0, THRESHOLD)
    # 03:00 is five minutes late (> threshold): skipped too; next is 03:15.
    assert step == Advance(next_at=utc(2026, 1, 1, 3, 15), late_streak=0, skipped=12)


def test_fire_all_fires_max_catch_up_late_then_jumps() -> None:
    rec = quarter_hourly(misfire=Misfire.FIRE_ALL, max_catch_up=3)
    now = utc(2026, 1, 1, 3, 0, 7)
    late = [NOW]  # the 00:00 occurrence fires late first
    current, streak = NOW, 0
    while True:
        step = rec.advance(current, now, streak, THRESHOLD)
        assert step.next_at is not None
        if step.skipped:
            break
        late.append(step.next_at)
        current, streak = step.next_at, step.late_streak
    assert late == [NOW, utc(2026, 1, 1, 0, 15), utc(2026, 1, 1, 0, 30)]
    # 00:45 .. 02:45 jumped over; back on time at 03:00 with a fresh streak.
    assert step == Advance(next_at=utc(2026, 1, 1, 3), late_streak=0, skipped=9)


def test_fire_all_with_max_catch_up_one_fires_only_the_current() -> None:
    rec = quarter_hourly(misfire=Misfire.FIRE_ALL, max_catch_up=1)
    step = rec.advance(NOW, utc(2026, 1, 1, 3, 0, 7), 0, THRESHOLD)
    assert step == Advance(next_at=utc(2026, 1, 1, 3), late_streak=0, skipped=11)


def test_fire_all_streak_resets_once_back_on_time() -> None:
    rec = quarter_hourly(misfire=Misfire.FIRE_ALL, max_catch_up=3)
    step = rec.advance(utc(2026, 1, 1, 0, 45), utc(2026, 1, 1, 0, 45, 1), 2, THRESHOLD)
    assert step == Advance(next_at=utc(2026, 1, 1, 1), late_streak=0, skipped=0)


def test_skip_drops_the_late_occurrence_and_jumps() -> None:
    rec = quarter_hourly(misfire=Misfire.SKIP)
    now = utc(2026, 1, 1, 3, 0, 7)
    assert rec.should_skip(NOW, now, THRESHOLD)
    assert not rec.should_skip(utc(2026, 1, 1, 3), now, THRESHOLD)
    assert not quarter_hourly().should_skip(NOW, now, THRESHOLD)  # fire_once delivers it
    assert rec.advance(NOW, now, 0, THRESHOLD) == Advance(
        next_at=utc(2026, 1, 1, 3), late_streak=0, skipped=11
    )


def test_outage_past_the_end_ends_the_chain_counting_only_up_to_end() -> None:
    rec = quarter_hourly(end=utc(2026, 1, 1, 1))
    step = rec.advance(NOW, utc(2026, 1, 1, 3, 0, 7), 0, THRESHOLD)
    assert step == Advance(next_at=None, late_streak=0, skipped=4)  # 00:15 .. 01:00
    assert rec.advance(utc(2026, 1, 1, 1), utc(2026, 1, 1, 1), 0, THRESHOLD) == Advance(
        next_at=None, late_streak=0, skipped=0
    )


def test_interval_outage_of_a_year_is_counted_exactly() -> None:
    rec = Recurrence(every=timedelta(seconds=1), start=NOW)
    step = rec.advance(NOW, utc(2027, 1, 1, 0, 0, 30), 0, THRESHOLD)
    # Occurrences 00:00:01 (2026) .. 2026-12-31T23:59:29 jumped; next 23:59:30.
    assert step == Advance(next_at=utc(2026, 12, 31, 23, 59, 30), late_streak=0, skipped=31_535_969)


def test_cron_fire_once_after_an_outage_in_a_zone() -> None:
    rec = cron("*/15 * * * *", "Europe/Berlin")
    current = utc(2026, 10, 24, 23, 45)  # 01:45 CEST
    now = utc(2026, 10, 25, 1, 50)  # 02:50 CET, after the repeated hour
    step = rec.advance(current, now, 0, THRESHOLD)
    # Jumped: 00:00Z .. 01:45Z (eight, both passes of 02:xx); next 02:00Z (03:00 CET).
    assert step == Advance(next_at=utc(2026, 10, 25, 2), late_streak=0, skipped=8)


def test_cron_fire_all_counts_the_current_toward_the_cap() -> None:
    rec = cron("0 * * * *", misfire=Misfire.FIRE_ALL, max_catch_up=2)
    now = utc(2026, 1, 1, 10, 0, 5)
    first = rec.advance(NOW, now, 0, THRESHOLD)
    assert first == Advance(next_at=utc(2026, 1, 1, 1), late_streak=1, skipped=0)
    second = rec.advance(utc(2026, 1, 1, 1), now, first.late_streak, THRESHOLD)
    assert second == Advance(next_at=utc(2026, 1, 1, 10), late_streak=0, skipped=8)


def test_cron_outage_of_a_year_returns_the_right_next_and_caps_the_count() -> None:
    rec = cron("* * * * *")
    step = rec.advance(NOW, utc(2027, 1, 1, 0, 0, 30), 0, THRESHOLD)
    # The first minute at or after now - threshold (2026-12-31T23:59:30).
    assert step == Advance(next_at=utc(2027, 1, 1), late_streak=0, skipped=SKIPPED_COUNT_CAP)


def test_cron_outage_past_the_end() -> None:
    rec = cron("0 * * * *", end=utc(2026, 1, 1, 5))
    step = rec.advance(NOW, utc(2026, 1, 2), 0, THRESHOLD)
    assert step == Advance(next_at=None, late_streak=0, skipped=5)  # 01:00 .. 05:00
