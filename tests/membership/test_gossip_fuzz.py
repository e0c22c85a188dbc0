"""Fuzzing a live gossip agent over its real sockets (issue 17).

A ``Membership`` agent runs on 127.0.0.1 beside a second live member. Each
hypothesis example throws a batch at the agent's UDP port (and some at its
TCP push-pull port): random bytes, and valid packets of every message type
(signed when the agent has a key, so they reach the field checks) with
fields mutated, addresses broken (ports 70000, -1, 0, huge numbers), ids,
numbers and metadata out of range, values of the wrong type, fields missing
or added, deep nesting, huge length prefixes, bit flips and truncations.

After every batch:

* the agent answers a real ``Ping`` (which also proves every datagram of the
  batch was handled: loopback keeps one sender's datagrams in order), and the
  live member hears an ``Ack`` from it again;
* its UDP transport is open and its driver task alive;
* every packet that reached it was either accepted or dropped and counted
  under a reason, and the dropped ones are exactly those its codec rejects
  (the packets known to be bad, such as a port of 70000, must be among them,
  under the reason named here); of a push-pull connection only the first
  frame is read, as the agent reads one frame a connection;
* everything it sent decodes: a forged value it took in (an incarnation at
  the top of the range) never comes back out in a packet its peers drop.

Before the fix of issue 17 this failed at once: an Ack to port 70000 closed
the agent's UDP socket (asyncio's "Fatal write error on datagram transport"),
and an address without a port ended its driver task. A batch that breaks the
agent starts a fresh one for the next example, so hypothesis shrinks to the
batch that did it. Everything is polled with deadlines; nothing sleeps and
hopes. The examples are derandomized (the same ones on every run);
GOSSIP_FUZZ_EXAMPLES=1000 runs more of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import hmac
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from membership.codec import FLAG_MAC, HEADER_BYTES, MAX_STREAM_BYTES, VERSION, Codec, DecodeError
from membership.config import FAST
from membership.messages import (
    MAX_INCARNATION,
    MAX_SEQ,
    Ack,
    Alive,
    Dead,
    MemberRecord,
    Message,
    Nack,
    Packet,
    Ping,
    PingReq,
    PushPull,
    State,
    Suspect,
)
from membership.service import Membership
from membership.transport import FRAME

KEY = bytes(range(32))
OTHER_KEY = b"k" * 32
# Short timings so the live member probes the agent about ten times a second.
TIMING = replace(FAST, probe_interval=0.1, probe_timeout=0.05, gossip_interval=0.05)
AGENT, MEMBER, PROBER = "agent", "member", "prober"
DEADLINE = 10.0  # a hang guard, far above what a healthy agent needs
EXAMPLES = int(os.environ.get("GOSSIP_FUZZ_EXAMPLES", "75"))  # per agent (plain, signed)

# Where each kind of field sits in a message, by message code (index 0 is the code).
ADDRESS_FIELDS = {1: (4,), 2: (3, 5), 5: (3,), 8: (2,)}
ID_FIELDS = {1: (2, 3), 2: (2, 4), 3: (2,), 4: (2,), 5: (1,), 6: (1, 3), 7: (1, 3), 8: (1,)}
SEQ_FIELDS = {1: (1,), 2: (1,), 3: (1,), 4: (1,)}
INCARNATION_FIELDS = {5: (2,), 6: (2,), 7: (2,)}
META_FIELDS = {5: (4,)}

BAD_ADDRESSES = [
    "127.0.0.1:70000",
    "127.0.0.1:65536",
    "127.0.0.1:-1",
    "127.0.0.1:0",
    "127.0.0.1:" + "9" * 40,
    "127.0.0.1:07946",
    "127.0.0.1:+80",
    "127.0.0.1: 80",
    "127.0.0.1:8_0",
    "127.0.0.1:\u0663\u0663",  # Arabic-Indic digits: int() would take them
    "127.0.0.1",
    "127.0.0.1:",
    ":7946",
    "",
    ":",
    "::1:7946",  # IPv6 without brackets
    "[::1]",
    "[::1:7946",
    "[127.0.0.1]:7946",
    "[fe80::1%eth0]:7946",
    "300.1.1.1:7946",
    "1.2.3:7946",  # not an IPv4 address, and inet_aton would read it as one
    "0.0.0.0:7946",
    "224.0.0.1:7946",
    "255.255.255.255:7946",
    "-bad-.example:7946",
    "a..b:7946",
    "a" * 64 + ".example:7946",
    "a." * 127 + "b:7946",
    "host name:7946",
    "host\x00:7946",
    "nœud:7946",
    "x" * 300,
]
BAD_IDS = ["", "bad id", "x" * 65, "\x00", "nœud", "a/b", "a:b", "\n"]
BAD_META = [
    [["k", "\x00"]],
    [["k", "v" * 257]],
    [["", "v"]],
    [["k y", "v"]],
    [["k", "v"], ["k", "w"]],  # one key twice
    [["k", "\u00e9"]],
]
# Unusual but valid: a packet carrying these decodes and is processed (an IPv6
# or host name destination must then be refused by the transport, not sendto).
ODD_ADDRESSES = [
    "127.0.0.1:65535",
    "127.0.0.1:1",
    "[::1]:7946",
    "[2001:db8::1]:1",
    "localhost:7946",
    "a:1",
    "x" * 63 + ".example:65535",
]
ODD_IDS = ["a", "x" * 64, "A.b_c-9", AGENT, MEMBER, "-", "..."]
ODD_META = [[], [[f"k{i}", "v"] for i in range(32)], [["http", "~" * 256]]]
BAD_SEQS = [-1, 2**62, 2**63, 2**64 - 1]
BAD_INCARNATIONS = [-1, 2**63, 2**64 - 1]
NASTY_INTS = [0, -1, 1, 65535, 65536, 70000, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
HUGE_HEADERS = [b"\xdb\xff\xff\xff\xff", b"\xdd\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff"]


def frame(body: bytes, key: bytes | None) -> bytes:
    """A datagram as the codec frames it, signed with ``key`` (or not)."""
    if key is None:
        return bytes((VERSION, 0)) + body
    header = bytes((VERSION, FLAG_MAC))
    return header + hmac.new(key, header + body, hashlib.sha256).digest() + body


def structure(packet: Packet) -> list[Any]:
    """The msgpack body of a valid packet as plain lists, to mutate."""
    body: list[Any] = msgpack.unpackb(Codec().encode(packet)[HEADER_BYTES:], raw=False)
    return body


def nest(depth: int) -> Any:
    value: Any = None
    for _ in range(depth):
        value = [value]
    return value


# -- the shots -----------------------------------------------------------------------


@dataclass(frozen=True)
class Shot:
    data: bytes
    # The reason the agent must drop it for, known here without asking the
    # codec; None: whatever the codec decides (decoded packets are processed).
    expect: str | None
    what: str


@dataclass(frozen=True)
class StreamShot:
    bodies: tuple[bytes, ...]  # complete frames, signed as the agent expects
    tail: str  # how the connection ends
    expect_tail: str | None  # the reason the tail must be dropped for


@dataclass(frozen=True)
class Batch:
    shots: tuple[Shot, ...]
    stream: StreamShot | None


def templates(sink: str) -> list[list[Any]]:
    messages: list[Message] = [
        Ping(7, AGENT, "fz", sink),
        Ping(8, "someone-else", "fz", sink),
        PingReq(9, "fzt", sink, "fz", sink, True),
        Ack(10, "fz"),
        Nack(11, "fz"),
        Alive("fz1", 5, sink, (("http", "127.0.0.1:1"), ("placement", "1"))),
        Suspect("fz1", 5, "fz"),
        Dead("fz1", 6, "fz"),
        Dead("fz2", 6, "fz2"),
        Suspect(AGENT, 3, "fz"),
        # About the agent at the top of the range: it refutes, and its Alive
        # must stay in the range its peers accept.
        Suspect(AGENT, MAX_INCARNATION, "fz"),
        Dead(MEMBER, MAX_INCARNATION, "fz"),
        PushPull(
            "fz",
            sink,
            (
                MemberRecord("fz1", sink, 5, State.ALIVE, (("k", "v"),)),
                MemberRecord("fz2", sink, 1, State.DEAD),
            ),
            False,
            False,
        ),
        PushPull("fz", sink, (), True, True),
    ]
    out = [structure(Packet("fz", (m,))) for m in messages]
    out.append(structure(Packet("fz", (messages[0], messages[5], messages[6]))))
    return out


def nasty_values() -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.sampled_from(NASTY_INTS),
        st.integers(-(2**63), 2**64 - 1),
        st.sampled_from([*BAD_ADDRESSES, *BAD_IDS, "127.0.0.1:7946", "a:1"]),
        st.text(max_size=30),
        st.text(min_size=400, max_size=2000),
        st.none(),
        st.booleans(),
        st.floats(allow_nan=True),
        st.binary(max_size=8),
        st.just({}),
        st.just({"k": 1}),
    )
    return st.one_of(
        scalars,
        st.lists(scalars, max_size=4),
        st.integers(1, 400).map(nest),
        st.integers(33, 300).map(lambda n: [["k", "v"]] * n),
    )


@st.composite
def structural(draw: st.DrawFn, bases: list[list[Any]]) -> list[Any]:
    """A valid body with one to three fields replaced, removed, added or wrapped."""
    body = copy.deepcopy(draw(st.sampled_from(bases)))
    for _ in range(draw(st.integers(1, 3))):
        parent: list[Any] = body
        index = draw(st.integers(0, max(0, len(parent) - 1)))
        # Walk down a random path while the node is a non-empty list.
        while (
            index < len(parent)
            and isinstance(parent[index], list)
            and parent[index]
            and draw(st.booleans())
        ):
            parent = parent[index]
            index = draw(st.integers(0, len(parent) - 1))
        op = draw(st.sampled_from(["replace", "delete", "insert", "wrap"]))
        if op == "replace" and index < len(parent):
            parent[index] = draw(nasty_values())
        elif op == "delete" and index < len(parent):
            del parent[index]
        elif op == "wrap" and index < len(parent):
            parent[index] = [parent[index]]
        else:
            parent.insert(index, draw(nasty_values()))
    return body


@st.composite
def targeted(draw: st.DrawFn, bases: list[list[Any]]) -> tuple[list[Any], str, str]:
    """A valid body with one field of a known kind made bad: (body, reason, what)."""
    body = copy.deepcopy(draw(st.sampled_from(bases)))
    kind = draw(st.sampled_from(["address", "address_type", "id", "seq", "incarnation", "meta"]))
    spots: list[tuple[list[Any], int]] = []
    for message in body[1]:
        code = message[0]
        table = {
            "address": ADDRESS_FIELDS,
            "address_type": ADDRESS_FIELDS,
            "id": ID_FIELDS,
            "seq": SEQ_FIELDS,
            "incarnation": INCARNATION_FIELDS,
            "meta": META_FIELDS,
        }[kind]
        spots.extend((message, i) for i in table.get(code, ()))
        if code == 8:  # a push-pull's member records
            record_fields = {"address": 1, "address_type": 1, "id": 0, "incarnation": 2, "meta": 4}
            if kind in record_fields:
                spots.extend((r, record_fields[kind]) for r in message[3])
    if kind == "id":
        spots.append((body, 0))  # the sender
    if not spots:
        kind = "address"
        body = structure(Packet("fz", (Ping(1, AGENT, "fz", "127.0.0.1:1"),)))
        spots = [(body[1][0], 4)]
    parent, index = draw(st.sampled_from(spots))
    if kind == "address":
        bad: Any = draw(
            st.one_of(
                st.sampled_from(BAD_ADDRESSES),
                st.integers(65536, 10**30).map(lambda p: f"127.0.0.1:{p}"),
                st.integers(-(10**30), 0).map(lambda p: f"127.0.0.1:{p}"),
            )
        )
        reason = "address"
    elif kind == "address_type":
        bad, reason = draw(st.sampled_from([70000, None, ["127.0.0.1", 7946], 1.5])), "malformed"
    elif kind == "id":
        bad, reason = draw(st.sampled_from(BAD_IDS)), "malformed"
    elif kind == "seq":
        bad, reason = draw(st.sampled_from(BAD_SEQS)), "malformed"
    elif kind == "incarnation":
        bad, reason = draw(st.sampled_from(BAD_INCARNATIONS)), "malformed"
    else:
        bad, reason = draw(st.sampled_from(BAD_META)), "malformed"
    parent[index] = bad
    return body, reason, f"{kind} {bad!r:.60}"


@st.composite
def odd(draw: st.DrawFn, bases: list[list[Any]]) -> list[Any]:
    """A valid body, some fields set to the edges of what is valid."""
    body = copy.deepcopy(draw(st.sampled_from(bases)))
    for message in body[1]:
        code = message[0]
        for table, values in (
            (ADDRESS_FIELDS, ODD_ADDRESSES),
            (ID_FIELDS, ODD_IDS),
            (SEQ_FIELDS, [0, MAX_SEQ]),
            (INCARNATION_FIELDS, [0, 1, MAX_INCARNATION]),
            (META_FIELDS, ODD_META),
        ):
            for index in table.get(code, ()):
                if draw(st.booleans()):
                    message[index] = draw(st.sampled_from(values))
    return body


@st.composite
def byte_mutation(draw: st.DrawFn, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "truncate", "append", "huge", "nest", "byte"]))
        at = draw(st.integers(0, len(out)))
        if op == "flip" and at < len(out):
            out[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del out[at:]
        elif op == "append":
            out += draw(st.binary(min_size=1, max_size=16))
        elif op == "huge":
            out[at:at] = draw(st.sampled_from(HUGE_HEADERS))
        elif op == "nest":
            out[at:at] = b"\x91" * draw(st.integers(500, 1350))
        elif at < len(out):
            out[at] = draw(st.sampled_from([0x00, 0x7F, 0xC0, 0xC1, 0xC2, 0xDC, 0xDE, 0xFF]))
    return bytes(out)


def pack(body: Any) -> bytes | None:
    try:
        packed: bytes = msgpack.packb(body)
    except (OverflowError, ValueError, TypeError):
        return None
    return packed


@st.composite
def shots(draw: st.DrawFn, bases: list[list[Any]], key: bytes | None) -> Shot:
    """One datagram; ``key`` is what the agent signs with (None: no key)."""
    kind = draw(st.sampled_from(["targeted", "structural", "bytes", "random", "foreign", "odd"]))
    if kind == "random":
        data = draw(st.binary(max_size=1500))
        if data and draw(st.booleans()):
            data = bytes((VERSION, draw(st.sampled_from([0, FLAG_MAC])))) + data
        return Shot(data, None, "random bytes")
    if kind == "targeted":
        body, reason, what = draw(targeted(bases))
        packed = pack(body)
        assert packed is not None
        return Shot(frame(packed, key), reason, what)
    if kind == "odd":
        packed = pack(draw(odd(bases)))
        assert packed is not None
        return Shot(frame(packed, key), None, "odd but valid")
    if kind == "foreign":
        # Signed with a key the agent does not hold, or unsigned when it has one.
        packed = pack(draw(st.sampled_from(bases)))
        assert packed is not None
        other = draw(st.sampled_from([OTHER_KEY, None] if key else [KEY, OTHER_KEY]))
        return Shot(frame(packed, other), "mac", "foreign key")
    body = draw(structural(bases)) if kind == "structural" else draw(st.sampled_from(bases))
    packed = pack(body)
    if packed is None:
        packed = pack(draw(st.sampled_from(bases)))
        assert packed is not None
    if kind == "structural":
        return Shot(frame(packed, key), None, "structural")
    if key is not None and draw(st.booleans()):
        # Changed after signing: the MAC no longer matches.
        signed = frame(packed, key)
        changed = draw(byte_mutation(signed[HEADER_BYTES:]))
        data = signed[:HEADER_BYTES] + changed
        fits = len(data) <= TIMING.max_packet_bytes  # size is checked before the MAC
        return Shot(data, "mac" if data != signed and fits else None, "bytes after signing")
    return Shot(frame(draw(byte_mutation(packed)), key), None, "bytes")


@st.composite
def stream_shots(draw: st.DrawFn, bases: list[list[Any]], key: bytes | None) -> StreamShot:
    bodies = []
    for _ in range(draw(st.integers(0, 2))):
        shot = draw(shots(bases, key))
        bodies.append(shot.data)
    tail = draw(st.sampled_from(["clean", "too_large", "short_header", "short_body"]))
    expect = {"clean": None, "too_large": "too_large"}.get(tail, "truncated")
    return StreamShot(tuple(bodies), tail, expect)


def batches(bases: list[list[Any]], key: bytes | None) -> st.SearchStrategy[Batch]:
    return st.builds(
        Batch,
        st.lists(shots(bases, key), min_size=1, max_size=6).map(tuple),
        st.one_of(st.none(), stream_shots(bases, key)),
    )


# -- the agent under fire --------------------------------------------------------------


def udp_open(membership: Membership) -> bool:
    return membership.transport.udp_open


@dataclass
class Harness:
    keys: tuple[bytes, ...]
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    agent: Membership | None = None
    member: Membership | None = None
    member_acks: int = 0
    seq: int = 1 << 40
    restarts: int = 0
    unreadable: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # What the agent must accept and reject: its own codec configuration.
        self.codec = Codec(self.keys, max_bytes=TIMING.max_packet_bytes)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        # The address the fuzzed packets name: the agent's answers come here.
        self.sink = f"127.0.0.1:{self.sock.getsockname()[1]}"

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    @property
    def target(self) -> tuple[str, int]:
        assert self.agent is not None
        return ("127.0.0.1", self.agent.transport.port)

    async def start(self) -> None:
        self.agent = Membership(
            AGENT,
            bind=("127.0.0.1", 0),
            advertise_host="127.0.0.1",
            config=TIMING,
            keys=self.keys,
        )
        await self.agent.start()
        self.member = Membership(
            MEMBER,
            bind=("127.0.0.1", 0),
            advertise_host="127.0.0.1",
            config=TIMING,
            seeds=[f"127.0.0.1:{self.agent.transport.port}"],
            keys=self.keys,
        )
        await self.member.start()
        deliver = self.member.transport.receiver

        def spy(packet: Packet) -> None:
            if packet.sender == AGENT and any(isinstance(m, Ack) for m in packet.messages):
                self.member_acks += 1
            deliver(packet)

        self.member.transport.receiver = spy

        # Whatever the agent sends, its peers must accept: a forged value it
        # took in must not come back out in a packet every peer drops.
        agent_send = self.agent.transport.send

        def checked_send(address: str, packet: Packet, *, reliable: bool) -> None:
            encoded = self.codec.encode(packet)
            try:
                self.codec.decode(encoded, stream=reliable)
            except DecodeError as exc:
                self.unreadable.append(f"{exc}: {packet!r:.300}")
            agent_send(address, packet, reliable=reliable)

        self.agent.transport.send = checked_send  # type: ignore[method-assign]
        member = self.member
        await self.until(lambda: AGENT in {m.id for m in member.members()}, "the member to join")
        await self.member_hears_an_ack()

    async def stop(self, *, broken: bool = False) -> None:
        for membership in (self.member, self.agent):
            if membership is not None:
                try:
                    await membership.stop()
                except Exception:
                    if not broken:
                        raise
        self.agent = self.member = None

    async def restart_if_broken(self) -> None:
        """A batch that broke the agent must not fail every later example too
        (hypothesis then shrinks to the batch that broke it)."""
        with contextlib.suppress(AssertionError):
            self.check_alive()
            return
        self.restarts += 1
        self.unreadable.clear()
        await self.stop(broken=True)  # stopping a broken agent may fail as well
        await self.start()

    def check_alive(self) -> None:
        """Fail at once (not at the deadline) once the agent lost its socket or driver."""
        agent = self.agent
        assert agent is not None
        assert udp_open(agent), (
            f"the agent's UDP transport closed (counters {dict(agent.transport.counters)}; "
            f"dropped {dict(agent.transport.dropped)})"
        )
        task = agent._task
        assert task is not None and not task.done(), "the agent's driver task ended"

    async def until(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + DEADLINE
        while not condition():
            self.check_alive()
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {DEADLINE:g} s waiting for {what}")
            await asyncio.sleep(0.005)

    async def member_hears_an_ack(self) -> None:
        """The live member's own probing gets an answer from the agent."""
        heard = self.member_acks
        await self.until(lambda: self.member_acks > heard, "the live member to hear an ack")

    async def probe(self) -> None:
        """A real Ping to the agent; wait for its Ack. The batch's datagrams
        were sent before it from this socket, so they were all handled."""
        self.seq += 1
        seq = self.seq
        ping = Packet(PROBER, (Ping(seq, AGENT, PROBER, self.sink),))
        self.sock.sendto(self.codec.encode(ping), self.target)
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            while True:
                try:
                    data = self.sock.recv(65536)
                except BlockingIOError:
                    break
                with contextlib.suppress(DecodeError):
                    packet = self.codec.decode(data)
                    if any(
                        isinstance(m, Ack) and m.seq == seq and m.source == AGENT
                        for m in packet.messages
                    ):
                        return
            self.check_alive()
            await asyncio.sleep(0.002)
        agent = self.agent
        assert agent is not None
        raise AssertionError(
            f"the agent answered no probe within {DEADLINE:g} s "
            f"(UDP open: {udp_open(agent)}; counters {dict(agent.transport.counters)}; "
            f"dropped {dict(agent.transport.dropped)})"
        )

    async def stream(self, shot: StreamShot) -> None:
        """One push-pull connection: frames, then the tail, then wait until
        the agent has closed its side (it has read its one frame by then)."""
        payload = b"".join(FRAME.pack(len(b)) + b for b in shot.bodies)
        if shot.tail == "too_large":
            payload += FRAME.pack(MAX_STREAM_BYTES + 1) + b"\x01\x00"
        elif shot.tail == "short_header":
            payload += b"\x00\x00"
        elif shot.tail == "short_body":
            payload += FRAME.pack(50) + b"\x01\x00\x92"[: len(shot.bodies) % 4]
        reader, writer = await asyncio.open_connection(*self.target)
        try:
            writer.write(payload)
            await writer.drain()
            writer.write_eof()
            await asyncio.wait_for(reader.read(), DEADLINE)
        except (ConnectionError, OSError):
            pass  # the agent closed first (a frame too large): also the end
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    def outcome(self, data: bytes, *, stream: bool) -> str:
        try:
            self.codec.decode(data, stream=stream)
        except DecodeError as exc:
            return exc.reason
        return "ok"

    async def fire(self, batch: Batch) -> None:
        await self.restart_if_broken()
        agent = self.agent
        assert agent is not None
        transport = agent.transport
        inbound = {k: v for k, v in transport.dropped.items() if k != "partitioned"}
        dropped_before, arrived_before = Counter(inbound), transport.counters["packets_in"]
        accepted_before = transport.counters["packets_accepted"]

        predicted: Counter[str] = Counter()
        known: list[tuple[Shot, str]] = []
        for shot in batch.shots:
            outcome = self.outcome(shot.data, stream=False)
            if outcome != "ok":
                predicted[outcome] += 1
            if shot.expect is not None:
                known.append((shot, outcome))
            self.sock.sendto(shot.data, self.target)
        if batch.stream is not None:
            # A connection carries one frame: the agent reads the first (the
            # tail, when there is no body) and closes.
            if batch.stream.bodies:
                outcome = self.outcome(batch.stream.bodies[0], stream=True)
                if outcome != "ok":
                    predicted[outcome] += 1
            elif batch.stream.expect_tail is not None:
                predicted[batch.stream.expect_tail] += 1
            await self.stream(batch.stream)

        # The agent still answers probes, from us and from the live member.
        await self.probe()
        self.check_alive()
        await self.member_hears_an_ack()
        assert not self.unreadable, f"the agent sent packets its peers drop: {self.unreadable}"

        # The packets known to be bad were rejected for the reason expected.
        for shot, outcome in known:
            assert outcome == shot.expect, f"{shot.what}: {outcome}, expected {shot.expect}"
        # Each packet that arrived was accepted, or dropped and counted; the
        # dropped ones are exactly those the codec rejects (no legitimate
        # packet from the member was lost, no bad one slipped through).
        inbound = {k: v for k, v in transport.dropped.items() if k != "partitioned"}
        dropped = Counter(inbound)
        dropped.subtract(dropped_before)
        assert +dropped == +predicted, (dict(+dropped), dict(predicted))
        arrived = transport.counters["packets_in"] - arrived_before
        accepted = transport.counters["packets_accepted"] - accepted_before
        assert arrived == accepted + dropped.total()
        assert arrived >= len(batch.shots)


@pytest.mark.parametrize("keys", [(), (KEY,)], ids=["plain", "signed"])
def test_a_live_agent_survives_hostile_packets(keys: tuple[bytes, ...]) -> None:
    harness = Harness(keys)
    bases = templates(harness.sink)
    try:
        harness.run(harness.start())

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(batch=batches(bases, keys[0] if keys else None))
        def fire(batch: Batch) -> None:
            note(f"batch: {batch!r}")  # printed with a failure, whatever pytest shows
            harness.run(harness.fire(batch))

        fire()
        assert harness.agent is not None
        # The agent handled every packet without a handler error.
        assert harness.agent.handler_errors == 0
        assert harness.restarts == 0
    finally:
        harness.run(harness.stop())
        harness.sock.close()
        harness.loop.close()
