"""The broker check's verdict and its fault timing, without a broker: what
the producers were told compared with what a reader was served, made up."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import cast

import pytest

from chaos import brokercheck
from chaos.brokercheck import (
    Ack,
    Broker,
    Fault,
    Options,
    Tally,
    default_batch_gap,
    fault_due,
    inject,
    judge,
    phase,
    producer_settings,
    refusal,
    wait_for_turn,
    when,
)

Served = list[tuple[int, int, str]]


def tally(acks: dict[str, Ack], failures: dict[str, float] | None = None) -> Tally:
    told = Tally()
    told.acks.update(acks)
    told.failures.update(failures or {})
    return told


def crash(start: float, end: float, number: int = 1) -> Fault:
    return Fault("crash", number, acknowledged=0, settled=0, start=start, end=end)


def test_a_record_acknowledged_and_read_back_is_not_missing() -> None:
    told = tally({"p0-0": Ack(0, 0, 1.0), "p1-0": Ack(0, 1, 1.1)})
    result = judge(told, [(0, 0, "p0-0"), (0, 1, "p1-0")], [], [], 1)
    assert (result.acknowledged, result.read, result.missing, result.details) == (2, 2, [], [])
    assert (result.offsets_reused, result.read_twice, result.misplaced) == (0, 0, 0)
    assert (result.acks_shared, result.failed_present) == (0, 0)
    assert "read by partition" not in result.lines(1)[1]  # one partition: no split


def test_a_record_acknowledged_and_not_read_is_missing_with_what_its_offset_holds() -> None:
    told = tally({"p0-0": Ack(0, 0, 1.0), "p1-0": Ack(0, 1, 1.1), "p2-0": Ack(0, 2, 1.2)})
    # Offset 1 went to another record; offset 2 is not there at all.
    served = [(0, 0, "p0-0"), (0, 1, "p3-7")]
    result = judge(told, served, [], [], 1)
    assert result.missing == ["p1-0", "p2-0"]
    assert result.misplaced == 0  # missing, not elsewhere
    assert result.details == [
        "p1-0: given partition 0 offset 1; that offset holds p3-7",
        "p2-0: given partition 0 offset 2; that offset holds nothing",
    ]
    assert result.lines(3)[0] == (
        "round 3: 3 acknowledged, 0 sends failed, 2 read, "
        "0 offsets given to two records, 2 missing (p1-0, p2-0)"
    )


def test_missing_records_come_in_the_order_of_their_places_and_at_most_shown_in_detail() -> None:
    count = brokercheck.SHOWN + 3
    acks = {f"p0-{i}": Ack(i % 2, i, float(i)) for i in reversed(range(count))}
    result = judge(tally(acks), [], [], [], 2)
    evens, odds = range(0, count, 2), range(1, count, 2)
    assert result.missing == [f"p0-{i}" for i in evens] + [f"p0-{i}" for i in odds]
    assert len(result.details) == brokercheck.SHOWN
    assert result.details[0].startswith("p0-0: given partition 0 offset 0;")


def test_an_offset_served_with_two_different_records_counts_as_reused() -> None:
    told = tally({"a": Ack(0, 0, 1.0), "b": Ack(0, 0, 1.1)})
    result = judge(told, [(0, 0, "a"), (0, 0, "b"), (0, 1, "c")], [], [], 1)
    assert result.offsets_reused == 1
    assert result.acks_shared == 1  # both acknowledged at (0, 0)
    assert result.missing == [] and result.read_twice == 0


def test_a_record_read_twice_is_counted_and_not_as_a_reused_offset() -> None:
    told = tally({"a": Ack(0, 0, 1.0)})
    result = judge(told, [(0, 0, "a"), (0, 1, "a")], [], [], 1)
    assert (result.read_twice, result.offsets_reused, result.misplaced) == (1, 0, 0)
    assert result.missing == []


def test_a_record_served_only_away_from_its_acknowledged_offset_is_misplaced_not_missing() -> None:
    told = tally({"a": Ack(0, 3, 1.0), "b": Ack(1, 0, 1.0)})
    result = judge(told, [(0, 5, "a"), (1, 0, "b")], [], [], 2)
    assert (result.misplaced, result.missing) == (1, [])
    assert result.read_by_partition == [1, 1]
    assert result.lines(1)[1].endswith("; read by partition 1, 1")


def test_a_failed_send_found_in_the_topic_anyway_is_counted() -> None:
    told = tally({"a": Ack(0, 0, 1.0)}, failures={"b": 2.0, "c": 2.5})
    result = judge(told, [(0, 0, "a"), (0, 1, "b")], [], [], 1)
    assert (result.failed, result.failed_present) == (2, 1)
    assert result.missing == []  # a failed send is not owed


def test_the_reads_are_counted_per_partition() -> None:
    served = [(0, 0, "a"), (2, 0, "b"), (2, 1, "c")]
    result = judge(tally({}), served, [], [], 3)
    assert result.read_by_partition == [1, 0, 2]
    assert result.read == 3


def test_a_missing_record_says_when_it_was_acknowledged_relative_to_the_faults() -> None:
    faults = [crash(10.0, 14.0), crash(20.0, 23.0, number=2)]
    told = tally({"early": Ack(0, 0, 5.0), "during": Ack(0, 1, 10.5), "after": Ack(0, 2, 14.4)})
    result = judge(told, [], faults, [], 1)
    assert result.details == [
        "early: given partition 0 offset 0, acknowledged before the faults; "
        "that offset holds nothing",
        "during: given partition 0 offset 1, acknowledged during crash 1, 0.50 s in; "
        "that offset holds nothing",
        "after: given partition 0 offset 2, acknowledged +0.40 s from the restart of crash 1; "
        "that offset holds nothing",
    ]
    assert result.missing_by_phase == Counter(
        {"before the faults": 1, "during crash 1": 1, "after crash 1": 1}
    )


def test_failures_are_counted_by_phase_and_acks_right_after_each_fault() -> None:
    faults = [crash(10.0, 14.0), crash(20.0, 23.0, number=2)]
    acks = {"a": Ack(0, 0, 14.2), "b": Ack(0, 1, 14.9), "c": Ack(0, 2, 15.5), "d": Ack(0, 3, 23.0)}
    told = tally(acks, failures={"x": 12.0, "y": 21.0, "z": 22.0})
    served = [(0, n, value) for n, value in enumerate(acks)]
    result = judge(told, served, faults, ["pause 1"], 1)
    assert result.right_after == [2, 1]  # 15.5 is past RIGHT_AFTER; 23.0 is at the end
    assert result.failed_by_phase == Counter({"during crash 1": 1, "during crash 2": 2})
    assert result.missing_by_phase == Counter()
    lines = result.lines(1)
    assert "  failed by phase: during crash 1: 1, during crash 2: 2" in lines
    assert not any(line.startswith("  missing by phase") for line in lines)
    assert any(line.startswith("  not made: pause 1 (") for line in lines)


def test_without_faults_no_phase_lines_are_shown() -> None:
    result = judge(tally({}, failures={"x": 1.0}), [], [], [], 1)
    assert result.failed_by_phase == Counter({"before the faults": 1})
    assert len(result.lines(1)) == 2  # the head and the counts only


def test_a_fault_line_gives_its_length_signal_and_acks_right_after() -> None:
    fault = Fault("pause", 1, acknowledged=40, settled=42, start=10.0, end=12.5)
    assert fault.line(7) == (
        "  pause 1: 2.5 s from the SIGSTOP to the SIGCONT, after 40 acks (42 sends settled); "
        "7 acks within 1 s of the SIGCONT"
    )
    assert "from the SIGKILL to the restart" in crash(0.0, 1.0).line(0)


def test_phase_and_when_place_a_moment_among_the_faults() -> None:
    faults = [crash(10.0, 14.0)]
    assert phase(9.9, faults) == "before the faults"
    assert phase(14.0, faults) == "during crash 1"
    assert phase(14.1, faults) == "after crash 1"
    assert when(9.9, faults) == "before the faults"
    assert when(3.0, []) == ""
    assert when(16.25, faults) == "+2.25 s from the restart of crash 1"


def test_the_kth_of_f_faults_is_due_once_k_over_f_plus_2_of_the_records_are_settled() -> None:
    assert fault_due(1, 1, 300) == pytest.approx(100)  # a pause alone: a third in
    assert [fault_due(k, 3, 500) for k in (1, 2, 3)] == pytest.approx([100, 200, 300])
    # Records are left for after the last fault.
    assert fault_due(3, 3, 500) < 500


def test_options_list_the_crashes_before_the_pause() -> None:
    options = Options(producers=2, records=10, crashes=2, pause=1.5)
    assert options.faults == ["crash", "crash", "pause"]
    assert options.fault_names == ["crash 1", "crash 2", "pause 1"]
    assert Options(2, 10, pause=0.0).faults == []
    assert Options(2, 10, pause=0.0).fault_names == []
    assert Options(2, 10, pause=0.5).fault_names == ["pause 1"]


def test_the_batch_gap_paces_producers_only_with_crashes() -> None:
    assert default_batch_gap(crashes=0, in_flight=8) == 0.0
    assert default_batch_gap(crashes=1, in_flight=1) == pytest.approx(1 / brokercheck.CRASH_PACE)
    assert default_batch_gap(crashes=3, in_flight=8) == pytest.approx(8 / brokercheck.CRASH_PACE)


def test_producers_linger_only_with_several_records_in_flight() -> None:
    alone = producer_settings("h:1", Options(1, 1))
    assert alone == {"bootstrap_servers": "h:1", "acks": "all", "linger_ms": 0}
    batched = producer_settings("h:1", Options(1, 1, in_flight=4, request_timeout=2.5))
    assert (batched["linger_ms"], batched["request_timeout_ms"]) == (2, 2500)


def test_faults_are_refused_where_the_check_cannot_make_them() -> None:
    crashing, pausing, quiet = Options(1, 1, crashes=1), Options(1, 1, pause=1.0), Options(1, 1)
    assert refusal(crashing, memory=False, bootstrap="h:1") is not None
    assert refusal(pausing, memory=False, bootstrap="h:1") is not None
    assert refusal(quiet, memory=False, bootstrap="h:1") is None
    assert refusal(crashing, memory=True, bootstrap=None) is not None
    assert refusal(pausing, memory=True, bootstrap=None) is None
    assert refusal(crashing, memory=False, bootstrap=None) is None


async def test_a_fault_waits_for_its_share_of_the_records_and_not_once_they_are_done() -> None:
    told, done = tally({"a": Ack(0, 0, 1.0)}), asyncio.Event()
    assert await asyncio.wait_for(wait_for_turn(told, due=1, ready_at=0.0, done=done), 1.0)
    waiting = asyncio.create_task(wait_for_turn(told, due=2, ready_at=0.0, done=done))
    await asyncio.sleep(brokercheck.POLL * 3)
    assert not waiting.done()
    done.set()
    assert await asyncio.wait_for(waiting, 1.0) is False


class FakeBroker:
    """Records the faults asked of it; each takes no time."""

    def __init__(self, told: Tally) -> None:
        self.told, self.clock = told, 0.0
        self.calls: list[tuple[str, float]] = []

    async def crash(self, down_for: float) -> tuple[float, float]:
        return self._fault(("crash", down_for))

    async def pause(self, seconds: float) -> tuple[float, float]:
        return self._fault(("pause", seconds))

    def _fault(self, call: tuple[str, float]) -> tuple[float, float]:
        self.calls.append(call)
        # The producers write on while it lasts: the next fault is due.
        self.told.acks[f"during-{len(self.calls)}"] = Ack(0, 100 + len(self.calls), 0.0)
        self.clock += 1.0
        return self.clock - 1.0, self.clock


async def test_inject_makes_the_faults_in_order_numbered_by_kind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(brokercheck, "GAP", 0.0)
    told = tally({f"r{i}": Ack(0, i, 0.0) for i in range(2)}, failures={"x": 0.0})
    broker = FakeBroker(told)
    options = Options(producers=1, records=4, crashes=2, pause=0.5)
    # 4 records, 3 faults: due at 0.8, 1.6 and 2.4 settled; 3 are settled
    # and each fault settles one more.
    faults = await asyncio.wait_for(inject(cast(Broker, broker), options, told, asyncio.Event()), 5)
    down = brokercheck.DOWN
    assert broker.calls == [("crash", down), ("crash", down), ("pause", 0.5)]
    assert [fault.name for fault in faults] == options.fault_names
    assert [(fault.acknowledged, fault.settled) for fault in faults] == [(2, 3), (3, 4), (4, 5)]
    assert [(fault.start, fault.end) for fault in faults] == [(0, 1), (1, 2), (2, 3)]


async def test_inject_begins_no_fault_once_the_producers_are_done() -> None:
    told = tally({})
    broker = FakeBroker(told)
    done = asyncio.Event()
    done.set()
    faults = await inject(cast(Broker, broker), Options(1, 10, crashes=1), told, done)
    assert (faults, broker.calls) == ([], [])
