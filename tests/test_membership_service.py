"""The Membership service over real UDP and TCP sockets, in one process."""

from __future__ import annotations

import random
import socket
from collections.abc import AsyncIterator, Callable

import pytest

from membership.config import FAST
from membership.messages import Event, EventKind, State
from membership.service import Membership, resolve_seeds
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
