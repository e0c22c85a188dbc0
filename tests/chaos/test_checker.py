"""The chaos checker over histories: each invariant judged from what the
load, the fault player and the observer wrote, and what the topic got."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from chaos.checker import INVARIANTS, check, late_past_windows, passed
from chaos.checker.flow import most_allowed, over_flow_rate
from chaos.history import HTTP, INFO, KAFKA, Delivery, History, Topic, occurrence
from chaos.observe import served_late
from ring import bucket_for
from tests.chaos_histories import Load, created, iso, topic


def test_a_clean_run_passes() -> None:
    accepted = {"a": 100.0, "b": 101.0}
    result = check(
        created(accepted), topic(Delivery("a", 1, 1, 100.02), Delivery("b", 1, 1, 101.5))
    )
    assert passed(result)
    assert (result["lost"], result["duplicates"], result["delivered"]) == (0, 0, 2)
    assert result["lateness_s"]["max"] == pytest.approx(0.5)


def test_recurring_schedules_are_judged_occurrence_by_occurrence() -> None:
    load = Load()
    ticks = load.chain("chain", 100.0, 110.0, 5)
    history = load.history
    each_once = [Delivery(unit, 1, 1, 100.1 + 5 * k) for k, unit in enumerate(ticks)]
    result = check(history, topic(*each_once))
    assert passed(result) and result["occurrences"] == 3

    missing = check(history, topic(*each_once[:2]))
    assert not passed(missing) and missing["lost_ids"] == [ticks[2]]

    doubled = check(history, topic(*each_once, Delivery(ticks[1], 1, 1, 105.2)))
    assert not passed(doubled) and doubled["duplicates_same_claim_ids"] == [ticks[1]]

    off_grid = occurrence("chain", iso(109.0))
    drifted = check(history, topic(*each_once, Delivery(off_grid, 1, 1, 109)))
    assert not passed(drifted)
    assert drifted["unexpected_occurrences_ids"] == [off_grid]


def test_an_occurrence_is_fenced_by_its_schedules_bucket() -> None:
    """Stale claims compare tokens of one bucket: an occurrence's is its schedule's."""
    load = Load()
    a, b = load.chain("chain", 100.0, 105.0, 5)
    # Token 5 delivered at 100.1; token 4 then claimed an occurrence due at 105: two owners.
    result = check(load.history, topic(Delivery(a, 5, 1, 100.1), Delivery(b, 4, 1, 105.1)))
    assert result["stale_claims_ids"] == [b]


def test_an_accepted_schedule_never_delivered_is_lost() -> None:
    result = check(created({"a": 100.0, "b": 100.0}), topic(Delivery("a", 1, 1, 100.1)))
    assert not passed(result)
    assert (result["lost"], result["lost_ids"]) == (1, ["b"])


def test_a_cancelled_schedule_is_not_lost_but_must_never_arrive() -> None:
    history = Load().created({"a": 100.0}).cancel("a", 99.0).history
    assert passed(check(history, topic()))
    result = check(history, topic(Delivery("a", 1, 1, 100.1)))
    assert not passed(result)
    assert result["cancelled_delivered_ids"] == ["a"]


def test_a_duplicate_under_a_new_token_is_explained_one_under_the_same_claim_is_not() -> None:
    takeover = [Delivery("a", 3, 1, 100.1), Delivery("a", 4, 2, 110.0)]
    retry = [Delivery("b", 3, 1, 100.1), Delivery("b", 3, 2, 102.0)]
    result = check(created({"a": 100.0, "b": 100.0}), topic(*takeover, *retry))
    assert passed(result)
    assert (result["duplicates"], result["duplicates_same_claim"]) == (2, 0)
    # Two copies under one token and attempt: two owners claimed with one token.
    twice = [Delivery("c", 5, 1, 100.1), Delivery("c", 5, 1, 100.2)]
    result = check(created({"c": 100.0}), topic(*twice))
    assert not passed(result)
    assert result["duplicates_same_claim_ids"] == ["c"]


def crashed(accepted: dict[str, float], at: float, lasting: float = 0.0) -> History:
    """The database killed ``at`` (the history starts at 0)."""
    load = Load().created(accepted)
    load.fault("crash-store", at, lasting, f"crash the store for {lasting:g} s")
    return load.history


def test_one_claim_delivered_on_both_sides_of_a_database_crash_is_explained() -> None:
    # The claim's acknowledgement was lost with the database: the owner
    # claims again, same token, same attempt number.
    twice = topic(Delivery("c", 5, 1, 100.1), Delivery("c", 5, 1, 104.0))
    result = check(crashed({"c": 100.0}, 101.0), twice)
    assert passed(result)
    assert (result["duplicates_across_store_crash"], result["duplicates_same_claim"]) == (1, 0)
    # A crash before both copies explains nothing.
    assert not passed(check(crashed({"c": 100.0}, 99.0), twice))


# -- duplicates, told apart by kind ----------------------------------------------

# A broker paused at 121 s for 10 s: its window runs from a second before to
# the end of the recovery allowance (120 to 151), as the runner draws it.
PAUSE = "pause the broker for 10 s"


def broker_paused(accepted: dict[str, float]) -> History:
    load = Load().created(accepted)
    load.fault("pause-broker", 121.0, 10.0, PAUSE)
    return load.history


def kind_of(result: dict[str, Any], unit: str) -> tuple[str, str | None]:
    [entry] = [e for e in result["duplicates_explained"] if e["id"] == unit]
    return entry["kind"], entry["window"]


def test_copies_under_different_tokens_are_an_owner_change() -> None:
    copies = topic(Delivery("a", 3, 1, 100.1), Delivery("a", 4, 2, 110.0))
    result = check(created({"a": 100.0}), copies)
    assert passed(result)
    assert result["duplicates_by_kind"]["owner_change"] == result["duplicates"] == 1
    assert kind_of(result, "a") == ("owner_change", None)


def test_later_attempts_of_one_owner_are_a_retried_publish() -> None:
    copies = topic(Delivery("b", 3, 1, 100.1), Delivery("b", 3, 2, 102.0))
    result = check(created({"b": 100.0}), copies)
    assert passed(result)
    assert result["duplicates_by_kind"]["retried_publish"] == 1
    assert kind_of(result, "b") == ("retried_publish", None)


def test_one_claim_across_a_database_crash_is_explained_by_that_crash() -> None:
    history = crashed({"c": 100.0}, 101.0, 5.0)  # down from 101 to 106
    twice = topic(Delivery("c", 5, 1, 100.1, "d1"), Delivery("c", 5, 1, 107.0, "d1"))
    result = check(history, twice)
    assert passed(result)
    assert result["duplicates_by_kind"]["across_store_crash"] == 1
    assert kind_of(result, "c") == ("across_store_crash", "crash the store for 5 s")
    # Claimed just before the kill, published as it landed (everything,
    # seed 2: the record stamped 3 ms after the runner sent the kill), or
    # while the database was down: the crash lost that claim too.
    landing = topic(Delivery("c", 5, 1, 101.003, "d1"), Delivery("c", 5, 1, 113.0, "d1"))
    result = check(history, landing)
    assert kind_of(result, "c") == ("across_store_crash", "crash the store for 5 s")
    # Both copies after the crash: the crash explains neither.
    later = topic(Delivery("c", 5, 1, 107.0, "d1"), Delivery("c", 5, 1, 108.0, "d1"))
    result = check(history, later)
    assert not passed(result)
    assert kind_of(result, "c") == ("same_claim", None)


def test_a_batch_resent_inside_a_broker_fault_is_a_producer_retry() -> None:
    # The broker stored the first copy after the producer had given up on
    # the request; the resend carries the very batch, CreateTime included.
    sent = Delivery("p", 5, 1, 125.123, "9f2c", partition=0, offset=40)
    again = Delivery("p", 5, 1, 125.123, "9f2c", partition=0, offset=57)
    result = check(broker_paused({"p": 125.0}), topic(sent, again))
    assert passed(result)
    assert (result["duplicates_same_claim"], result["duplicates_by_kind"]["producer_retry"]) == (
        0,
        1,
    )
    assert kind_of(result, "p") == ("producer_retry", "pause the broker for 10 s")


@pytest.mark.parametrize(
    "faults",
    [
        (),  # no broker fault in the run
        (("pause-broker", 121.0, 10.0),),  # the resend's timestamp is after the pause's window
        (("kill", 151.0, 0.0),),  # a fault, but not the broker's
    ],
    ids=["no-fault", "after-the-pause", "not-the-broker"],
)
def test_the_same_batch_twice_outside_every_broker_fault_fails_the_run(
    faults: tuple[tuple[str, float, float], ...],
) -> None:
    load = Load().created({"p": 160.0})
    for do, at, lasting in faults:
        load.fault(do, at, lasting)
    twice = topic(
        Delivery("p", 5, 1, 160.0, "9f2c", 0, 40), Delivery("p", 5, 1, 160.0, "9f2c", 0, 41)
    )
    result = check(load.history, twice)
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
    result = check(broker_paused({"p": 125.0}), topic(first, second))
    assert not passed(result)
    assert result["duplicates_same_claim_ids"] == ["p"]
    assert kind_of(result, "p") == ("same_claim", None)


def test_copies_recorded_without_a_digest_are_never_a_producer_retry() -> None:
    # Same token, attempt and timestamp inside a pause, but nothing shows
    # the value was the same: not proved a resend.
    twice = topic(Delivery("p", 5, 1, 125.123), Delivery("p", 5, 1, 125.123))
    result = check(broker_paused({"p": 125.0}), twice)
    assert not passed(result)
    assert kind_of(result, "p") == ("same_claim", None)


def test_a_producer_retry_does_not_hide_another_send_of_the_same_claim() -> None:
    # A resend inside the pause, and a third copy of that claim stamped
    # later, with another value and no database crash between: one claim
    # published twice.
    copies = topic(
        Delivery("p", 5, 1, 125.5, "9f2c"),
        Delivery("p", 5, 1, 125.5, "9f2c"),
        Delivery("p", 5, 1, 126.0, "77aa"),
    )
    result = check(broker_paused({"p": 125.0}), copies)
    assert not passed(result)
    assert kind_of(result, "p") == ("same_claim", None)


def test_a_claim_published_again_after_a_broker_fault_is_a_deferred_publish() -> None:
    # The broker stored the copy sent during its fault, its answer was lost;
    # the broker's trouble spends no attempt, so the node published the same
    # claim again (a new record timestamp) once the broker was back.
    cut = "cut node-3 from the broker for 10 s"  # at 121: its window 120 to 151

    def cut_off(accepted: dict[str, float]) -> History:
        load = Load().created(accepted)
        load.fault("cut-broker", 121.0, 10.0, cut)
        return load.history

    copies = topic(Delivery("d", 5, 1, 125.5, "9f2c"), Delivery("d", 5, 1, 160.0, "9f2c"))
    result = check(cut_off({"d": 125.0}), copies)
    assert passed(result)
    assert kind_of(result, "d") == ("deferred_publish", cut)
    assert result["duplicates_by_kind"]["deferred_publish"] == 1
    # The earlier send outside every broker fault: nothing explains it.
    early = topic(Delivery("d", 5, 1, 110.0, "9f2c"), Delivery("d", 5, 1, 160.0, "9f2c"))
    assert kind_of(check(cut_off({"d": 110.0}), early), "d") == ("same_claim", None)
    # Another value, or none recorded: not the same record published again.
    for digests in (("9f2c", "77aa"), (None, None)):
        other = topic(
            Delivery("d", 5, 1, 125.5, digests[0]), Delivery("d", 5, 1, 160.0, digests[1])
        )
        result = check(cut_off({"d": 125.0}), other)
        assert not passed(result) and kind_of(result, "d") == ("same_claim", None)


def test_a_duplicate_is_explained_with_its_copies_in_time_order() -> None:
    later = Delivery("p", 6, 2, 140.0, "9f2c", partition=1, offset=3)  # the next owner's
    sent = Delivery("p", 5, 1, 125.1234, "9f2c", partition=0, offset=40)
    again = Delivery("p", 5, 1, 125.1234, "9f2c", partition=0, offset=57)
    result = check(broker_paused({"p": 125.0}), topic(later, sent, again))
    copy = {
        "token": 5,
        "attempt": 1,
        "at": 125.123,
        "digest": "9f2c",
        "partition": 0,
        "sink": "kafka",
    }
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
                    "sink": "kafka",
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
    result = check(broker_paused({"m": 100.0, "r": 125.0}), topic(*mixed, *retried))
    assert not passed(result)
    assert result["duplicates_same_claim_ids"] == ["m"]
    assert kind_of(result, "r") == ("producer_retry", PAUSE)
    assert sum(result["duplicates_by_kind"].values()) == result["duplicates"] == 2


def test_the_explained_duplicates_list_failures_first_and_stop_at_fifty() -> None:
    units = [f"u{i:02}" for i in range(60)]
    deliveries = [Delivery(u, t, t, 100.1 + t) for u in units for t in (1, 2)]
    deliveries += [Delivery("zz", 1, 1, 100.1), Delivery("zz", 1, 1, 100.2)]
    result = check(created({u: 100.0 for u in [*units, "zz"]}), topic(*deliveries))
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


def test_a_record_gone_from_the_topic_at_the_end_vanished() -> None:
    history = created({"a": 100.0, "b": 100.0})
    deliveries = [Delivery("a", 1, 1, 100.1), Delivery("b", 1, 1, 100.2)]
    assert passed(check(history, topic(*deliveries, kept={"a", "b"})))
    result = check(history, topic(*deliveries, kept={"b"}))
    assert not passed(result)
    assert (result["vanished"], result["vanished_ids"]) == (1, ["a"])


def test_a_record_only_the_fresh_reader_at_the_end_found_is_delivered_not_lost() -> None:
    """The live reader was never served it (its fetches passed the offset
    before the broker showed the record), but it is in the topic."""
    history = created({"a": 100.0, "b": 100.0})
    live = Delivery("a", 1, 1, 100.1, digest="x", partition=0, offset=4)
    late = Delivery("b", 1, 1, 100.2, digest="y", partition=0, offset=3)
    assert check(history, topic(live, kept={"a", "b"}))["lost_ids"] == ["b"]
    result = check(history, topic(live, kept={"a", "b"}, replayed=[late]))
    assert passed(result)
    assert (result["lost"], result["delivered"], result["duplicates"]) == (0, 2, 0)


def test_a_record_read_live_and_again_at_the_end_is_one_delivery_a_second_copy_two() -> None:
    history = created({"a": 100.0})
    live = Delivery("a", 1, 1, 100.1, digest="x", partition=0, offset=4)
    again = replace(live, received=200.0)
    assert check(history, topic(live, kept={"a"}, replayed=[again]))["duplicates"] == 0
    # Another copy at another offset is in the topic twice.
    copy = replace(live, offset=9)
    assert check(history, topic(live, kept={"a"}, replayed=[copy]))["duplicates"] == 1


def test_served_late_is_what_the_live_reader_was_never_served() -> None:
    live = [Delivery("a", 1, 1, 100.1, digest="x", partition=0, offset=4)]
    replayed = [
        replace(live[0], received=200.0),  # the same record, read again
        Delivery("b", 1, 1, 100.2, digest="y", partition=0, offset=3),
        replace(live[0], digest="z"),  # other bytes at that place: another record
    ]
    assert served_late(live, replayed) == (replayed[1], replayed[2])


def same_bucket_ids(count: int, buckets: int = 256) -> list[str]:
    first = bucket_for("s0", buckets)
    found = [f"s{i}" for i in range(100_000) if bucket_for(f"s{i}", buckets) == first]
    return found[:count]


def test_a_claim_under_a_token_older_than_one_already_at_work_is_a_double_claim() -> None:
    old_batch, new_work, stale = same_bucket_ids(3)
    deliveries = [
        Delivery(new_work, 5, 1, 100.1),  # the new owner (token 5) at work at 100.1
        # The former owner (token 4) finishing a batch claimed before it lost
        # the lease: due before token 5 acted, so explained.
        Delivery(old_batch, 4, 1, 101.0),
    ]
    assert passed(check(created({old_batch: 99.0, new_work: 100.0}), topic(*deliveries)))
    # Due at 105, after token 5 delivered: token 4 claimed it while token 5
    # held the bucket.
    accepted = {old_batch: 99.0, new_work: 100.0, stale: 105.0}
    result = check(created(accepted), topic(*deliveries, Delivery(stale, 4, 1, 105.2)))
    assert not passed(result)
    assert (result["stale_claims"], result["stale_claims_ids"]) == (1, [stale])


def test_lateness_is_split_by_fault_window_and_taken_from_the_first_copy() -> None:
    load = Load().created({"early": 100.0, "hit": 120.0, "late": 150.0})
    load.fault("kill", 119.0, 0.0, "kill node-2")  # its window: 118 to 139
    deliveries = topic(
        Delivery("early", 1, 1, 100.1),
        Delivery("hit", 1, 1, 128.0),
        Delivery("hit", 2, 2, 129.0),
        Delivery("late", 1, 1, 150.2),
    )
    result = check(load.history, deliveries)
    [window] = result["windows"]
    assert window["lateness_s"]["count"] == 1
    assert window["lateness_s"]["max"] == pytest.approx(8.0)
    outside = result["lateness_outside_windows_s"]
    assert outside["count"] == 2
    assert outside["max"] == pytest.approx(0.2)


def test_a_delivery_before_its_time_fails_the_run() -> None:
    deliveries = topic(Delivery("a", 1, 1, 99.9), Delivery("b", 1, 1, 99.999))
    result = check(created({"a": 100.0, "b": 100.0}), deliveries)
    assert not passed(result)
    assert result["early_ids"] == ["a"]  # b is within the millisecond timestamps' rounding
    assert math.isnan(check(History(), topic())["lateness_s"]["p99"])


# -- the verbs of issue 19: bulk cancel, pause and resume, reschedule ----------------


def test_a_bulk_cancelled_schedule_is_owed_nothing_and_never_goes_out_after_the_200() -> None:
    def taken(execute_at: float) -> History:  # the bulk cancel answered at 100
        return Load().created({"a": execute_at}, group="g1").bulk_cancel("g1", 100.0, ["a"]).history

    result = check(taken(102.0), topic())
    assert passed(result) and (result["lost"], result["bulk_cancelled"]) == (0, 1)
    # Out before the 200: it had gone out, then was PENDING again (a dead
    # owner's publish, redone) when the bulk cancel took it.
    assert passed(check(taken(99.0), topic(Delivery("a", 1, 1, 99.5))))
    result = check(taken(102.0), topic(Delivery("a", 1, 1, 102.1)))
    assert not passed(result)
    assert result["cancelled_delivered_ids"] == ["a"]


def test_a_bulk_paused_schedule_is_owed_nothing_and_never_goes_out_after_the_last_200() -> None:
    def taken(execute_at: float) -> History:  # the bulk pause's last call answered at 100
        return Load().created({"a": execute_at}, group="g1").bulk_pause("g1", 100.0, ["a"]).history

    result = check(taken(102.0), topic())
    assert passed(result) and (result["lost"], result["bulk_paused"]) == (0, 1)
    assert result["still_paused"] == 0  # counted as the bulk pause's
    # Out before the last answer: in flight when the pause was sent (its
    # more then true), put back and paused after: not a breach.
    assert passed(check(taken(99.0), topic(Delivery("a", 1, 1, 99.5))))
    result = check(taken(102.0), topic(Delivery("a", 1, 1, 102.1)))
    assert not passed(result)
    assert result["paused_delivered_ids"] == ["a"]


def test_a_schedule_paused_for_good_is_owed_nothing_and_never_goes_out_after_the_200() -> None:
    def paused(execute_at: float) -> History:  # the pause answered at 100, no resume
        return Load().created({"p": execute_at}).pause("p", 100.0).history

    result = check(paused(103.0), topic())
    assert passed(result) and (result["lost"], result["still_paused"]) == (0, 1)
    assert passed(check(paused(99.0), topic(Delivery("p", 1, 1, 99.2))))
    result = check(paused(103.0), topic(Delivery("p", 1, 1, 103.1)))
    assert not passed(result)
    assert result["paused_delivered_ids"] == ["p"]


def test_a_resumed_schedule_is_owed_again_but_never_while_it_was_paused() -> None:
    # Due at 101, paused at 100, its resume sent at 105 and answered at 105.2.
    resumed = Load().created({"p": 101.0}).pause("p", 100.0).resume("p", 105.0, 105.2).history
    result = check(resumed, topic())
    assert not passed(result) and result["lost_ids"] == ["p"]
    result = check(resumed, topic(Delivery("p", 1, 1, 105.3)))
    assert passed(result) and result["still_paused"] == 0
    # Late from its resume, not from its executeAt (4.3 s before it).
    assert result["lateness_s"]["max"] == pytest.approx(0.1)
    # Out at its executeAt while paused, and again after the resume.
    result = check(resumed, topic(Delivery("p", 1, 1, 101.0), Delivery("p", 2, 1, 105.3)))
    assert not passed(result)
    assert result["paused_delivered_ids"] == ["p"]


def moved() -> History:
    """Created for 100; a PATCH answered at 98 moved it to 104, one answered
    at 99 to 102."""
    return Load().created({"r": 100.0}).patch("r", 104.0, 98.0).patch("r", 102.0, 99.0).history


def test_a_rescheduled_schedule_goes_out_at_its_last_time() -> None:
    result = check(moved(), topic(Delivery("r", 1, 1, 102.1, execute_at=102.0)))
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
    result = check(moved(), topic(stray, Delivery("r", 2, 1, 102.1, execute_at=102.0)))
    assert not passed(result)
    assert result["rescheduled_wrong_time_ids"] == ["r"]


def test_a_rescheduled_schedule_out_only_at_an_earlier_time_is_lost() -> None:
    # Out at 100 before the first PATCH answered (then PENDING again), never at 102.
    result = check(moved(), topic(Delivery("r", 1, 1, 97.5, execute_at=100.0)))
    assert result["rescheduled_wrong_time"] == 0
    assert not passed(result) and result["lost_ids"] == ["r"]


def test_a_rescheduled_schedule_is_early_by_the_time_its_record_carries() -> None:
    # Its last PATCH (to 104) has no known outcome: 102 and 104 both stand,
    # and a record is early against the one it carries.
    unsure = Load().created({"r": 100.0}).patch("r", 102.0, 98.0).patch("r", 104.0, 99.0, INFO)
    history = unsure.history
    for carried in (102.0, 104.0):
        copy = Delivery("r", 1, 1, carried + 0.1, execute_at=carried)
        assert passed(check(history, topic(copy)))
    result = check(history, topic(Delivery("r", 1, 1, 103.0, execute_at=104.0)))
    assert not passed(result) and result["early_ids"] == ["r"]
    result = check(history, topic(Delivery("r", 1, 1, 100.1, execute_at=100.0)))
    assert not passed(result) and result["rescheduled_wrong_time_ids"] == ["r"]


def test_a_record_out_before_a_reschedule_is_fenced_by_the_time_it_carries() -> None:
    moved_one, other = same_bucket_ids(2)
    # Created for 100, moved to 110 by a PATCH answered at 103.
    history = (
        Load().created({moved_one: 100.0, other: 101.0}).patch(moved_one, 110.0, 103.0).history
    )
    deliveries = [
        # Token 4 sent it at its first time; then PENDING again (its owner
        # died before marking it) and moved to 110 by a PATCH.
        Delivery(moved_one, 4, 1, 100.1, execute_at=100.0),
        Delivery(other, 5, 1, 101.1, execute_at=101.0),  # token 5 at work from 101.1
        Delivery(moved_one, 5, 1, 110.1, execute_at=110.0),
    ]
    result = check(history, topic(*deliveries))
    assert passed(result) and result["stale_claims"] == 0
    # Judged by its last time (110), token 4's copy would be a claim made
    # after token 5 acted.
    blind = [replace(d, execute_at=None) for d in deliveries]
    assert check(history, topic(*blind))["stale_claims_ids"] == [moved_one]


# -- lateness outside the faults' intended windows ---------------------------------


def test_a_delivery_late_outside_every_intended_window_fails_the_run() -> None:
    """A one-node broker cut of 60 s: the fault's report window covers the
    whole cut, so the old checker passed a run whose share of the cut node
    went out a minute late. Its intended window is only the hand-over."""
    accepted = {"early-in-cut": 1005.0, "late-in-cut": 1040.0, "after": 1100.0}
    deliveries = topic(
        Delivery("early-in-cut", 3, 1, 1013.0),  # during the hand-over: intended
        Delivery("late-in-cut", 3, 1, 1061.0),  # 21 s late, after the hand-over
        Delivery("after", 4, 1, 1100.2),
    )

    def cut(do: str) -> History:
        load = Load().created(accepted)
        load.fault(do, 1000.0, 60.0, "cut node-2 from the broker for 60 s")
        return load.history

    # Where nobody can work (the broker down for all), the whole fault is
    # intended, as every fault's window was before.
    old = check(cut("crash-broker"), deliveries)
    assert old["late_outside_windows"] == 0 and passed(old)
    result = check(cut("cut-broker"), deliveries)
    assert result["late_outside_windows_ids"] == ["late-in-cut"]
    assert not passed(result)
    # Lateness of up to the bound outside any window is still a pass.
    fine = check(
        cut("cut-broker"), topic(*(Delivery(u, 3, 1, at + 9.5) for u, at in accepted.items()))
    )
    assert fine["late_outside_windows"] == 0 and passed(fine)


def test_a_fault_no_other_node_could_take_over_costs_its_whole_length() -> None:
    """The simulation marks a fault of one node ``unshared`` when no other
    could do its work (every node under a fault, or one its target rides
    out holding its buckets): intended for its whole length, as a fault of
    the servers is."""
    accepted = {"late-in-fault": 1040.0}
    late = topic(Delivery("late-in-fault", 3, 1, 1061.0))

    def lost_answers(**fields: Any) -> History:
        load = Load().created(accepted)
        load.fault("lose-store-answers", 1000.0, 60.0, **fields)
        return load.history

    assert check(lost_answers(), late)["late_outside_windows_ids"] == ["late-in-fault"]
    assert check(lost_answers(unshared=True), late)["late_outside_windows"] == 0


def test_late_past_its_windows_is_judged_where_asked() -> None:
    """Due inside a window, a unit may be late while the windows last, not
    for good: a claim left to the sweep of stranded claims (minutes) fails
    ``late_past_windows``, which the simulation judges (its windows are
    exact); a window that overlaps the first extends it."""
    load = Load().created({"in-window": 1005.0})
    load.fault("cut-broker", 1000.0, 5.0)  # intended until 1025
    load.fault("kill", 1030.0, 5.0)  # opens at 1020: overlaps, intended until 1050
    judged = (*INVARIANTS, late_past_windows)

    def delivered_at(at: float) -> dict[str, Any]:
        return check(load.history, topic(Delivery("in-window", 3, 1, at)), judged)

    assert delivered_at(1059.0)["late_past_windows"] == 0
    swept = delivered_at(1125.0)
    assert swept["late_past_windows_ids"] == ["in-window"] and not passed(swept)
    assert swept["late_outside_windows"] == 0  # due inside a window: excused there
    # Not one of the invariants every run is judged by.
    unjudged = check(load.history, topic(Delivery("in-window", 3, 1, 1125.0)))
    assert "late_past_windows" not in unjudged


def test_a_chain_replaying_its_backlog_is_late_by_its_first_missed_occurrence_only() -> None:
    # The broker down 100 to 160 (intended until 180); the chain's missed
    # occurrences go out one after another from 170, two seconds apart, so
    # the last, due at 185 (after the window), goes at 204: 19 s late, all
    # but 2 of them waiting on the one before it (out at 202).
    load = Load()
    ticks = load.chain("c", 100.0, 185.0, 5)
    load.fault("crash-broker", 100.0, 60.0)
    replayed = [
        Delivery(unit, 1, 1, max(170.0 + 2 * k, 100.0 + 5 * k)) for k, unit in enumerate(ticks)
    ]
    assert replayed[-1].at == 204.0
    result = check(load.history, topic(*replayed))
    assert passed(result) and result["late_outside_windows"] == 0
    # Out at 220 instead: 18 s after the one before it, its own lateness.
    stuck = [*replayed[:-1], replace(replayed[-1], at=220.0)]
    assert check(load.history, topic(*stuck))["late_outside_windows_ids"] == [ticks[-1]]


def test_a_broker_stall_most_nodes_saw_is_an_intended_window() -> None:
    def stalled(*, most: bool) -> History:
        load = Load().created({"a": 1040.0})
        load.stall("the broker stalled", 1035.0, 1050.0, most=most)
        return load.history

    late = topic(Delivery("a", 3, 1, 1061.0))
    assert check(stalled(most=False), late)["late_outside_windows"] == 1
    assert check(stalled(most=True), late)["late_outside_windows"] == 0


def test_a_schedule_left_in_flight_at_the_end_fails_the_run() -> None:
    result = check(created({"a": 100.0}), topic(Delivery("a", 1, 1, 100.1)))
    assert passed({**result, "stranded": 0})
    assert not passed({**result, "stranded": 1})  # delivered, but its mark is owed for good


# -- the composition: each invariant counts, and nothing else does its work ----------


def _breaks_stale_claims() -> tuple[History, Topic]:
    new_work, stale = same_bucket_ids(2)
    history = created({new_work: 100.0, stale: 105.0})
    return history, topic(Delivery(new_work, 5, 1, 100.1), Delivery(stale, 4, 1, 105.2))


def _breaks_unexpected_occurrences() -> tuple[History, Topic]:
    load = Load()
    ticks = load.chain("c", 100.0, 105.0, 5)
    past_end = occurrence("c", iso(110.0))
    ends = [Delivery(unit, 1, 1, 100.1 + 5 * k) for k, unit in enumerate([*ticks, past_end])]
    return load.history, topic(*ends)


# A history and a topic that break exactly one invariant, by its name.
def _limited(count: int, spacing: float) -> tuple[History, Topic]:
    load = Load()
    for n in range(count):
        load.create(f"k{n}", 100.0, sink=HTTP, flow_rate=4)
    calls = (Delivery(f"k{n}", 1, 1, 100.1 + n * spacing, sink=HTTP) for n in range(count))
    return load.history, topic(*calls)


def _breaks_flow_rate() -> tuple[History, Topic]:
    return _limited(7, 0.07)


BREAKS: dict[str, Callable[[], tuple[History, Topic]]] = {
    "lost": lambda: (created({"a": 100.0}), topic()),
    "cancelled_delivered": lambda: (
        Load().created({"a": 100.0}).cancel("a", 99.0).history,
        topic(Delivery("a", 1, 1, 100.1)),
    ),
    "paused_delivered": lambda: (
        Load().created({"p": 103.0}).pause("p", 100.0).history,
        topic(Delivery("p", 1, 1, 103.1)),
    ),
    "rescheduled_wrong_time": lambda: (
        Load().created({"r": 100.0}).patch("r", 102.0, 99.0).history,
        topic(
            Delivery("r", 1, 1, 100.1, execute_at=100.0),
            Delivery("r", 2, 1, 102.1, execute_at=102.0),
        ),
    ),
    "early": lambda: (created({"a": 100.0}), topic(Delivery("a", 1, 1, 99.9))),
    "early_received": lambda: (
        created({"a": 100.0}),
        topic(Delivery("a", 1, 1, 100.01, received=95.0)),
    ),
    "duplicates": lambda: (
        created({"c": 100.0}),
        topic(Delivery("c", 5, 1, 100.1), Delivery("c", 5, 1, 100.2)),
    ),
    "vanished": lambda: (created({"a": 100.0}), topic(Delivery("a", 1, 1, 100.1), kept=())),
    "stale_claims": _breaks_stale_claims,
    "unexpected_occurrences": _breaks_unexpected_occurrences,
    "late_outside_windows": lambda: (created({"a": 100.0}), topic(Delivery("a", 1, 1, 111.0))),
    # Switched to the receiver at 99, then a record in the topic after that.
    "wrong_destination": lambda: (
        Load().create("w", 100.0, sink=KAFKA).switch("w", HTTP, 102.0, 99.0).history,
        topic(
            Delivery("w", 1, 1, 102.1, execute_at=102.0, sink=HTTP),
            Delivery("w", 2, 1, 102.2, execute_at=102.0),
        ),
    ),
    # Seven calls of a key limited to 4 a second in half a second (6 allowed).
    "over_flow_rate": _breaks_flow_rate,
    # Given up on, and the receiver refused nothing of it.
    "delivery_failed": lambda: (
        Load().create("f", 100.0).failed("f").history,
        topic(Delivery("f", 1, 1, 100.1)),
    ),
}


def test_a_flow_limited_key_may_see_its_rate_and_two_slices_in_any_second() -> None:
    assert (most_allowed(4), most_allowed(20), most_allowed(25)) == (6, 24, 31)
    within = over_flow_rate(*_limited(6, 0.07))
    assert within.ids == () and within.figures["flow_most_in_a_period"] == 6
    # Spread out, any number: never more than 6 in a second.
    spread = over_flow_rate(*_limited(40, 0.2))
    assert spread.ids == () and spread.figures["flow_most_in_a_period"] == 5
    over = over_flow_rate(*_breaks_flow_rate())
    assert over.ids == ("k6",)


@pytest.mark.parametrize("invariant", INVARIANTS, ids=lambda i: i.__name__)
def test_each_invariant_alone_fails_the_history_that_breaks_it(invariant: Any) -> None:
    history, got = BREAKS[invariant.__name__]()
    name = invariant(history, got).name
    result = check(history, got)
    assert result[name] == 1 and not passed(result)
    # The others see nothing wrong: without it, the run passes.
    rest = [other for other in INVARIANTS if other is not invariant]
    without = check(history, got, invariants=rest)
    assert name not in without and passed(without)


def test_a_history_written_and_read_back_checks_the_same(tmp_path: Path) -> None:
    load = Load(started=1000.0, buckets=16)
    load.created({"a": 1010.0, "b": 1011.0, "m": 1012.0, "p": 1013.0})
    load.created({"g": 1014.0, "h": 1015.0}, group="g1")
    ticks = load.chain("chain", 1020.0, 1030.0, 5)
    load.cancel("b", 1005.0).patch("m", 1016.0, 1004.0).patch("m", 1018.0, 1006.0, INFO)
    load.pause("p", 1008.0).resume("p", 1012.0, 1012.2).bulk_cancel("g1", 1009.0, ["g"])
    killed = load.fault("kill", 12.0, 0.0, "kill node-2")
    load.note(killed, 1019.0, settled_after_s=6.5)
    load.fault("pause-broker", 15.0, 5.0)
    load.fault("crash-store", 25.0, 3.0)
    load.stall("the broker stalled", 1021.0, 1024.0, most=True)
    got = topic(
        Delivery("a", 1, 1, 1010.1, "d1", 0, 1, received=1010.2),
        Delivery("b", 1, 1, 1011.1, "d2", 0, 2),
        Delivery("m", 2, 1, 1016.3, "d3", 1, 1, execute_at=1016.0),
        Delivery("p", 2, 1, 1013.1, "d4", 1, 2),
        Delivery("h", 2, 1, 1015.5, "d5", 1, 3),
        Delivery("h", 2, 1, 1030.5, "d5", 1, 4),
        *(Delivery(unit, 3, 1, 1020.4 + 5 * k, f"t{k}", 2, k) for k, unit in enumerate(ticks)),
        kept={"a", "m", "p", "h"},
    )
    path = tmp_path / "history.jsonl"
    load.history.write(path)
    again = check(History.read(path), got)
    # (NaN, the lateness of a window nothing fell due in, equals no NaN.)
    assert json.dumps(again) == json.dumps(check(load.history, got))
    assert not passed(again) and again["duplicates_across_store_crash"] == 1
    assert (again["cancelled_delivered"], again["vanished"], again["bulk_cancelled"]) == (1, 4, 1)
