"""The chaos checker over histories whose load went to both sinks, the
topic and the webhook receiver: one delivery stream keyed by unit, judged
by the same rules, a switched schedule by its destination in force, the
receiver's faults excusing only what was delivered by HTTP; and the
receiver's steps as a scenario names them."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from chaos.checker import check, passed
from chaos.checker.model import events
from chaos.history import HTTP, INFO, KAFKA, Delivery
from chaos.receipts import ReceiverLog
from chaos.run import Run, receiver_figures
from chaos.scenario import ScenarioError, Step, parse
from chaos.summary import receiver_lines
from tests.chaos_histories import Load, topic

DOWN = "take the receiver down for 30 s"  # at 100: HTTP units excused until 210
SLOW = "receiver answers slowly for 15 s"  # at 100: its window 99 to 135


def http(unit: str, token: int, attempt: int, at: float, **fields: Any) -> Delivery:
    """A request the receiver took."""
    return Delivery(unit, token, attempt, at, sink=HTTP, received=at, **fields)


def test_both_sinks_are_one_stream_and_a_missing_request_is_lost() -> None:
    load = Load().create("k", 100.0, sink=KAFKA).create("h", 100.0, sink=HTTP)
    both = check(load.history, topic(Delivery("k", 1, 1, 100.1), http("h", 1, 1, 100.2)))
    assert passed(both)
    assert (both["delivered"], both["delivered_http"], both["lost"]) == (2, 1, 0)

    missing = check(load.history, topic(Delivery("k", 1, 1, 100.1)))
    assert not passed(missing) and missing["lost_ids"] == ["h"]


def test_a_schedule_delivered_at_the_sink_it_never_named_is_lost_and_misdelivered() -> None:
    history = Load().create("h", 100.0, sink=HTTP).history
    result = check(history, topic(Delivery("h", 1, 1, 100.1)))  # a record in the topic
    assert result["lost_ids"] == ["h"] and result["wrong_destination_ids"] == ["h"]


def test_an_http_schedule_is_judged_by_the_same_rules_as_a_record() -> None:
    load = Load().create("early", 100.0, sink=HTTP).create("twice", 100.0, sink=HTTP)
    load.create("gone", 103.0, sink=HTTP).cancel("gone", 99.0)
    got = topic(
        http("early", 1, 1, 99.5),
        http("twice", 4, 1, 100.1),
        http("twice", 4, 1, 100.3),  # one claim twice, no fault to explain it
        http("gone", 1, 1, 103.1),
    )
    result = check(load.history, got)
    assert result["early_ids"] == ["early"]
    assert result["duplicates_same_claim_ids"] == ["twice"]
    assert result["cancelled_delivered_ids"] == ["gone"]


def test_a_switched_schedule_is_owed_at_the_destination_in_force() -> None:
    # Created for the topic, switched to the receiver (and to 102) at 99.
    history = Load().create("w", 100.0, sink=KAFKA).switch("w", HTTP, 102.0, 99.0).history
    at_receiver = check(history, topic(http("w", 1, 1, 102.1, execute_at=102.0)))
    assert passed(at_receiver)

    # Only at the topic, after the switch: not delivered where it goes.
    in_topic = check(history, topic(Delivery("w", 1, 1, 102.1, execute_at=102.0)))
    assert in_topic["lost_ids"] == ["w"] and in_topic["wrong_destination_ids"] == ["w"]


def test_a_record_sent_before_the_switch_answered_is_not_misdelivered() -> None:
    # A record of the first claim, sent before the switch's 200 (a dead
    # owner's, whose claim went back to PENDING), then the request: a
    # duplicate a new owner explains, at no wrong destination.
    history = Load().create("w", 100.0, sink=KAFKA).switch("w", HTTP, 102.0, 101.0).history
    got = topic(
        Delivery("w", 1, 1, 100.1, execute_at=100.0),
        http("w", 2, 1, 102.1, execute_at=102.0),
    )
    result = check(history, got)
    assert passed(result) and result["wrong_destination"] == 0


def test_a_switch_of_unknown_outcome_counts_either_destination() -> None:
    history = Load().create("u", 100.0, sink=KAFKA).switch("u", HTTP, 102.0, 99.0, INFO).history
    for copy in (
        Delivery("u", 1, 1, 100.1, execute_at=100.0),
        http("u", 1, 1, 102.1, execute_at=102.0),
    ):
        assert passed(check(history, topic(copy)))


def test_a_schedule_the_receiver_refused_for_good_is_explained_not_lost() -> None:
    load = Load().create("r", 100.0, sink=HTTP).create("k", 100.0, sink=KAFKA)
    load.fault("receiver-400", 99.0, 10.0, "receiver answers 400 for 10 s")
    history = load.failed("r", "HTTP 400").history
    refused = check(history, topic(Delivery("k", 1, 1, 100.1), refused=["r"]))
    assert passed(refused)
    assert (refused["lost"], refused["delivery_failed"], refused["delivery_failed_refused"]) == (
        0,
        0,
        1,
    )

    # Given up on with no refusal of the receiver's: lost, and a failure.
    unexplained = check(history, topic(Delivery("k", 1, 1, 100.1)))
    assert unexplained["lost_ids"] == ["r"] and unexplained["delivery_failed_ids"] == ["r"]


def test_a_refused_occurrence_explains_its_chains_failure() -> None:
    load = Load()
    first, second = load.chain("c", 100.0, 105.0, 5, sink=HTTP)
    history = load.failed("c").history
    result = check(history, topic(http(first, 1, 1, 100.1), refused=[second]))
    assert passed(result) and result["delivery_failed_refused"] == 1


def test_a_receiver_fault_excuses_the_lateness_of_http_units_only() -> None:
    load = Load().create("h", 110.0, sink=HTTP).create("k", 110.0, sink=KAFKA)
    load.fault("receiver-down", 100.0, 30.0, DOWN)
    result = check(load.history, topic(http("h", 1, 1, 135.0), Delivery("k", 1, 1, 135.0)))
    assert result["late_outside_windows_ids"] == ["k"]

    # Due after the circuits had time to try again: late for nothing.
    after = Load().create("h", 250.0, sink=HTTP)
    after.fault("receiver-down", 100.0, 30.0, DOWN)
    late = check(after.history, topic(http("h", 1, 1, 265.0)))
    assert late["late_outside_windows_ids"] == ["h"]


def test_a_503_window_stretches_by_its_retry_after() -> None:
    def late_by(retry_after: int) -> int:
        # Due at 149, 17 s late: its window runs to 100 + 10 + retry_after +
        # the circuits' 10 + 0.6 x 10 for the backlog + 20.
        load = Load().create("h", 149.0, sink=HTTP)
        load.fault("receiver-503", 100.0, 10.0, "receiver answers 503", retry_after=retry_after)
        result = check(load.history, topic(http("h", 1, 1, 166.0)))
        return int(result["late_outside_windows"])

    assert (late_by(5), late_by(0)) == (0, 1)


def test_one_claim_taken_twice_by_the_receiver_is_explained_by_its_fault_only() -> None:
    # The probe of an open circuit timed out on the slow receiver, which
    # took it after all; the probe spent no attempt, so the same claim went
    # again once the receiver answered.
    def sent_twice(do: str, label: str, sink: str) -> tuple[str, str | None]:
        load = Load().create("d", 104.0, sink=sink)
        load.fault(do, 100.0, 15.0, label)
        copies = [
            Delivery("d", 5, 1, 105.0, "9f2c", sink=sink),
            Delivery("d", 5, 1, 140.0, "9f2c", sink=sink),
        ]
        [entry] = check(load.history, topic(*copies))["duplicates_explained"]
        return entry["kind"], entry["window"]

    assert sent_twice("receiver-slow", SLOW, HTTP) == ("deferred_publish", SLOW)
    # A receiver fault explains nothing of the topic's, a broker fault
    # nothing of the receiver's.
    assert sent_twice("receiver-slow", SLOW, KAFKA) == ("same_claim", None)
    assert sent_twice("pause-broker", "pause the broker", HTTP) == ("same_claim", None)


def test_what_the_receiver_took_is_never_gone_from_the_topic() -> None:
    history = Load().create("h", 100.0, sink=HTTP).history
    result = check(history, topic(http("h", 1, 1, 100.1), kept=()))
    assert passed(result) and result["vanished"] == 0


def test_a_bad_signature_fails_a_run() -> None:
    history = Load().create("h", 100.0, sink=HTTP).history
    result = check(history, topic(http("h", 1, 1, 100.1)))
    assert passed(result)
    assert not passed({**result, "bad_signatures": 1})


# -- the receiver's steps --------------------------------------------------------------


def scenario(*timeline: dict[str, Any], http_share: float = 0.25) -> Any:
    data = {"nodes": 3, "duration": 60, "rate": 10, "timeline": list(timeline)}
    if http_share:
        data["http_share"] = http_share
    return parse("s", data)


def test_the_receiver_steps_parse_with_their_fields() -> None:
    parsed = scenario(
        {"at": 5, "do": "receiver-down", "for": 20},
        {"at": 10, "do": "receiver-503", "for": 10, "retry_after": 7},
        {"at": 15, "do": "receiver-503", "for": 10},
        {"at": 20, "do": "receiver-slow", "for": 10},
        {"at": 25, "do": "receiver-400", "for": 5},
    )
    assert parsed.http_share == 0.25
    assert [(s.do, s.target, s.lasting, s.retry_after) for s in parsed.steps] == [
        ("receiver-down", "", 20.0, 0),
        ("receiver-503", "", 10.0, 7),
        ("receiver-503", "", 10.0, 5),
        ("receiver-slow", "", 10.0, 0),
        ("receiver-400", "", 5.0, 0),
    ]
    assert [s.label for s in parsed.steps] == [
        "take the receiver down for 20 s",
        "receiver answers 503 (Retry-After 7 s) for 10 s",
        "receiver answers 503 (Retry-After 5 s) for 10 s",
        "receiver answers slowly for 10 s",
        "receiver answers 400 for 5 s",
    ]


@pytest.mark.parametrize(
    ("entry", "http_share", "says"),
    [
        ({"at": 5, "do": "receiver-down", "for": 20}, 0.0, "needs an http_share"),
        ({"at": 5, "do": "receiver-down", "for": 20, "target": "node-1"}, 0.5, "takes no target"),
        ({"at": 5, "do": "receiver-slow", "for": 5, "retry_after": 3}, 0.5, "retry_after"),
        ({"at": 5, "do": "receiver-503", "for": 5, "retry_after": 0}, 0.5, "retry_after"),
    ],
)
def test_a_bad_receiver_step_is_refused(
    entry: dict[str, Any], http_share: float, says: str
) -> None:
    with pytest.raises(ScenarioError, match=says):
        scenario(entry, http_share=http_share)


def test_an_http_share_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ScenarioError, match="http_share"):
        scenario(http_share=1.5)


def test_a_draw_of_receiver_faults_holds_the_receiver_one_at_a_time() -> None:
    parsed = parse(
        "s",
        {
            "nodes": 3,
            "duration": 120,
            "rate": 10,
            "http_share": 0.5,
            "timeline": [
                {
                    "at": 5,
                    "every": 4,
                    "do": "any",
                    "kinds": ["receiver-down", "receiver-503", "receiver-slow"],
                    "for": 10,
                }
            ],
        },
    )
    steps: list[Step] = list(parsed.timeline(1))
    assert steps and {s.do for s in steps} <= {"receiver-down", "receiver-503", "receiver-slow"}
    for before, after in pairwise(steps):
        assert after.at >= before.at + before.lasting  # never two at once


# -- the run and the player ------------------------------------------------------------


class FakeReceiver:
    """What the player asked of the receiver, in order."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, ...]] = []

    def kill(self) -> None:
        self.asked.append(("kill",))

    def start(self) -> None:
        self.asked.append(("start",))

    def mode(self, mode: str, retry_after: int = 1) -> None:
        self.asked.append(("mode", mode, str(retry_after)))


def http_run(tmp_path: Path, *timeline: dict[str, Any]) -> Run:
    data = {"nodes": 3, "duration": 60, "rate": 10, "http_share": 0.5, "timeline": list(timeline)}
    return Run(parse("h", data), tmp_path, seed=1, namespaces=False)


def test_a_run_with_an_http_share_lets_the_nodes_reach_and_sign_for_its_receiver(
    tmp_path: Path,
) -> None:
    run = http_run(tmp_path)
    assert run.receiver is not None and run.receiver.host == "127.0.0.1"
    assert run.cluster.env["HTTP_TARGETS_ALLOW"] == "127.0.0.1/32"
    assert run.cluster.env["HTTP_SIGNING_SECRET"] == run.receiver.secret
    assert run.receiver.secret.startswith("whsec_")
    plain = Run(parse("p", {"nodes": 3, "duration": 60, "rate": 10}), tmp_path, seed=1)
    assert plain.receiver is None and "HTTP_SIGNING_SECRET" not in plain.cluster.env


async def test_each_receiver_step_breaks_the_receiver_then_brings_it_up(tmp_path: Path) -> None:
    run = http_run(tmp_path)
    fake = FakeReceiver()
    run.player.receiver = fake  # type: ignore[assignment]
    for step in (
        Step(0, "receiver-down", "", 0.0),
        Step(0, "receiver-503", "", 0.0, retry_after=7),
        Step(0, "receiver-slow", "", 0.0),
        Step(0, "receiver-400", "", 0.0),
    ):
        await run.player.play(step)
        await run.player.aftermath()
    assert fake.asked == [
        ("kill",),
        ("start",),
        ("mode", "503", "7"),
        ("mode", "up", "1"),
        ("mode", "slow", "0"),
        ("mode", "up", "1"),
        ("mode", "400", "0"),
        ("mode", "up", "1"),
    ]
    played = events(run.history)
    assert [e["do"] for e in played] == [
        "receiver-down", "receiver-up", "receiver-503", "receiver-up",
        "receiver-slow", "receiver-up", "receiver-400", "receiver-up",
    ]  # fmt: skip
    assert played[2]["retry_after"] == 7
    # Faults of the receiver, each with a window; their ends are not.
    assert [e.get("window") for e in played] == [0, None, 1, None, 2, None, 3, None]
    assert all("skipped_settle" in e for e in played)  # nothing of the cluster's to time


def test_a_receiver_step_in_a_run_without_a_receiver_is_skipped_saying_why(
    tmp_path: Path,
) -> None:
    run = Run(parse("p", {"nodes": 3, "duration": 60, "rate": 10}), tmp_path, seed=1)
    assert "no receiver" in (run.player._cannot(Step(0, "receiver-down", "", 5.0)) or "")


def test_the_summary_counts_the_receivers_requests_by_attempt(tmp_path: Path) -> None:
    """http-busy's figure: 503s with Retry-After spend no attempt, so the
    requests a receiver took carry attempt 1 unless a real failure spent one."""
    log = ReceiverLog(tmp_path / "receiver.jsonl")
    log.deliveries += [http("a", 1, 1, 100.0), http("b", 1, 1, 100.5), http("c", 2, 2, 101.0)]
    log.answers.update({200: 3, 503: 40})
    figures = receiver_figures(log)
    assert figures["receiver_attempts"] == {"1": 2, "2": 1}
    assert figures["receiver_answers"] == {"200": 3, "503": 40}
    [line] = receiver_lines({**figures, "delivered_http": 3})
    assert "requests taken by attempt 1: 2, 2: 1;" in line
