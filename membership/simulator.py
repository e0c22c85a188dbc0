"""A deterministic simulator: N ``Swim`` state machines on a simulated
network with loss, delay, partitions and paused members, driven by a virtual
clock. Same seed, same run, on any machine.

Every datagram is encoded with the real codec, so byte counts are what the
wire would carry. Stream messages (push-pull) are never lost (TCP), but a
partition blocks them like anything else.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from membership.codec import Codec
from membership.config import SwimConfig
from membership.messages import Alive, Event, EventKind, Outgoing, Packet, State
from membership.state import Meta, Swim

# A paused process's socket buffer holds this many datagrams; the rest drop.
PAUSED_BUFFER = 256


@dataclass
class SimNode:
    id: str
    address: str
    swim: Swim
    crashed: bool = False
    paused: bool = False
    held: list[tuple[Packet, int]] = field(default_factory=list)
    timer_token: int = 0
    bytes_sent: int = 0  # datagrams and streams
    packets_sent: int = 0
    stream_bytes_sent: int = 0  # push-pull exchanges alone


@dataclass(frozen=True)
class Observation:
    at: float
    observer: str
    event: Event


class Simulator:
    def __init__(
        self,
        config: SwimConfig,
        *,
        seed: int = 0,
        loss: float = 0.0,
        delay: float = 0.0005,
        jitter: float = 0.001,
        codec: Codec | None = None,
    ) -> None:
        self.config = config
        self.rng = random.Random(seed)
        self.loss = loss
        self.delay = delay
        self.jitter = jitter
        self.codec = codec or Codec(max_bytes=config.max_packet_bytes)
        self.now = 0.0
        self.nodes: dict[str, SimNode] = {}
        self.by_address: dict[str, str] = {}
        self.observations: list[Observation] = []
        self.groups: dict[str, int] | None = None
        self.dropped = 0
        self._heap: list[tuple[float, int, str, object]] = []
        self._seq = 0
        self._watchers: list[Callable[[Observation], None]] = []

    # -- building the cluster ------------------------------------------------------

    def add_node(self, node_id: str, *, seeds: Iterable[str] = (), meta: Meta = ()) -> SimNode:
        address = f"{node_id}:7946"
        swim = Swim(
            node_id,
            address,
            self.config,
            now=self.now,
            rng=random.Random(self.rng.random()),
            meta=meta,
        )
        node = SimNode(node_id, address, swim)
        self.nodes[node_id] = node
        self.by_address[address] = node_id
        seed_addresses = [self.nodes[s].address for s in seeds]
        if seed_addresses:
            swim.join(seed_addresses, self.now)
        self._flush(node)
        return node

    def update_meta(self, node_id: str, meta: Meta) -> None:
        """``node_id`` advertises new metadata (``Membership.update_meta``)."""
        node = self.nodes[node_id]
        node.swim.update_meta(meta, self.now)
        self._flush(node)

    def bootstrap(self, count: int, prefix: str = "m") -> list[str]:
        """``count`` members that already know each other (a formed cluster):
        each has answered the others' probes."""
        ids = [f"{prefix}{i}" for i in range(count)]
        for node_id in ids:
            self.add_node(node_id)
        for node_id in ids:
            swim = self.nodes[node_id].swim
            for other in ids:
                if other != node_id:
                    swim._apply_alive(Alive(other, 0, self.nodes[other].address), self.now)
                    swim._answer(swim.members[other], self.now)
            swim.drain()  # the bootstrap itself is not news to gossip
            swim._queue = type(swim._queue)()
            self._schedule_timer(self.nodes[node_id])
        self.observations.clear()
        return ids

    # -- faults ------------------------------------------------------------------

    def inject(self, node_id: str, packet: Packet) -> None:
        """A datagram from outside the cluster (a forgery on unsigned gossip)
        for ``node_id``, delivered like any other after the network's delay."""
        size = len(self.codec.encode(packet))
        self._push(self.now + self.delay, "packet", (node_id, packet, size))

    def crash(self, node_id: str) -> None:
        node = self.nodes[node_id]
        node.crashed = True
        node.held.clear()

    def pause(self, node_id: str) -> None:
        self.nodes[node_id].paused = True

    def resume(self, node_id: str) -> None:
        node = self.nodes[node_id]
        node.paused = False
        held, node.held = node.held, []
        for packet, _size in held:
            node.swim.receive(packet, self.now)
        node.swim.tick(self.now)
        self._flush(node)

    def partition(self, *groups: Iterable[str]) -> None:
        self.groups = {}
        for index, group in enumerate(groups):
            for node_id in group:
                self.groups[node_id] = index

    def heal(self) -> None:
        self.groups = None

    def leave(self, node_id: str) -> None:
        node = self.nodes[node_id]
        node.swim.leave(self.now)
        self._flush(node)

    # -- running -------------------------------------------------------------------

    def watch(self, callback: Callable[[Observation], None]) -> None:
        self._watchers.append(callback)

    def run_until(self, until: float, stop: Callable[[], bool] | None = None) -> None:
        while self._heap and self._heap[0][0] <= until:
            at, _, kind, data = heapq.heappop(self._heap)
            self.now = at
            if kind == "timer":
                assert isinstance(data, tuple)
                node_id, token = data
                node = self.nodes[str(node_id)]
                if token != node.timer_token or node.crashed or node.paused:
                    continue
                node.swim.tick(at)
                self._flush(node)
            else:
                self._deliver(data)  # type: ignore[arg-type]
            if stop is not None and stop():
                return
        self.now = max(self.now, until)

    def _deliver(self, data: tuple[str, Packet, int]) -> None:
        node_id, packet, size = data
        node = self.nodes.get(node_id)
        if node is None or node.crashed:
            return
        if node.paused:
            if len(node.held) < PAUSED_BUFFER:
                node.held.append((packet, size))
            return
        node.swim.receive(packet, self.now)
        self._flush(node)

    def _flush(self, node: SimNode) -> None:
        outgoing, events = node.swim.drain()
        for event in events:
            observation = Observation(self.now, node.id, event)
            self.observations.append(observation)
            for watcher in self._watchers:
                watcher(observation)
        for out in outgoing:
            self._send(node, out)
        self._schedule_timer(node)

    def _send(self, node: SimNode, out: Outgoing) -> None:
        size = len(self.codec.encode(out.packet))
        node.bytes_sent += size
        node.packets_sent += 1
        if out.reliable:
            node.stream_bytes_sent += size
        target = self.by_address.get(out.address)
        if target is None:
            self.dropped += 1
            return
        if self.groups is not None and self.groups.get(node.id, -1) != self.groups.get(target, -2):
            self.dropped += 1
            return
        if not out.reliable and self.rng.random() < self.loss:
            self.dropped += 1
            return
        at = self.now + self.delay + self.rng.random() * self.jitter
        self._push(at, "packet", (target, out.packet, size))

    def _schedule_timer(self, node: SimNode) -> None:
        if node.crashed:
            return
        node.timer_token += 1
        # A deadline already past (a gossip round due since the queue was
        # empty) runs now; virtual time never goes backwards.
        at = max(self.now, node.swim.next_deadline())
        self._push(at, "timer", (node.id, node.timer_token))

    def _push(self, at: float, kind: str, data: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, data))

    # -- questions ---------------------------------------------------------------

    def live(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if not n.crashed]

    def all_see(self, member: str, state: State, among: Iterable[str] | None = None) -> bool:
        ids = among if among is not None else [n.id for n in self.live() if n.id != member]
        return all(self.nodes[i].swim.state_of(member) == state for i in ids)

    def first_seen(self, member: str, kind: EventKind, after: float) -> dict[str, float]:
        """Per observer, when it first reported ``kind`` for ``member`` after ``after``."""
        seen: dict[str, float] = {}
        for o in self.observations:
            if o.at >= after and o.event.member.id == member and o.event.kind == kind:
                seen.setdefault(o.observer, o.at)
        return seen
