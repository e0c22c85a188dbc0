"""The chaos steps of issue 17, without processes: cut-store, cut-broker,
skew-clock and garbage-gossip as scenario data; ``any`` entries drawn per
seed within their limits; the garbage generator's mutations, each what it
claims by membership's own codec; the settled check with a node cut from the
store; the flood's verdict; an early record caught by when it was read."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest

from chaos.checker import Delivery, check, passed
from chaos.checker.model import events
from chaos.faults.garbage import (
    KEYED_MUTATIONS,
    MALFORMED,
    MUTATIONS,
    RANDOM_MUTATIONS,
    STREAM_ABUSES,
    Garbage,
    dropped,
)
from chaos.history import NEMESIS, History
from chaos.lab import cluster as cluster_module
from chaos.lab.cluster import LocalCluster
from chaos.observe import judge_floods, note_unready
from chaos.report import render_html
from chaos.run import Run
from chaos.scenario import (
    ACTIONS,
    HOLDS,
    RECEIVER_STEPS,
    RECOVERY,
    Draw,
    Scenario,
    ScenarioError,
    Step,
    load,
    parse,
)
from chaos.summary import render
from membership.codec import FLAG_MAC, HEADER_BYTES, MAC_BYTES, VERSION, Codec, DecodeError
from tests.chaos_histories import as_run, created, topic
from tests.helpers import scenario

NEW = ("cut-store", "cut-broker", "skew-clock", "garbage-gossip")
KEY = bytes(range(32))


# -- the new steps as data ----------------------------------------------------------


def test_the_new_steps_parse_with_their_fields() -> None:
    parsed = parse(
        "n",
        scenario(
            timeline=[
                {"at": 5, "do": "cut-store", "target": "node-2", "for": 8},
                {"at": 6, "do": "cut-broker", "for": 9},
                {"at": 7, "do": "skew-clock", "target": "random", "seconds": -45},
                {"at": 8, "do": "garbage-gossip", "for": 10},
                {"at": 9, "do": "garbage-gossip", "target": "node-1", "for": 10, "rate": 250},
            ]
        ),
    )
    store, broker, skew, garbage, faster = parsed.steps
    assert (store.do, store.target, store.lasting) == ("cut-store", "node-2", 8)
    assert store.label == "cut node-2 from the store for 8 s"
    assert (broker.target, broker.label) == ("random", "cut a random node from the broker for 9 s")
    assert (skew.skew, skew.lasting) == (-45, 0)
    assert skew.label == "restart a random node with its clock -45 s off"
    assert (garbage.rate, faster.rate) == (100, 250)
    assert faster.label == "garbage gossip at node-1 for 10 s"
    assert store.needs_namespaces and broker.needs_namespaces
    assert not skew.needs_namespaces and not garbage.needs_namespaces


def test_auth_and_cluster_keys_are_off_unless_asked() -> None:
    plain = parse("p", scenario())
    assert (plain.auth, plain.cluster_keys) == (False, False)
    on = parse("p", scenario(auth=True, cluster_keys=True))
    assert (on.auth, on.cluster_keys) == (True, True)
    assert all(not load(name).auth for name in ("zombie-pause", "everything", "isolate-one"))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"at": 5, "do": "cut-store"}, "missing 'for'"),
        ({"at": 5, "do": "cut-broker", "for": 5, "seconds": 3}, "cut-broker takes no seconds"),
        ({"at": 5, "do": "skew-clock"}, "missing 'seconds'"),
        ({"at": 5, "do": "skew-clock", "seconds": 0}, "seconds must not be 0"),
        ({"at": 5, "do": "skew-clock", "seconds": "30"}, "seconds must be a number"),
        ({"at": 5, "do": "skew-clock", "seconds": 90000}, "seconds must be between"),
        ({"at": 5, "do": "skew-clock", "seconds": 5, "for": 3}, "skew-clock takes no for"),
        ({"at": 5, "do": "garbage-gossip"}, "missing 'for'"),
        ({"at": 5, "do": "garbage-gossip", "for": 5, "rate": 0}, "rate must be between"),
        ({"at": 5, "do": "pause", "for": 5, "rate": 9}, "pause takes no rate"),
        ({"at": 5, "do": "any"}, "kinds must be a non-empty list"),
        ({"at": 5, "do": "any", "kinds": []}, "kinds must be a non-empty list"),
        ({"at": 5, "do": "any", "kinds": "kill"}, "kinds must be a non-empty list"),
        ({"at": 5, "do": "any", "kinds": ["kill", "explode"]}, "kinds: 'explode' is no action"),
        ({"at": 5, "do": "any", "kinds": ["any"]}, "kinds: 'any' is no action"),
        ({"at": 5, "do": "any", "kinds": ["kill", "kill"]}, "each kind once"),
        ({"at": 5, "do": "any", "kinds": ["kill"], "target": "x"}, "any takes no target"),
        ({"at": 5, "do": "any", "kinds": ["kill"], "for": 0}, "for must be between"),
        ({"at": 5, "until": 9, "do": "any", "kinds": ["kill"]}, "'until' needs 'every'"),
        ({"do": "any", "kinds": ["kill"]}, "missing 'at'"),
    ],
)
def test_a_bad_new_step_or_draw_is_refused_naming_the_field(
    entry: dict[str, Any], message: str
) -> None:
    with pytest.raises(ScenarioError) as caught:
        parse("bad", scenario(timeline=[entry]), where="bad.json")
    assert message in str(caught.value)
    assert str(caught.value).startswith("bad.json: timeline[0]")


@pytest.mark.parametrize("field", ["auth", "cluster_keys"])
def test_the_switches_must_be_booleans(field: str) -> None:
    with pytest.raises(ScenarioError, match=f"{field} must be true or false"):
        parse("bad", scenario(**{field: "yes"}))


# -- drawing (``any``) --------------------------------------------------------------

LONG = Draw(at=10, every=9, until=590, kinds=ACTIONS, longest=15)


def overlapping(steps: list[Step], what: str) -> list[tuple[Step, Step]]:
    """Pairs of steps holding ``what`` at once (with its recovery time)."""
    holding = [s for s in steps if what in HOLDS[s.do]]
    end = {id(s): s.at + s.lasting + RECOVERY.get(what, 0.0) for s in holding}
    return [(a, b) for i, a in enumerate(holding) for b in holding[i + 1 :] if b.at < end[id(a)]]


def node_count(steps: list[Step], nodes: int) -> list[int]:
    counts = [nodes]
    for step in steps:
        counts.append(counts[-1] + {"start": 1, "stop": -1}.get(step.do, 0))
    return counts


def test_the_same_seed_draws_the_same_timeline_and_another_seed_another() -> None:
    soak = load("soak")
    assert soak.timeline(seed=3) == soak.timeline(seed=3)
    assert soak.timeline(seed=3) != soak.timeline(seed=4)
    assert [s.at for s in soak.timeline(seed=3)] == [s.at for s in soak.timeline(seed=4)]


@pytest.mark.parametrize("seed", range(1, 11))
def test_a_long_draw_deals_every_kind_and_keeps_the_limits(seed: int) -> None:
    steps = LONG.steps(random.Random(seed), nodes=5)
    kinds = Counter(s.do for s in steps)
    assert set(kinds) == set(ACTIONS)
    # Dealt like cards: no kind far ahead of another (node faults wait for
    # each other, so the others may get a turn more).
    assert max(kinds.values()) - min(kinds.values()) <= 3, kinds
    assert len(steps) >= 60
    # One node out at a time, one fault of each server at a time (a store
    # cut and a store crash included), one node joining or leaving at a time.
    for what in ("node", "store", "broker", "churn"):
        assert overlapping(steps, what) == [], what
    assert min(node_count(steps, 5)) >= 3 and max(node_count(steps, 5)) <= 5
    for step in steps:
        if step.do == "kill":
            assert step.restart
        if step.do in ("pause", "isolate", "split", "cut-store", "cut-broker", "garbage-gossip"):
            assert 6 <= step.lasting <= 15
        if step.do in ("crash-store", "crash-broker", "pause-broker"):
            assert 2 <= step.lasting <= 10 and step.target == ""
        if step.do == "skew-clock":
            assert 5 <= abs(step.skew) <= 60
        if step.do == "garbage-gossip":
            assert step.rate > 0


def test_a_draw_names_only_its_kinds_and_the_count_stays_in_bounds_from_three() -> None:
    churn = Draw(at=0, every=9, until=300, kinds=("stop", "start", "kill"))
    steps = churn.steps(random.Random(1), nodes=3)
    assert {s.do for s in steps} == {"stop", "start", "kill"}
    counts = node_count(steps, 3)
    assert min(counts) >= 3 and max(counts) <= 5
    # With 3 nodes nothing may stop before a start made room.
    first_stop = next(i for i, s in enumerate(steps) if s.do == "stop")
    assert any(s.do == "start" for s in steps[:first_stop])


def test_drawn_steps_keep_clear_of_the_fixed_ones() -> None:
    fixed = [Step(100, "pause", lasting=30), Step(100, "crash-store", "", 20)]
    draw = Draw(at=0, every=5, until=200, kinds=("isolate", "cut-store", "crash-store", "kill"))
    steps = draw.steps(random.Random(2), nodes=4, fixed=fixed)
    everything = sorted([*fixed, *steps], key=lambda s: s.at)
    for what in ("node", "store"):
        assert overlapping(everything, what) == [], what
    assert any(s.do == "kill" and 100 <= s.at <= 135 for s in steps)  # churn is free


def test_a_scenario_keeps_its_draws_through_scaling_with_a_floor_on_the_spacing() -> None:
    soak = load("soak")
    assert (soak.nodes, soak.duration, soak.auth, soak.cluster_keys) == (5, 600, True, True)
    assert soak.steps == () and len(soak.draws) == 1
    full = soak.timeline(seed=1)
    # Every kind but the receiver's: the soak's load delivers nothing by HTTP.
    assert len(full) >= 60 and {s.do for s in full} == set(ACTIONS) - set(RECEIVER_STEPS)
    short = soak.scaled(nodes=4, duration=60, rate=20)
    [draw] = short.draws
    assert (draw.at, draw.until, draw.every) == (1, 59, 4)  # 9 * 0.1 would overlap everything
    timeline = short.timeline(seed=1)
    assert 10 <= len(timeline) <= 15
    assert all(0 <= s.at <= 60 for s in timeline)
    assert short.auth and short.cluster_keys


def test_a_scenario_built_in_code_draws_nothing_by_default() -> None:
    plain = Scenario("x", "", 3, 60, 10, (Step(5, "kill"),))
    assert plain.timeline(seed=1) == plain.steps


# -- garbage ----------------------------------------------------------------------


def garbage(keys: tuple[bytes, ...] = (KEY,), seed: int = 1) -> Garbage:
    return Garbage(
        random.Random(seed),
        keys,
        target="node-1",
        target_address="10.0.0.10:7946",
        peers=[("node-2", "10.0.0.11:7946"), ("node-3", "10.0.0.12:7946")],
    )


def reasons(maker: Garbage, name: str, times: int = 40) -> Counter[str]:
    codec = Codec(maker.keys)
    found: Counter[str] = Counter()
    for _ in range(times):
        try:
            codec.decode(maker.make(name))
            found["accepted"] += 1
        except DecodeError as exc:
            found[exc.reason] += 1
    return found


def test_the_valid_packets_garbage_starts_from_are_valid_and_signed() -> None:
    maker = garbage()
    for _ in range(30):
        data = maker.valid()
        assert data[:2] == bytes((VERSION, FLAG_MAC))
        packet = Codec([KEY]).decode(data)
        assert packet.sender in {"node-2", "node-3"}
    with pytest.raises(DecodeError, match="mac"):
        Codec([b"x" * 32]).decode(maker.valid())


@pytest.mark.parametrize("name", MALFORMED)
def test_each_signed_malformed_packet_passes_the_mac_and_fails_the_field_checks(
    name: str,
) -> None:
    maker = garbage()
    data = maker.make(name)
    # Signed with the run's key: what the decoder's field checks see.
    assert data[:2] == bytes((VERSION, FLAG_MAC))
    assert reasons(maker, name) == Counter({MALFORMED[name]: 40})
    # The same packet without keys fails the same way (no MAC to stop it first).
    assert reasons(garbage(keys=()), name) == Counter({MALFORMED[name]: 40})


def test_the_malformed_fields_are_the_ones_named() -> None:
    maker = garbage()

    def body(name: str) -> Any:
        data = maker.make(name)
        return msgpack.unpackb(data[HEADER_BYTES + MAC_BYTES :], strict_map_key=False)

    assert body("bad_port")[1][0][4].rsplit(":", 1)[1] in {"70000", "65536", "99999"}
    assert body("negative_port")[1][0][4].endswith(":-1")
    assert body("huge_int")[1][0][1] >= 2**62
    assert body("negative_int")[1][0][2] == -1
    nested = body("deep_nesting")[1][0][4]
    depth = 0
    while nested:
        nested, depth = nested[0], depth + 1
    assert depth == 500
    assert len(body("oversized_string")[1][0][2]) > 1024
    assert body("unknown_message")[1][0][0] not in range(1, 9)
    assert body("empty_packet") == ["garbage", []]
    assert isinstance(body("map_body"), dict)
    assert len(maker.make("oversized_string")) <= 1400  # a datagram, not a too_large


def test_noise_is_dropped_before_the_decoder_when_gossip_is_signed() -> None:
    maker = garbage()
    assert reasons(maker, "unsigned") == Counter({"mac": 40})
    assert reasons(maker, "wrong_key") == Counter({"mac": 40})
    assert reasons(maker, "truncated") == Counter({"mac": 40})
    assert reasons(maker, "bad_version") == Counter({"version": 40})
    assert reasons(maker, "oversized") == Counter({"too_large": 40})
    assert set(reasons(maker, "bitflip")) <= {"mac", "version"}
    assert set(reasons(maker, "random", 200)) == {"mac", "version"}  # half past the version byte


def test_no_random_mutation_is_ever_accepted_even_unsigned() -> None:
    # Unsigned, a bit flip in a sequence number can leave a valid ping: such
    # copies are made again, so every datagram sent is garbage to the node.
    maker = garbage(keys=())
    codec = Codec()
    for name in RANDOM_MUTATIONS:
        for _ in range(300):
            with pytest.raises(DecodeError):
                codec.decode(maker.make(name))
    assert maker.regenerated > 0


def test_the_mix_is_mostly_noise_with_some_signed_malformed_packets() -> None:
    maker = garbage()
    names = Counter(maker.datagram()[0] for _ in range(3000))
    assert set(names) == set(MUTATIONS)
    malformed = sum(names[m] for m in MALFORMED)
    assert 800 < malformed < 1200  # a third
    unsigned = garbage(keys=())
    assert not {unsigned.datagram()[0] for _ in range(500)} & set(KEYED_MUTATIONS)


def test_the_stream_abuses_break_the_framing_as_named() -> None:
    maker = garbage()
    huge, _ = maker.stream("huge_length")
    assert int.from_bytes(huge[:4], "big") > 16 * 1024 * 1024
    short, _ = maker.stream("short_frame")
    assert int.from_bytes(short[:4], "big") > len(short) - 4
    assert len(maker.stream("partial_header")[0]) < 4
    frame, _ = maker.stream("garbage_frame")
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    idle, wait = maker.stream("idle")
    assert len(idle) <= 1 and wait > 5  # past the node's stream timeout
    assert set(STREAM_ABUSES) == {"huge_length", "short_frame", "partial_header", "garbage_frame",
                                  "idle"}  # fmt: skip


def test_dropped_reads_the_counters_by_reason_from_metrics() -> None:
    text = "\n".join(
        [
            "# HELP scheduler_gossip_dropped_packets_total Gossip packets dropped by reason",
            "# TYPE scheduler_gossip_dropped_packets_total counter",
            'scheduler_gossip_dropped_packets_total{reason="mac"} 12.0',
            'scheduler_gossip_dropped_packets_total{reason="malformed"} 3.0',
            "scheduler_gossip_bytes_in_total 99.0",
        ]
    )
    assert dropped(text) == {"mac": 12.0, "malformed": 3.0}


# -- the runner's judgements ----------------------------------------------------


def flood_event(**report: Any) -> dict[str, Any]:
    return {
        "at": 10.0,
        "do": "garbage-gossip",
        "step": "garbage gossip at a random node for 10 s",
        "node": "node-2",
        "garbage": {"judged": [10.0, 20.0], "dropped": {"mac": 50.0}, **report},
    }


def sample(t: float, **not_alive: dict[str, str]) -> dict[str, Any]:
    return {"t": t, "held": {}, "sees": {}, "not_alive": not_alive}


def judged(event: dict[str, Any], samples: list[dict[str, Any]]) -> list[str]:
    """The floods that failed; ``event`` updated with its verdict, as the
    history now tells it."""
    history = History(started=0.0)
    history.event(NEMESIS, event["do"], 10.0, **event)
    failed = judge_floods(history, samples)
    [told] = events(history)
    event.update(told)
    return failed


def test_a_flood_passes_when_the_target_stays_alive_and_drops_rise() -> None:
    event = flood_event()
    samples = [
        sample(12.0, **{"node-1": {"node-4": "left"}}),
        sample(15.0, **{"node-3": {"node-2": "suspect"}}),  # suspected is not dead
        sample(40.0, **{"node-1": {"node-2": "dead"}}),  # long after: another fault's
    ]
    assert judged(event, samples) == []
    assert event["garbage"]["passed"]
    assert event["garbage"]["suspected_by"] == ["node-3"]


def test_a_flood_fails_when_another_node_declares_the_target_dead() -> None:
    event = flood_event()
    samples = [sample(9.5), sample(24.0, **{"node-1": {"node-2": "dead"}})]  # 4 s after the end
    assert judged(event, samples) == [event["step"]]
    assert event["garbage"]["declared_dead_by"] == ["node-1"]


def test_a_target_already_counted_dead_when_the_flood_began_proves_nothing() -> None:
    # Still dead to node-1 after an earlier partition: not the garbage's doing.
    event = flood_event()
    samples = [
        sample(9.5, **{"node-1": {"node-2": "dead"}}),
        sample(12.0, **{"node-1": {"node-2": "dead"}, "node-3": {"node-2": "dead"}}),
    ]
    assert judged(event, samples) == [event["step"]]  # node-3 saw it alive first
    assert event["garbage"]["not_alive_to_at_start"] == ["node-1"]
    assert event["garbage"]["declared_dead_by"] == ["node-3"]


def test_a_flood_fails_when_nothing_was_dropped_or_it_never_ran() -> None:
    quiet = flood_event(dropped={})
    assert judged(quiet, []) == [quiet["step"]]
    unfinished = flood_event()
    del unfinished["garbage"]["judged"]
    assert judged(unfinished, []) == [unfinished["step"]]


def test_a_failed_flood_fails_the_run() -> None:
    result = check(created({"a": 100.0}), topic(Delivery("a", 1, 1, 100.1)))
    assert passed(result)
    result["garbage_failures"] = 1
    assert not passed(result)


def test_a_node_under_a_lasting_fault_is_not_picked_for_another(tmp_path: Path) -> None:
    player = Run(load("zombie-pause"), tmp_path, seed=1).player
    for name in ("node-1", "node-2", "node-3", "node-4"):
        player.ready.add(name)
        player.cluster.nodes[name] = SimpleNamespace(name=name, alive=True)  # type: ignore[assignment]
    player.store_cut, player.broker_cut, player.flooded = {"node-1"}, {"node-2"}, {"node-3"}
    # Cut from the store: no calls go to it; cut from the broker: it still takes calls.
    assert player.running() == ["node-2", "node-3", "node-4"]
    assert {player._pick(Step(0, "kill")) for _ in range(20)} == {"node-4"}
    assert player._pick(Step(0, "pause", "node-2", 5)) is None


def test_without_namespaces_the_cuts_are_skipped_saying_why(tmp_path: Path) -> None:
    timeline = [{"at": 1, "do": "cut-store", "for": 5}, {"at": 2, "do": "cut-broker", "for": 5}]
    run = Run(parse("c", scenario(timeline=timeline)), tmp_path, seed=1, namespaces=False)
    assert run.cluster.network is None
    for step in run.steps:
        assert run.player._cannot(step) == "needs network namespaces (turned off (--no-namespaces))"
    external = Run(
        parse("c", scenario(timeline=timeline)), tmp_path, seed=1, external=("mongodb://x", "y:1")
    )
    assert "external" in (external.player._cannot(external.steps[0]) or "")


def test_auth_and_keys_reach_every_node_and_every_call(tmp_path: Path) -> None:
    run = Run(parse("a", scenario(auth=True, cluster_keys=True)), tmp_path, seed=1)
    assert run.cluster.auth
    [key] = run.cluster_keys
    assert len(key) == 32
    assert run.cluster.env["CLUSTER_KEYS"]  # base64 of the key, for every node
    run.cluster.api_key = "sk_test"
    assert run.cluster.headers == {"Authorization": "Bearer sk_test"}
    plain = Run(load("zombie-pause"), tmp_path, seed=1)
    assert plain.cluster.headers == {} and "CLUSTER_KEYS" not in plain.cluster.env


# -- settled, with a node cut from the store -------------------------------------


def views(
    members: dict[str, str], owners: list[tuple[str, str]], *, settled: bool = True
) -> dict[str, Any]:
    return {
        "members": [{"id": m, "state": s} for m, s in members.items()],
        "buckets": {
            "settled": settled,
            "owners": [{"bucket": i, "owner": o, "placed": p} for i, (o, p) in enumerate(owners)],
        },
    }


def fake_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answers: dict[str, Any]
) -> LocalCluster:
    cluster = LocalCluster(tmp_path)
    for name in answers:
        cluster.nodes[name] = SimpleNamespace(  # type: ignore[assignment]
            name=name, alive=True, url=f"http://{name}"
        )

    def get_json(url: str, headers: dict[str, str] | None = None) -> Any:
        answer = answers[url.removeprefix("http://").split("/")[0]]
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(cluster_module, "get_json", get_json)
    return cluster


def test_settled_does_not_ask_a_node_cut_from_the_store_but_expects_it_alive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alive = {"a": "alive", "b": "alive", "c": "alive"}
    # c is cut from the store (its view would time out); a and b hold everything.
    unplaced = views(alive, [("a", "a"), ("b", "b"), ("b", "b")])
    cluster = fake_cluster(
        tmp_path, monkeypatch, {"a": unplaced, "b": unplaced, "c": TimeoutError("store")}
    )
    assert not cluster.settled()  # asked, c cannot answer
    assert cluster.settled(unplaced={"c"})
    # While buckets are still placed on the cut node (before the others
    # stop placing it), nobody can serve them: not settled.
    stuck = views(alive, [("a", "a"), ("c", "c")])
    cluster = fake_cluster(tmp_path, monkeypatch, {"a": stuck, "b": stuck, "c": OSError()})
    assert not cluster.settled(unplaced={"c"})
    # A cut node that the others declared dead is not "unplaced" but gone.
    gone = views({"a": "alive", "b": "alive", "c": "dead"}, [("a", "a"), ("b", "b")])
    cluster = fake_cluster(tmp_path, monkeypatch, {"a": gone, "b": gone, "c": OSError()})
    assert not cluster.settled(unplaced={"c"})
    assert cluster.settled(exclude={"c"})


def test_the_summary_names_auth_the_skew_and_each_flood() -> None:
    result = check(created({"a": 100.0}), topic(Delivery("a", 1, 1, 100.1, received=100.2)))
    report = {
        "judged": [10.0, 20.0],
        "datagrams": 1000,
        "streams": {"idle": 2, "huge_length": 3},
        "dropped": {"mac": 600.0, "malformed": 300.0},
        "declared_dead_by": [],
        "suspected_by": ["node-3"],
        "passed": True,
    }
    as_run(
        result,
        scenario="soak",
        network="network namespaces",
        auth=True,
        cluster_keys=True,
        started=90.0,
        settings={"duration": 30.0},
        events=[
            {
                "at": 5.0,
                "step": "restart node-2 with its clock +30 s off",
                "node": "node-2",
                "settled_after_s": 3.0,
                "clock_offset_s": -30.001,
            },
            {
                "at": 10.0,
                "step": "garbage gossip at node-1 for 10 s",
                "node": "node-1",
                "settled_after_s": 1.0,
                "garbage": report,
            },
        ],
    )
    text = render(result)
    assert "auth on, cluster keys on" in text
    assert "(store clock - its clock: -30.001 s)" in text
    assert (
        "garbage: 1000 datagrams, 5 streams; dropped: mac 600, malformed 300; kept alive, "
        "suspected by node-3"
    ) in text
    assert "early 0 (read before due 0)" in text and text.endswith("PASSED")
    page = render_html(result)
    assert "1000 garbage datagrams, dropped mac 600, malformed 300: target kept alive" in page


def test_a_record_read_before_it_was_due_is_early_whatever_its_timestamp_says() -> None:
    # Stamped on time (a node's idea of the store's clock), yet read by the
    # runner 5 s before executeAt by the runner's own clock: sent early.
    result = check(created({"a": 100.0}), topic(Delivery("a", 1, 1, 100.01, received=95.0)))
    assert not passed(result)
    assert (result["early"], result["early_received_ids"]) == (0, ["a"])
    on_time = check(created({"a": 100.0}), topic(Delivery("a", 1, 1, 100.01, received=100.05)))
    assert passed(on_time) and on_time["early_received"] == 0


# -- what /readyz said during each fault -----------------------------------------


def test_each_lasting_fault_notes_the_readiness_checks_that_failed_while_it_lasted() -> None:
    outage = {"at": 10.0, "do": "crash-broker", "step": "crash the broker", "lasting": 20.0}
    kill = {"at": 12.0, "do": "kill", "step": "kill node-2", "lasting": 0.0}
    skipped = {"at": 5.0, "do": "cut-store", "step": "cut", "lasting": 9.0, "skipped": "no"}
    history = History(started=0.0)
    for event in (outage, kill, skipped):
        history.event(NEMESIS, event["do"], event["at"], **event)
    samples: list[dict[str, Any]] = [
        {"t": 9.0, "unready": {"node-3": ["store"]}},  # before the outage: not its doing
        {"t": 11.0, "unready": {"node-1": ["broker"]}},
        {"t": 25.0, "unready": {"node-1": ["broker"], "node-2": ["broker", "store"]}},
        {"t": 31.0, "unready": {"node-3": ["broker"]}},  # after it ended
        {"t": 29.0},  # a sample from before readiness was sampled
    ]
    note_unready(history, samples)
    outage, skipped, kill = sorted(events(history), key=lambda e: e["step"])
    assert outage["unready"] == {"broker": ["node-1", "node-2"], "store": ["node-2"]}
    assert "unready" not in kill and "unready" not in skipped
