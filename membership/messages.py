"""Wire messages and membership events: plain frozen data, no behaviour.

Message names follow SWIM (Das, Gupta, Motivala 2002) and HashiCorp
memberlist: ``Ping``/``Ack``/``PingReq`` for failure detection, ``Nack`` from
Lifeguard (Dadgar et al. 2017, section 4.3), and ``Alive``/``Suspect``/``Dead``
updates that ride piggyback on them. ``PushPull`` carries a full state
exchange over the reliable (stream) channel.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# The integer ranges on the wire. Sequence numbers wrap below MAX_SEQ (the
# state machine counts modulo MAX_SEQ + 1); an incarnation saturates at
# MAX_INCARNATION, msgpack's signed 64-bit range, rather than overflow it.
MAX_SEQ = (1 << 62) - 1
MAX_INCARNATION = (1 << 63) - 1


class State(enum.IntEnum):
    """A member's state. The numbers are on the wire; never renumber."""

    ALIVE = 0
    SUSPECT = 1
    DEAD = 2
    LEFT = 3

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class Ping:
    seq: int
    target: str  # the id the sender believes it is probing; a stale address is detected
    source: str
    source_address: str


@dataclass(frozen=True, slots=True)
class PingReq:
    """Ask the receiver to probe ``target`` for ``source`` (SWIM indirect probe)."""

    seq: int
    target: str
    target_address: str
    source: str
    source_address: str
    nack: bool  # Lifeguard: answer with Nack if the target does not ack in time


@dataclass(frozen=True, slots=True)
class Ack:
    seq: int
    source: str


@dataclass(frozen=True, slots=True)
class Nack:
    seq: int
    source: str


@dataclass(frozen=True, slots=True)
class Alive:
    member: str
    incarnation: int
    address: str
    meta: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Suspect:
    member: str
    incarnation: int
    source: str  # who suspects: distinct sources are independent confirmations


@dataclass(frozen=True, slots=True)
class Dead:
    member: str
    incarnation: int
    source: str  # source == member means a graceful leave


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """One member in a push-pull state exchange."""

    member: str
    address: str
    incarnation: int
    state: State
    meta: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class PushPull:
    """Full state exchange (memberlist's pushPull), sent on the stream channel.

    ``join`` marks the first exchange of a joining node; ``reply`` marks the
    answer, which must not be answered again.
    """

    source: str
    source_address: str
    members: tuple[MemberRecord, ...]
    join: bool
    reply: bool


Update = Alive | Suspect | Dead
Message = Ping | PingReq | Ack | Nack | Alive | Suspect | Dead | PushPull


@dataclass(frozen=True, slots=True)
class Packet:
    """What one datagram (or one stream frame) carries: the sender and its messages.

    The first message is the reason for the packet (a ping, an ack); the
    rest are piggybacked updates.
    """

    sender: str
    messages: tuple[Message, ...]


@dataclass(frozen=True, slots=True)
class Outgoing:
    address: str
    packet: Packet
    reliable: bool = False  # True: send on the stream channel (push-pull)


class EventKind(enum.Enum):
    JOINED = "joined"
    SUSPECT = "suspect"
    ALIVE = "alive"  # back to alive from suspect or dead (refuted, rejoined)
    DEAD = "dead"
    LEFT = "left"
    UPDATED = "updated"  # address or metadata changed
    # This node's own probe of the member was acked, for the first time in
    # its current life at its current address: before that it is hearsay
    # (anyone may gossip an Alive), and the node does not place it on buckets.
    ANSWERED = "answered"


@dataclass(frozen=True, slots=True)
class MemberView:
    id: str
    address: str
    state: State
    incarnation: int
    meta: tuple[tuple[str, str], ...] = ()
    # True once the member acked a probe of ours (see EventKind.ANSWERED);
    # always True for ourselves. Last, with a default, for positional callers.
    answered: bool = False


@dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    member: MemberView
    at: float
