"""The Membership service over real UDP and TCP sockets, in one process."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from membership.codec import Codec, DecodeError
from membership.config import FAST
from membership.messages import (
    Ack,
    Event,
    EventKind,
    MemberRecord,
    Packet,
    Ping,
    PushPull,
    State,
)
from membership.service import Membership, resolve_seeds
from membership.transport import FRAME
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
