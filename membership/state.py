"""The SWIM + Lifeguard state machine. No IO, no clock: everything that
changes membership state happens in this file, driven by three inputs.

* ``receive(packet, now)``: a packet arrived;
* ``tick(now)``: time passed; run every timer due by ``now``;
* ``join(seeds, now)`` / ``leave(now)``: the node's own intent.

After any of them, ``drain()`` returns the packets to send and the
membership events to publish, and ``next_deadline()`` says when ``tick``
must run next. The caller owns the clock and the sockets (h11's model).

Precedence of updates about a member, by incarnation (SWIM section 4.2):

* Alive(i) wins over any state with incarnation < i;
* Suspect(i) wins over Alive(j) and Suspect(j) for j < i, and over Alive(i);
* Dead(i) wins over Alive(j) and Suspect(j) for j <= i; Dead and Left are
  final until an Alive with a higher incarnation;
* about ourselves, Suspect or Dead (and an Alive with a higher incarnation)
  are refuted: our incarnation jumps past theirs and we broadcast Alive;
* a Suspect or Dead from the wire (in a packet or a push-pull record) at
  MAX_INCARNATION is refused (``Stats.refused_updates``), about anyone,
  ourselves included: its subject can refute only with a higher incarnation
  and there is none, so one forged packet would bury a live member for
  good. Our own suspicions (a probe failing, a suspicion timing out) apply
  at any incarnation: they need no refuting from afar.

States of a member: ALIVE -> SUSPECT (probe failed or a peer suspects it)
-> DEAD (suspicion timed out, or a peer declared it) and back to ALIVE only
by a higher incarnation; any state -> LEFT on its own Dead (graceful leave).

Trust: anyone can gossip an Alive, so a member learnt second-hand is
hearsay until it acks a probe of ours (directly or through a ping-req
helper): then it is ``answered`` (an ANSWERED event), which it stays until
it comes back from DEAD or LEFT (a new life) or changes address. We are
answered ourselves. Only answered members are asked to relay probes (a
member that never answers never nacks either, and Lifeguard would count
that against our own health) or picked for the periodic push-pull (a made-up
member's address is anyone's). Unanswered ALIVE members wait in a queue,
oldest first, that may take every other probe round: a newcomer is probed
at once, and a flood of made-up ones takes at most half the rounds from the
round robin. Against such a flood, a datagram adds at most
``max_new_per_packet`` members never heard of, and the table holds at most
``max_members`` (``Stats.refused_members``).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from membership.awareness import Awareness
from membership.broadcast import BroadcastQueue
from membership.codec import envelope_size, message_size
from membership.config import SwimConfig
from membership.messages import (
    MAX_INCARNATION,
    MAX_SEQ,
    Ack,
    Alive,
    Dead,
    Event,
    EventKind,
    MemberRecord,
    MemberView,
    Message,
    Nack,
    Outgoing,
    Packet,
    Ping,
    PingReq,
    PushPull,
    State,
    Suspect,
    Update,
)
from membership.suspicion import Suspicion

Meta = tuple[tuple[str, str], ...]
# Lifeguard: an intermediary that hears nothing from the target within this
# share of the probe timeout says so with a nack (memberlist: 80%).
NACK_SHARE = 0.8


@dataclass
class _Member:
    id: str
    address: str
    incarnation: int
    state: State
    meta: Meta
    since: float  # when the state last changed
    answered: bool = False  # acked a probe of ours in this life, at this address

    def view(self) -> MemberView:
        return MemberView(
            self.id, self.address, self.state, self.incarnation, self.meta, self.answered
        )


@dataclass
class _Probe:
    seq: int
    target: str
    address: str  # where we probed it: an ack answers for that address only
    ack_deadline: float  # no ack by then: ask others (ping-req)
    end: float  # no ack by then: suspect
    acked: bool = False
    indirect_sent: bool = False
    expected_nacks: int = 0
    nacks: int = 0


@dataclass
class _Relay:
    """A ping-req we are carrying out for ``requester``."""

    requester_address: str
    requester_seq: int
    target: str
    nack_at: float | None
    expires: float


@dataclass
class Stats:
    probes: int = 0
    probe_failures: int = 0
    ping_reqs: int = 0
    nacks_sent: int = 0
    suspicions: int = 0
    deaths: int = 0
    refutations: int = 0
    push_pulls: int = 0
    gossip_packets: int = 0
    misdirected: int = 0
    # Alives about members never heard of, refused: the table was full, or
    # the datagram had already added max_new_per_packet.
    refused_members: int = 0
    # Suspects and Deads from the wire at MAX_INCARNATION (see the module docstring).
    refused_updates: int = 0


class Swim:
    def __init__(
        self,
        node_id: str,
        address: str,
        config: SwimConfig,
        *,
        now: float,
        rng: random.Random,
        meta: Meta = (),
        incarnation: int = 0,
    ) -> None:
        self.id = node_id
        self.config = config
        self.rng = rng
        self.members: dict[str, _Member] = {
            node_id: _Member(node_id, address, incarnation, State.ALIVE, meta, now, answered=True)
        }
        self.awareness = Awareness(config.awareness_max)
        self.stats = Stats()
        self._queue = BroadcastQueue()
        self._suspicions: dict[str, Suspicion] = {}
        self._relays: dict[int, _Relay] = {}
        self._probe: _Probe | None = None
        self._probe_order: list[str] = []
        self._probe_index = 0
        # The members in _probe_order[_probe_index:], each there once: asking
        # the list instead costs O(N) per member learned, O(N^2) for a join's
        # full state (minutes at 5,000 members).
        self._probe_ahead: set[str] = set()
        # Who gossip may go to (ALIVE or SUSPECT, not us), rebuilt only when a
        # member joins, comes back or dies (_peers_changed): listing the
        # members every gossip round is O(N) five times a second, and so is
        # rebuilding on every suspicion, which at 5% loss comes every round.
        self._gossip_peers: list[_Member] | None = None
        # ALIVE members that have not answered a probe of ours, oldest first
        # (a dict as an ordered set); entries no longer ALIVE and unanswered
        # are skipped when reached. _fresh_last: the last round took from it.
        self._fresh: dict[str, None] = {}
        self._fresh_last = False
        # Members never heard of that the packet being received has added.
        self._new_in_packet = 0
        self._seq = rng.randrange(1 << 30)
        self._outbox: list[Outgoing] = []
        self._events: list[Event] = []
        # Stagger the timers so members started together do not probe in step.
        self._next_probe = now + rng.random() * config.probe_interval
        self._next_gossip = now + rng.random() * config.gossip_interval
        self._next_push_pull = now + self._push_pull_delay()
        self.leaving = False

    # -- views -------------------------------------------------------------------

    @property
    def me(self) -> _Member:
        return self.members[self.id]

    @property
    def incarnation(self) -> int:
        return self.me.incarnation

    def view(self) -> list[MemberView]:
        return [m.view() for m in sorted(self.members.values(), key=lambda m: m.id)]

    def alive_count(self) -> int:
        return sum(1 for m in self.members.values() if m.state == State.ALIVE)

    def state_of(self, member: str) -> State | None:
        found = self.members.get(member)
        return found.state if found else None

    def pending_broadcasts(self) -> int:
        return len(self._queue)

    # -- outputs -----------------------------------------------------------------

    def drain(self) -> tuple[list[Outgoing], list[Event]]:
        outgoing, events = self._outbox, self._events
        self._outbox, self._events = [], []
        return outgoing, events

    def next_deadline(self) -> float:
        deadlines = [self._next_probe, self._next_push_pull]
        if len(self._queue):
            deadlines.append(self._next_gossip)
        if self._probe is not None:
            deadlines.append(self._probe.end)
            if not self._probe.acked and not self._probe.indirect_sent:
                deadlines.append(self._probe.ack_deadline)
        deadlines.extend(s.deadline() for s in self._suspicions.values())
        for relay in self._relays.values():
            deadlines.append(relay.expires)
            if relay.nack_at is not None:
                deadlines.append(relay.nack_at)
        return min(deadlines)

    # -- the node's intent -------------------------------------------------------

    def join(self, seeds: Iterable[str], now: float) -> None:
        """Full state exchange with each seed address (memberlist Join)."""
        for address in seeds:
            if address != self.me.address:
                self._send_push_pull(address, join=True, reply=False)

    def update_meta(self, meta: Meta, now: float) -> None:
        """Change our metadata (memberlist UpdateNode): a new incarnation, so
        every peer takes the new Alive over what it knew, gossiped like a
        refutation; an UPDATED event for ourselves too."""
        me = self.me
        if self.leaving or meta == me.meta:
            return
        me.meta = meta
        me.incarnation = min(me.incarnation + 1, MAX_INCARNATION)
        self._queue.push(Alive(self.id, me.incarnation, me.address, me.meta))
        self._emit(EventKind.UPDATED, me, now)

    def leave(self, now: float) -> None:
        """Broadcast our own Dead (a graceful leave); the caller keeps running
        until ``pending_broadcasts()`` is 0 or its grace period ends."""
        if self.leaving:
            return
        self.leaving = True
        me = self.me
        me.state, me.since = State.LEFT, now
        self._queue.push(Dead(self.id, me.incarnation, self.id))
        self._gossip(now)

    # -- input: packets ----------------------------------------------------------

    def receive(self, packet: Packet, now: float) -> None:
        self._new_in_packet = 0
        for message in packet.messages:
            self._handle(message, now)

    def _handle(self, message: Message, now: float) -> None:
        match message:
            case Ping():
                self._on_ping(message)
            case PingReq():
                self._on_ping_req(message, now)
            case Ack():
                self._on_ack(message, now)
            case Nack():
                if self._probe is not None and message.seq == self._probe.seq:
                    self._probe.nacks += 1
            case Alive():
                self._apply_alive(message, now, in_datagram=True)
            case Suspect() | Dead():
                self._apply_bad_news(message, now)
            case PushPull():
                self._on_push_pull(message, now)

    def _on_ping(self, ping: Ping) -> None:
        if ping.target != self.id:
            # A stale address now used by another member: do not ack for it.
            self.stats.misdirected += 1
            return
        self._send(ping.source_address, Ack(ping.seq, self.id))

    def _on_ping_req(self, req: PingReq, now: float) -> None:
        seq = self._next_seq()
        timeout = self.awareness.scale(self.config.probe_timeout)
        self._relays[seq] = _Relay(
            requester_address=req.source_address,
            requester_seq=req.seq,
            target=req.target,
            nack_at=now + timeout * NACK_SHARE if req.nack else None,
            expires=now + self.awareness.scale(self.config.probe_interval),
        )
        self._send(req.target_address, Ping(seq, req.target, self.id, self.me.address))

    def _on_ack(self, ack: Ack, now: float) -> None:
        probe = self._probe
        if probe is not None and ack.seq == probe.seq:
            if ack.source != probe.target:
                return  # our seq in another's name: not the member answering
            probe.acked = True
            member = self.members.get(probe.target)
            if (
                member is not None
                and not member.answered
                and member.address == probe.address
                and member.state in (State.ALIVE, State.SUSPECT)
            ):
                self._answer(member, now)
            return
        relay = self._relays.get(ack.seq)
        if relay is not None and ack.source == relay.target:
            del self._relays[ack.seq]
            self._send(relay.requester_address, Ack(relay.requester_seq, ack.source))

    def _answer(self, member: _Member, now: float) -> None:
        """``member`` acked a probe of ours: no longer hearsay."""
        member.answered = True
        self._fresh.pop(member.id, None)
        self._emit(EventKind.ANSWERED, member, now)

    def _on_push_pull(self, message: PushPull, now: float) -> None:
        self.stats.push_pulls += 1
        self._merge(message.source, message.members, now)
        if not message.reply:
            # Answer after merging, so a refutation of what they said about
            # us is already in the state we send back.
            self._send_push_pull(message.source_address, join=False, reply=True)

    def _merge(self, source: str, records: Iterable[MemberRecord], now: float) -> None:
        """memberlist mergeState: a remote Dead is only a Suspect here, so a
        member wrongly declared dead on the other side of a partition gets
        the time to refute instead of being buried at once."""
        for r in records:
            if r.state == State.ALIVE:
                self._apply_alive(Alive(r.member, r.incarnation, r.address, r.meta), now)
            elif r.state == State.LEFT:
                self._apply_bad_news(Dead(r.member, r.incarnation, r.member), now)
            else:
                self._apply_bad_news(Suspect(r.member, r.incarnation, source), now)

    # -- the update rules ----------------------------------------------------------

    def _apply_bad_news(self, message: Suspect | Dead, now: float) -> None:
        """A Suspect or Dead, from a datagram or a state exchange."""
        if message.incarnation >= MAX_INCARNATION:
            self.stats.refused_updates += 1  # cannot be outbid: see the module docstring
        elif isinstance(message, Suspect):
            self._apply_suspect(message, now)
        else:
            self._apply_dead(message, now)

    def _refute(self, incarnation: int, now: float) -> None:
        """Someone believes an older or worse story about us: outbid it."""
        if self.leaving:
            return
        me = self.me
        # Saturate: past MAX_INCARNATION every peer's codec would drop our
        # Alive, and every packet it rides on (a forged Suspect at the top of
        # the range must not make our acks undecodable).
        me.incarnation = min(max(me.incarnation, incarnation) + 1, MAX_INCARNATION)
        self.stats.refutations += 1
        # Lifeguard: being suspected hints that we are the slow one.
        self.awareness.apply(1)
        self._queue.push(Alive(self.id, me.incarnation, me.address, me.meta))

    def _apply_alive(self, update: Alive, now: float, *, in_datagram: bool = False) -> None:
        """``in_datagram``: the update came in a datagram, which may add only
        ``max_new_per_packet`` members never heard of; a push-pull record
        (and our own bookkeeping) only ``max_members`` in all."""
        if update.member == self.id:
            if update.incarnation > self.incarnation:
                self._refute(update.incarnation, now)
            return
        member = self.members.get(update.member)
        if member is None:
            if not self._room_for_one_more(in_datagram=in_datagram):
                return
            member = _Member(
                update.member, update.address, update.incarnation, State.ALIVE, update.meta, now
            )
            self.members[update.member] = member
            self._peers_changed()
            self._add_to_probe_order(update.member)
            self._fresh[member.id] = None
            self._emit(EventKind.JOINED, member, now)
            self._queue.push(update)
            return
        if update.incarnation <= member.incarnation:
            return
        changed = (member.address, member.meta) != (update.address, update.meta)
        previous = member.state
        if previous in (State.DEAD, State.LEFT) or member.address != update.address:
            member.answered = False  # a new life, or someone else at another address
        member.incarnation = update.incarnation
        member.address, member.meta = update.address, update.meta
        self._suspicions.pop(member.id, None)
        if not member.answered:
            self._fresh[member.id] = None
        if previous != State.ALIVE:
            member.state, member.since = State.ALIVE, now
            if previous in (State.DEAD, State.LEFT):
                self._peers_changed()
                self._add_to_probe_order(member.id)
            self._emit(EventKind.ALIVE, member, now)
        elif changed:
            self._emit(EventKind.UPDATED, member, now)
        self._queue.push(update)

    def _room_for_one_more(self, *, in_datagram: bool) -> bool:
        """Whether a member never heard of may join the table."""
        full = len(self.members) >= self.config.max_members
        if full or (in_datagram and self._new_in_packet >= self.config.max_new_per_packet):
            self.stats.refused_members += 1
            return False
        if in_datagram:
            self._new_in_packet += 1
        return True

    def _apply_suspect(self, update: Suspect, now: float) -> None:
        if update.member == self.id:
            if update.incarnation >= self.incarnation:
                self._refute(update.incarnation, now)
            return
        member = self._buryable(update.member, update.incarnation)
        if member is None:
            return
        if member.state == State.SUSPECT and update.incarnation == member.incarnation:
            suspicion = self._suspicions.get(member.id)
            if suspicion is not None and suspicion.confirm(update.source):
                self._queue.push(update)  # spread the confirmation
            return
        member.incarnation = update.incarnation
        member.state, member.since = State.SUSPECT, now  # a gossip peer still
        low, high = self.config.suspicion_timeouts(len(self.members))
        expected = max(0, int(self.config.suspicion_mult) - 2)
        if len(self.members) - 2 < expected:
            expected = 0
        self._suspicions[member.id] = Suspicion(update.source, now, expected, low, high)
        self.stats.suspicions += 1
        self._emit(EventKind.SUSPECT, member, now)
        self._queue.push(update)

    def _buryable(self, member_id: str, incarnation: int) -> _Member | None:
        """The member a Suspect or Dead at ``incarnation`` may apply to:
        known, not newer than the news, and not already dead or gone."""
        member = self.members.get(member_id)
        if member is None or incarnation < member.incarnation:
            return None
        if member.state in (State.DEAD, State.LEFT):
            return None
        return member

    def _apply_dead(self, update: Dead, now: float) -> None:
        if update.member == self.id:
            # Our own Dead too, unless we are leaving: it is from a previous
            # life that left, and we are back (memberlist deadNode).
            if update.incarnation >= self.incarnation:
                self._refute(update.incarnation, now)
            return
        member = self._buryable(update.member, update.incarnation)
        if member is None:
            return
        left = update.source == update.member
        member.incarnation = update.incarnation
        member.state, member.since = (State.LEFT if left else State.DEAD), now
        self._peers_changed()
        self._suspicions.pop(member.id, None)
        if not left:
            self.stats.deaths += 1
        self._emit(EventKind.LEFT if left else EventKind.DEAD, member, now)
        self._queue.push(update)

    # -- input: time ---------------------------------------------------------------

    def tick(self, now: float) -> None:
        probe = self._probe
        if probe is not None:
            if not probe.acked and not probe.indirect_sent and now >= probe.ack_deadline:
                self._send_ping_reqs(probe)
            if now >= probe.end:
                self._finish_probe(probe, now)
        if now >= self._next_probe:
            self._start_probe(now)
        for member_id, suspicion in list(self._suspicions.items()):
            if now >= suspicion.deadline():
                del self._suspicions[member_id]
                member = self.members.get(member_id)
                if member is not None:
                    self._apply_dead(Dead(member_id, member.incarnation, self.id), now)
        for seq, relay in list(self._relays.items()):
            if relay.nack_at is not None and now >= relay.nack_at:
                relay.nack_at = None
                self.stats.nacks_sent += 1
                self._send(relay.requester_address, Nack(relay.requester_seq, self.id))
            if now >= relay.expires:
                del self._relays[seq]
        if now >= self._next_gossip:
            self._next_gossip = now + self.config.gossip_interval
            self._gossip(now)
        if now >= self._next_push_pull:
            self._next_push_pull = now + self._push_pull_delay()
            self._periodic_push_pull(now)

    def _start_probe(self, now: float) -> None:
        interval = self.awareness.scale(self.config.probe_interval)
        self._next_probe = now + interval
        target = self._next_probe_target()
        if target is None:
            return
        self._fresh.pop(target.id, None)  # an answer is due now either way
        seq = self._next_seq()
        self._probe = _Probe(
            seq=seq,
            target=target.id,
            address=target.address,
            ack_deadline=now + self.awareness.scale(self.config.probe_timeout),
            end=now + interval,
        )
        self.stats.probes += 1
        extra: list[Message] = []
        if target.state == State.SUSPECT:
            # Lifeguard buddy system: tell the suspect first, so it refutes.
            extra.append(Suspect(target.id, target.incarnation, self.id))
        self._send(
            target.address,
            Ping(seq, target.id, self.id, self.me.address),
            extra=extra,
            skip=target.id if extra else None,
        )

    def _send_ping_reqs(self, probe: _Probe) -> None:
        probe.indirect_sent = True
        target = self.members.get(probe.target)
        if target is None:
            return
        # Members that answered us: one that never answers never nacks either.
        helpers = [
            m
            for m in self.members.values()
            if m.state == State.ALIVE and m.answered and m.id not in (self.id, probe.target)
        ]
        chosen = self.rng.sample(helpers, min(self.config.indirect_checks, len(helpers)))
        probe.expected_nacks = len(chosen)
        for helper in chosen:
            self.stats.ping_reqs += 1
            self._send(
                helper.address,
                PingReq(probe.seq, target.id, target.address, self.id, self.me.address, True),
            )

    def _finish_probe(self, probe: _Probe, now: float) -> None:
        self._probe = None
        if probe.acked:
            self.awareness.apply(-1)
            return
        self.stats.probe_failures += 1
        target = self.members.get(probe.target)
        # Lifeguard: helpers that did not even nack point at our own network.
        # Not so for a member that never answered us: failing to reach one
        # says nothing of our health, and a flood of made-up members must not
        # stretch every timeout of ours (9x at the top of the scale).
        if target is not None and target.answered:
            missed = probe.expected_nacks - probe.nacks if probe.expected_nacks else 1
            self.awareness.apply(missed)
        if target is not None and target.state in (State.ALIVE, State.SUSPECT):
            self._apply_suspect(Suspect(target.id, target.incarnation, self.id), now)

    def _next_probe_target(self) -> _Member | None:
        """The oldest unanswered member every other round, if any; else the
        round robin. A member probed from the queue has had its probe of
        this pass, so the pass is no longer for it: the round robin keeps at
        least half the rounds, and a member answered late does not delay the
        others by more than its own turn."""
        if not self._fresh_last:
            fresh = self._next_fresh()
            if fresh is not None:
                self._fresh_last = True
                self._probe_ahead.discard(fresh.id)
                return fresh
        self._fresh_last = False
        return self._next_in_pass()

    def _next_fresh(self) -> _Member | None:
        while self._fresh:
            member_id = next(iter(self._fresh))
            del self._fresh[member_id]
            member = self.members.get(member_id)
            if member is not None and member.state == State.ALIVE and not member.answered:
                return member
        return None

    def _next_in_pass(self) -> _Member | None:
        """Randomized round robin (SWIM section 4.3): every member is probed
        once per pass over a shuffled list, so detection time is bounded."""
        for _ in range(2):
            while self._probe_index < len(self._probe_order):
                member_id = self._probe_order[self._probe_index]
                self._probe_index += 1
                if member_id not in self._probe_ahead:
                    continue  # probed from the unanswered queue in this pass
                self._probe_ahead.discard(member_id)
                member = self.members.get(member_id)
                if member is not None and member.state in (State.ALIVE, State.SUSPECT):
                    return member
            self._probe_order = [
                m.id
                for m in self.members.values()
                if m.id != self.id and m.state in (State.ALIVE, State.SUSPECT)
            ]
            self.rng.shuffle(self._probe_order)
            self._probe_index = 0
            self._probe_ahead = set(self._probe_order)
        return None

    def _add_to_probe_order(self, member_id: str) -> None:
        # At a random place still ahead, as memberlist does, so a newcomer is
        # probed within this pass. A member revived before the pass reached
        # its old place is already ahead: once per pass is enough.
        if member_id in self._probe_ahead:
            return
        position = self.rng.randint(self._probe_index, len(self._probe_order))
        self._probe_order.insert(position, member_id)
        self._probe_ahead.add(member_id)

    def _peers_changed(self) -> None:
        self._gossip_peers = None

    def _gossip(self, now: float) -> None:
        if not len(self._queue):
            return
        if self._gossip_peers is None:
            self._gossip_peers = [
                m
                for m in self.members.values()
                if m.id != self.id and m.state in (State.ALIVE, State.SUSPECT)
            ]
        peers = self._gossip_peers
        budget = self.config.max_packet_bytes - envelope_size(self.id)
        limit = self.config.retransmit_limit(len(self.members))
        for peer in self.rng.sample(peers, min(self.config.gossip_nodes, len(peers))):
            updates = self._queue.take(budget, limit)
            if not updates:
                break
            self.stats.gossip_packets += 1
            self._outbox.append(Outgoing(peer.address, Packet(self.id, tuple(updates))))

    def _periodic_push_pull(self, now: float) -> None:
        retention = self.config.dead_retention
        for member in list(self.members.values()):
            if member.state in (State.DEAD, State.LEFT) and now - member.since > retention:
                del self.members[member.id]  # not a gossip peer: dead or left
        # Dead members stay candidates: an exchange across a healed partition
        # is what lets both sides learn the other is alive again. Only those
        # that once answered us: a made-up member's address is anyone's, and
        # the exchange is a TCP connection carrying our whole table.
        candidates = [
            m
            for m in self.members.values()
            if m.id != self.id and m.state != State.LEFT and m.answered
        ]
        if candidates:
            self._send_push_pull(self.rng.choice(candidates).address, join=False, reply=False)

    def _push_pull_delay(self) -> float:
        period = self.config.push_pull_period(len(self.members))
        return period * (0.5 + self.rng.random())

    # -- output helpers ------------------------------------------------------------

    def _send_push_pull(self, address: str, *, join: bool, reply: bool) -> None:
        records = tuple(
            MemberRecord(m.id, m.address, m.incarnation, m.state, m.meta)
            for m in self.members.values()
        )
        message = PushPull(self.id, self.me.address, records, join, reply)
        self._outbox.append(Outgoing(address, Packet(self.id, (message,)), reliable=True))

    def _send(
        self,
        address: str,
        primary: Message,
        *,
        extra: list[Message] | None = None,
        skip: str | None = None,
    ) -> None:
        """Send ``primary`` with as many queued updates as fit (piggyback)."""
        messages: list[Message] = [primary, *(extra or [])]
        budget = (
            self.config.max_packet_bytes
            - envelope_size(self.id)
            - sum(message_size(m) for m in messages)
        )
        limit = self.config.retransmit_limit(len(self.members))
        piggyback: list[Update] = self._queue.take(budget, limit, skip=skip)
        messages.extend(piggyback)
        self._outbox.append(Outgoing(address, Packet(self.id, tuple(messages))))

    def _emit(self, kind: EventKind, member: _Member, now: float) -> None:
        self._events.append(Event(kind, member.view(), now))

    def _next_seq(self) -> int:
        self._seq = (self._seq + 1) % (MAX_SEQ + 1)
        return self._seq
