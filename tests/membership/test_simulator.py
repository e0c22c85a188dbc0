"""membership.simulator: whole-cluster scenarios on the virtual clock.

Every run is seeded, so a failure replays exactly. Times below are virtual
seconds; the wall time of each test is a fraction of a second.
"""

from __future__ import annotations

import pytest

from membership.config import FAST, LAN, SwimConfig
from membership.messages import Alive, EventKind, Packet, State
from membership.simulator import Simulator


def deaths(sim: Simulator, *, except_for: str | None = None) -> list[tuple[float, str, str]]:
    return [
        (o.at, o.observer, o.event.member.id)
        for o in sim.observations
        if o.event.kind == EventKind.DEAD and o.event.member.id != except_for
    ]


def everyone_sees_everyone_alive(sim: Simulator) -> bool:
    live = [n.id for n in sim.live()]
    return all(sim.all_see(member, State.ALIVE, among=live) for member in live)


def incarnation_of(sim: Simulator, observer: str, member: str) -> int:
    return sim.nodes[observer].swim.members[member].incarnation


@pytest.mark.parametrize(
    ("config", "members", "seed"),
    [(FAST, 20, 1), (FAST, 20, 2), (FAST, 30, 3), (LAN, 20, 4)],
    ids=["fast-20-1", "fast-20-2", "fast-30-3", "lan-20-4"],
)
def test_crashed_member_is_declared_dead_and_nobody_else(
    config: SwimConfig, members: int, seed: int
) -> None:
    sim = Simulator(config, seed=seed, loss=0.01)
    ids = sim.bootstrap(members)
    sim.run_until(5.0)
    sim.crash("m3")
    # Bound: a full probe round over every member, plus the longest suspicion.
    bound = members * config.probe_interval + config.suspicion_timeouts(members)[1]
    sim.run_until(5.0 + bound, stop=lambda: sim.all_see("m3", State.DEAD))
    assert sim.all_see("m3", State.DEAD)
    seen = sim.first_seen("m3", EventKind.DEAD, after=5.0)
    assert set(seen) == set(ids) - {"m3"}
    assert min(seen.values()) > 5.0

    sim.run_until(120.0)
    assert sim.all_see("m3", State.DEAD)
    assert deaths(sim, except_for="m3") == []
    assert sim.dropped > 0  # the loss was real
    for member in ids:
        if member != "m3":
            assert sim.all_see(member, State.ALIVE)


def test_joining_member_becomes_known_to_all() -> None:
    sim = Simulator(FAST, seed=5, loss=0.01)
    ids = sim.bootstrap(12)
    sim.run_until(3.0)
    sim.add_node("joiner", seeds=["m5"])
    sim.run_until(15.0, stop=lambda: everyone_sees_everyone_alive(sim))
    assert everyone_sees_everyone_alive(sim)
    assert sim.now < 15.0
    joined = sim.first_seen("joiner", EventKind.JOINED, after=3.0)
    assert set(joined) == set(ids)
    # And the joiner learnt everyone from the seed's state.
    assert {m.id for m in sim.nodes["joiner"].swim.view()} == {*ids, "joiner"}


def test_graceful_leave_is_left_everywhere_and_never_dead() -> None:
    sim = Simulator(FAST, seed=6, loss=0.01)
    ids = sim.bootstrap(12)
    sim.run_until(3.0)
    sim.leave("m4")
    leaver = sim.nodes["m4"].swim
    sim.run_until(10.0, stop=lambda: leaver.pending_broadcasts() == 0)
    assert leaver.pending_broadcasts() == 0
    sim.crash("m4")  # the process exits once its leave went out
    sim.run_until(60.0)

    assert sim.all_see("m4", State.LEFT)
    assert set(sim.first_seen("m4", EventKind.LEFT, after=3.0)) == set(ids) - {"m4"}
    assert deaths(sim) == []
    assert [o for o in sim.observations if o.event.member.id == "m4"] == [
        o for o in sim.observations if o.event.kind == EventKind.LEFT
    ]


def test_short_pauses_are_not_deaths() -> None:
    sim = Simulator(FAST, seed=7)
    sim.bootstrap(10)
    shortest, _ = FAST.suspicion_timeouts(10)
    pause = 0.9 * shortest
    start = 5.0
    for member in ("m2", "m5", "m7", "m2"):
        sim.run_until(start)
        sim.pause(member)
        sim.run_until(start + pause)
        sim.resume(member)
        start += 6.0
    sim.run_until(start + 30.0)
    assert deaths(sim) == []
    # The pauses were noticed, and refuted in time.
    suspected = {o.event.member.id for o in sim.observations if o.event.kind == EventKind.SUSPECT}
    assert suspected & {"m2", "m5", "m7"}
    assert everyone_sees_everyone_alive(sim)


def test_long_pause_is_a_death_then_a_comeback() -> None:
    """The control for the test above: the same pause, longer than any suspicion."""
    sim = Simulator(FAST, seed=7)
    ids = sim.bootstrap(10)
    _, longest = FAST.suspicion_timeouts(10)
    sim.run_until(5.0)
    sim.pause("m2")
    sim.run_until(5.0 + 10 * FAST.probe_interval + longest)
    assert sim.all_see("m2", State.DEAD, among=[i for i in ids if i != "m2"])
    sim.resume("m2")
    resumed = sim.now
    sim.run_until(resumed + 10.0, stop=lambda: everyone_sees_everyone_alive(sim))
    assert everyone_sees_everyone_alive(sim)
    assert sim.nodes["m2"].swim.incarnation > 0
    assert set(sim.first_seen("m2", EventKind.ALIVE, after=resumed)) == set(ids) - {"m2"}


@pytest.mark.parametrize(
    ("config", "members", "seed"),
    [(FAST, 10, 0), (FAST, 10, 5), (FAST, 16, 8), (LAN, 20, 1)],
    ids=["fast-10-0", "fast-10-5", "fast-16-8", "lan-20-1"],
)
def test_partition_heals_within_three_push_pull_periods(
    config: SwimConfig, members: int, seed: int
) -> None:
    sim = Simulator(config, seed=seed, loss=0.01)
    ids = sim.bootstrap(members)
    left, right = ids[: members // 2], ids[members // 2 :]
    sim.run_until(5.0)
    sim.partition(left, right)
    sim.run_until(35.0)
    # Each side has buried the other ...
    for a in left:
        assert sim.all_see(a, State.DEAD, among=right)
    for b in right:
        assert sim.all_see(b, State.DEAD, among=left)
    # ... and only the other.
    assert all(sim.all_see(a, State.ALIVE, among=[x for x in left if x != a]) for a in left)

    sim.heal()
    limit = 35.0 + 3 * config.push_pull_period(members)
    sim.run_until(limit, stop=lambda: everyone_sees_everyone_alive(sim))
    assert everyone_sees_everyone_alive(sim), f"not healed by {limit}"
    assert sim.now <= limit
    # It stays healed.
    sim.run_until(sim.now + 30.0)
    assert everyone_sees_everyone_alive(sim)


@pytest.mark.parametrize("how", ["detected", "undetected", "left"])
def test_restarted_member_is_alive_again_with_a_higher_incarnation(how: str) -> None:
    sim = Simulator(FAST, seed=11, loss=0.01)
    ids = sim.bootstrap(10)
    others = [i for i in ids if i != "m2"]
    sim.run_until(5.0)
    # A first life that had to refute a suspicion: the others hold m2 above 0.
    sim.pause("m2")
    sim.run_until(20.0)
    sim.resume("m2")
    sim.run_until(30.0)
    assert sim.all_see("m2", State.ALIVE)
    assert sim.nodes["m2"].swim.incarnation > 0
    if how == "left":
        sim.leave("m2")
        sim.run_until(35.0)
        assert sim.all_see("m2", State.LEFT)
    sim.crash("m2")
    if how == "detected":
        sim.run_until(60.0, stop=lambda: sim.all_see("m2", State.DEAD))
        assert sim.all_see("m2", State.DEAD)
    old = max(incarnation_of(sim, o, "m2") for o in others)
    assert old > 0

    restarted_at = sim.now
    # A new process under the same id and address, starting from incarnation 0.
    node = sim.add_node("m2", seeds=["m0"])
    assert node.swim.incarnation == 0

    def converged() -> bool:
        current = node.swim.incarnation
        return everyone_sees_everyone_alive(sim) and all(
            incarnation_of(sim, o, "m2") == current for o in others
        )

    sim.run_until(restarted_at + 20.0, stop=converged)
    assert converged()
    assert node.swim.incarnation > old
    if how != "undetected":
        assert set(sim.first_seen("m2", EventKind.ALIVE, after=restarted_at)) == set(others)


def scenario(seed: int) -> Simulator:
    sim = Simulator(FAST, seed=seed, loss=0.02)
    ids = sim.bootstrap(12)
    sim.run_until(4.0)
    sim.crash("m1")
    sim.add_node("late", seeds=["m3"])
    sim.run_until(10.0)
    sim.partition(ids[:6], [*ids[6:], "late"])
    sim.run_until(25.0)
    sim.heal()
    sim.leave("m7")
    sim.run_until(60.0)
    return sim


def test_same_seed_same_run() -> None:
    first, second = scenario(42), scenario(42)
    assert len(first.observations) > 50
    assert first.observations == second.observations
    assert {n.id: n.bytes_sent for n in first.nodes.values()} == {
        n.id: n.bytes_sent for n in second.nodes.values()
    }
    assert first.dropped == second.dropped
    assert scenario(43).observations != first.observations


# -- forged members (unsigned gossip) ------------------------------------------------------


def answered(sim: Simulator, observer: str, member: str) -> bool:
    return {m.id: m.answered for m in sim.nodes[observer].swim.view()}.get(member, False)


def test_forged_members_are_never_answered_and_end_dead() -> None:
    """The review's attack: 600 forged datagrams naming 30 made-up members,
    sent to the members of a 3-member cluster. Ghosts never answer a probe,
    so they are never placed (the node places ALIVE and answered members),
    and the probes of them bury them."""
    sim = Simulator(FAST, seed=21)
    ids = sim.bootstrap(3)
    sim.run_until(2.0)
    ghosts = [f"ghost{i:02d}" for i in range(30)]
    for n in range(600):
        names = [ghosts[(3 * n + k) % len(ghosts)] for k in range(3)]
        forged = Packet("mallory", tuple(Alive(g, 0, f"{g}:7946") for g in names))
        sim.inject(ids[n % len(ids)], forged)
    sim.run_until(2.1)
    assert all(sim.all_see(g, State.ALIVE, among=ids) for g in ghosts)  # the forgeries landed

    def buried() -> bool:
        return all(sim.all_see(g, State.DEAD, among=ids) for g in ghosts)

    # Every ghost is probed within every other round of a pass, then suspected.
    bound = 2 * len(ghosts) * FAST.probe_interval + FAST.suspicion_timeouts(33)[1]
    sim.run_until(2.1 + bound, stop=buried)
    assert buried()
    assert not [
        o
        for o in sim.observations
        if o.event.kind == EventKind.ANSWERED and o.event.member.id in ghosts
    ]
    assert not any(answered(sim, o, g) for o in ids for g in ghosts)
    # The real members were never in doubt.
    assert {member for _, _, member in deaths(sim)} == set(ghosts)
    assert all(answered(sim, o, m) for o in ids for m in ids)
    assert everyone_sees_everyone_alive(sim)


def test_a_joining_member_is_answered_everywhere_within_a_few_probe_intervals() -> None:
    sim = Simulator(FAST, seed=22, loss=0.01)
    ids = sim.bootstrap(5)
    sim.run_until(3.0)
    sim.add_node("joiner", seeds=["m2"])
    sim.run_until(3.0 + (len(ids) + 2) * FAST.probe_interval)
    heard = sim.first_seen("joiner", EventKind.JOINED, after=3.0)
    answered_at = sim.first_seen("joiner", EventKind.ANSWERED, after=3.0)
    assert set(answered_at) == set(heard) == set(ids)
    # Each member probes a newcomer at its next round or the one after (not
    # somewhere in its pass), and that probe ends one interval later.
    for member in ids:
        assert answered_at[member] - heard[member] <= 3 * FAST.probe_interval, member
    assert all(answered(sim, o, "joiner") for o in ids)
    # The joiner answers a member as soon (Membership.joined waits for that),
    # and every member within a pass.
    by_joiner = [
        o.at
        for o in sim.observations
        if o.observer == "joiner" and o.event.kind == EventKind.ANSWERED
    ]
    assert min(by_joiner) - min(heard.values()) <= 3 * FAST.probe_interval
    assert all(answered(sim, "joiner", m) for m in ids)
