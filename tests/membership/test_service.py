"""The Membership service over real UDP and TCP sockets, in one process."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

import membership.transport as transport_module
from membership.codec import FLAG_MAC, MAX_STREAM_BYTES, VERSION, Codec, DecodeError
from membership.config import FAST
from membership.messages import (
    Ack,
    Alive,
    Event,
    EventKind,
    MemberRecord,
    Packet,
    Ping,
    PushPull,
    State,
)
from membership.service import JOIN_PATIENCE, Membership, resolve_seeds
from membership.state import Swim
from membership.transport import FRAME, MAX_STREAMS_IN, MAX_STREAMS_OUT
from node.ops.embedded import port_taken
from tests.conftest import wait_until


@pytest.fixture
async def start() -> AsyncIterator[Callable[..., object]]:
    started: list[Membership] = []

    async def make(
        name: str, seeds: list[str] | None = None, keys: tuple[bytes, ...] = ()
    ) -> Membership:
        membership = Membership(
            name,
            bind=("127.0.0.1", 0),
            advertise_host="127.0.0.1",
            config=FAST,
            seeds=seeds or [],
            keys=keys,
            meta={"http": f"127.0.0.1:{8000 + len(started)}"},
        )
        await membership.start()
        started.append(membership)
        return membership

    yield make
    for membership in started:
        await membership.stop()


def states(membership: Membership) -> dict[str, State]:
    return {m.id: m.state for m in membership.members()}


async def test_resolve_seeds_accepts_addresses_and_dns_names() -> None:
    resolved = await resolve_seeds(["10.0.0.1:7946", "localhost:7000", "localhost"], 7946)
    assert "10.0.0.1:7946" in resolved
    assert "127.0.0.1:7000" in resolved
    assert "127.0.0.1:7946" in resolved


async def test_join_through_a_dns_seed_then_leave(start) -> None:  # type: ignore[no-untyped-def]
    a = await start("a")
    events: list[Event] = []
    a.subscribe(events.append)
    b = await start("b", seeds=[f"localhost:{a.transport.port}"])

    async def joined() -> bool:
        return states(a).get("b") == State.ALIVE and states(b).get("a") == State.ALIVE

    await wait_until(joined, what="a and b to see each other")
    assert next(e.kind for e in events if e.member.id == "b") == EventKind.JOINED
    view_of_a = {m.id: m for m in b.members()}["a"]
    assert dict(view_of_a.meta) == {"http": "127.0.0.1:8000"}

    await b.leave(grace=5)

    async def left() -> bool:
        return states(a).get("b") == State.LEFT

    await wait_until(left, what="a to see b leave")
    assert EventKind.DEAD not in [e.kind for e in events]


async def test_keys_keep_strangers_out_and_rotate(start) -> None:  # type: ignore[no-untyped-def]
    # Mid-rotation: a still signs with the old key but accepts the new one,
    # b already signs with the new one and still accepts the old.
    old, new, other = b"o" * 16, b"n" * 16, b"x" * 16
    a = await start("a", keys=(old, new))
    b = await start("b", seeds=[f"127.0.0.1:{a.transport.port}"], keys=(new, old))
    stranger = await start("s", seeds=[f"127.0.0.1:{a.transport.port}"], keys=(other,))

    async def joined() -> bool:
        return states(a).get("b") == State.ALIVE and states(b).get("a") == State.ALIVE

    await wait_until(joined, what="a and b to join across the rotation")

    async def stranger_rejected() -> bool:
        return a.transport.dropped["mac"] > 0

    await wait_until(stranger_rejected, what="the stranger's packets to be dropped")
    assert "s" not in states(a)
    assert "s" not in states(b)
    assert set(states(stranger)) == {"s"}


async def test_garbage_on_the_socket_is_counted_not_raised(start) -> None:  # type: ignore[no-untyped-def]
    a = await start("a")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for payload in (b"", b"\x01", b"\x09\x00junk", b"\x01\x00\xc1", b"\x01\x00" + b"\x92" * 5):
            sock.sendto(payload, ("127.0.0.1", a.transport.port))
        sock.sendto(b"x" * 5000, ("127.0.0.1", a.transport.port))

    async def counted() -> bool:
        return sum(a.transport.dropped.values()) >= 6

    await wait_until(counted, what="every bad packet to be counted")
    assert set(a.transport.dropped) <= {"too_large", "truncated", "version", "mac", "malformed"}
    assert a.transport.dropped["too_large"] == 1
    assert a.transport.dropped["version"] == 1
    assert a.handler_errors == 0
    assert states(a) == {"a": State.ALIVE}


async def test_a_seed_that_came_up_late_is_found(start) -> None:  # type: ignore[no-untyped-def]
    # b's only seed is a, which is not up yet; c joins through b. When a
    # finally starts (with no seeds of its own), b must still reach it.
    # Below the ephemeral range, so no outgoing connection borrows it meanwhile.
    late_port = next(
        p
        for p in random.Random().sample(range(20_000, 30_000), 200)
        if not port_taken("127.0.0.1", p, socket.SOCK_STREAM)
        and not port_taken("127.0.0.1", p, socket.SOCK_DGRAM)
    )
    b = await start("b", seeds=[f"127.0.0.1:{late_port}"])
    c = await start("c", seeds=[f"127.0.0.1:{b.transport.port}"])

    async def b_and_c() -> bool:
        return states(b).get("c") == State.ALIVE

    await wait_until(b_and_c, what="c to join through b")
    a = Membership(
        "a",
        bind=("127.0.0.1", late_port),
        advertise_host="127.0.0.1",
        config=FAST,
    )
    await a.start()
    try:

        async def one_cluster() -> bool:
            return all(
                set(states(m)) == {"a", "b", "c"}
                and all(s == State.ALIVE for s in states(m).values())
                for m in (a, b, c)
            )

        await wait_until(one_cluster, within=60, what="the late seed to join the others")
    finally:
        await a.stop()


# -- hostile peers (issue 17) ---------------------------------------------------------


class Prober:
    """A bare UDP socket that speaks the codec: forges packets, probes for acks."""

    def __init__(self, keys: tuple[bytes, ...] = ()) -> None:
        self.codec = Codec(keys)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.seq = 1000

    def send(self, membership: Membership, data: bytes) -> None:
        self.sock.sendto(data, ("127.0.0.1", membership.transport.port))

    async def answered(self, membership: Membership, within: float = 10.0) -> None:
        """Send a real Ping to ``membership``; wait for its Ack."""
        self.seq += 1
        seq = self.seq
        ping = Packet("prober", (Ping(seq, membership.node_id, "prober", self.address),))
        self.send(membership, self.codec.encode(ping))
        acked = False

        async def ack() -> bool:
            nonlocal acked
            while not acked:
                try:
                    data = self.sock.recv(65536)
                except BlockingIOError:
                    return False
                with contextlib.suppress(DecodeError):
                    packet = self.codec.decode(data)
                    acked = any(isinstance(m, Ack) and m.seq == seq for m in packet.messages)
            return True

        await wait_until(ack, within=within, what=f"{membership.node_id} to ack a probe")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def prober() -> Iterator[Prober]:
    made = Prober()
    yield made
    made.close()


async def test_a_ping_with_source_port_70000_is_dropped_and_probes_still_answered(  # type: ignore[no-untyped-def]
    start, prober: Prober
) -> None:
    """Issue 17: the Ack to port 70000 used to raise OverflowError in sendto,
    which asyncio treats as fatal: it closed the socket, and the node was
    deaf (then declared dead) for good."""
    a = await start("a")
    b = await start("b", seeds=[f"127.0.0.1:{a.transport.port}"])

    async def joined() -> bool:
        return states(a).get("b") == State.ALIVE and states(b).get("a") == State.ALIVE

    await wait_until(joined, what="a and b to see each other")
    forged = Packet("mallory", (Ping(1, "a", "mallory", "127.0.0.1:70000"),))
    for _ in range(3):
        prober.send(a, Codec().encode(forged))
    await prober.answered(a)
    assert a.transport.dropped["address"] == 3
    assert a.transport.udp_open
    assert a.handler_errors == 0

    # Past the codec (as if it let one through), the transport refuses it too.
    before = a.transport.counters["send_errors"]
    a.transport.send("127.0.0.1:70000", Packet("a", (Ack(1, "a"),)), reliable=False)
    assert a.transport.counters["send_errors"] == before + 1
    assert a.transport.udp_open
    await prober.answered(a)

    # And b keeps probing a successfully: a stays alive in its view, unsuspected.
    probes = b.swim.stats.probes if b.swim else 0

    async def probed_again() -> bool:
        return b.swim is not None and b.swim.stats.probes >= probes + 3

    await wait_until(probed_again, what="b to probe a a few more times")
    assert states(b)["a"] == State.ALIVE
    assert b.swim is not None and b.swim.stats.probe_failures == 0


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1:70000",
        "127.0.0.1:-1",
        "127.0.0.1:0",
        "127.0.0.1:99999999999999999999",
        "127.0.0.1",
        "garbage",
        "",
        "[::1]:7946",  # valid, but the socket is IPv4
        "localhost:7946",  # valid, but members advertise IP addresses
        "0.0.0.0:7946",
        "255.255.255.255:7946",
        "224.0.0.1:7946",
        "host\x00:1",
    ],
)
async def test_sending_to_a_bad_address_is_counted_never_raised(  # type: ignore[no-untyped-def]
    start, prober: Prober, address: str
) -> None:
    a = await start("a")
    packet = Packet("a", (Ack(1, "a"),))
    for reliable in (False, True):
        a.transport.send(address, packet, reliable=reliable)
    assert a.transport.counters["send_errors"] == 2
    assert a.transport.counters["packets_out"] == 0
    assert a.transport.udp_open
    await prober.answered(a)


async def test_the_driver_survives_errors_in_any_round(  # type: ignore[no-untyped-def]
    start, prober: Prober, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = await start("a")
    assert a.swim is not None
    failures = {"next_deadline": 2, "tick": 2, "send": 2}
    next_deadline, tick, send = a.swim.next_deadline, a.swim.tick, a.transport.send

    def failing(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if failures[name]:
                failures[name] -= 1
                raise RuntimeError(f"injected {name} failure")
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(a.swim, "next_deadline", failing("next_deadline", next_deadline))
    monkeypatch.setattr(a.swim, "tick", failing("tick", tick))
    monkeypatch.setattr(a.transport, "send", failing("send", send))
    a._wake.set()

    async def all_failed() -> bool:
        return not any(failures.values())

    # The ack to the probe is a send too: the first ones fail, so probe until one works.
    for _ in range(5):
        with contextlib.suppress(AssertionError):
            await prober.answered(a, within=1.0)
            break
    await wait_until(all_failed, what="every injected failure to happen")
    await prober.answered(a)
    assert a._task is not None and not a._task.done()
    assert a.handler_errors >= 4


async def test_a_udp_socket_that_closes_anyway_is_bound_again(  # type: ignore[no-untyped-def]
    start, prober: Prober
) -> None:
    a = await start("a")
    port = a.transport.port
    udp = a.transport._udp
    assert udp is not None
    udp.abort()  # what asyncio does on a fatal error

    async def reopened() -> bool:
        return a.transport.udp_open

    await wait_until(reopened, what="the socket to be bound again")
    assert a.transport.port == port
    assert a.transport.counters["udp_reopens"] == 1
    await prober.answered(a)


async def test_hostile_push_pull_streams_are_counted_and_survived(  # type: ignore[no-untyped-def]
    start, prober: Prober
) -> None:
    a = await start("a")
    codec = Codec()
    forged = codec.encode(Packet("m", (PushPull("m", "127.0.0.1:70000", (), False, False),)))
    valid = codec.encode(
        Packet(
            "m",
            (
                PushPull(
                    "m",
                    "127.0.0.1:1",
                    (MemberRecord("m", "127.0.0.1:1", 1, State.ALIVE),),
                    False,
                    True,
                ),
            ),
        )
    )
    streams = [
        FRAME.pack(len(forged)) + forged,  # an address the reply cannot go to
        b"\x00\x00",  # part of a header
        FRAME.pack(100) + b"\x01\x00",  # a header, then less than it said
        FRAME.pack(100),  # a header, then nothing
        FRAME.pack(2**32 - 1) + b"x" * 64,  # too large to read at all
        FRAME.pack(3) + b"\x01\x00\xc1",  # a frame that does not decode
        FRAME.pack(len(valid)) + valid,  # and a good one still gets through
    ]
    for payload in streams:
        reader, writer = await asyncio.open_connection("127.0.0.1", a.transport.port)
        writer.write(payload)
        with contextlib.suppress(OSError):
            await writer.drain()
            writer.write_eof()
            await asyncio.wait_for(reader.read(), 10)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()

    async def member_known() -> bool:
        return "m" in states(a)

    await wait_until(member_known, what="the valid push-pull to be merged")
    dropped = a.transport.dropped
    assert dropped == {"address": 1, "truncated": 3, "too_large": 1, "malformed": 1}
    counters = a.transport.counters
    assert counters["packets_in"] == counters["packets_accepted"] + sum(dropped.values())
    assert a.handler_errors == 0
    await prober.answered(a)


def test_ids_metadata_and_addresses_a_peer_would_drop_are_refused_up_front() -> None:
    for bad_id in ("", "bad id", "x" * 65, "nœud"):
        with pytest.raises(ValueError, match="member id"):
            Membership(bad_id, bind=("127.0.0.1", 0), advertise_host="127.0.0.1", config=FAST)
    for bad_meta in ({"k": "\x00"}, {"bad key": "v"}, {"k": "v" * 257}):
        with pytest.raises(ValueError, match="metadata"):
            Membership(
                "a", bind=("127.0.0.1", 0), advertise_host="127.0.0.1", config=FAST, meta=bad_meta
            )


async def test_an_unusable_advertise_address_is_refused_at_start() -> None:
    membership = Membership("a", bind=("127.0.0.1", 0), advertise_host="0.0.0.0", config=FAST)
    with pytest.raises(ValueError, match="cannot advertise"):
        await membership.start()
    assert not membership.transport.udp_open


# -- the gossip port under attack: channels, frames, connections (issue: ghosts) -------------

KEY = bytes(range(32))


def exchange(source: str, address: str, *members: str, reply: bool = True) -> Packet:
    records = tuple(MemberRecord(m, "127.0.0.1:1", 1, State.ALIVE) for m in members)
    return Packet(source, (PushPull(source, address, records, False, reply),))


def counted_once(membership: Membership) -> bool:
    """The transport's invariant: every packet that arrived, or began to, is
    accepted or dropped under one reason."""
    counters, dropped = membership.transport.counters, membership.transport.dropped
    inbound = sum(n for reason, n in dropped.items() if reason != "partitioned")
    return counters["packets_in"] == counters["packets_accepted"] + inbound


async def read_to_the_end(reader: asyncio.StreamReader) -> bytes:
    """What the node sends before it closes (a reset is a close too)."""
    try:
        return await asyncio.wait_for(reader.read(), 10)  # a hang guard
    except ConnectionError:
        return b""


async def test_a_push_pull_datagram_is_dropped_and_opens_no_connection(  # type: ignore[no-untyped-def]
    start, prober: Prober
) -> None:
    """One forged datagram used to make the node connect to whatever address
    it named (the push-pull answer goes over TCP)."""
    a = await start("a")
    assert a.swim is not None
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        victim = f"127.0.0.1:{listener.getsockname()[1]}"
        prober.send(a, Codec().encode(exchange("m", victim, "m", reply=False)))
        await prober.answered(a)  # sent after it from the same socket: it was handled
        assert a.transport.dropped["channel"] == 1
        assert a.swim.stats.push_pulls == 0
        assert "m" not in states(a)
        assert a.transport.counters["streams_out"] == 0
        assert a.transport.counters["stream_connect_errors"] == 0

    # And a stream frame that is not one push-pull is dropped too.
    answers = a.transport.counters["packets_out"]
    ping = Codec().encode(Packet("m", (Ping(1, "a", "m", "127.0.0.1:1"),)))
    reader, writer = await asyncio.open_connection("127.0.0.1", a.transport.port)
    writer.write(FRAME.pack(len(ping)) + ping)
    await writer.drain()
    await read_to_the_end(reader)
    writer.close()

    async def dropped_twice() -> bool:
        return a.transport.dropped["channel"] == 2

    await wait_until(dropped_twice, what="the ping over the stream to be dropped")
    assert a.transport.counters["packets_out"] == answers  # not acked
    assert counted_once(a)


async def test_a_stream_frame_is_refused_on_its_header_before_its_body(start) -> None:  # type: ignore[no-untyped-def]
    """With keys, an unsigned frame is refused on its first six bytes (length
    and header): the node used to read up to 16 MiB before it checked the MAC."""
    a = await start("a", keys=(KEY,))
    b = await start("b")

    def refused(node: Membership, length: int, header: bytes) -> int:
        """Send a frame's length and header, wait for ``node`` to close (it
        must not wait for the body), then write the body: how much of it
        went before the write failed."""
        with socket.create_connection(("127.0.0.1", node.transport.port), timeout=10) as sock:
            # A small buffer: the write fails once the node's reset is back,
            # not after the kernel took megabytes on its behalf.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
            sock.sendall(FRAME.pack(length) + header)
            with contextlib.suppress(ConnectionError):
                assert sock.recv(1) == b""  # closed (the timeout is a hang guard)
            sent, chunk = 0, bytes(64 * 1024)
            with contextlib.suppress(OSError):
                while sent < length:
                    sent += sock.send(chunk)
            return sent

    def assert_refused(node: Membership, length: int, header: bytes) -> None:
        sent = refused(node, length, header)
        assert sent < length // 2, f"{sent} bytes of the body went before the write failed"

    unsigned, signed = bytes((VERSION, 0)), bytes((VERSION, FLAG_MAC))
    await asyncio.to_thread(assert_refused, a, MAX_STREAM_BYTES, unsigned)
    assert dict(a.transport.dropped) == {"mac": 1}
    await asyncio.to_thread(assert_refused, a, MAX_STREAM_BYTES, bytes((VERSION + 8, FLAG_MAC)))
    assert dict(a.transport.dropped) == {"mac": 1, "version": 1}
    # 16 MiB, the old limit (read in full before), is past the new one.
    await asyncio.to_thread(assert_refused, a, 16 * 1024 * 1024, signed)
    assert dict(a.transport.dropped) == {"mac": 1, "version": 1, "too_large": 1}
    # Without keys, a signed frame is refused on its header the same way.
    await asyncio.to_thread(assert_refused, b, MAX_STREAM_BYTES, signed)
    assert dict(b.transport.dropped) == {"mac": 1}

    # A good frame still gets through.
    valid = Codec([KEY]).encode(exchange("m", "127.0.0.1:1", "m"))
    reader, writer = await asyncio.open_connection("127.0.0.1", a.transport.port)
    writer.write(FRAME.pack(len(valid)) + valid)
    await writer.drain()
    await read_to_the_end(reader)
    writer.close()
    assert "m" in states(a)
    assert counted_once(a) and counted_once(b)


async def test_a_connection_carries_one_frame(start) -> None:  # type: ignore[no-untyped-def]
    a = await start("a")
    first, second = (Codec().encode(exchange("m", "127.0.0.1:1", m)) for m in ("m1", "m2"))
    before = a.transport.counters["packets_in"]
    reader, writer = await asyncio.open_connection("127.0.0.1", a.transport.port)
    writer.write(FRAME.pack(len(first)) + first + FRAME.pack(len(second)) + second)
    await writer.drain()
    with contextlib.suppress(OSError):
        writer.write_eof()
    await read_to_the_end(reader)  # the node closed: it is done with the connection
    writer.close()
    assert "m1" in states(a)
    assert "m2" not in states(a)
    assert a.transport.counters["packets_in"] == before + 1
    assert counted_once(a)


async def test_stream_connections_past_the_cap_are_closed_and_counted(  # type: ignore[no-untyped-def]
    start, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The held connections must not time out while the test runs, however slow.
    monkeypatch.setattr(transport_module, "STREAM_TIMEOUT", 120.0)
    a = await start("a")
    port = a.transport.port
    held = []
    for _ in range(MAX_STREAMS_IN):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"\x00\x00")  # half a length prefix: the node waits for the rest
        await writer.drain()
        held.append((reader, writer))

    async def all_held() -> bool:
        return a.transport.counters["streams_in"] == MAX_STREAMS_IN

    await wait_until(all_held, what="the node to read every held connection")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    valid = Codec().encode(exchange("m", "127.0.0.1:1", "m"))
    writer.write(FRAME.pack(len(valid)) + valid)
    with contextlib.suppress(OSError):
        await writer.drain()
    assert await read_to_the_end(reader) == b""  # closed at once, unread
    writer.close()

    async def refused() -> bool:
        return a.transport.dropped["busy"] == 1

    await wait_until(refused, what="the connection past the cap to be counted")
    assert "m" not in states(a)
    assert a.transport.counters["streams_in"] == MAX_STREAMS_IN

    # Once they end (half a prefix each: truncated), connections are read again.
    for _reader, held_writer in held:
        held_writer.close()

    async def released() -> bool:
        return a.transport.dropped["truncated"] == MAX_STREAMS_IN

    await wait_until(released, what="the held connections to end")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(FRAME.pack(len(valid)) + valid)
    await writer.drain()
    await read_to_the_end(reader)
    writer.close()
    assert "m" in states(a)
    assert counted_once(a)


async def test_push_pull_sends_past_the_cap_are_dropped_and_counted(start) -> None:  # type: ignore[no-untyped-def]
    a = await start("a")
    frames = 0

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal frames
        with contextlib.suppress(Exception):
            (length,) = FRAME.unpack(await reader.readexactly(FRAME.size))
            await reader.readexactly(length)
            frames += 1
        writer.close()

    server = await asyncio.start_server(sink, "127.0.0.1", 0)
    try:
        destination = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        packet = exchange("a", a.address, "a")
        for _ in range(MAX_STREAMS_OUT + 3):
            a.transport.send(destination, packet, reliable=True)
        # Counted when asked: the cap is on sends begun and not yet ended.
        assert a.transport.counters["streams_out_busy"] == 3

        async def sent() -> bool:
            return a.transport.counters["streams_out"] == MAX_STREAMS_OUT and frames == 8

        await wait_until(sent, what="the sends within the cap to arrive")
        a.transport.send(destination, packet, reliable=True)  # a slot is free again

        async def one_more() -> bool:
            return frames == MAX_STREAMS_OUT + 1

        await wait_until(one_more, what="a send after the others ended")
        assert a.transport.counters["streams_out_busy"] == 3
    finally:
        server.close()
        await server.wait_closed()


def joining(member: str, port: int, clock: Callable[[], float], *, seed: int) -> Membership:
    """A node joining through the seed 127.0.0.1:7001, driven by hand."""
    membership = Membership(
        member,
        bind=("127.0.0.1", 0),
        advertise_host="127.0.0.1",
        config=FAST,
        seeds=["127.0.0.1:7001"],
        clock=clock,
    )
    membership.swim = Swim(member, f"127.0.0.1:{port}", FAST, now=clock(), rng=random.Random(seed))
    membership._started_at = clock()
    return membership


def test_joined_counts_only_a_member_that_answered_our_probe() -> None:
    """A forged Alive made a joining node believe it had company: it then
    placed only itself for a moment and took every free bucket."""
    now = 0.0
    membership = joining("a", 7000, lambda: now, seed=3)
    swim = membership.swim
    assert swim is not None
    swim.receive(Packet("b", (Alive("b", 1, "127.0.0.1:7001"),)), now)
    assert swim.state_of("b") == State.ALIVE
    assert not membership.joined

    # Our probe of b, and b's ack.
    pings: list[Ping] = []
    while not pings:
        now = swim.next_deadline()
        swim.tick(now)
        pings = [m for o in swim.drain()[0] for m in o.packet.messages if isinstance(m, Ping)]
    swim.receive(Packet("b", (Ack(pings[0].seq, "b"),)), now)
    assert membership.joined

    # Nobody answering at all: after JOIN_PATIENCE we are the first member up.
    alone = joining("c", 7002, lambda: now, seed=4)
    assert alone.swim is not None
    alone.swim.receive(Packet("b", (Alive("ghost", 1, "127.0.0.1:7003"),)), now)
    assert not alone.joined
    now += JOIN_PATIENCE
    assert alone.joined
