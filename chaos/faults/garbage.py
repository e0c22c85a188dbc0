"""Hostile input for a node's gossip port (the ``garbage-gossip`` step).

``Garbage`` makes datagrams, each named by its mutation (``MUTATIONS``):

* random bytes, oversized datagrams, a wrong version byte;
* copies of valid packets (built with membership's own codec, signed with
  the run's cluster key) truncated, or with bits flipped after signing;
* unsigned packets, or signed with a key the cluster does not have;
* with the run's key, correctly signed packets whose msgpack is well formed
  but whose fields are not: ports 70000 and -1, integers past their range
  or negative, values of the wrong type, nesting 500 deep, strings longer
  than any field may be, unknown message types, wrong field counts, bad
  member ids and metadata, empty packets, trailing bytes, a map for a body.

With cluster keys most garbage fails the MAC and is dropped before decoding;
the signed malformed packets are what reach the decoder's field checks.
Every datagram is meant to be dropped: a random mutation that happens to
decode (a bit flip in an unsigned packet's sequence number is still a ping)
is made again, so what the node receives is garbage by its own codec.

``STREAM_ABUSES`` are done over TCP to the same port (the push-pull stream):
a length prefix past the limit, a frame shorter than its prefix, half a
prefix, a frame of garbage, and connections that send nothing (or one
byte) and wait for the node to give up on them.

``flood`` sends both for a while at a rate; ``dropped`` reads the node's
``scheduler_gossip_dropped_packets_total`` counters from its /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import random
import re
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from membership.codec import FLAG_MAC, VERSION, Codec, DecodeError
from membership.messages import (
    Ack,
    Alive,
    Dead,
    Message,
    Packet,
    Ping,
    PingReq,
    Suspect,
)

SENDER = "garbage"  # the id the hostile packets claim (a valid one)
MAX_DATAGRAM = 1400  # the nodes' codec limit for a datagram
FRAME = struct.Struct(">I")  # a push-pull frame's length prefix
STREAM_WAIT = 6.0  # past the node's stream timeout (5 s): it must give up first
STREAMS_PER_SECOND = 2.0

# Mutations that need no key; and those built from a key (signed), with
# the decoder's reason each one is dropped under when the node has that key.
RANDOM_MUTATIONS = ("random", "oversized", "bad_version", "truncated", "bitflip")
KEYED_MUTATIONS = ("unsigned", "wrong_key")
MALFORMED = {
    "bad_port": "address",
    "negative_port": "address",
    "huge_int": "malformed",
    "negative_int": "malformed",
    "wrong_type": "malformed",
    "deep_nesting": "malformed",
    "oversized_string": "malformed",
    "unknown_message": "malformed",
    "bad_arity": "malformed",
    "bad_member_id": "malformed",
    "bad_meta": "malformed",
    "bad_state": "malformed",
    "empty_packet": "malformed",
    "trailing_bytes": "malformed",
    "map_body": "malformed",
}
MUTATIONS = (*RANDOM_MUTATIONS, *KEYED_MUTATIONS, *MALFORMED)
MALFORMED_SHARE = 1 / 3
STREAM_ABUSES = ("huge_length", "short_frame", "partial_header", "garbage_frame", "idle")

_DROPPED = re.compile(
    r'^scheduler_gossip_dropped_packets_total\{reason="([^"]+)"\}\s+([0-9.eE+-]+)\s*$', re.M
)


def dropped(metrics: str) -> dict[str, float]:
    """Gossip packets the node dropped so far, by reason, from /metrics."""
    return {reason: float(value) for reason, value in _DROPPED.findall(metrics)}


class Garbage:
    """Hostile packets for one target. ``keys``: the cluster's keys (the first
    signs, as the nodes do); empty when gossip is not signed."""

    def __init__(
        self,
        rng: random.Random,
        keys: Sequence[bytes],
        *,
        target: str,
        target_address: str,
        peers: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.rng = rng
        self.keys = tuple(keys)
        self.codec = Codec(self.keys)  # what the target decodes with
        self.target = target
        self.target_address = target_address
        # (id, address) of real members: valid packets look like theirs.
        self.peers = list(peers) or [(SENDER, "127.0.0.1:7946")]
        self.regenerated = 0  # random mutations that decoded and were made again

    # -- what a valid packet looks like --------------------------------------

    def valid(self) -> bytes:
        """A packet the target would accept: signed with the cluster's key."""
        return self.codec.encode(self._packet())

    def _packet(self) -> Packet:
        rng = self.rng
        peer, address = rng.choice(self.peers)
        seq = rng.randrange(1 << 30)
        incarnation = rng.randrange(1 << 20)
        # No PushPull: a datagram holding one is dropped ("channel"), as it
        # travels on the stream alone.
        messages: list[Message] = [
            Ping(seq, self.target, peer, address),
            PingReq(seq, self.target, self.target_address, peer, address, True),
            Ack(seq, peer),
            Alive(peer, incarnation, address, (("http", address),)),
            Suspect(peer, incarnation, SENDER),
            Dead(peer, incarnation, SENDER),
        ]
        return Packet(peer, (rng.choice(messages),))

    def _sign(self, body: bytes, key: bytes | None = None) -> bytes:
        """``body`` (msgpack) as the codec frames it, signed with ``key``
        (default: the cluster's first key; unsigned when there is none)."""
        key = key if key is not None else (self.keys[0] if self.keys else None)
        if key is None:
            return bytes((VERSION, 0)) + body
        header = bytes((VERSION, FLAG_MAC))
        return header + hmac.new(key, header + body, hashlib.sha256).digest() + body

    def _body(self, messages: list[Any], sender: Any = SENDER) -> bytes:
        packed: bytes = msgpack.packb([sender, messages])
        return packed

    # -- the mutations ---------------------------------------------------------

    def datagram(self) -> tuple[str, bytes]:
        """A mutation chosen at random, and its bytes: two in three are noise
        (which a keyed node drops at the MAC check), one in three a signed
        packet with a malformed field (which reaches its decoder)."""
        if self.rng.random() < MALFORMED_SHARE:
            name = self.rng.choice(list(MALFORMED))
        else:
            name = self.rng.choice(
                [
                    m
                    for m in (*RANDOM_MUTATIONS, *KEYED_MUTATIONS)
                    if self.keys or m in RANDOM_MUTATIONS
                ]
            )
        return name, self.make(name)

    def make(self, name: str) -> bytes:
        if name in RANDOM_MUTATIONS:
            # A random change can leave a packet valid: make it again.
            for _ in range(20):
                data = self._random(name)
                if not self.accepted(data):
                    return data
                self.regenerated += 1
            return self.rng.randbytes(1) if name != "oversized" else self._random(name)
        if name == "unsigned":
            return Codec().encode(self._packet())
        if name == "wrong_key":
            other = bytes(b ^ 0x5A for b in (self.keys[0] if self.keys else b"k" * 32))
            return Codec([other]).encode(self._packet())
        return self._sign(self._malformed(name))

    def accepted(self, data: bytes) -> bool:
        """True when the target's codec would take ``data`` as a packet."""
        try:
            self.codec.decode(data)
        except DecodeError:
            return False
        return True

    def _random(self, name: str) -> bytes:
        rng = self.rng
        if name == "random":
            data = rng.randbytes(rng.randint(0, MAX_DATAGRAM))
            if rng.random() < 0.5:  # past the version check, half the time
                data = bytes((VERSION, rng.choice([0, FLAG_MAC]))) + data[2:]
            return data
        if name == "oversized":
            return rng.randbytes(rng.randint(MAX_DATAGRAM + 1, 8000))
        valid = self.valid()
        if name == "bad_version":
            return bytes((rng.choice([0, 2, 7, 255]),)) + valid[1:]
        if name == "truncated":
            return valid[: rng.randint(0, len(valid) - 1)]
        flipped = bytearray(valid)  # bitflip: after signing, so the MAC no longer fits
        for _ in range(rng.randint(1, 8)):
            spot = rng.randrange(len(flipped) * 8)
            flipped[spot // 8] ^= 1 << (spot % 8)
        return bytes(flipped)

    def _malformed(self, name: str) -> bytes:
        """The msgpack body of a well-formed packet whose fields are not."""
        rng = self.rng
        address = rng.choice(self.peers)[1]
        host = address.rpartition(":")[0] or "127.0.0.1"
        seq = rng.randrange(1 << 30)
        build: dict[str, Callable[[], bytes]] = {
            # Ping [1, seq, target, source, source address]
            "bad_port": lambda: self._body(
                [[1, seq, self.target, SENDER, f"{host}:{rng.choice([70000, 65536, 99999])}"]]
            ),
            "negative_port": lambda: self._body([[1, seq, self.target, SENDER, f"{host}:-1"]]),
            "huge_int": lambda: self._body(
                [[1, rng.choice([2**64 - 1, 2**63, 2**62]), self.target, SENDER, address]]
            ),
            # Alive [5, member, incarnation, address, meta]
            "negative_int": lambda: self._body([[5, SENDER, -1, address, []]]),
            "wrong_type": lambda: self._body(
                [
                    rng.choice(
                        [
                            [1, "seq", self.target, SENDER, address],
                            [1, seq, 12345, SENDER, address],
                            [5, SENDER, 1.5, address, []],
                            [5, SENDER, 1, 7946, []],
                            [2, seq, self.target, address, SENDER, address, "yes"],
                        ]
                    )
                ]
            ),
            "deep_nesting": lambda: self._body([[5, SENDER, 1, address, _nested(500)]]),
            "oversized_string": lambda: self._body([[3, seq, "x" * rng.randint(1100, 1300)]]),
            "unknown_message": lambda: self._body(
                [[rng.choice([0, 9, 99, -1, 2**32]), seq, SENDER]]
            ),
            "bad_arity": lambda: self._body(
                [rng.choice([[1, seq], [3, seq, SENDER, SENDER], [1], []])]
            ),
            "bad_member_id": lambda: self._body(
                [[3, seq, rng.choice(["", "two words", "ünïcode", "a/b", "x" * 65])]]
            ),
            "bad_meta": lambda: self._body(
                [
                    [
                        5,
                        SENDER,
                        1,
                        address,
                        rng.choice([[[1, 2]], [["k"]], [["k", "v"]] * 2, [["k", "\x00"]], {}]),
                    ]
                ]
            ),
            # PushPull [8, source, address, [[member, address, inc, state, meta]], join, reply]
            "bad_state": lambda: self._body(
                [
                    [
                        8,
                        SENDER,
                        address,
                        [[SENDER, address, 1, rng.choice([4, 9, -1]), []]],
                        False,
                        True,
                    ]
                ]
            ),
            "empty_packet": lambda: self._body([]),
            "trailing_bytes": lambda: self._body([[3, seq, SENDER]]) + rng.randbytes(4),
            "map_body": lambda: bytes(msgpack.packb({"sender": SENDER, "messages": []})),
        }
        return build[name]()

    # -- the push-pull stream ----------------------------------------------------

    def stream(self, abuse: str) -> tuple[bytes, float]:
        """What one abusive connection sends, and how long it then stays open."""
        if abuse == "huge_length":
            return FRAME.pack(0xFFFFFFFF), 0.0
        if abuse == "short_frame":
            return FRAME.pack(1000) + self.rng.randbytes(10), 0.0
        if abuse == "partial_header":
            return b"\x00\x00", 0.0
        if abuse == "garbage_frame":
            data = self.datagram()[1]
            return FRAME.pack(len(data)) + data, 0.0
        return self.rng.choice([b"", b"\x00"]), STREAM_WAIT  # idle


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


async def flood(
    garbage: Garbage, host: str, port: int, seconds: float, rate: float
) -> dict[str, Counter[str]]:
    """Send datagrams at ``rate`` a second to host:port, and abusive streams
    to its TCP port a few times a second, for ``seconds``. Returns what was
    sent: datagrams by mutation, streams by abuse (and those that could not
    connect)."""
    sent: Counter[str] = Counter()
    streams: Counter[str] = Counter()
    tasks: list[asyncio.Task[None]] = []
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    began = time.monotonic()
    next_stream = began
    count = 0
    try:
        while (now := time.monotonic()) < began + seconds:
            name, data = garbage.datagram()
            try:
                sock.sendto(data, (host, port))
                sent[name] += 1
            except OSError as exc:  # a full buffer, or the route is gone
                sent[f"send error {type(exc).__name__}"] += 1
            if now >= next_stream:
                abuse = STREAM_ABUSES[len(tasks) % len(STREAM_ABUSES)]
                tasks.append(asyncio.create_task(_abuse(garbage, host, port, abuse, streams)))
                next_stream += 1 / STREAMS_PER_SECOND
            count += 1
            await asyncio.sleep(max(0.0, began + count / rate - time.monotonic()))
        await asyncio.gather(*tasks)
    finally:
        sock.close()
        for task in tasks:
            task.cancel()
    return {"datagrams": sent, "streams": streams}


async def _abuse(garbage: Garbage, host: str, port: int, abuse: str, streams: Counter[str]) -> None:
    data, wait = garbage.stream(abuse)
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 3)
    except (OSError, TimeoutError):
        streams[f"{abuse} (no connection)"] += 1
        return
    try:
        writer.write(data)
        await asyncio.wait_for(writer.drain(), 3)
        streams[abuse] += 1
        if wait:
            await asyncio.sleep(wait)
    except (OSError, TimeoutError):
        streams[f"{abuse} (cut short)"] += 1
    finally:
        writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), 3)
