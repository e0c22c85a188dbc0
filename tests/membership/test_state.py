"""membership.state: the SWIM + Lifeguard state machine, driven by hand.

No sockets and no clock: every input carries its ``now``, and ``Net`` (in the
spirit of h11's ConnectionPair) moves drained packets between a few ``Swim``
instances by address, instantly, optionally losing some. Members named in a
view but without an instance in the net are phantoms: packets to them are
recorded and lost, which is how a crashed or unreachable member looks.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from membership.codec import Codec
from membership.config import LAN, ConfigError, SwimConfig
from membership.messages import (
    MAX_INCARNATION,
    MAX_SEQ,
    Ack,
    Alive,
    Dead,
    Event,
    EventKind,
    MemberRecord,
    Message,
    Nack,
    Outgoing,
    Packet,
    Ping,
    PingReq,
    PushPull,
    State,
    Suspect,
)
from membership.state import Swim

KEY = bytes(range(32))


def address(node_id: str) -> str:
    return f"{node_id}:7946"


@dataclass(frozen=True)
class Sent:
    at: float
    sender: str
    out: Outgoing
    delivered: bool

    @property
    def messages(self) -> tuple[Message, ...]:
        return self.out.packet.messages

    @property
    def first(self) -> Message:
        return self.out.packet.messages[0]


class Net:
    """A few ``Swim`` instances on a lossless, zero-latency wire."""

    def __init__(
        self, *ids: str, config: SwimConfig = LAN, seed: int = 0, introduce: bool = True
    ) -> None:
        self.config = config
        self.seed = seed
        self.now = 0.0
        self.nodes: dict[str, Swim] = {}
        self.down: set[str] = set()
        # (sender id, receiver id) -> True when the packet is lost.
        self.lost: Callable[[str, str], bool] = lambda sender, to: False
        self.sent: list[Sent] = []
        self.events: list[tuple[float, str, Event]] = []
        self._lives = 0
        for node_id in ids:
            self.start(node_id)
        if introduce:
            for node_id in ids:
                self.know(node_id, *(o for o in ids if o != node_id))

    def start(self, node_id: str, *, incarnation: int = 0) -> Swim:
        """A new process for ``node_id`` (a restart when it existed before)."""
        self._lives += 1
        rng = random.Random(f"{self.seed}/{node_id}/{self._lives}")
        swim = Swim(
            node_id, address(node_id), self.config, now=self.now, rng=rng, incarnation=incarnation
        )
        self.nodes[node_id] = swim
        self.down.discard(node_id)
        return swim

    def know(self, node_id: str, *others: str, incarnation: int | None = None) -> None:
        """Teach ``node_id`` that ``others`` are alive (phantoms when not in the net),
        one datagram each: a datagram adds few members we never heard of."""
        for other in others:
            inc = incarnation
            if inc is None:
                inc = self.nodes[other].incarnation if other in self.nodes else 0
            self.tell(node_id, Alive(other, inc, address(other)), sender=other)

    def tell(self, to: str, *messages: Message, sender: str = "z") -> None:
        self.nodes[to].receive(Packet(sender, messages), self.now)
        self.flush()

    def flush(self) -> None:
        """Drain every live node and deliver until nothing more is sent."""
        for _ in range(1000):
            wire: list[tuple[str, Packet]] = []
            for node_id, swim in self.nodes.items():
                if node_id in self.down:
                    continue
                outgoing, events = swim.drain()
                self.events.extend((self.now, node_id, e) for e in events)
                for out in outgoing:
                    to = out.address.removesuffix(":7946")
                    delivered = (
                        to in self.nodes and to not in self.down and not self.lost(node_id, to)
                    )
                    self.sent.append(Sent(self.now, node_id, out, delivered))
                    if delivered:
                        wire.append((to, out.packet))
            if not wire:
                return
            for to, packet in wire:
                self.nodes[to].receive(packet, self.now)
        raise AssertionError("packets keep bouncing between the nodes")

    def run(self, until: float) -> None:
        """Run every timer due by ``until``, in time order."""
        while True:
            due = [(s.next_deadline(), i) for i, s in self.nodes.items() if i not in self.down]
            if not due or min(due)[0] > until:
                break
            self.now = max(self.now, min(due)[0])
            for deadline, node_id in due:
                if deadline <= self.now:
                    self.nodes[node_id].tick(self.now)
            self.flush()
        self.now = max(self.now, until)

    def step(self) -> None:
        """Run the earliest timer of any live node."""
        self.run(min(s.next_deadline() for i, s in self.nodes.items() if i not in self.down))

    def next_ping(self, sender: str) -> Sent:
        """Run timers one by one until ``sender`` sends its next ping."""
        count = len(self.packets(sender, Ping))
        for _ in range(1000):
            self.step()
            pings = self.packets(sender, Ping)
            if len(pings) > count:
                return pings[count]
        raise AssertionError(f"{sender} sends no ping")

    def leave(self, node_id: str) -> None:
        self.nodes[node_id].leave(self.now)
        self.flush()

    # -- questions -------------------------------------------------------------

    def seen(
        self, observer: str | None = None, member: str | None = None, kind: EventKind | None = None
    ) -> list[tuple[float, str, Event]]:
        return [
            (at, who, e)
            for at, who, e in self.events
            if (observer is None or who == observer)
            and (member is None or e.member.id == member)
            and (kind is None or e.kind == kind)
        ]

    def kinds(self, observer: str) -> list[tuple[EventKind, str]]:
        return [(e.kind, e.member.id) for _, _, e in self.seen(observer)]

    def packets(
        self, sender: str | None = None, first: type | None = None, to: str | None = None
    ) -> list[Sent]:
        return [
            s
            for s in self.sent
            if (sender is None or s.sender == sender)
            and (first is None or isinstance(s.first, first))
            and (to is None or s.out.address == address(to))
        ]

    def first_ping(self, sender: str, after: float = -1.0) -> Sent:
        for sent in self.packets(sender, Ping):
            if sent.at > after:
                return sent
        raise AssertionError(f"{sender} sent no ping after {after}")


def solo(*others: str, incarnation: int = 0, config: SwimConfig = LAN) -> Net:
    """Node ``a`` alone in the net, knowing ``others`` (phantoms) as alive at 0."""
    net = Net(config=config, introduce=False)
    net.start("a", incarnation=incarnation)
    if others:
        net.know("a", *others)
        net.events.clear()
    return net


def vouch(net: Net, node_id: str, *members: str) -> None:
    """Mark ``members`` answered at ``node_id``, as if they had acked its
    probes (phantoms cannot): only members that answered relay probes."""
    swim = net.nodes[node_id]
    for member in members:
        swim._answer(swim.members[member], net.now)
    net.flush()


def ping(sent: Sent) -> Ping:
    assert isinstance(sent.first, Ping)
    return sent.first


def exchange(sent: Sent) -> PushPull:
    assert isinstance(sent.first, PushPull)
    return sent.first


# -- updates about other members ----------------------------------------------


def test_alive_about_an_unknown_member_is_a_join_and_is_gossiped_on() -> None:
    net = solo()
    a = net.nodes["a"]
    meta = (("zone", "eu-1"),)
    net.tell("a", Alive("b", 3, "b:7946", meta))
    assert net.kinds("a") == [(EventKind.JOINED, "b")]
    event = net.events[0][2]
    assert (event.member.state, event.member.incarnation, event.member.meta) == (
        State.ALIVE,
        3,
        meta,
    )
    assert a.state_of("b") == State.ALIVE
    assert [m.id for m in a.view()] == ["a", "b"]
    assert a.pending_broadcasts() == 1

    # News reaches the next member a talks to.
    net.know("a", "c")
    net.run(1.0)
    carried = [m for s in net.packets("a") for m in s.messages]
    assert Alive("b", 3, "b:7946", meta) in carried


def test_suspect_or_dead_about_an_unknown_member_is_ignored() -> None:
    net = solo()
    a = net.nodes["a"]
    net.tell("a", Suspect("b", 0, "c"), Dead("d", 0, "c"), Dead("e", 0, "e"))
    assert net.events == []
    assert [a.state_of(m) for m in "bde"] == [None, None, None]
    assert a.pending_broadcasts() == 0


def to_state(net: Net, state: str) -> None:
    """Put phantom ``b`` (known to ``a`` at incarnation 0) into ``state``."""
    messages: dict[str, Message] = {
        "suspect": Suspect("b", 0, "c"),
        "dead": Dead("b", 0, "c"),
        "left": Dead("b", 0, "b"),
    }
    net.tell("a", messages[state])
    assert net.nodes["a"].state_of("b") == State[state.upper()]
    net.events.clear()


@pytest.mark.parametrize("state", ["suspect", "dead", "left"])
def test_alive_with_a_higher_incarnation_revives(state: str) -> None:
    net = solo("b", "c")
    a = net.nodes["a"]
    to_state(net, state)

    # The same incarnation does not bring it back ...
    net.tell("a", Alive("b", 0, "b:7946"))
    assert a.state_of("b") == State[state.upper()]
    assert net.events == []

    # ... a higher one does.
    net.tell("a", Alive("b", 1, "b:7946"))
    assert net.kinds("a") == [(EventKind.ALIVE, "b")]
    assert net.events[0][2].member.incarnation == 1
    assert a.state_of("b") == State.ALIVE


def test_revived_member_is_probed_again() -> None:
    net = solo("b")
    a = net.nodes["a"]
    to_state(net, "dead")
    net.run(10.0)
    assert net.packets("a", Ping) == []  # nobody left to probe

    net.tell("a", Alive("b", 1, "b:7946"))
    net.run(12.0)
    assert [ping(s).target for s in net.packets("a", Ping)][:1] == ["b"]
    assert a.stats.probes >= 1


@pytest.mark.parametrize("seed", range(5))
def test_revived_member_is_probed_within_the_current_pass(seed: int) -> None:
    """Round robin: every member is probed once before any is probed twice,
    and a member back from the dead joins the pass under way."""
    live = [f"m{i}" for i in range(8)]
    # No ping-reqs: every ping a sends is one of its own probes, none relayed.
    net = Net("a", *live, seed=seed, config=SwimConfig(indirect_checks=0))
    net.know("a", "b")
    net.tell("a", Dead("b", 0, "m0"))
    # Well into the pass, past b's old place in it.
    before = [ping(net.next_ping("a")).target for _ in range(len(live) - 1)]
    assert len(set(before)) == len(before)
    net.tell("a", Alive("b", 1, "b:7946"))
    after = [ping(net.next_ping("a")).target for _ in range(2)]
    assert sorted(after) == sorted({*live, "b"} - set(before))


@pytest.mark.parametrize("seed", range(5))
def test_a_member_revived_twice_in_one_pass_is_probed_once_in_it(seed: int) -> None:
    live = [f"m{i}" for i in range(8)]
    net = Net("a", *live, seed=seed, config=SwimConfig(indirect_checks=0))
    net.know("a", "b")
    net.tell("a", Dead("b", 0, "m0"))
    before = [ping(net.next_ping("a")).target for _ in range(len(live) - 1)]
    # Back, dead again and back again before the pass ends: b is queued ahead
    # of the pass once, not once per revival.
    net.tell("a", Alive("b", 1, "b:7946"))
    net.tell("a", Dead("b", 1, "m0"))
    net.tell("a", Alive("b", 2, "b:7946"))
    rest = [ping(net.next_ping("a")).target for _ in range(2)]
    assert sorted(rest) == sorted({*live, "b"} - set(before))


def test_alive_with_the_same_or_a_lower_incarnation_is_ignored() -> None:
    net = solo()
    a = net.nodes["a"]
    net.tell("a", Alive("b", 5, "b:7946"))
    net.events.clear()
    net.tell("a", Alive("b", 5, "elsewhere:1"), Alive("b", 4, "elsewhere:2"))
    assert net.events == []
    [b] = [m for m in a.view() if m.id == "b"]
    assert (b.address, b.incarnation) == ("b:7946", 5)


def test_alive_with_a_new_address_or_metadata_is_an_update() -> None:
    net = solo("b")
    a = net.nodes["a"]
    net.tell("a", Alive("b", 1, "b:7946"))  # same address and metadata: no event
    assert net.events == []
    net.tell("a", Alive("b", 2, "b2:7946"))
    net.tell("a", Alive("b", 3, "b2:7946", (("role", "x"),)))
    assert net.kinds("a") == [(EventKind.UPDATED, "b"), (EventKind.UPDATED, "b")]
    [b] = [m for m in a.view() if m.id == "b"]
    assert (b.address, b.incarnation, b.meta, b.state) == (
        "b2:7946",
        3,
        (("role", "x"),),
        State.ALIVE,
    )


def test_our_new_metadata_reaches_every_peer_and_outbids_what_they_knew() -> None:
    net = Net("a", "b", "c")
    net.run(5.0)
    before = net.nodes["a"].incarnation
    net.nodes["a"].update_meta((("store", "cut"),), net.now)
    net.flush()
    assert net.kinds("a")[-1] == (EventKind.UPDATED, "a")  # our own listeners hear it at once
    net.run(net.now + 10.0)  # gossip carries it, piggybacked on probes
    for peer in ("b", "c"):
        [a] = [m for m in net.nodes[peer].view() if m.id == "a"]
        assert (a.meta, a.incarnation, a.state) == ((("store", "cut"),), before + 1, State.ALIVE)
        assert (EventKind.UPDATED, "a") in net.kinds(peer)
    net.nodes["a"].update_meta((("store", "cut"),), net.now)  # the same again: nothing new
    assert net.nodes["a"].incarnation == before + 1


def test_suspect_precedence() -> None:
    net = solo()
    a = net.nodes["a"]
    net.tell("a", Alive("b", 2, "b:7946"))
    net.events.clear()

    net.tell("a", Suspect("b", 1, "c"))  # older than what we know
    assert a.state_of("b") == State.ALIVE
    assert net.events == []

    net.tell("a", Suspect("b", 2, "c"))  # Suspect(i) beats Alive(i)
    assert net.kinds("a") == [(EventKind.SUSPECT, "b")]
    assert a.stats.suspicions == 1

    net.tell("a", Alive("b", 2, "b:7946"))  # Alive(i) does not beat Suspect(i)
    assert a.state_of("b") == State.SUSPECT

    net.tell("a", Suspect("b", 2, "d"))  # a confirmation, not a new suspicion
    assert len(net.events) == 1
    assert a.stats.suspicions == 1

    net.tell("a", Suspect("b", 4, "c"))  # a newer suspicion
    assert net.kinds("a") == [(EventKind.SUSPECT, "b")] * 2
    assert net.events[-1][2].member.incarnation == 4

    net.tell("a", Alive("b", 5, "b:7946"))  # refuted
    assert net.kinds("a")[-1] == (EventKind.ALIVE, "b")


def test_suspect_about_a_member_with_a_higher_incarnation_takes_its_incarnation() -> None:
    net = solo()
    net.tell("a", Alive("b", 2, "b:7946"))
    net.tell("a", Suspect("b", 7, "c"))
    [b] = [m for m in net.nodes["a"].view() if m.id == "b"]
    assert (b.state, b.incarnation) == (State.SUSPECT, 7)


@pytest.mark.parametrize("state", ["dead", "left"])
def test_suspect_and_dead_do_not_touch_dead_or_left_members(state: str) -> None:
    net = solo("b", "c")
    a = net.nodes["a"]
    to_state(net, state)
    net.tell("a", Suspect("b", 0, "c"), Suspect("b", 3, "c"), Dead("b", 3, "c"), Dead("b", 4, "b"))
    assert a.state_of("b") == State[state.upper()]
    assert net.events == []


def test_dead_from_a_peer_is_dead_and_from_the_member_itself_is_left() -> None:
    net = solo("b", "c", "d")
    a = net.nodes["a"]
    net.tell("a", Dead("b", 0, "c"))
    net.tell("a", Dead("c", 0, "c"))
    net.tell("a", Suspect("d", 0, "b"), Dead("d", 0, "b"))  # Dead(i) beats Suspect(i)
    assert net.kinds("a") == [
        (EventKind.DEAD, "b"),
        (EventKind.LEFT, "c"),
        (EventKind.SUSPECT, "d"),
        (EventKind.DEAD, "d"),
    ]
    assert [a.state_of(m) for m in "bcd"] == [State.DEAD, State.LEFT, State.DEAD]
    assert a.stats.deaths == 2  # a leave is not a death


def test_dead_with_a_lower_incarnation_is_ignored() -> None:
    net = solo()
    a = net.nodes["a"]
    net.tell("a", Alive("b", 3, "b:7946"), Alive("c", 3, "c:7946"))
    net.events.clear()
    net.tell("a", Dead("b", 2, "c"), Dead("c", 2, "c"))
    assert (a.state_of("b"), a.state_of("c")) == (State.ALIVE, State.ALIVE)
    assert net.events == []


# -- suspicion timeouts (Lifeguard) ---------------------------------------------

# Four other members: suspicion lasts between min and max of suspicion_timeouts(5)
# and shrinks with each of k = suspicion_mult - 2 = 2 independent confirmations.
LOW, HIGH = LAN.suspicion_timeouts(5)
ONE_CONFIRMATION = HIGH - (HIGH - LOW) * math.log(2) / math.log(3)


@pytest.mark.parametrize(
    ("sources", "timeout"),
    [
        (["c"], HIGH),
        (["c", "c"], HIGH),  # the same source again is no confirmation
        (["c", "d"], ONE_CONFIRMATION),
        (["c", "d", "e"], LOW),
        (["c", "d", "e", "x"], LOW),  # never below the minimum
    ],
)
def test_suspicion_times_out_at_its_deadline(sources: list[str], timeout: float) -> None:
    assert (LOW, HIGH) == (4.0, 24.0)
    net = solo("b", "c", "d", "e")
    a = net.nodes["a"]
    net.tell("a", Suspect("b", 0, sources[0]))
    # Confirmations arriving later still count from the start of the suspicion.
    net.now = 2.0
    net.tell("a", *(Suspect("b", 0, s) for s in sources[1:]))
    net.events.clear()

    a.tick(timeout - 0.01)
    assert a.state_of("b") == State.SUSPECT
    # Every other timer was just pushed past the suspicion's deadline.
    assert a.next_deadline() == pytest.approx(timeout)

    a.tick(a.next_deadline())
    _, events = a.drain()
    assert [(e.kind, e.member.id) for e in events] == [(EventKind.DEAD, "b")]
    assert events[0].at == pytest.approx(timeout)
    assert a.stats.deaths == 1


def test_gossip_goes_to_alive_and_suspect_members_only() -> None:
    """Gossip targets follow every change of state: joined, suspected, dead,
    revived (they are kept between rounds, so each change must reach them)."""
    net = solo("b", "c", "d", config=SwimConfig(gossip_interval=0.01, gossip_nodes=10))

    def gossiped_to(news: Message) -> set[str]:
        since = len(net.sent)
        net.tell("a", news)
        net.run(net.now + 0.02)
        return {
            s.out.address.removesuffix(":7946")
            for s in net.sent[since:]
            if s.sender == "a" and news in s.out.packet.messages
        }

    assert gossiped_to(Alive("e", 0, "e:7946")) == {"b", "c", "d", "e"}  # e joins
    assert gossiped_to(Suspect("c", 0, "z")) == {"b", "c", "d", "e"}
    assert gossiped_to(Dead("d", 0, "z")) == {"b", "c", "e"}
    assert gossiped_to(Alive("d", 1, "d:7946")) == {"b", "c", "d", "e"}
    assert gossiped_to(Dead("b", 0, "b")) == {"c", "d", "e"}  # b left


def test_confirmations_are_gossiped_on_but_repeats_are_not() -> None:
    # Gossip rounds every 10 ms: a queued update is used up long before a's
    # first probe can fail and add its own suspicion.
    net = solo("b", "c", "d", "e", config=SwimConfig(gossip_interval=0.01))
    limit = LAN.retransmit_limit(5)

    def sent(update: Suspect) -> int:
        return sum(m == update for s in net.packets("a") for m in s.messages)

    net.tell("a", Suspect("b", 0, "c"))
    net.run(0.1)
    assert sent(Suspect("b", 0, "c")) == limit
    net.tell("a", Suspect("b", 0, "c"))  # heard again: old news
    net.run(0.2)
    assert sent(Suspect("b", 0, "c")) == limit
    net.tell("a", Suspect("b", 0, "d"))  # a new, independent witness
    net.run(0.3)
    assert sent(Suspect("b", 0, "d")) == limit


def test_small_cluster_expects_no_confirmations_and_uses_the_minimum() -> None:
    net = solo("b", "c")  # k = 2 confirmations cannot come from one other member
    a = net.nodes["a"]
    low, _ = LAN.suspicion_timeouts(3)
    net.tell("a", Suspect("b", 0, "c"))
    a.tick(low - 0.01)
    assert a.state_of("b") == State.SUSPECT
    a.tick(low)
    assert a.state_of("b") == State.DEAD


def test_refuted_suspicion_is_cancelled() -> None:
    net = solo("b", "c", "d", "e")
    a = net.nodes["a"]
    net.tell("a", Suspect("b", 0, "c"))
    net.tell("a", Alive("b", 1, "b:7946"))
    a.tick(HIGH + 1)
    assert a.state_of("b") == State.ALIVE
    assert a.stats.deaths == 0


# -- refutation -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ours", "accusation", "expected"),
    [
        (0, Suspect("a", 0, "b"), 1),
        (0, Suspect("a", 5, "b"), 6),
        (3, Suspect("a", 3, "b"), 4),
        (0, Dead("a", 0, "b"), 1),
        (2, Dead("a", 4, "b"), 5),
        (0, Alive("a", 2, "a:7946"), 3),
        # Our own leave from an earlier life: we are back, so outbid it.
        (0, Dead("a", 0, "a"), 1),
    ],
)
def test_accusations_about_ourselves_are_refuted(
    ours: int, accusation: Message, expected: int
) -> None:
    net = solo("b", incarnation=ours)
    a = net.nodes["a"]
    net.tell("a", accusation, sender="b")
    assert a.incarnation == expected
    assert a.state_of("a") == State.ALIVE
    assert a.stats.refutations == 1
    assert a.awareness.score == 1  # being suspected hints that we are the slow one
    assert net.seen("a", member="a") == []

    net.run(1.0)
    assert net.packets("a")
    assert Alive("a", expected, "a:7946") in net.packets("a")[0].messages


@pytest.mark.parametrize(
    "accusation",
    [
        # (A Suspect or Dead at the top itself is refused, never refuted: see
        # test_suspect_or_dead_at_the_top_of_the_range_from_the_wire_is_refused.)
        Alive("a", MAX_INCARNATION, "x:1"),
        Suspect("a", MAX_INCARNATION - 1, "b"),
        Dead("a", MAX_INCARNATION - 1, "b"),
    ],
)
def test_refutation_saturates_at_the_top_of_the_incarnation_range(accusation: Message) -> None:
    """A forged accusation at the top of the range must not push our
    incarnation past what peers decode: every packet carrying our Alive (our
    acks among them) would be dropped, and we would be deaf."""
    net = solo("b")
    a = net.nodes["a"]
    net.tell("a", accusation, sender="b")
    assert a.incarnation == MAX_INCARNATION
    assert a.stats.refutations == 1
    net.tell("a", Ping(5, "a", "b", "b:7946"), sender="b")
    net.run(1.0)
    codec = Codec([KEY])
    sent = [s.out for s in net.sent if s.sender == "a"]
    assert any(Alive("a", MAX_INCARNATION, "a:7946") in out.packet.messages for out in sent)
    for out in sent:
        assert codec.decode(codec.encode(out.packet), stream=out.reliable) == out.packet


def test_sequence_numbers_wrap_inside_the_wire_range() -> None:
    net = solo("b")
    a = net.nodes["a"]
    a._seq = MAX_SEQ - 1
    assert [a._next_seq() for _ in range(3)] == [MAX_SEQ, 0, 1]


@pytest.mark.parametrize(
    "stale",
    [Suspect("a", 2, "b"), Dead("a", 2, "b"), Alive("a", 3, "a:7946"), Alive("a", 1, "x:1")],
)
def test_stale_news_about_ourselves_is_not_refuted(stale: Message) -> None:
    net = solo("b", incarnation=3)
    a = net.nodes["a"]
    net.tell("a", stale, sender="b")
    assert a.awareness.score == 0
    net.run(2.0)
    assert a.incarnation == 3
    assert a.stats.refutations == 0
    assert not [m for s in net.sent for m in s.messages if isinstance(m, Alive) and m.member == "a"]


def test_a_leaving_node_does_not_refute() -> None:
    net = solo("b", "c")
    a = net.nodes["a"]
    net.leave("a")
    net.tell("a", Suspect("a", 0, "b"), Dead("a", 0, "b"), Alive("a", 5, "a:7946"))
    net.run(2.0)
    assert a.incarnation == 0
    assert a.stats.refutations == 0
    carried = [m for s in net.packets("a") for m in s.messages]
    assert Dead("a", 0, "a") in carried
    assert not [m for m in carried if isinstance(m, Alive) and m.member == "a"]


# -- the probe cycle ----------------------------------------------------------------


def test_acked_probes_raise_no_suspicion() -> None:
    net = Net("a", "b", "c")
    net.run(20.0)
    assert net.seen(kind=EventKind.SUSPECT) == []
    assert net.seen(kind=EventKind.DEAD) == []
    for swim in net.nodes.values():
        assert swim.stats.probes >= 15
        assert (swim.stats.probe_failures, swim.stats.ping_reqs) == (0, 0)
        assert swim.awareness.score == 0
    # Every ping was answered, by the member it was meant for, with its seq.
    acks = {(s.out.address, s.first) for s in net.packets(first=Ack)}
    for sent in net.packets(first=Ping):
        p = ping(sent)
        assert (address(sent.sender), Ack(p.seq, p.target)) in acks


def test_unanswered_probe_asks_others_then_suspects() -> None:
    net = solo("b", "c", "d", "e", "f")
    vouch(net, "a", "b", "c", "d", "e", "f")
    net.tell("a", Dead("f", 0, "c"))  # not a helper any more
    net.events.clear()
    a = net.nodes["a"]
    timeout, interval = LAN.probe_timeout, LAN.probe_interval
    first = net.next_ping("a")
    t0, p = first.at, ping(first)
    assert first.out.address == address(p.target)
    helpers = {"b", "c", "d", "e"} - {p.target}

    # An ack for another probe does not count.
    net.tell("a", Ack(p.seq + 1, p.target), sender=p.target)

    net.run(t0 + timeout - 1e-9)
    assert net.packets("a", PingReq) == []
    net.run(t0 + timeout)
    reqs = net.packets("a", PingReq)
    assert {s.out.address for s in reqs} == {address(h) for h in helpers}
    assert {s.at for s in reqs} == {t0 + timeout}
    assert {s.first for s in reqs} == {
        PingReq(p.seq, p.target, address(p.target), "a", "a:7946", True)
    }
    assert a.stats.ping_reqs == 3

    net.run(t0 + interval - 1e-9)
    assert a.state_of(p.target) == State.ALIVE
    net.run(t0 + interval)
    assert [(at, e.kind, e.member.id) for at, _, e in net.seen("a")] == [
        (t0 + interval, EventKind.SUSPECT, p.target)
    ]
    assert a.stats.probe_failures == 1
    # Lifeguard: none of the three helpers even sent a nack.
    assert a.awareness.score == 3

    # The next probe waits (score + 1) times as long before going indirect.
    second = net.first_ping("a", after=t0)
    assert second.at == t0 + interval
    net.run(second.at + 4 * timeout - 1e-9)
    assert [s for s in net.packets("a", PingReq) if s.at > t0 + timeout] == []
    net.run(second.at + 4 * timeout)
    assert {s.at for s in net.packets("a", PingReq) if s.at > t0 + timeout} == {
        second.at + 4 * timeout
    }


@pytest.mark.parametrize("nacks", [0, 1, 2, 3])
def test_nacks_keep_a_failed_probe_from_raising_awareness(nacks: int) -> None:
    net = solo("b", "c", "d", "e")
    vouch(net, "a", "b", "c", "d", "e")
    a = net.nodes["a"]
    first = net.next_ping("a")
    p = ping(first)
    net.run(first.at + LAN.probe_timeout)
    helpers = [s.out.address.removesuffix(":7946") for s in net.packets("a", PingReq)]
    assert len(helpers) == 3
    for helper in helpers[:nacks]:
        net.tell("a", Nack(p.seq, helper), Nack(p.seq + 1, helper), sender=helper)
    net.run(first.at + LAN.probe_interval)
    assert a.stats.probe_failures == 1
    assert a.awareness.score == 3 - nacks


def test_awareness_stretches_the_probe_interval_and_falls_after_acks() -> None:
    net = solo("b")  # no helpers: a failed probe counts one
    vouch(net, "a", "b")  # (of a member that once answered: see the test below)
    a = net.nodes["a"]
    t0 = net.next_ping("a").at
    net.run(t0 + 1.0)
    assert a.awareness.score == 1
    assert a.state_of("b") == State.SUSPECT

    # The second probe lasts twice as long; answer it.
    second = net.first_ping("a", after=t0)
    assert second.at == t0 + 1.0
    net.now = second.at + 0.1
    net.tell("a", Ack(ping(second).seq, "b"), sender="b")
    net.run(second.at + 2.0 - 1e-9)
    assert a.awareness.score == 1
    assert [s.at for s in net.packets("a", Ping)] == [t0, t0 + 1.0]
    net.run(second.at + 2.0)
    assert a.awareness.score == 0
    third = net.first_ping("a", after=second.at)
    assert third.at == second.at + 2.0
    # An ack proves the member reachable, but only an Alive refutes a suspicion.
    assert a.state_of("b") == State.SUSPECT


def test_failing_to_reach_a_member_that_never_answered_says_nothing_of_our_health() -> None:
    """A made-up member (a forged Alive) never answers: its failed probes
    must not raise our Lifeguard score, or a flood of them would stretch
    every timeout of ours (up to 9x) and slow the detection of real failures."""
    net = solo(*(f"ghost{i}" for i in range(5)))
    a = net.nodes["a"]
    net.run(net.now + 20 * LAN.probe_interval)
    assert a.stats.probe_failures >= 5
    assert a.awareness.score == 0
    assert all(a.state_of(f"ghost{i}") != State.ALIVE for i in range(5))


def relayed_net() -> Net:
    """a, b and e, with a and e cut from each other from the start. a and e
    learn of b first, so their first probes (of the oldest member they have
    not heard answer) make b a helper before they need one."""
    net = Net("a", "b", "e", introduce=False)
    for node_id, others in (("a", "be"), ("b", "ae"), ("e", "ba")):
        net.know(node_id, *others)
    net.lost = lambda sender, to: {sender, to} == {"a", "e"}
    return net


def test_indirect_ack_through_a_relay_counts() -> None:
    net = relayed_net()
    cut = {frozenset("ae")}
    net.lost = lambda sender, to: frozenset((sender, to)) in cut
    net.run(20.0)
    a, e = net.nodes["a"], net.nodes["e"]
    assert a.stats.ping_reqs >= 3 and e.stats.ping_reqs >= 3
    assert a.stats.probe_failures == e.stats.probe_failures == 0
    assert net.seen(kind=EventKind.SUSPECT) == []
    forwarded = [s.first for s in net.packets("b", Ack, to="a")]
    assert any(isinstance(m, Ack) and m.source == "e" for m in forwarded)

    # Once the relay cannot reach e either, a suspects it.
    cut.add(frozenset("be"))
    net.run(30.0)
    assert a.state_of("e") in (State.SUSPECT, State.DEAD)
    assert net.seen("a", "e", EventKind.SUSPECT)


def test_relay_probes_the_target_and_nacks_when_it_is_silent() -> None:
    net = Net("b", introduce=False)
    b = net.nodes["b"]
    net.tell("b", PingReq(77, "e", "e:7946", "a", "a:7946", True), sender="a")
    [relayed] = net.packets("b")
    assert relayed.out.address == "e:7946"
    assert ping(relayed).target == "e"
    assert ping(relayed).source_address == "b:7946"

    nack_at = LAN.probe_timeout * 0.8
    net.run(nack_at - 1e-9)
    assert net.packets("b", Nack) == []
    net.run(nack_at)
    [nack] = net.packets("b", Nack)
    assert (nack.at, nack.out.address, nack.first) == (nack_at, "a:7946", Nack(77, "b"))
    assert b.stats.nacks_sent == 1

    net.run(10.0)
    assert len(net.packets("b", Nack)) == 1
    assert net.packets("b", Ack) == []


def test_relay_without_nack_stays_silent() -> None:
    net = Net("b", introduce=False)
    net.tell("b", PingReq(77, "e", "e:7946", "a", "a:7946", False), sender="a")
    net.run(10.0)
    assert net.packets("b", Nack) == []
    assert net.nodes["b"].stats.nacks_sent == 0


def test_relay_forwards_the_targets_ack_instead_of_a_nack() -> None:
    net = Net("b", "e")
    net.tell("b", PingReq(77, "e", "e:7946", "a", "a:7946", True), sender="a")
    net.run(10.0)
    assert [s.first for s in net.packets("b", to="a")] == [Ack(77, "e")]


def test_ping_to_a_suspect_carries_the_suspicion_buddy_system() -> None:
    # No gossip rounds: queued updates leave only on pings.
    net = solo("b", "c", config=SwimConfig(gossip_nodes=0))
    net.tell("a", Suspect("b", 0, "c"))
    net.run(3.0)
    to_b = next(s for s in net.packets("a", Ping) if ping(s).target == "b")
    about_b = [m for m in to_b.messages if getattr(m, "member", None) == "b"]
    assert to_b.messages[1] == Suspect("b", 0, "a")
    assert about_b == [Suspect("b", 0, "a")]  # the queued copy is not sent twice

    to_c = next(s for s in net.packets("a", Ping) if ping(s).target == "c")
    assert not [m for m in to_c.messages if isinstance(m, Suspect) and m.member == "c"]


def test_ping_for_another_member_is_not_acked() -> None:
    net = solo()
    a = net.nodes["a"]
    net.tell("a", Ping(5, "old-owner-of-this-address", "b", "b:7946"), sender="b")
    assert net.sent == []
    assert a.stats.misdirected == 1
    net.tell("a", Ping(6, "a", "b", "b:7946"), sender="b")
    assert [(s.out.address, s.first) for s in net.sent] == [("b:7946", Ack(6, "a"))]
    assert a.stats.misdirected == 1


# -- push-pull -------------------------------------------------------------------------


def test_join_exchanges_state_once_each_way() -> None:
    net = Net("a", "b", introduce=False)
    net.nodes["a"].join(["a:7946", "b:7946"], net.now)  # our own address is skipped
    net.flush()
    exchanges = net.packets(first=PushPull)
    assert len(net.sent) == len(exchanges) == 2
    request, reply = exchanges
    assert (request.sender, request.out.address, request.out.reliable) == ("a", "b:7946", True)
    assert isinstance(request.first, PushPull) and isinstance(reply.first, PushPull)
    assert (request.first.join, request.first.reply) == (True, False)
    assert (reply.sender, reply.out.address, reply.out.reliable) == ("b", "a:7946", True)
    assert (reply.first.join, reply.first.reply) == (False, True)
    assert {r.member for r in reply.first.members} == {"a", "b"}
    assert net.kinds("a") == [(EventKind.JOINED, "b")]
    assert net.kinds("b") == [(EventKind.JOINED, "a")]
    assert net.nodes["a"].stats.push_pulls == net.nodes["b"].stats.push_pulls == 1


def records(*rows: tuple[str, int, State]) -> tuple[MemberRecord, ...]:
    return tuple(MemberRecord(m, address(m), inc, state) for m, inc, state in rows)


def test_merge_softens_remote_deaths_to_suspicions() -> None:
    net = solo("b", "c", "d", "g")
    a = net.nodes["a"]
    remote = records(
        ("b", 0, State.DEAD),
        ("c", 0, State.SUSPECT),
        ("d", 0, State.LEFT),
        ("e", 2, State.ALIVE),
        ("f", 0, State.DEAD),  # unknown and dead: not worth learning
        ("g", 1, State.DEAD),
    )
    net.tell("a", PushPull("z", "z:7946", remote, False, True))
    assert net.kinds("a") == [
        (EventKind.SUSPECT, "b"),
        (EventKind.SUSPECT, "c"),
        (EventKind.LEFT, "d"),
        (EventKind.JOINED, "e"),
        (EventKind.SUSPECT, "g"),
    ]
    assert a.state_of("f") is None
    assert [m.incarnation for m in a.view() if m.id in "eg"] == [2, 1]
    assert net.sent == []  # a reply is not answered


def test_push_pull_answer_already_holds_the_refutation() -> None:
    net = solo()
    remote = records(("a", 0, State.DEAD), ("z", 4, State.ALIVE))
    net.tell("a", PushPull("z", "z:7946", remote, False, False))
    [answer] = net.sent
    assert answer.out.address == "z:7946" and answer.out.reliable
    assert isinstance(answer.first, PushPull)
    assert (answer.first.join, answer.first.reply) == (False, True)
    assert set(answer.first.members) == set(records(("a", 1, State.ALIVE), ("z", 4, State.ALIVE)))


def test_periodic_push_pull_picks_a_known_member() -> None:
    net = Net("a", "b")
    net.run(LAN.push_pull_interval * 1.5)
    for node_id, other in (("a", "b"), ("b", "a")):
        asked = [s for s in net.packets(node_id, PushPull) if not exchange(s).reply]
        assert asked
        assert {s.out.address for s in asked} == {address(other)}


# -- leaving and restarting -------------------------------------------------------


def test_graceful_leave_broadcasts_our_own_dead() -> None:
    net = Net("a", "b", "c")
    net.run(2.0)
    net.events.clear()
    left_at = net.now
    net.leave("a")
    gossip = [s for s in net.packets("a") if s.at == left_at]
    assert {s.out.address for s in gossip} == {"b:7946", "c:7946"}
    assert all(Dead("a", 0, "a") in s.messages for s in gossip)
    assert net.nodes["a"].state_of("a") == State.LEFT
    for other in "bc":
        assert [(at, e.kind) for at, _, e in net.seen(other, "a")] == [(left_at, EventKind.LEFT)]

    net.nodes["a"].leave(net.now)  # once is enough
    net.flush()
    net.run(30.0)
    assert net.seen(member="a", kind=EventKind.DEAD) == []
    assert net.seen(member="a", kind=EventKind.SUSPECT) == []
    assert [s for s in net.packets(first=Ping) if ping(s).target == "a" and s.at > left_at] == []


@pytest.mark.parametrize("how", ["crashed", "undetected", "left"])
def test_restarted_member_outbids_its_previous_life(how: str) -> None:
    net = Net(seed=3, introduce=False)
    net.start("a")
    net.start("b", incarnation=3)
    net.start("c")
    for node_id in "abc":
        net.know(node_id, *(o for o in "abc" if o != node_id))
    net.run(2.0)
    if how == "left":
        net.leave("b")
        net.run(4.0)
        expected = State.LEFT
    elif how == "crashed":
        net.down.add("b")
        net.run(15.0)
        expected = State.DEAD
    else:
        net.down.add("b")
        expected = State.ALIVE
    assert net.nodes["a"].state_of("b") == net.nodes["c"].state_of("b") == expected

    restarted_at = net.now
    b = net.start("b")  # a new process: incarnation 0 again
    b.join(["a:7946"], net.now)
    net.flush()
    net.run(restarted_at + 5.0)
    assert b.incarnation == 4
    for node_id in "ac":
        view = {m.id: m for m in net.nodes[node_id].view()}
        assert (view["b"].state, view["b"].incarnation) == (State.ALIVE, 4)
    assert b.alive_count() == 3
    if how != "undetected":
        assert len(net.seen(member="b", kind=EventKind.ALIVE)) == 2


# -- what goes on the wire ------------------------------------------------------------


@pytest.mark.parametrize("max_bytes", [300, 1400])
def test_piggybacked_packets_fit_in_max_packet_bytes(max_bytes: int) -> None:
    config = SwimConfig(max_packet_bytes=max_bytes)
    codec = Codec([KEY], max_bytes=max_bytes)
    net = Net("a", "b", config=config)
    meta = (("zone", "eu-west-1a"), ("role", "scheduler"))
    many = [f"member-with-a-rather-long-identifier-{i:03d}" for i in range(200)]
    step = config.max_new_per_packet  # members a datagram may add
    for start in range(0, len(many), step):
        chunk = many[start : start + step]
        net.tell("a", *(Alive(m, start, f"{m}.cluster.local:7946", meta) for m in chunk))
    net.tell("a", *(Suspect(m, 500, "b") for m in many[:100]))
    assert net.nodes["a"].pending_broadcasts() == len(many) + 1  # and b's own join
    net.run(10.0)

    datagrams = [s for s in net.packets("a") if not s.out.reliable]
    assert len(datagrams) > 50
    sizes = []
    for sent in datagrams:
        data = codec.encode(sent.out.packet)
        sizes.append(len(data))
        assert codec.decode(data) == sent.out.packet  # decode enforces max_bytes
    assert max(sizes) <= max_bytes
    # The packets are packed, not merely small.
    assert max(sizes) > max_bytes * 0.8
    assert max(len(s.messages) for s in datagrams) > 2


def test_an_update_is_piggybacked_at_most_retransmit_limit_times() -> None:
    net = solo("b", "c", "d", "e")
    news = Alive("z", 7, "z:7946")
    net.tell("a", news)
    limit = LAN.retransmit_limit(6)
    assert limit == 4
    net.run(30.0)
    carried = [m for s in net.packets("a") for m in s.messages if m == news]
    assert len(carried) == limit


# -- answered: a member learnt second-hand is not trusted until it acks our probe ------


def answered(swim: Swim, member: str) -> bool:
    return {m.id: m for m in swim.view()}[member].answered


def test_a_member_is_answered_only_once_it_acks_our_own_probe() -> None:
    net = solo("b")
    a = net.nodes["a"]
    assert answered(a, "a")  # ourselves, always
    assert not answered(a, "b")  # hearsay: an Alive anyone could have sent
    first = net.next_ping("a")
    p = ping(first)
    assert p.target == "b"
    # None of these is b answering our probe: an ack for another seq, our seq
    # acked in another member's name, b pinging us, b's Alive at a higher
    # incarnation.
    net.tell("a", Ack(p.seq + 1, "b"), Ack(p.seq, "c"), sender="b")
    net.tell("a", Ping(9, "a", "b", "b:7946"), Alive("b", 1, "b:7946"), sender="b")
    assert not answered(a, "b")
    assert net.seen("a", kind=EventKind.ANSWERED) == []

    net.tell("a", Ack(p.seq, "b"), sender="b")
    assert answered(a, "b")
    [(at, _, event)] = net.seen("a", kind=EventKind.ANSWERED)
    assert (at, event.member.id, event.member.answered) == (net.now, "b", True)
    net.tell("a", Ack(p.seq, "b"), sender="b")  # again: no second event
    assert len(net.seen("a", kind=EventKind.ANSWERED)) == 1


def test_an_ack_relayed_by_a_ping_req_helper_answers_too() -> None:
    net = relayed_net()
    net.run(20.0)
    a, e = net.nodes["a"], net.nodes["e"]
    assert answered(a, "e") and answered(e, "a")  # through b, never directly
    assert a.stats.probe_failures == e.stats.probe_failures == 0
    assert not [s for s in net.packets("a", Ack) if s.out.address == address("e")]


def test_a_relay_forwards_only_the_targets_own_ack() -> None:
    net = Net("b", introduce=False)
    net.tell("b", PingReq(77, "e", "e:7946", "a", "a:7946", True), sender="a")
    relayed = ping(net.packets("b", Ping)[0])
    net.tell("b", Ack(relayed.seq, "mallory"), sender="mallory")  # our seq, not e's ack
    assert net.packets("b", Ack) == []
    net.tell("b", Ack(relayed.seq, "e"), sender="e")
    assert [s.first for s in net.packets("b", Ack)] == [Ack(77, "e")]


def test_answered_is_reset_by_a_new_life_or_a_new_address() -> None:
    net = Net("a", "b", "c")
    a = net.nodes["a"]
    net.run(5.0)
    assert answered(a, "b")

    # A suspicion refuted is the same life: still answered.
    net.tell("a", Suspect("b", net.nodes["b"].incarnation, "c"))
    net.run(net.now + 1.0)
    assert a.state_of("b") == State.ALIVE and answered(a, "b")

    # Back from the dead is a new life: hearsay again until b answers.
    incarnation = max(m.incarnation for m in a.view() if m.id == "b")
    net.tell("a", Dead("b", incarnation, "c"))
    assert a.state_of("b") == State.DEAD and answered(a, "b")  # it did, in that life
    net.tell("a", Alive("b", incarnation + 1, "b:7946"))
    assert a.state_of("b") == State.ALIVE
    assert not answered(a, "b")
    net.run(net.now + 5.0)
    assert answered(a, "b")
    assert len(net.seen("a", "b", EventKind.ANSWERED)) == 2

    # A new address is someone to trust anew: nobody answers at b2 ...
    incarnation = max(m.incarnation for m in a.view() if m.id == "b")
    net.tell("a", Alive("b", incarnation + 1, "b2:7946"))
    assert not answered(a, "b")
    net.run(net.now + 0.5)
    assert not answered(a, "b")
    # ... and back at b:7946, b is hearsay until it answers there.
    net.tell("a", Alive("b", incarnation + 2, "b:7946"))
    assert not answered(a, "b")
    net.run(net.now + 5.0)
    [view] = [m for m in a.view() if m.id == "b"]
    assert (view.address, view.state, view.answered) == ("b:7946", State.ALIVE, True)
    assert len(net.seen("a", "b", EventKind.ANSWERED)) == 3


def test_unanswered_members_take_every_other_probe_round_oldest_first() -> None:
    """A newcomer is probed at the next round (not somewhere in the pass), and
    a flood of them takes at most every other round: the rounds between still
    follow the round robin, so the members it probes keep their pace."""
    real = ["b", "c", "d", "e"]
    net = solo(*real)
    vouch(net, "a", *real)  # a formed cluster
    a = net.nodes["a"]
    ghosts = [f"g{i}" for i in range(6)]
    for ghost in ghosts:  # they never answer
        net.tell("a", Alive(ghost, 0, address(ghost)), sender="mallory")
    targets = [ping(net.next_ping("a")).target for _ in range(len(real) + len(ghosts))]
    for index, target in enumerate(targets):
        waiting = [g for g in ghosts if g not in targets[:index]]
        if index % 2 == 0 and waiting:
            assert target == waiting[0], (index, targets)
    # One pass: each member once, the queue's probes counting as theirs.
    assert sorted(targets) == sorted([*real, *ghosts])
    assert not any(answered(a, g) for g in ghosts)


def test_ping_req_helpers_are_members_that_answered() -> None:
    """A ghost asked to relay never nacks: Lifeguard would count that silence
    against our own health, and stretch every timeout of ours."""
    net = solo("b", "c", "d", "e")  # phantoms, never answered
    net.start("h")  # a real member: it acks, and relays and nacks for a
    net.know("a", "h")
    for _ in range(100):
        if answered(net.nodes["a"], "h"):
            break
        net.step()
    assert answered(net.nodes["a"], "h")
    before = len(net.packets("a", PingReq))
    for _ in range(6):
        net.next_ping("a")
    reqs = net.packets("a", PingReq)[before:]
    assert reqs
    assert {s.out.address for s in reqs} == {address("h")}


def test_periodic_push_pull_goes_only_to_members_that_answered() -> None:
    """A made-up member's address is anyone's: an exchange is a TCP connection
    carrying our whole table, so it goes to members that answered us (dead
    ones included, which is what heals a partition)."""
    net = solo("b", "c", "d")  # never answered
    net.start("h")
    net.know("a", "h")
    net.run(LAN.push_pull_interval * 6)
    asked = [s.out.address for s in net.packets("a", PushPull) if not exchange(s).reply]
    assert len(asked) >= 3
    assert set(asked) == {address("h")}


# -- caps against a flood of made-up members ------------------------------------------


def test_a_datagram_adds_at_most_max_new_per_packet_members() -> None:
    net = solo(config=SwimConfig(max_new_per_packet=3))
    a = net.nodes["a"]
    net.tell("a", *(Alive(f"g{i}", 0, f"g{i}:7946") for i in range(5)))
    assert sorted(m.id for m in a.view()) == ["a", "g0", "g1", "g2"]
    assert a.stats.refused_members == 2
    # News about members already known does not count against the cap.
    net.tell(
        "a",
        *(Alive(f"g{i}", 1, f"g{i}:7946") for i in range(3)),
        *(Alive(f"n{i}", 0, f"n{i}:7946") for i in range(4)),
    )
    assert sorted(m.id for m in a.view()) == ["a", "g0", "g1", "g2", "n0", "n1", "n2"]
    assert [m.incarnation for m in a.view() if m.id.startswith("g")] == [1, 1, 1]
    assert a.stats.refused_members == 3
    assert a.pending_broadcasts() == 6  # the refused ones are not gossiped on


def test_the_member_table_is_capped_and_a_push_pull_may_fill_it() -> None:
    net = solo(config=SwimConfig(max_members=10))
    a = net.nodes["a"]
    # A join's full state legitimately carries the whole cluster: more than
    # a datagram's few, up to the table's cap.
    many = records(*((f"m{i:02d}", 0, State.ALIVE) for i in range(20)))
    net.tell("a", PushPull("z", "z:7946", many, False, True))
    assert len(a.view()) == 10
    assert a.stats.refused_members == 11
    net.tell("a", Alive("late", 0, "late:7946"))
    assert a.state_of("late") is None
    assert a.stats.refused_members == 12
    # Known members still change.
    net.tell("a", Dead("m00", 0, "z"), Alive("m01", 4, "m01:7946"))
    assert a.state_of("m00") == State.DEAD
    assert [m.incarnation for m in a.view() if m.id == "m01"] == [4]


@pytest.mark.parametrize(
    "setting",
    [{"max_members": 1}, {"max_members": 4097}, {"max_new_per_packet": 0}],
)
def test_the_caps_are_validated(setting: dict[str, int]) -> None:
    with pytest.raises(ConfigError, match=next(iter(setting))):
        SwimConfig(**setting)


# -- incarnations that cannot be outbid -----------------------------------------------


def test_suspect_or_dead_at_the_top_of_the_range_from_the_wire_is_refused() -> None:
    """Its subject could refute only with a higher incarnation, and there is
    none: one forged packet would bury a live member for good."""
    net = solo("b", "c", "d", "e")
    a = net.nodes["a"]
    queued = a.pending_broadcasts()
    net.tell("a", Suspect("b", MAX_INCARNATION, "z"), Dead("c", MAX_INCARNATION, "z"))
    top = records(
        ("d", MAX_INCARNATION, State.SUSPECT),
        ("e", MAX_INCARNATION, State.DEAD),
        ("b", MAX_INCARNATION, State.LEFT),
    )
    net.tell("a", PushPull("z", "z:7946", top, False, True))
    # About ourselves too: refuting would not outbid it either.
    net.tell("a", Suspect("a", MAX_INCARNATION, "z"), Dead("a", MAX_INCARNATION, "z"))
    assert [a.state_of(m) for m in "bcde"] == [State.ALIVE] * 4
    assert net.events == []
    assert a.stats.refused_updates == 7
    assert (a.incarnation, a.stats.refutations) == (0, 0)
    assert a.pending_broadcasts() == queued  # nothing of it is gossiped on


def test_a_local_suspicion_applies_at_the_top_of_the_range() -> None:
    net = solo()
    a = net.nodes["a"]
    net.tell("a", Alive("b", MAX_INCARNATION, "b:7946"))  # an Alive there is taken
    net.run(30.0)  # b never answers our probes
    assert a.state_of("b") == State.DEAD
    assert [e.member.incarnation for _, _, e in net.seen("a", "b", EventKind.DEAD)] == [
        MAX_INCARNATION
    ]


def test_a_forged_dead_at_the_top_leaves_the_member_alive_everywhere() -> None:
    net = Net("a", "b", "c")
    net.run(3.0)
    net.tell("c", Dead("b", MAX_INCARNATION, "mallory"), sender="mallory")
    # Past two push-pull periods: b hears of its death at the latest there.
    net.run(3.0 + 2 * LAN.push_pull_interval)
    for observer in "ac":
        assert net.nodes[observer].state_of("b") == State.ALIVE
    assert net.seen(member="b", kind=EventKind.DEAD) == []


def test_a_dead_one_below_the_top_is_refuted_to_the_top_and_peers_take_it() -> None:
    net = Net("a", "b", "c")
    net.run(3.0)
    net.tell("c", Dead("b", MAX_INCARNATION - 1, "mallory"), sender="mallory")
    assert net.nodes["c"].state_of("b") == State.DEAD
    net.run(3.0 + 2 * LAN.push_pull_interval)
    assert net.nodes["b"].incarnation == MAX_INCARNATION
    for observer in "ac":
        [b] = [m for m in net.nodes[observer].view() if m.id == "b"]
        assert (b.state, b.incarnation) == (State.ALIVE, MAX_INCARNATION)
