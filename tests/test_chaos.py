"""Chaos scenarios and the checker: pure parts, no processes."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiokafka import ConsumerRecord

from chaos import runner
from chaos.checker import Changes, Delivery, Window, check, occurrence, passed
from chaos.lab.harness import Recorder, epoch
from chaos.report import render_html
from chaos.runner import STALL_LEAD, Run, broker_stalls, render
from chaos.scenario import ScenarioError, available, load, parse
from ring import bucket_for


def scenario(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"nodes": 3, "duration": 60, "rate": 10, "timeline": []}
    base.update(fields)
    return base


def test_every_shipped_scenario_loads() -> None:
    names = set(available())
    assert {"scale-out", "scale-in", "rolling-restart", "kill-loop", "zombie-pause"} <= names
    for name in names:
        loaded = load(name)
        assert loaded.description
        timeline = loaded.timeline(seed=1)
        assert timeline, name
        assert all(0 <= s.at <= loaded.duration for s in timeline)


def test_every_repeats_a_step_until_its_end() -> None:
    kills = parse(
        "k",
        scenario(timeline=[{"at": 10, "every": 10, "until": 40, "do": "kill", "restart": True}]),
    )
    assert [s.at for s in kills.steps] == [10, 20, 30, 40]
    assert all(s.do == "kill" and s.restart and s.target == "random" for s in kills.steps)


def test_steps_are_played_in_time_order() -> None:
    parsed = parse(
        "t",
        scenario(
            timeline=[
                {"at": 30, "do": "stop", "target": "node-1"},
                {"at": 5, "do": "start"},
                {"at": 20, "do": "pause", "target": "node-2", "for": 12},
            ]
        ),
    )
    assert [(s.at, s.do) for s in parsed.steps] == [(5, "start"), (20, "pause"), (30, "stop")]
    assert parsed.steps[1].lasting == 12
    assert parsed.steps[1].label == "pause node-2 for 12 s"


def test_scaling_keeps_the_faults_at_the_same_share_of_the_run() -> None:
    parsed = parse("s", scenario(timeline=[{"at": 15, "do": "pause", "for": 20}]))
    shorter = parsed.scaled(nodes=None, duration=30, rate=None)
    assert (shorter.duration, shorter.nodes, shorter.rate) == (30, 3, 10)
    assert shorter.steps[0].at == 7.5
    assert shorter.steps[0].lasting == 20  # a pause must still outlast the lease


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "must be a JSON object"),
        (scenario(speed=3), "unknown field(s) speed"),
        ({"duration": 60, "rate": 10}, "missing 'nodes'"),
        (scenario(nodes=2.5), "nodes must be an integer"),
        (scenario(rate=0), "rate must be between"),
        (scenario(duration="60"), "duration must be a number"),
        (scenario(timeline={}), "timeline must be a list"),
        (scenario(timeline=[{"at": 5, "do": "explode"}]), "timeline[0]: 'do' must be one of"),
        (scenario(timeline=[{"at": 61, "do": "start"}]), "at must be between 0 and 60"),
        (scenario(timeline=[{"do": "start"}]), "missing 'at'"),
        (scenario(timeline=[{"at": 5, "do": "start", "target": "x"}]), "start takes no target"),
        (scenario(timeline=[{"at": 5, "do": "pause"}]), "missing 'for'"),
        (scenario(timeline=[{"at": 5, "until": 9, "do": "kill"}]), "'until' needs 'every'"),
        (scenario(timeline=[{"at": 5, "do": "kill", "restart": "yes"}]), "restart must be"),
    ],
)
def test_a_bad_scenario_is_refused_naming_the_field(data: Any, message: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        parse("bad", data, where="bad.json")
    assert message in str(caught.value)
    assert str(caught.value).startswith("bad.json")


def test_an_unknown_scenario_name_lists_the_known_ones() -> None:
    with pytest.raises(ScenarioError, match=r"known: .*zombie-pause"):
        load("no-such-scenario")


# -- the checker ----------------------------------------------------------------


def test_a_clean_run_passes() -> None:
    accepted = {"a": 100.0, "b": 101.0}
    result = check(accepted, set(), [Delivery("a", 1, 1, 100.02), Delivery("b", 1, 1, 101.5)])
    assert passed(result)
    assert (result["lost"], result["duplicates"], result["delivered"]) == (0, 0, 2)
    assert result["lateness_s"]["max"] == pytest.approx(0.5)


def test_recurring_schedules_are_judged_occurrence_by_occurrence() -> None:
    ticks = [occurrence("chain", f"T{k}") for k in range(3)]
    accepted = {unit: 100.0 + k for k, unit in enumerate(ticks)}
    each_once = [Delivery(unit, 1, 1, 100.1 + k) for k, unit in enumerate(ticks)]
    result = check(accepted, set(), each_once)
    assert passed(result) and result["occurrences"] == 3

    missing = check(accepted, set(), each_once[:2])
    assert not passed(missing) and missing["lost_ids"] == [ticks[2]]

    doubled = check(accepted, set(), [*each_once, Delivery(ticks[1], 1, 1, 101.2)])
    assert not passed(doubled) and doubled["duplicates_same_claim_ids"] == [ticks[1]]

    drifted = check(accepted, set(), [*each_once, Delivery(occurrence("chain", "T9"), 1, 1, 109)])
    assert not passed(drifted)
    assert drifted["unexpected_occurrences_ids"] == [occurrence("chain", "T9")]


def test_an_occurrence_is_fenced_by_its_schedules_bucket() -> None:
    """Stale claims compare tokens of one bucket: an occurrence's is its schedule's."""
    a, b = occurrence("chain", "T1"), occurrence("chain", "T2")
    accepted = {a: 100.0, b: 105.0}
    # Token 5 delivered at 100.1; token 4 then claimed an occurrence due at 105: two owners.
    result = check(accepted, set(), [Delivery(a, 5, 1, 100.1), Delivery(b, 4, 1, 105.1)])
    assert result["stale_claims_ids"] == [b]


def test_an_accepted_schedule_never_delivered_is_lost() -> None:
    result = check({"a": 100.0, "b": 100.0}, set(), [Delivery("a", 1, 1, 100.1)])
    assert not passed(result)
    assert (result["lost"], result["lost_ids"]) == (1, ["b"])


def test_a_cancelled_schedule_is_not_lost_but_must_never_arrive() -> None:
    assert passed(check({"a": 100.0}, {"a"}, []))
    result = check({"a": 100.0}, {"a"}, [Delivery("a", 1, 1, 100.1)])
    assert not passed(result)
    assert result["cancelled_delivered_ids"] == ["a"]


def test_a_duplicate_under_a_new_token_is_explained_one_under_the_same_claim_is_not() -> None:
    takeover = [Delivery("a", 3, 1, 100.1), Delivery("a", 4, 2, 110.0)]
    retry = [Delivery("b", 3, 1, 100.1), Delivery("b", 3, 2, 102.0)]
    result = check({"a": 100.0, "b": 100.0}, set(), [*takeover, *retry])
    assert passed(result)
    assert (result["duplicates"], result["duplicates_same_claim"]) == (2, 0)
    # Two copies under one token and attempt: two owners claimed with one token.
    twice = [Delivery("c", 5, 1, 100.1), Delivery("c", 5, 1, 100.2)]
    result = check({"c": 100.0}, set(), twice)
    assert not passed(result)
    assert result["duplicates_same_claim_ids"] == ["c"]


def test_one_claim_delivered_on_both_sides_of_a_database_crash_is_explained() -> None:
    # The claim's acknowledgement was lost with the database: the owner
    # claims again, same token, same attempt number.
    twice = [Delivery("c", 5, 1, 100.1), Delivery("c", 5, 1, 104.0)]
    result = check({"c": 100.0}, set(), twice, store_crashes=[101.0])
    assert passed(result)
    assert (result["duplicates_across_store_crash"], result["duplicates_same_claim"]) == (1, 0)
    # A crash before both copies explains nothing.
    assert not passed(check({"c": 100.0}, set(), twice, store_crashes=[99.0]))


# -- duplicates, told apart by kind ----------------------------------------------

# A broker paused at 121 s for 10 s: its window runs to the end of the
# recovery allowance, as the runner draws it.
PAUSE = Window("pause the broker for 10 s", 120.0, 151.0)


def kind_of(result: dict[str, Any], unit: str) -> tuple[str, str | None]:
    [entry] = [e for e in result["duplicates_explained"] if e["id"] == unit]
    return entry["kind"], entry["window"]


def test_copies_under_different_tokens_are_an_owner_change() -> None:
    copies = [Delivery("a", 3, 1, 100.1), Delivery("a", 4, 2, 110.0)]
    result = check({"a": 100.0}, set(), copies)
    assert passed(result)
    assert result["duplicates_by_kind"]["owner_change"] == result["duplicates"] == 1
    assert kind_of(result, "a") == ("owner_change", None)


def test_later_attempts_of_one_owner_are_a_retried_publish() -> None:
    copies = [Delivery("b", 3, 1, 100.1), Delivery("b", 3, 2, 102.0)]
    result = check({"b": 100.0}, set(), copies)
    assert passed(result)
    assert result["duplicates_by_kind"]["retried_publish"] == 1
    assert kind_of(result, "b") == ("retried_publish", None)


def test_one_claim_across_a_database_crash_is_explained_by_that_crash() -> None:
    crash = Window("crash the store for 5 s", 101.0, 106.0)
    twice = [Delivery("c", 5, 1, 100.1, "d1"), Delivery("c", 5, 1, 107.0, "d1")]
    result = check({"c": 100.0}, set(), twice, store_crashes=[crash])
    assert passed(result)
    assert result["duplicates_by_kind"]["across_store_crash"] == 1
    assert kind_of(result, "c") == ("across_store_crash", "crash the store for 5 s")
    # Claimed just before the kill, published as it landed (everything,
    # seed 2: the record stamped 3 ms after the runner sent the kill), or
    # while the database was down: the crash lost that claim too.
    landing = [Delivery("c", 5, 1, 101.003, "d1"), Delivery("c", 5, 1, 113.0, "d1")]
    result = check({"c": 100.0}, set(), landing, store_crashes=[crash])
    assert kind_of(result, "c") == ("across_store_crash", "crash the store for 5 s")
    # Both copies after the crash: the crash explains neither.
    later = [Delivery("c", 5, 1, 107.0, "d1"), Delivery("c", 5, 1, 108.0, "d1")]
    result = check({"c": 100.0}, set(), later, store_crashes=[crash])
    assert not passed(result)
    assert kind_of(result, "c") == ("same_claim", None)


def test_a_batch_resent_inside_a_broker_fault_is_a_producer_retry() -> None:
    # The broker stored the first copy after the producer had given up on
    # the request; the resend carries the very batch, CreateTime included.
    sent = Delivery("p", 5, 1, 125.123, "9f2c", partition=0, offset=40)
    again = Delivery("p", 5, 1, 125.123, "9f2c", partition=0, offset=57)
    result = check({"p": 125.0}, set(), [sent, again], broker_faults=[PAUSE])
    assert passed(result)
    assert (result["duplicates_same_claim"], result["duplicates_by_kind"]["producer_retry"]) == (
        0,
        1,
    )
    assert kind_of(result, "p") == ("producer_retry", "pause the broker for 10 s")


@pytest.mark.parametrize(
    ("broker_faults", "windows"),
    [
        ((), ()),  # no broker fault in the run
        ((PAUSE,), ()),  # the resend's timestamp is after the pause's window
        ((), (Window("kill node-2", 150.0, 170.0),)),  # a fault, but not the broker's
    ],
)
def test_the_same_batch_twice_outside_every_broker_fault_fails_the_run(
    broker_faults: tuple[Window, ...], windows: tuple[Window, ...]
) -> None:
    twice = [Delivery("p", 5, 1, 160.0, "9f2c", 0, 40), Delivery("p", 5, 1, 160.0, "9f2c", 0, 41)]
    result = check({"p": 160.0}, set(), twice, windows, broker_faults=broker_faults)
    assert not passed(result)
    assert result["duplicates_same_claim_ids"] == ["p"]
    assert result["duplicates_by_kind"]["producer_retry"] == 0
    assert kind_of(result, "p") == ("same_claim", None)


@pytest.mark.parametrize(
    "second",
    [
        Delivery("p", 5, 1, 125.123, "77aa", 0, 57),  # another value
        Delivery("p", 5, 1, 125.124, "9f2c", 0, 57),  # stamped a millisecond later: sent anew
        Delivery("p", 5, 1, 125.123, None, 0, 57),  # no digest recorded: nothing proves it
    ],
    ids=["other-digest", "other-timestamp", "no-digest"],
)
def test_a_repeat_inside_a_broker_fault_that_is_not_the_same_batch_fails_the_run(
    second: Delivery,
) -> None:
    first = Delivery("p", 5, 1, 125.123, "9f2c", 0, 40)
    result = check({"p": 125.0}, set(), [first, second], broker_faults=[PAUSE])
    assert not passed(result)
    assert result["duplicates_same_claim_ids"] == ["p"]
    assert kind_of(result, "p") == ("same_claim", None)


def test_copies_recorded_without_a_digest_are_never_a_producer_retry() -> None:
    # Same token, attempt and timestamp inside a pause, but nothing shows
    # the value was the same: not proved a resend.
    twice = [Delivery("p", 5, 1, 125.123), Delivery("p", 5, 1, 125.123)]
    result = check({"p": 125.0}, set(), twice, broker_faults=[PAUSE])
    assert not passed(result)
    assert kind_of(result, "p") == ("same_claim", None)


def test_a_producer_retry_does_not_hide_another_send_of_the_same_claim() -> None:
    # A resend inside the pause, and a third copy of that claim stamped
    # later, with another value and no database crash between: one claim
    # published twice.
    copies = [
        Delivery("p", 5, 1, 125.5, "9f2c"),
        Delivery("p", 5, 1, 125.5, "9f2c"),
        Delivery("p", 5, 1, 126.0, "77aa"),
    ]
    result = check({"p": 125.0}, set(), copies, broker_faults=[PAUSE])
    assert not passed(result)
    assert kind_of(result, "p") == ("same_claim", None)


def test_a_claim_published_again_after_a_broker_fault_is_a_deferred_publish() -> None:
    # The broker stored the copy sent during its fault, its answer was lost;
    # the broker's trouble spends no attempt, so the node published the same
    # claim again (a new record timestamp) once the broker was back.
    cut = Window("cut node-3 from the broker for 10 s", 120.0, 151.0)
    copies = [Delivery("d", 5, 1, 125.5, "9f2c"), Delivery("d", 5, 1, 160.0, "9f2c")]
    result = check({"d": 125.0}, set(), copies, broker_faults=[cut])
    assert passed(result)
    assert kind_of(result, "d") == ("deferred_publish", cut.label)
    assert result["duplicates_by_kind"]["deferred_publish"] == 1
    # The earlier send outside every broker fault: nothing explains it.
    early = [Delivery("d", 5, 1, 110.0, "9f2c"), Delivery("d", 5, 1, 160.0, "9f2c")]
    assert kind_of(check({"d": 110.0}, set(), early, broker_faults=[cut]), "d") == (
        "same_claim",
        None,
    )
    # Another value, or none recorded: not the same record published again.
    for digests in (("9f2c", "77aa"), (None, None)):
        other = [Delivery("d", 5, 1, 125.5, digests[0]), Delivery("d", 5, 1, 160.0, digests[1])]
        result = check({"d": 125.0}, set(), other, broker_faults=[cut])
        assert not passed(result) and kind_of(result, "d") == ("same_claim", None)


def test_a_duplicate_is_explained_with_its_copies_in_time_order() -> None:
    later = Delivery("p", 6, 2, 140.0, "9f2c", partition=1, offset=3)  # the next owner's
    sent = Delivery("p", 5, 1, 125.1234, "9f2c", partition=0, offset=40)
    again = Delivery("p", 5, 1, 125.1234, "9f2c", partition=0, offset=57)
    result = check({"p": 125.0}, set(), [later, sent, again], broker_faults=[PAUSE])
    copy = {"token": 5, "attempt": 1, "at": 125.123, "digest": "9f2c", "partition": 0}
    assert result["duplicates_explained"] == [
        {
            "id": "p",
            "kind": "producer_retry",
            "window": "pause the broker for 10 s",
            "copies": [
                {**copy, "offset": 40},
                {**copy, "offset": 57},
                {
                    "token": 6,
                    "attempt": 2,
                    "at": 140.0,
                    "digest": "9f2c",
                    "partition": 1,
                    "offset": 3,
                },
            ],
        }
    ]


def test_a_unit_repeated_in_several_ways_counts_once_as_its_least_explained_repeat() -> None:
    # A same-claim repeat is not hidden by an owner change of the same unit.
    mixed = [Delivery("m", 5, 1, 100.1), Delivery("m", 5, 1, 100.2), Delivery("m", 6, 1, 110.0)]
    # An owner change after a producer retry: both explained, counted once.
    retried = [
        Delivery("r", 5, 1, 125.5, "9f2c"),
        Delivery("r", 5, 1, 125.5, "9f2c"),
        Delivery("r", 6, 2, 140.0, "9f2c"),
    ]
    result = check({"m": 100.0, "r": 125.0}, set(), [*mixed, *retried], broker_faults=[PAUSE])
    assert not passed(result)
    assert result["duplicates_same_claim_ids"] == ["m"]
    assert kind_of(result, "r") == ("producer_retry", PAUSE.label)
    assert sum(result["duplicates_by_kind"].values()) == result["duplicates"] == 2


def test_the_explained_duplicates_list_failures_first_and_stop_at_fifty() -> None:
    units = [f"u{i:02}" for i in range(60)]
    deliveries = [Delivery(u, t, t, 100.1 + t) for u in units for t in (1, 2)]
    deliveries += [Delivery("zz", 1, 1, 100.1), Delivery("zz", 1, 1, 100.2)]
    result = check({u: 100.0 for u in [*units, "zz"]}, set(), deliveries)
    assert result["duplicates"] == 61
    assert result["duplicates_by_kind"] == {
        "owner_change": 60,
        "retried_publish": 0,
        "across_store_crash": 0,
        "deferred_publish": 0,
        "producer_retry": 0,
        "same_claim": 1,
    }
    explained = result["duplicates_explained"]
    assert len(explained) == 50
    assert explained[0]["id"] == "zz"
    assert [e["id"] for e in explained[1:3]] == ["u00", "u01"]


def test_the_summary_prints_the_kinds_and_a_line_per_duplicate_up_to_twenty() -> None:
    units = [f"u{i:02}" for i in range(25)]
    deliveries = [Delivery(u, t, 1, 1000.1 + t, "9f2c", 0, t) for u in units for t in (1, 2)]
    result = check({u: 1000.0 for u in units}, set(), deliveries)
    result.update(
        scenario="s",
        seed=1,
        unfenced=False,
        refused=0,
        chains=0,
        network="loopback",
        events=[],
        refusals={},
        started=995.0,
        passed=passed(result),
    )
    text = render(result)
    assert "duplicates 25 (owner_change 25, retried_publish 0, across_store_crash 0" in text
    lines = [line for line in text.splitlines() if ": owner_change: " in line]
    assert len(lines) == 20
    assert lines[0] == "  u00: owner_change: t1/a1 at 6.100 s #9f2c 0:1; t2/a1 at 7.100 s #9f2c 0:2"
    assert "  ... 5 more duplicated units (summary.json lists 25)" in text


def test_a_record_gone_from_the_topic_at_the_end_vanished() -> None:
    deliveries = [Delivery("a", 1, 1, 100.1), Delivery("b", 1, 1, 100.2)]
    assert passed(check({"a": 100.0, "b": 100.0}, set(), deliveries, kept={"a", "b"}))
    result = check({"a": 100.0, "b": 100.0}, set(), deliveries, kept={"b"})
    assert not passed(result)
    assert (result["vanished"], result["vanished_ids"]) == (1, ["a"])


def same_bucket_ids(count: int, buckets: int = 256) -> list[str]:
    first = bucket_for("s0", buckets)
    found = [f"s{i}" for i in range(100_000) if bucket_for(f"s{i}", buckets) == first]
    return found[:count]


def test_a_claim_under_a_token_older_than_one_already_at_work_is_a_double_claim() -> None:
    old_batch, new_work, stale = same_bucket_ids(3)
    accepted = {old_batch: 99.0, new_work: 100.0, stale: 105.0}
    deliveries = [
        Delivery(new_work, 5, 1, 100.1),  # the new owner (token 5) at work at 100.1
        # The former owner (token 4) finishing a batch claimed before it lost
        # the lease: due before token 5 acted, so explained.
        Delivery(old_batch, 4, 1, 101.0),
    ]
    assert passed(check({old_batch: 99.0, new_work: 100.0}, set(), deliveries))
    # Due at 105, after token 5 delivered: token 4 claimed it while token 5
    # held the bucket.
    result = check(accepted, set(), [*deliveries, Delivery(stale, 4, 1, 105.2)])
    assert not passed(result)
    assert (result["stale_claims"], result["stale_claims_ids"]) == (1, [stale])


def test_lateness_is_split_by_fault_window_and_taken_from_the_first_copy() -> None:
    accepted = {"early": 100.0, "hit": 120.0, "late": 150.0}
    deliveries = [
        Delivery("early", 1, 1, 100.1),
        Delivery("hit", 1, 1, 128.0),
        Delivery("hit", 2, 2, 129.0),
        Delivery("late", 1, 1, 150.2),
    ]
    result = check(accepted, set(), deliveries, [Window("kill node-2", 118.0, 138.0)])
    [window] = result["windows"]
    assert window["lateness_s"]["count"] == 1
    assert window["lateness_s"]["max"] == pytest.approx(8.0)
    outside = result["lateness_outside_windows_s"]
    assert outside["count"] == 2
    assert outside["max"] == pytest.approx(0.2)


def test_a_delivery_before_its_time_fails_the_run() -> None:
    deliveries = [Delivery("a", 1, 1, 99.9), Delivery("b", 1, 1, 99.999)]
    result = check({"a": 100.0, "b": 100.0}, set(), deliveries)
    assert not passed(result)
    assert result["early_ids"] == ["a"]  # b is within the millisecond timestamps' rounding
    assert math.isnan(check({}, set(), [])["lateness_s"]["p99"])


# -- the verbs of issue 19: bulk cancel, pause and resume, reschedule ----------------


def test_a_bulk_cancelled_schedule_is_owed_nothing_and_never_goes_out_after_the_200() -> None:
    taken = Changes(bulk_cancelled={"a": 100.0})  # the bulk cancel answered at 100
    result = check({"a": 102.0}, set(), [], changes=taken)
    assert passed(result) and (result["lost"], result["bulk_cancelled"]) == (0, 1)
    # Out before the 200: it had gone out, then was PENDING again (a dead
    # owner's publish, redone) when the bulk cancel took it.
    assert passed(check({"a": 99.0}, set(), [Delivery("a", 1, 1, 99.5)], changes=taken))
    result = check({"a": 102.0}, set(), [Delivery("a", 1, 1, 102.1)], changes=taken)
    assert not passed(result)
    assert result["cancelled_delivered_ids"] == ["a"]


def test_a_schedule_paused_for_good_is_owed_nothing_and_never_goes_out_after_the_200() -> None:
    paused = Changes(paused={"p": [(100.0, None)]})  # the pause answered at 100, no resume
    result = check({"p": 103.0}, set(), [], changes=paused)
    assert passed(result) and (result["lost"], result["still_paused"]) == (0, 1)
    assert passed(check({"p": 99.0}, set(), [Delivery("p", 1, 1, 99.2)], changes=paused))
    result = check({"p": 103.0}, set(), [Delivery("p", 1, 1, 103.1)], changes=paused)
    assert not passed(result)
    assert result["paused_delivered_ids"] == ["p"]


def test_a_resumed_schedule_is_owed_again_but_never_while_it_was_paused() -> None:
    # Due at 101, paused at 100, its resume sent at 105 and answered at 105.2.
    resumed = Changes(paused={"p": [(100.0, 105.0)]}, resumed={"p": 105.2})
    result = check({"p": 101.0}, set(), [], changes=resumed)
    assert not passed(result) and result["lost_ids"] == ["p"]
    result = check({"p": 101.0}, set(), [Delivery("p", 1, 1, 105.3)], changes=resumed)
    assert passed(result) and result["still_paused"] == 0
    # Late from its resume, not from its executeAt (4.3 s before it).
    assert result["lateness_s"]["max"] == pytest.approx(0.1)
    # Out at its executeAt while paused, and again after the resume.
    copies = [Delivery("p", 1, 1, 101.0), Delivery("p", 2, 1, 105.3)]
    result = check({"p": 101.0}, set(), copies, changes=resumed)
    assert not passed(result)
    assert result["paused_delivered_ids"] == ["p"]


# Created for 100; a PATCH answered at 98 moved it to 104, one answered at 99 to 102.
MOVED = Changes(moved={"r": [(100.0, None), (104.0, 98.0), (102.0, 99.0)]})


def test_a_rescheduled_schedule_goes_out_at_its_last_time() -> None:
    result = check(
        {"r": 102.0}, set(), [Delivery("r", 1, 1, 102.1, execute_at=102.0)], changes=MOVED
    )
    assert passed(result) and result["rescheduled"] == 1
    assert result["lateness_s"]["max"] == pytest.approx(0.1)


@pytest.mark.parametrize(
    "stray",
    [
        Delivery("r", 1, 1, 100.1, execute_at=100.0),  # its first time, after it was moved off
        Delivery("r", 1, 1, 104.1, execute_at=104.0),  # its second, moved off at 99
        Delivery("r", 1, 1, 101.1, execute_at=101.0),  # a time it never had
    ],
    ids=["first-time", "second-time", "never-had"],
)
def test_a_rescheduled_schedule_out_at_a_time_it_was_moved_off_fails_the_run(
    stray: Delivery,
) -> None:
    copies = [stray, Delivery("r", 2, 1, 102.1, execute_at=102.0)]
    result = check({"r": 102.0}, set(), copies, changes=MOVED)
    assert not passed(result)
    assert result["rescheduled_wrong_time_ids"] == ["r"]


def test_a_rescheduled_schedule_out_only_at_an_earlier_time_is_lost() -> None:
    # Out at 100 before the first PATCH answered (then PENDING again), never at 102.
    before = Delivery("r", 1, 1, 97.5, execute_at=100.0)
    result = check({"r": 102.0}, set(), [before], changes=MOVED)
    assert result["rescheduled_wrong_time"] == 0
    assert not passed(result) and result["lost_ids"] == ["r"]


def test_a_rescheduled_schedule_is_early_by_the_time_its_record_carries() -> None:
    # Its last PATCH (to 104) has no known outcome: 102 and 104 both stand,
    # and a record is early against the one it carries.
    unsure = Changes(
        moved={"r": [(100.0, None), (102.0, 98.0), (104.0, 99.0)]}, unsure=frozenset({"r"})
    )
    for carried in (102.0, 104.0):
        copy = Delivery("r", 1, 1, carried + 0.1, execute_at=carried)
        assert passed(check({"r": 102.0}, set(), [copy], changes=unsure))
    result = check(
        {"r": 102.0}, set(), [Delivery("r", 1, 1, 103.0, execute_at=104.0)], changes=unsure
    )
    assert not passed(result) and result["early_ids"] == ["r"]
    result = check(
        {"r": 102.0}, set(), [Delivery("r", 1, 1, 100.1, execute_at=100.0)], changes=unsure
    )
    assert not passed(result) and result["rescheduled_wrong_time_ids"] == ["r"]


def test_a_record_out_before_a_reschedule_is_fenced_by_the_time_it_carries() -> None:
    moved, other = same_bucket_ids(2)
    accepted = {moved: 110.0, other: 101.0}
    changes = Changes(moved={moved: [(100.0, None), (110.0, 103.0)]})
    deliveries = [
        # Token 4 sent it at its first time; then PENDING again (its owner
        # died before marking it) and moved to 110 by a PATCH.
        Delivery(moved, 4, 1, 100.1, execute_at=100.0),
        Delivery(other, 5, 1, 101.1, execute_at=101.0),  # token 5 at work from 101.1
        Delivery(moved, 5, 1, 110.1, execute_at=110.0),
    ]
    result = check(accepted, set(), deliveries, changes=changes)
    assert passed(result) and result["stale_claims"] == 0
    # Judged by its last time (110), token 4's copy would be a claim made
    # after token 5 acted.
    blind = [replace(d, execute_at=None) for d in deliveries]
    assert check(accepted, set(), blind, changes=changes)["stale_claims_ids"] == [moved]


def test_the_summary_counts_what_the_verbs_changed_and_what_broke() -> None:
    changes = Changes(
        bulk_cancelled={"b": 1000.0},
        paused={"p": [(1000.0, None)], "q": [(1000.0, 1002.0)]},
        resumed={"q": 1002.1},
        moved=MOVED.moved,
    )
    accepted = {"b": 1001.0, "p": 1001.0, "q": 1001.0, "r": 102.0}
    deliveries = [
        Delivery("p", 1, 1, 1001.0),
        Delivery("q", 1, 1, 1002.2),
        Delivery("r", 1, 1, 104.1, execute_at=104.0),
        Delivery("r", 1, 1, 102.0, execute_at=102.0),
    ]
    result = check(accepted, set(), deliveries, changes=changes)
    result.update(
        scenario="s", seed=1, unfenced=False, refused=0, chains=0, network="loopback",
        events=[], refusals={}, started=995.0, passed=passed(result),
        verbs={"PATCH 200": 2, "pause 200": 2, "resume 200": 1},
        bulk_calls=[{"group": "g1", "at": 5.0, "cancelled": 1, "answers": [200]}],
    )  # fmt: skip
    assert not result["passed"]
    text = render(result)
    assert "delivered while paused 1, rescheduled at the wrong time 1," in text
    assert (
        "schedules changed by the verbs: 1 rescheduled, 2 paused (1 resumed, 1 still paused "
        "at the end), 1 taken by 1 bulk cancels (answered 1 cancelled), 0 outcomes unsettled; "
        "answers: PATCH 200 2, pause 200 2, resume 200 1"
    ) in text


def test_a_record_s_execute_at_header_reads_as_epoch_seconds() -> None:
    assert epoch("1970-01-01T00:01:40.123Z") == pytest.approx(100.123)
    assert epoch("") is None and epoch("soon") is None and epoch("1970-01-01T00:01:40") is None
    # As the recorder reads a record the node built (node.schedule.record).
    headers = [
        ("schedule-id", b"s7"),
        ("execute-at", b"1970-01-01T00:01:40.123Z"),
        ("fence-token", b"3"),
        ("tenant", b"default"),
        ("attempt", b"1"),
    ]
    record = ConsumerRecord("chaos", 0, 5, 100_200, 0, b"s7", b"7", None, 2, 1, headers)
    recorder = Recorder.__new__(Recorder)  # no consumer: only its reading of a record
    recorder.recurring = ()
    delivery = recorder._delivery(record, received=100.3)
    assert (delivery.schedule_id, delivery.token, delivery.at) == ("s7", 3, 100.2)
    assert delivery.execute_at == pytest.approx(100.123)


# The runner's side: what it does with each answer, and how it settles the
# unknown ones after the run, against a stand-in for a node's API.

Handler = Callable[[web.Request], web.Response]


@pytest.fixture
async def stand_in(tmp_path: Path) -> AsyncIterator[tuple[Run, dict[str, Handler]]]:
    """A Run whose one node is a local app routing to ``handlers``, keyed
    "METHOD path" (the path as the app matches it)."""
    handlers: dict[str, Handler] = {}

    async def route(request: web.Request) -> web.Response:
        handler = handlers.get(f"{request.method} {request.path}")
        if handler is None:
            return web.json_response({"error": {"code": "not_found"}}, status=404)
        return handler(request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", route)
    site_runner = web.AppRunner(app)
    await site_runner.setup()
    site = web.TCPSite(site_runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    run = Run(load("kill-loop"), tmp_path, seed=1)
    run.ready.add("node-1")
    run.cluster.nodes["node-1"] = SimpleNamespace(  # type: ignore[assignment]
        name="node-1", alive=True, url=f"http://127.0.0.1:{port}"
    )
    try:
        yield run, handlers
    finally:
        await site_runner.cleanup()


def answer(status: int, body: Any) -> Handler:
    return lambda _request: web.json_response(body, status=status)


def view(status: str, execute_at: str = "1970-01-01T00:01:40.000Z") -> Handler:
    return answer(200, {"status": status, "executeAt": execute_at})


async def test_the_runner_moves_a_schedule_only_on_a_200_and_asks_after_no_answer(
    stand_in: tuple[Run, dict[str, Handler]], monkeypatch: pytest.MonkeyPatch
) -> None:
    run, handlers = stand_in
    monkeypatch.setattr(runner, "VERB_DELAY", 0.0)
    monkeypatch.setattr(runner, "RESCHEDULE_AGAIN", 0.0)
    handlers["PATCH /v1/schedules/ok"] = answer(200, {"status": "PENDING", "version": 3})
    handlers["PATCH /v1/schedules/claimed"] = answer(409, {"error": {"code": "in_flight"}})
    handlers["PATCH /v1/schedules/lost"] = answer(503, {"error": {"code": "store_unavailable"}})
    run.accepted = {"ok": 100.0, "claimed": 100.0, "lost": 100.0}
    async with aiohttp.ClientSession() as session:
        for schedule_id in run.accepted:
            await run._reschedule(session, schedule_id, 2)
    [created, (moved_to, answered)] = run.reschedules["ok"]
    assert created == (100.0, None) and answered is not None
    assert run.accepted["ok"] == moved_to > answered  # at least half a second ahead
    assert set(run.reschedules) == {"ok"} and run.accepted["claimed"] == 100.0
    assert set(run.patch_unknown) == {"lost"}
    assert run.verbs == Counter(
        {"PATCH 200": 1, "PATCH 409 in_flight": 1, "PATCH 503 store_unavailable": 1}
    )


async def test_the_runner_settles_the_verbs_unknown_outcomes_from_the_views(
    stand_in: tuple[Run, dict[str, Handler]],
) -> None:
    run, handlers = stand_in
    run.accepted = {s: 100.0 for s in ("b1", "b2", "b3", "p", "q", "m", "n", "x")}
    run.groups = {"b1": "g1", "b2": "g1", "b3": "g2"}
    run.bulk = {"g1": 50.0}  # g1 was bulk-cancelled, its call answered at 50
    run.pause_unknown = {"p": 40.0}
    run.pauses = {"q": (41.0, 45.0)}
    run.resume_unknown = {"q": 45.5}
    run.patch_unknown = {"m": (102.5, 42.0), "n": (103.0, 43.0), "x": (104.0, 44.0)}
    handlers.update(
        {
            "GET /v1/schedules/b1": view("CANCELLED"),
            "GET /v1/schedules/b2": view("DELIVERED"),
            "GET /v1/schedules/b3": view("CANCELLED"),  # not of a bulk-cancelled group
            "GET /v1/schedules/p": view("PAUSED"),
            "GET /v1/schedules/q": view("PAUSED"),  # the resume did not land
            "GET /v1/schedules/m": view("PENDING", "1970-01-01T00:01:42.500Z"),  # moved
            "GET /v1/schedules/n": view("DELIVERED"),  # still at 100: not moved
        }
    )  # x: no node shows it
    await run._resolve_unknown()
    assert run.bulk_cancelled == {"b1": 50.0}
    assert run.pauses == {"p": (40.0, None), "q": (41.0, None)}
    assert not run.resumed and not run.pause_unknown and not run.resume_unknown
    assert run.reschedules["m"] == [(100.0, None), (102.5, 42.0)] and run.accepted["m"] == 102.5
    assert "n" not in run.reschedules and run.accepted["n"] == 100.0
    # x: either time may go out, until a node can say.
    assert run.reschedules["x"] == [(100.0, None), (104.0, 44.0)] and run.unsure == {"x"}
    handlers["GET /v1/schedules/x"] = view("PENDING")  # still at 100 after all
    await run._resolve_unknown()
    assert "x" not in run.unsure and run.reschedules["x"] == [(100.0, None)]
    assert run.accepted["x"] == 100.0 and not run.patch_unknown


async def test_a_bulk_cancel_is_asked_again_while_more_remain(
    stand_in: tuple[Run, dict[str, Handler]],
) -> None:
    run, handlers = stand_in
    pages = iter([{"cancelled": 500, "more": True}, {"cancelled": 7, "more": False}])
    handlers["POST /v1/schedules:cancel"] = lambda _request: web.json_response(next(pages))
    async with aiohttp.ClientSession() as session:
        await run._bulk_cancel(session, "g3")
    [call] = run.bulk_calls
    assert (call["group"], call["cancelled"], call["answers"]) == ("g3", 507, [200, 200])
    assert set(run.bulk) == {"g3"}


# -- the HTML report -------------------------------------------------------------


class Svgs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.plots: dict[str, Counter[str]] = {}
        self._current: str | None = None
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "svg":
            self._current = named["data-plot"] or ""
            self.plots[self._current] = Counter()
        elif self._current is not None:
            self.plots[self._current][named.get("class") or tag] += 1
        self._in_title = tag == "title" and self._current is None

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._current = None

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data


def a_result(*, lost: bool) -> dict[str, Any]:
    accepted = {"a": 1000.0, "b": 1010.0, "c": 1020.0}
    deliveries = [Delivery("a", 1, 1, 1000.1), Delivery("b", 2, 1, 1014.0)]
    if not lost:
        deliveries.append(Delivery("c", 2, 1, 1020.2))
    result = check(accepted, set(), deliveries, [Window("kill node-1", 1008.0, 1028.0)])
    result.update(
        scenario="kill-once",
        seed=7,
        settings={"duration": 30.0},
        started=995.0,
        passed=passed(result),
        events=[
            {"at": 13.0, "step": "kill node-1", "node": "node-1", "settled_after_s": 6.5},
            {"at": 20.0, "step": "start a node", "node": "node-3", "settled_after_s": None},
        ],
        samples=[
            {"t": t, "held": {"node-1": 8, "node-2": 8}, "sees": {"node-1": 2, "node-2": 2}}
            for t in (1.0, 2.0, 3.0)
        ]
        + [{"t": 20.0, "held": {"node-2": 16}, "sees": {"node-2": 1}}],
    )
    return result


def test_the_report_plots_lateness_buckets_and_views_with_event_markers() -> None:
    page = Svgs()
    page.feed(render_html(a_result(lost=False)))
    assert "kill-once" in page.title and "PASSED" in page.title
    assert set(page.plots) == {"lateness", "buckets", "members"}
    assert page.plots["lateness"]["circle"] == 3  # one dot per delivered schedule
    for plot in page.plots.values():
        assert plot["event"] == 2  # a marker per event
    assert page.plots["buckets"]["series"] == 2  # a line per node seen
    assert page.plots["members"]["series"] == 2


def test_a_failed_run_says_so_in_its_title() -> None:
    page = Svgs()
    page.feed(render_html(a_result(lost=True)))
    assert "FAILED" in page.title
    assert page.plots["lateness"]["circle"] == 2


@pytest.mark.parametrize(
    ("do", "label"),
    [("crash-store", "crash the store for 5 s"), ("pause-broker", "pause the broker for 5 s")],
)
def test_a_server_fault_takes_an_outage_and_no_target(do: str, label: str) -> None:
    parsed = parse("c", scenario(timeline=[{"at": 20, "do": do, "for": 5}]))
    [step] = parsed.steps
    assert (step.do, step.lasting, step.target) == (do, 5, "")
    assert step.label == label
    with pytest.raises(ScenarioError, match="missing 'for'"):
        parse("c", scenario(timeline=[{"at": 20, "do": do}]))


def test_crash_store_takes_no_target() -> None:
    with pytest.raises(ScenarioError, match="crash-store takes no target"):
        parse("c", scenario(timeline=[{"at": 20, "do": "crash-store", "for": 5, "target": "x"}]))


def test_an_offset_served_with_two_records_is_reported_and_fails_no_run() -> None:
    deliveries = [
        Delivery("a", 1, 1, 100.1, digest="d1", partition=0, offset=7),
        Delivery("a", 1, 1, 100.1, digest="d1", partition=0, offset=7),  # read twice: no reuse
        Delivery("b", 1, 1, 100.2, digest="d2", partition=0, offset=8),
        Delivery("c", 2, 1, 100.3, digest="d3", partition=0, offset=8),  # offset 8 given twice
        Delivery("d", 1, 1, 100.4, digest="d4", partition=1, offset=8),  # another partition
    ]
    accepted = {unit: 100.0 for unit in "abcd"}
    result = check(accepted, set(), deliveries)
    assert (result["offsets_reused"], result["offsets_reused_ids"]) == (1, ["0:8"])
    assert (result["delivered"], result["duplicates"]) == (4, 0)  # a's second read is one record
    assert passed(result)
    result.update(
        scenario="s", seed=1, unfenced=False, refused=0, chains=0, network="loopback",
        events=[], refusals={}, started=95.0, passed=True,
    )  # fmt: skip
    text = render(result)
    assert "the broker served 1 offsets with two different records (0:8)" in text


def test_a_broker_stall_the_nodes_saw_explains_a_deferred_publish() -> None:
    """Soak seed 1: the embedded broker stopped answering for ~40 s with no
    fault injected; a node's send timed out after 10 s (deferred, no attempt
    spent) and went again under the same claim once the broker was back.
    The nodes' /readyz said `broker: false` meanwhile: that is the fault."""
    started = 1000.0
    samples: list[dict[str, Any]] = [
        {"t": 440.0, "unready": {}},
        *({"t": float(t), "unready": {"node-7": ["broker"]}} for t in range(452, 483)),
        {"t": 484.0, "unready": {"node-4": ["store"]}},  # another check: not the broker
        {"t": 500.0, "unready": {"node-2": ["broker", "store"]}},  # a second, short spell
    ]
    stalls = broker_stalls(samples, started)
    assert [(w.start, w.end) for w in stalls] == [
        (started + 452 - STALL_LEAD, started + 483.0),
        (started + 500 - STALL_LEAD, started + 501.0),
    ]
    copies = [
        Delivery("chain1@x", 17, 1, started + 442.133, "f6fc", 0, 4252),
        Delivery(
            "chain1@x", 17, 1, started + 483.310, "f6fc", 0, 4006
        ),  # the stalled send landed last
    ]
    accepted = {"chain1@x": started + 442.0}
    assert not passed(check(accepted, set(), copies))  # no fault known: a double claim
    result = check(accepted, set(), copies, broker_faults=stalls)
    assert result["duplicates_by_kind"]["deferred_publish"] == 1
    assert passed(result)


def test_a_delivery_late_outside_every_intended_window_fails_the_run() -> None:
    """A one-node broker cut of 60 s: the fault's report window covers the
    whole cut, so the old checker passed a run whose share of the cut node
    went out a minute late. Its intended window is only the hand-over."""
    cut = Window("cut node-2 from the broker for 60 s", 999.0, 1081.0)
    handover = Window(cut.label, 999.0, 1021.0)
    accepted = {"early-in-cut": 1005.0, "late-in-cut": 1040.0, "after": 1100.0}
    deliveries = [
        Delivery("early-in-cut", 3, 1, 1013.0),  # during the hand-over: intended
        Delivery("late-in-cut", 3, 1, 1061.0),  # 21 s late, after the hand-over
        Delivery("after", 4, 1, 1100.2),
    ]
    old = check(accepted, set(), deliveries, [cut])
    assert old["late_outside_windows"] == 0 and passed(old)  # before: windows only
    result = check(accepted, set(), deliveries, [cut], intended=[handover])
    assert result["late_outside_windows_ids"] == ["late-in-cut"]
    assert not passed(result)
    # Lateness of up to the bound outside any window is still a pass.
    fine = check(
        accepted, set(), [Delivery(u, 3, 1, at + 9.5) for u, at in accepted.items()], [cut],
        intended=[handover],
    )  # fmt: skip
    assert fine["late_outside_windows"] == 0 and passed(fine)


def test_a_broker_cut_of_one_node_is_not_a_stall_of_the_broker() -> None:
    """For the intended windows, a broker spell is one most nodes saw: a
    node cut from the broker alone says so on its /readyz too."""
    held = {"node-1": 80, "node-2": 90, "node-3": 86}
    one = [{"t": float(t), "held": held, "unready": {"node-2": ["broker"]}} for t in range(5)]
    two = [
        {"t": float(t), "held": held, "unready": {"node-2": ["broker"], "node-3": ["broker"]}}
        for t in range(10, 15)
    ]
    assert len(broker_stalls(one, 0.0)) == 1  # any node: explains duplicates
    assert broker_stalls(one, 0.0, most=True) == []
    [spell] = broker_stalls([*one, *two], 0.0, most=True)
    assert (spell.start, spell.end) == (10.0 - STALL_LEAD, 15.0)


def test_a_schedule_left_in_flight_at_the_end_fails_the_run() -> None:
    result = check({"a": 100.0}, set(), [Delivery("a", 1, 1, 100.1)])
    assert passed({**result, "stranded": 0})
    assert not passed({**result, "stranded": 1})  # delivered, but its mark is owed for good
