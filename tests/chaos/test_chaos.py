"""Chaos scenarios and the checker: pure parts, no processes."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka import ConsumerRecord

from chaos.checker import Delivery, check, passed
from chaos.checker.model import faults
from chaos.history import History
from chaos.lab.harness import epoch
from chaos.observe import STALL_LEAD, Recorder, broker_stalls, note_stalls
from chaos.report import render_html
from chaos.scenario import ScenarioError, available, load, parse
from chaos.summary import render
from tests.chaos_histories import Load, as_run, created, topic
from tests.helpers import Svgs, scenario


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


# -- the checker's findings in the summary (the checker: tests/chaos/test_checker.py)


def test_the_summary_prints_the_kinds_and_a_line_per_duplicate_up_to_twenty() -> None:
    units = [f"u{i:02}" for i in range(25)]
    deliveries = [Delivery(u, t, 1, 1000.1 + t, "9f2c", 0, t) for u in units for t in (1, 2)]
    result = as_run(check(created({u: 1000.0 for u in units}), topic(*deliveries)))
    text = render(result)
    assert "duplicates 25 (owner_change 25, retried_publish 0, across_store_crash 0" in text
    lines = [line for line in text.splitlines() if ": owner_change: " in line]
    assert len(lines) == 20
    assert lines[0] == "  u00: owner_change: t1/a1 at 6.100 s #9f2c 0:1; t2/a1 at 7.100 s #9f2c 0:2"
    assert "  ... 5 more duplicated units (summary.json lists 25)" in text


def test_the_summary_counts_what_the_verbs_changed_and_what_broke() -> None:
    load = Load().created({"b": 1001.0}, group="g1").created({"p": 1001.0, "q": 1001.0})
    load.bulk_cancel("g1", 1000.0, ["b"])  # answered at 1000, taking b
    load.pause("p", 1000.0).pause("q", 1000.0).resume("q", 1002.0, 1002.1)
    # Created for 100; a PATCH answered at 98 moved it to 104, one answered at 99 to 102.
    load.created({"r": 100.0}).patch("r", 104.0, 98.0).patch("r", 102.0, 99.0)
    deliveries = [
        Delivery("p", 1, 1, 1001.0),
        Delivery("q", 1, 1, 1002.2),
        Delivery("r", 1, 1, 104.1, execute_at=104.0),
        Delivery("r", 1, 1, 102.0, execute_at=102.0),
    ]
    result = as_run(
        check(load.history, topic(*deliveries)),
        verbs={"PATCH 200": 2, "pause 200": 2, "resume 200": 1},
        bulk_calls=[{"group": "g1", "at": 5.0, "cancelled": 1, "answers": [200]}],
    )
    assert not result["passed"]
    text = render(result)
    assert "delivered while paused 1, rescheduled at the wrong time 1," in text
    assert (
        "schedules changed by the verbs: 1 rescheduled, 2 paused (1 resumed, 1 still paused "
        "at the end), 1 taken by 1 bulk cancels (answered 1 cancelled), 0 by 0 bulk pauses "
        "(answered 0 paused), 0 outcomes unsettled; answers: PATCH 200 2, pause 200 2, "
        "resume 200 1"
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


# -- the HTML report -------------------------------------------------------------


def a_result(*, lost: bool) -> dict[str, Any]:
    accepted = {"a": 1000.0, "b": 1010.0, "c": 1020.0}
    deliveries = [Delivery("a", 1, 1, 1000.1), Delivery("b", 2, 1, 1014.0)]
    if not lost:
        deliveries.append(Delivery("c", 2, 1, 1020.2))
    load = Load(started=995.0).created(accepted)
    load.fault("kill", 13.0, 0.0, "kill node-1")  # its window: 1007 to 1028
    result = check(load.history, topic(*deliveries))
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
    result = check(created({unit: 100.0 for unit in "abcd"}), topic(*deliveries))
    assert (result["offsets_reused"], result["offsets_reused_ids"]) == (1, ["0:8"])
    assert (result["delivered"], result["duplicates"]) == (4, 0)  # a's second read is one record
    assert passed(result)
    text = render(as_run(result, started=95.0))
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
    assert broker_stalls(samples) == [[452.0, 482.0], [500.0, 500.0]]
    observed = History(started=started)
    note_stalls(observed, samples)
    stalls = faults(observed).broker
    assert [(w.start, w.end) for w in stalls] == [
        (started + 452 - STALL_LEAD, started + 483.0),
        (started + 500 - STALL_LEAD, started + 501.0),
    ]
    quiet = Load(started)
    [tick] = quiet.chain("chain1", started + 442.0, started + 442.0, 5)
    copies = topic(
        Delivery(tick, 17, 1, started + 442.133, "f6fc", 0, 4252),
        Delivery(tick, 17, 1, started + 483.310, "f6fc", 0, 4006),  # the stalled send landed last
    )
    assert not passed(check(quiet.history, copies))  # no fault known: a double claim
    seen = Load(started)
    seen.chain("chain1", started + 442.0, started + 442.0, 5)
    for stall in stalls:
        seen.stall(stall.label, stall.start, stall.end)
    result = check(seen.history, copies)
    assert result["duplicates_by_kind"]["deferred_publish"] == 1
    assert passed(result)


def test_a_broker_cut_of_one_node_is_not_a_stall_of_the_broker() -> None:
    """For the intended windows, a broker spell is one most nodes saw: a
    node cut from the broker alone says so on its /readyz too."""
    held = {"node-1": 80, "node-2": 90, "node-3": 86}
    one = [{"t": float(t), "held": held, "unready": {"node-2": ["broker"]}} for t in range(5)]
    two = [
        {"t": float(t), "held": held, "unready": {"node-2": ["broker"], "node-3": ["broker"]}}
        for t in range(10, 15)
    ]
    assert len(broker_stalls(one)) == 1  # any node: explains duplicates
    assert broker_stalls(one, most=True) == []
    assert broker_stalls([*one, *two], most=True) == [[10.0, 14.0]]
    observed = History(started=0.0)
    note_stalls(observed, [*one, *two])
    [spell] = faults(observed).intended
    assert (spell.start, spell.end) == (10.0 - STALL_LEAD, 15.0)
    assert len(faults(observed).broker) == 2  # any node: both spells explain duplicates
