"""membership.codec: round trips, cluster keys, and every reason to drop a packet.

Hostile input must end in ``DecodeError`` with a reason the transport can
count; the fuzz tests below are seeded, so a failure replays exactly.
"""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest

import membership.codec
from membership.address import AddressError, is_address, parse_address
from membership.codec import (
    HEADER_BYTES,
    MAC_BYTES,
    MAX_STR_BYTES,
    MAX_STREAM_BYTES,
    STREAM_BYTES_PER_MEMBER,
    VERSION,
    Codec,
    DecodeError,
    envelope_size,
    is_member_id,
    is_meta,
    message_size,
)
from membership.config import SwimConfig
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

KEY = bytes(range(32))
OLD_KEY = b"o" * 16
NEW_KEY = b"n" * 24
OTHER_KEY = b"x" * 32
REASONS = {"too_large", "truncated", "version", "mac", "malformed", "address", "channel"}
BIG = MAX_INCARNATION

MESSAGES: list[Message] = [
    Ping(0, "b", "a", "10.0.0.1:7946"),
    Ping(MAX_SEQ, "node-b.2_x", "a", "[::1]:7946"),
    PingReq(17, "c", "10.0.0.3:7946", "a", "10.0.0.1:7946", True),
    PingReq(18, "c", "10.0.0.3:7946", "a", "10.0.0.1:7946", False),
    Ack(17, "c"),
    Nack(2**40, "b"),
    Alive("b", 3, "10.0.0.2:7946"),
    Alive("b", BIG, "10.0.0.2:7946", (("zone", "eu-1"), ("role", ""))),
    Suspect("c", 4, "a"),
    Dead("c", 5, "b"),
    Dead("c", 5, "c"),
    PushPull("a", "10.0.0.1:7946", (), True, False),
    PushPull(
        "a",
        "10.0.0.1:7946",
        tuple(
            MemberRecord(f"m{i}", f"10.0.1.{i}:7946", i, state, (("k", str(i)),) if i % 2 else ())
            for i, state in enumerate(State)
        ),
        False,
        True,
    ),
]


def body(sender: Any, messages: Any) -> bytes:
    """An unsigned datagram with an arbitrary (possibly invalid) msgpack body."""
    packed: bytes = msgpack.packb([sender, messages])
    return bytes((VERSION, 0)) + packed


def reason(codec: Codec, data: bytes, *, stream: bool = False) -> str:
    with pytest.raises(DecodeError) as caught:
        codec.decode(data, stream=stream)
    return caught.value.reason


# -- round trips ------------------------------------------------------------------------


@pytest.mark.parametrize("keys", [(), (KEY,)], ids=["plain", "signed"])
@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(message: Message, keys: tuple[bytes, ...]) -> None:
    codec = Codec(keys)
    packet = Packet("a", (message,))
    data = codec.encode(packet)
    assert data[0] == VERSION
    assert data[1] == (1 if keys else 0)
    # A push-pull travels on the stream channel, everything else in datagrams.
    decoded = codec.decode(data, stream=isinstance(message, PushPull))
    assert decoded == packet
    assert type(decoded.messages[0]) is type(message)


def test_a_packet_with_many_messages_round_trips_in_order() -> None:
    codec = Codec([KEY], max_bytes=4096)
    packet = Packet("sender", tuple(m for m in MESSAGES if not isinstance(m, PushPull)))
    assert codec.decode(codec.encode(packet)) == packet
    # The signature costs exactly the MAC.
    assert len(codec.encode(packet)) == len(Codec().encode(packet)) + MAC_BYTES


def test_message_and_envelope_sizes_bound_the_encoded_packet() -> None:
    """The state machine packs piggybacks with these sizes; they must not undercount."""
    codec = Codec([KEY])
    rng = random.Random(5)
    for count in (1, 2, 15, 16, 17, 40):
        messages = tuple(rng.choice(MESSAGES[:11]) for _ in range(count))
        packet = Packet("some-sender", messages)
        budget = envelope_size("some-sender") + sum(message_size(m) for m in messages)
        assert len(codec.encode(packet)) <= budget
        assert len(codec.encode(packet)) >= budget - 4  # and not wildly overcount


def test_keys_must_have_aes_lengths() -> None:
    for bad in (b"", b"k" * 15, b"k" * 33):
        with pytest.raises(ValueError):
            Codec([bad])
    Codec([b"k" * 16, b"k" * 24, b"k" * 32])


# -- cluster keys --------------------------------------------------------------------


PACKET = Packet("a", (Ping(1, "b", "a", "a:7946"), Suspect("c", 2, "a")))


def test_key_rotation_accepts_any_configured_key_and_signs_with_the_first() -> None:
    old = Codec([OLD_KEY])
    rotating = Codec([NEW_KEY, OLD_KEY])
    new = Codec([NEW_KEY])

    # Step 1: members with [new, old] accept what the not yet rotated ones send.
    assert rotating.decode(old.encode(PACKET)) == PACKET
    # They sign with the new key: only members that know it accept.
    assert new.decode(rotating.encode(PACKET)) == PACKET
    assert reason(old, rotating.encode(PACKET)) == "mac"
    # Once the old key is dropped, its packets are rejected.
    assert reason(new, old.encode(PACKET)) == "mac"
    # Accepting under the second key also works for the older order.
    assert Codec([OLD_KEY, NEW_KEY]).decode(new.encode(PACKET)) == PACKET


def test_unrelated_key_is_rejected() -> None:
    assert reason(Codec([OTHER_KEY]), Codec([KEY]).encode(PACKET)) == "mac"


def test_unsigned_packet_is_rejected_when_keys_are_configured() -> None:
    plain = Codec().encode(PACKET)
    assert reason(Codec([KEY]), plain) == "mac"
    # Claiming a signature it does not carry does not help either.
    forged = bytes((VERSION, 1)) + plain[HEADER_BYTES:]
    assert reason(Codec([KEY]), forged) == "mac"
    assert reason(Codec([KEY]), bytes((VERSION, 1)) + b"\x00" * (MAC_BYTES - 1)) == "mac"


def test_signed_packet_is_rejected_without_keys() -> None:
    assert reason(Codec(), Codec([KEY]).encode(PACKET)) == "mac"


def test_any_change_to_a_signed_packet_is_rejected() -> None:
    codec = Codec([KEY])
    data = codec.encode(PACKET)
    for index in range(HEADER_BYTES, len(data)):
        changed = bytearray(data)
        changed[index] ^= 0x01
        assert reason(codec, bytes(changed)) == "mac", index


# -- every drop reason from a crafted input ----------------------------------------------


def test_too_large() -> None:
    codec = Codec(max_bytes=300)
    records = tuple(MemberRecord(f"m{i}", f"m{i}:7946", i, State.ALIVE) for i in range(50))
    data = codec.encode(Packet("a", (PushPull("a", "a:7946", records, False, False),)))
    assert len(data) > 300
    assert reason(codec, data) == "too_large"
    assert reason(codec, b"\x01\x00" + b"\x00" * 299) == "too_large"
    # The stream channel carries a whole cluster's state.
    assert codec.decode(data, stream=True).messages[0] == PushPull(
        "a", "a:7946", records, False, False
    )
    # Exactly at the limit is still fine.
    small = codec.encode(PACKET)
    assert Codec(max_bytes=len(small)).decode(small) == PACKET


@pytest.mark.parametrize("cut", [0, 1, 2, 3, 5, -1])
def test_truncated(cut: int) -> None:
    data = Codec().encode(PACKET)
    assert reason(Codec(), data[:cut]) == "truncated"


def test_truncated_signed_packet_fails_its_mac() -> None:
    data = Codec([KEY]).encode(PACKET)
    assert reason(Codec([KEY]), data[:-1]) == "mac"
    assert reason(Codec([KEY]), data[:1]) == "truncated"


@pytest.mark.parametrize("version", [0, 2, 255])
def test_version(version: int) -> None:
    data = bytearray(Codec().encode(PACKET))
    data[0] = version
    assert reason(Codec(), bytes(data)) == "version"
    assert reason(Codec([KEY]), bytes(data)) == "version"


# -- channels and stream frames ------------------------------------------------------------

EXCHANGE = PushPull("a", "10.0.0.1:7946", (), False, False)


@pytest.mark.parametrize("keys", [(), (KEY,)], ids=["plain", "signed"])
def test_a_push_pull_travels_only_on_the_stream(keys: tuple[bytes, ...]) -> None:
    """One datagram holding a PushPull made a node open a TCP connection to
    any address the datagram named; and a stream frame carries one push-pull,
    nothing else (the sender sends exactly that)."""
    codec = Codec(keys)
    alone = Packet("a", (EXCHANGE,))
    assert codec.decode(codec.encode(alone), stream=True) == alone
    assert reason(codec, codec.encode(alone)) == "channel"
    behind_a_ping = Packet("a", (Ping(1, "b", "a", "a:7946"), EXCHANGE))
    assert reason(codec, codec.encode(behind_a_ping)) == "channel"
    for packet in (
        PACKET,
        behind_a_ping,
        Packet("a", (EXCHANGE, Alive("b", 1, "10.0.0.2:7946"))),
        Packet("a", (EXCHANGE, EXCHANGE)),
    ):
        assert reason(codec, codec.encode(packet), stream=True) == "channel"


@pytest.mark.parametrize("keys", [(), (KEY,)], ids=["plain", "signed"])
@pytest.mark.parametrize(
    "header", [b"", b"\x01", b"\x01\x00", b"\x01\x01", b"\x01\x03", b"\x02\x00", b"\x00\x01"]
)
def test_a_frame_header_is_judged_alone_as_decode_judges_it(
    header: bytes, keys: tuple[bytes, ...]
) -> None:
    """The transport refuses a stream frame on its first two bytes, before it
    reads a body of up to MAX_STREAM_BYTES: for the same reason decode would."""
    codec = Codec(keys)
    whole = header + Codec(keys).encode(Packet("a", (EXCHANGE,)))[HEADER_BYTES:]
    try:
        codec.check_header(header)
    except DecodeError as exc:
        assert reason(codec, whole if len(header) == HEADER_BYTES else header) == exc.reason
    else:
        assert len(header) == HEADER_BYTES and header[0] == VERSION
        assert bool(header[1] & 1) == bool(keys)


def test_a_full_member_table_fits_one_stream_frame() -> None:
    """MAX_STREAM_BYTES is SwimConfig.max_members records of
    STREAM_BYTES_PER_MEMBER: that bound must hold a node's record with room."""
    node_record = MemberRecord(
        "scheduler-7d9f8c6b5-x2k4p",
        "10.244.12.201:7946",
        1_735_689_600,
        State.SUSPECT,
        (("http", "10.244.12.201:8080"), ("placement", "3"), ("store", "cut"), ("broker", "cut")),
    )
    cost = message_size(PushPull("a", "10.0.0.1:7946", (node_record,), False, False)) - (
        message_size(EXCHANGE)
    )
    assert cost <= STREAM_BYTES_PER_MEMBER / 8
    meta = (("http", "10.0.0.1:8080"), ("placement", "3"))
    table = tuple(
        MemberRecord(
            f"m{i:04d}-" + "x" * 58,
            f"10.{i >> 8}.{i & 255}.1:7946",
            MAX_INCARNATION,
            State.ALIVE,
            meta,
        )
        for i in range(SwimConfig().max_members)
    )
    exchange = PushPull("m0000", "10.0.0.1:7946", table, False, False)
    data = Codec([KEY]).encode(Packet("m0000", (exchange,)))
    assert len(data) <= MAX_STREAM_BYTES == SwimConfig().max_members * STREAM_BYTES_PER_MEMBER
    assert Codec([KEY]).decode(data, stream=True).messages == (exchange,)


PING_FIELDS: list[Any] = [1, 5, "b", "a", "a:7946"]
ALIVE_FIELDS: list[Any] = [5, "b", 1, "b:7946", []]
RECORD: list[Any] = ["b", "b:7946", 1, 0, []]


def with_field(fields: list[Any], index: int, value: Any) -> list[Any]:
    changed = list(fields)
    changed[index] = value
    return changed


@pytest.mark.parametrize(
    "messages",
    [
        # wrong arity
        [PING_FIELDS[:-1]],
        [[*PING_FIELDS, "extra"]],
        [[3, 1]],
        [[8, "a", "a:7946", [], False]],
        # wrong field types
        [with_field(PING_FIELDS, 1, "5")],
        [with_field(PING_FIELDS, 1, True)],
        [with_field(PING_FIELDS, 1, -1)],
        [with_field(PING_FIELDS, 1, 2**63)],
        [with_field(PING_FIELDS, 1, 1.5)],
        [with_field(PING_FIELDS, 1, None)],
        [with_field(PING_FIELDS, 2, 7)],
        [with_field(PING_FIELDS, 2, ["b"])],
        [with_field(PING_FIELDS, 2, "x" * 513)],
        [with_field(PING_FIELDS, 2, b"b")],
        [[2, 1, "c", "c:7946", "a", "a:7946", 1]],  # nack must be a boolean
        [[3, 1, 2]],
        [with_field(ALIVE_FIELDS, 4, {})],
        [with_field(ALIVE_FIELDS, 4, "zone=eu")],
        [with_field(ALIVE_FIELDS, 4, [["zone"]])],
        [with_field(ALIVE_FIELDS, 4, [["zone", "eu", "x"]])],
        [with_field(ALIVE_FIELDS, 4, [["zone", 1]])],
        [with_field(ALIVE_FIELDS, 4, [["k", "v"]] * 33)],
        [[6, "c", 1.0, "a"]],
        [[7, "c", 1, None]],
        [[8, "a", "a:7946", "not records", False, False]],
        [[8, "a", "a:7946", [RECORD[:-1]], False, False]],
        [[8, "a", "a:7946", [with_field(RECORD, 2, "1")], False, False]],
        [[8, "a", "a:7946", [RECORD], 0, False]],
        # unknown state values
        [[8, "a", "a:7946", [with_field(RECORD, 3, 4)], False, False]],
        [[8, "a", "a:7946", [with_field(RECORD, 3, -1)], False, False]],
        [[8, "a", "a:7946", [with_field(RECORD, 3, "alive")], False, False]],
        # unknown message codes
        [with_field(PING_FIELDS, 0, 0)],
        [with_field(PING_FIELDS, 0, 9)],
        [with_field(PING_FIELDS, 0, 255)],
        [with_field(PING_FIELDS, 0, "1")],
        [with_field(PING_FIELDS, 0, None)],
        [with_field(PING_FIELDS, 0, True)],  # a boolean is not the code 1
        # not messages at all
        [[]],
        ["ping"],
        [5],
        [PING_FIELDS, 5],
        # the empty message list
        [],
    ],
)
def test_malformed_messages(messages: Any) -> None:
    assert reason(Codec(), body("a", messages)) == "malformed"


@pytest.mark.parametrize(
    "data",
    [
        body(5, [PING_FIELDS]),  # the sender must be a string
        body(None, [PING_FIELDS]),
        body("a", "not a list"),
        body("a", {"m": 1}),
        bytes((VERSION, 0)) + msgpack.packb(["a"]),
        bytes((VERSION, 0)) + msgpack.packb(["a", [PING_FIELDS], "x"]),
        bytes((VERSION, 0)) + msgpack.packb("a"),
        bytes((VERSION, 0)) + msgpack.packb(None),
        bytes((VERSION, 0)) + msgpack.packb(b"raw bytes"),
        bytes((VERSION, 0)) + msgpack.packb(msgpack.ExtType(1, b"x")),
        bytes((VERSION, 0)) + b"\xc1",  # a byte msgpack never uses
        bytes((VERSION, 0)) + b"\x91" * 2000 + b"\xc0",  # nested past any sane depth
    ],
    ids=lambda d: d[2:12].hex(),
)
def test_malformed_envelopes(data: bytes) -> None:
    assert reason(Codec(max_bytes=4096), data) == "malformed"


def test_trailing_bytes_are_malformed() -> None:
    data = Codec().encode(PACKET)
    assert reason(Codec(), data + b"\x00") == "malformed"
    assert reason(Codec(), data + Codec().encode(PACKET)[HEADER_BYTES:]) == "malformed"
    # Under a MAC the extra bytes are part of what was signed.
    signed = Codec([KEY]).encode(PACKET)
    assert reason(Codec([KEY]), signed + b"\x00") == "mac"


def test_each_well_formed_body_still_decodes() -> None:
    """The crafted cases above differ from these by the one broken field."""
    valid: list[list[Any]] = [
        PING_FIELDS,
        ALIVE_FIELDS,
        with_field(ALIVE_FIELDS, 4, [[f"k{i}", "eu"] for i in range(32)]),
        [2, 1, "c", "c:7946", "a", "a:7946", True],
        [8, "a", "a:7946", [RECORD, with_field(RECORD, 3, 3)], False, False],
        with_field(PING_FIELDS, 1, MAX_SEQ),
        with_field(PING_FIELDS, 2, "x" * 64),
    ]
    for fields in valid:
        assert len(Codec().decode(body("a", [fields]), stream=fields[0] == 8).messages) == 1


# -- values from the wire: addresses, ids, metadata, numbers ----------------------------

GOOD_ADDRESSES = {
    "10.0.0.1:7946": ("10.0.0.1", 7946, 4),
    "127.0.0.1:1": ("127.0.0.1", 1, 4),
    "192.168.1.255:65535": ("192.168.1.255", 65535, 4),
    "[::1]:7946": ("::1", 7946, 6),
    "[2001:db8::7]:80": ("2001:db8::7", 80, 6),
    "[::ffff:10.0.0.1]:7946": ("::ffff:10.0.0.1", 7946, 6),
    "a:7946": ("a", 7946, None),
    "scheduler-1:7946": ("scheduler-1", 7946, None),
    "pod-0.scheduler.default.svc.cluster.local:7946": (
        "pod-0.scheduler.default.svc.cluster.local",
        7946,
        None,
    ),
    "x" * 63 + ".example:1": ("x" * 63 + ".example", 1, None),
    "a1.2b:7946": ("a1.2b", 7946, None),
    ".".join(["a" * 63] * 3 + ["b" * 61]) + ":7946": (
        ".".join(["a" * 63] * 3 + ["b" * 61]),
        7946,
        None,
    ),
}

BAD_ADDRESSES = [
    # ports out of range, or not plain ASCII digits
    "10.0.0.1:70000",
    "10.0.0.1:65536",
    "10.0.0.1:0",
    "10.0.0.1:-1",
    "10.0.0.1:" + "9" * 40,
    "10.0.0.1:07946",
    "10.0.0.1:+80",
    "10.0.0.1: 80",
    "10.0.0.1:80 ",
    "10.0.0.1:8_0",
    "10.0.0.1:\u0663\u0663",
    "10.0.0.1:80\n",
    "10.0.0.1:0x50",
    # no port, no host, no colon
    "10.0.0.1",
    "10.0.0.1:",
    ":7946",
    "",
    ":",
    # IPv6 must be bracketed and zone-free; brackets are for IPv6 only
    "::1:7946",
    "[::1]",
    "[::1:7946",
    "::1]:7946",
    "[fe80::1%eth0]:7946",
    "[127.0.0.1]:7946",
    "[example]:7946",
    "[]:7946",
    # IPv4 that is not, or names no single member
    "300.1.1.1:7946",
    "1.2.3:7946",
    "01.2.3.4:7946",
    "1.2.3.4.5:7946",
    "0.0.0.0:7946",
    "224.0.0.1:7946",
    "255.255.255.255:7946",
    "[::]:7946",
    "[ff02::1]:7946",
    # host names outside RFC 1123
    "-bad:7946",
    "bad-:7946",
    "a..b:7946",
    ".a:7946",
    "a.:7946",
    "under_score:7946",
    "host name:7946",
    "host\x00:7946",
    "n\u0153ud:7946",
    "a" * 64 + ".example:7946",
    "a." * 127 + "b:7946",
    "x" * 300,
]


@pytest.mark.parametrize("text", sorted(GOOD_ADDRESSES))
def test_valid_addresses_parse(text: str) -> None:
    host, port, version = GOOD_ADDRESSES[text]
    parsed = parse_address(text)
    assert (parsed.host, parsed.port) == (host, port)
    assert (parsed.ip.version if parsed.ip else None) == version


@pytest.mark.parametrize("text", BAD_ADDRESSES, ids=repr)
def test_invalid_addresses_do_not_parse(text: str) -> None:
    with pytest.raises(AddressError):
        parse_address(text)
    assert not is_address(text)


@pytest.mark.parametrize("value", [7946, None, b"10.0.0.1:7946", ["10.0.0.1", 7946]])
def test_an_address_is_a_string(value: Any) -> None:
    with pytest.raises(AddressError):
        parse_address(value)


def addressed_bodies(address: Any) -> list[list[Any]]:
    """One message of every type that carries an address, with ``address`` in it."""
    good = "10.0.0.1:7946"
    return [
        [1, 5, "b", "a", address],  # Ping: the source's address
        [2, 5, "c", address, "a", good, True],  # PingReq: the target's ...
        [2, 5, "c", good, "a", address, True],  # ... and the requester's
        [5, "b", 1, address, []],  # Alive
        [8, "a", address, [], False, False],  # PushPull: the sender's ...
        [8, "a", good, [["b", address, 1, 0, []]], False, False],  # ... and each record's
    ]


@pytest.mark.parametrize("address", BAD_ADDRESSES, ids=repr)
def test_a_bad_address_in_any_message_is_dropped_as_address(address: str) -> None:
    for fields in addressed_bodies(address):
        assert reason(Codec(), body("a", [fields])) == "address", fields
        # As a piggyback behind a good message, and on the stream channel too.
        assert reason(Codec(), body("a", [PING_FIELDS, fields]), stream=True) == "address"


@pytest.mark.parametrize("address", [70000, -1, None, 1.5, ["10.0.0.1", 7946], True])
def test_an_address_of_the_wrong_type_is_malformed(address: Any) -> None:
    for fields in addressed_bodies(address):
        assert reason(Codec(), body("a", [fields])) == "malformed", fields


@pytest.mark.parametrize("address", sorted(GOOD_ADDRESSES))
def test_every_valid_address_is_accepted_everywhere(address: str) -> None:
    for fields in addressed_bodies(address):
        assert len(Codec().decode(body("a", [fields]), stream=fields[0] == 8).messages) == 1


def test_a_ping_with_port_70000_is_dropped_signed_or_not() -> None:
    """Issue 17: this packet used to close the receiver's UDP socket."""
    forged = Packet("mallory", (Ping(1, "b", "mallory", "127.0.0.1:70000"),))
    assert reason(Codec(), Codec().encode(forged)) == "address"
    # A member that holds the key is no more trusted with a bad address.
    assert reason(Codec([KEY]), Codec([KEY]).encode(forged)) == "address"


BAD_IDS = ["", "x" * 65, "bad id", "a/b", "a:b", "\x00", "\n", "n\u0153ud", "\u0661"]
GOOD_IDS = ["a", "x" * 64, "node-1", "scheduler-0.scheduler", "A_b.c-9", "-", "..."]


def id_bodies(member: Any) -> list[list[Any]]:
    """One message of every type, with ``member`` in each place an id goes."""
    good = "10.0.0.1:7946"
    return [
        [1, 5, member, "a", good],  # Ping: the target ...
        [1, 5, "b", member, good],  # ... and the source
        [2, 5, member, good, "a", good, True],
        [2, 5, "c", good, member, good, True],
        [3, 5, member],
        [4, 5, member],
        [5, member, 1, good, []],
        [6, member, 1, "a"],
        [6, "c", 1, member],
        [7, member, 1, "a"],
        [7, "c", 1, member],
        [8, member, good, [], False, False],
        [8, "a", good, [[member, good, 1, 0, []]], False, False],
    ]


@pytest.mark.parametrize("member", BAD_IDS, ids=repr)
def test_a_bad_member_id_anywhere_is_malformed(member: str) -> None:
    assert not is_member_id(member)
    assert reason(Codec(), body(member, [PING_FIELDS])) == "malformed"  # the sender
    for fields in id_bodies(member):
        assert reason(Codec(), body("a", [fields])) == "malformed", fields


@pytest.mark.parametrize("member", GOOD_IDS)
def test_member_ids_like_node_ids_are_accepted(member: str) -> None:
    assert is_member_id(member)
    assert Codec().decode(body(member, [PING_FIELDS])).sender == member
    for fields in id_bodies(member):
        assert len(Codec().decode(body("a", [fields]), stream=fields[0] == 8).messages) == 1


@pytest.mark.parametrize("member", [7, None, ["a"], True])
def test_a_member_id_of_the_wrong_type_is_malformed(member: Any) -> None:
    for fields in id_bodies(member):
        assert reason(Codec(), body("a", [fields])) == "malformed", fields


BAD_META: list[Any] = [
    [["k", "v"]] * 2,  # the same key twice
    [[f"k{i}", "v"] for i in range(33)],  # too many pairs
    [["", "v"]],
    [["k" * 65, "v"]],
    [["a key", "v"]],
    [["k", "v" * 257]],
    [["k", "tab\there"]],
    [["k", "\x00"]],
    [["k", "\x7f"]],
    [["k", "caf\u00e9"]],
    [["k", 1]],
    [[1, "v"]],
    [["k"]],
    "k=v",
]
GOOD_META: list[Any] = [
    [],
    [["http", "10.0.0.1:8080"], ["placement", "2"]],
    [[f"k{i}", "v"] for i in range(32)],
    [["k", " !~" + "v" * 253]],  # printable ASCII, 256 characters
    [["k" * 64, ""]],
]


@pytest.mark.parametrize("meta", BAD_META, ids=lambda m: repr(m)[:40])
def test_bad_metadata_is_malformed_in_alive_and_in_records(meta: Any) -> None:
    assert not is_meta(meta)
    assert reason(Codec(), body("a", [[5, "b", 1, "10.0.0.2:7946", meta]])) == "malformed"
    record = ["b", "10.0.0.2:7946", 1, 0, meta]
    assert (
        reason(Codec(), body("a", [[8, "a", "10.0.0.1:7946", [record], False, False]]), stream=True)
        == "malformed"
    )


@pytest.mark.parametrize("meta", GOOD_META, ids=lambda m: repr(m)[:40])
def test_metadata_within_bounds_is_accepted(meta: Any) -> None:
    assert is_meta(meta)
    decoded = Codec().decode(body("a", [[5, "b", 1, "10.0.0.2:7946", meta]]))
    assert decoded.messages[0] == Alive("b", 1, "10.0.0.2:7946", tuple((k, v) for k, v in meta))


@pytest.mark.parametrize(
    ("fields", "index"),
    [
        ([1, 0, "b", "a", "10.0.0.1:7946"], 1),  # Ping seq
        ([2, 0, "c", "10.0.0.3:7946", "a", "10.0.0.1:7946", True], 1),  # PingReq seq
        ([3, 0, "c"], 1),  # Ack seq
        ([4, 0, "c"], 1),  # Nack seq
    ],
)
def test_sequence_numbers_stay_in_their_range(fields: list[Any], index: int) -> None:
    for good in (0, 1, MAX_SEQ):
        assert Codec().decode(body("a", [with_field(fields, index, good)])).messages
    for bad in (-1, MAX_SEQ + 1, 2**63, 2**64 - 1, -(2**63)):
        assert reason(Codec(), body("a", [with_field(fields, index, bad)])) == "malformed"


@pytest.mark.parametrize(
    ("fields", "index"),
    [
        ([5, "b", 0, "10.0.0.2:7946", []], 2),  # Alive
        ([6, "c", 0, "a"], 2),  # Suspect
        ([7, "c", 0, "a"], 2),  # Dead
    ],
)
def test_incarnations_stay_in_their_range(fields: list[Any], index: int) -> None:
    for good in (0, 1, MAX_INCARNATION):
        assert Codec().decode(body("a", [with_field(fields, index, good)])).messages
    for bad in (-1, MAX_INCARNATION + 1, 2**64 - 1, -(2**63)):
        assert reason(Codec(), body("a", [with_field(fields, index, bad)])) == "malformed"
    record = ["b", "10.0.0.2:7946", MAX_INCARNATION + 1, 0, []]
    push_pull = [8, "a", "10.0.0.1:7946", [record], False, False]
    assert reason(Codec(), body("a", [push_pull]), stream=True) == "malformed"


def test_long_strings_are_refused_before_they_are_allocated() -> None:
    # No valid field is near MAX_STR_BYTES; msgpack refuses longer strings.
    record = ["b", "10.0.0.2:7946", 1, 0, [["k", "v" * (MAX_STR_BYTES + 1)]]]
    data = body("a", [[8, "a", "10.0.0.1:7946", [record], False, False]])
    assert reason(Codec(), data, stream=True) == "malformed"


def test_decode_raises_nothing_but_decode_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Should a field check ever raise something else, it is still a drop."""

    def broken(value: Any) -> str:
        raise KeyError(value)

    monkeypatch.setattr(membership.codec, "_address", broken)
    assert reason(Codec(), Codec().encode(Packet("a", (Ping(1, "b", "a", "10.0.0.1:1"),)))) == (
        "malformed"
    )


# -- fuzz ----------------------------------------------------------------------------


def decode_or_drop(codec: Codec, data: bytes, outcomes: dict[str, int]) -> Packet | None:
    """Decode must give a Packet or a DecodeError with a known reason, nothing else."""
    try:
        packet = codec.decode(data)
    except DecodeError as exc:
        assert exc.reason in REASONS, exc.reason
        outcomes[exc.reason] = outcomes.get(exc.reason, 0) + 1
        return None
    assert isinstance(packet, Packet)
    # Whatever decodes is well typed: it encodes again to the same packet.
    assert codec.decode(codec.encode(packet)) == packet
    outcomes["ok"] = outcomes.get("ok", 0) + 1
    return packet


def test_random_bytes_never_escape_decode_error() -> None:
    rng = random.Random(1234)
    plain, signed = Codec(max_bytes=512), Codec([KEY], max_bytes=512)
    outcomes: dict[str, int] = {}
    for _ in range(4000):
        length = rng.choice([rng.randrange(0, 8), rng.randrange(0, 600)])
        data = bytearray(rng.randbytes(length))
        if data and rng.random() < 0.7:
            data[0] = VERSION  # get past the version check
        if len(data) > 1 and rng.random() < 0.7:
            data[1] = 0
        if len(data) > 2 and rng.random() < 0.5:
            data[2] = rng.choice([0x92, 0x91, 0xDC])  # look like the envelope
        decode_or_drop(plain, bytes(data), outcomes)
        assert decode_or_drop(signed, bytes(data), {}) is None
    # The fuzzing reached past the header checks.
    assert {"too_large", "truncated", "version", "malformed", "mac"} <= set(outcomes)


def mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(5)
        if kind == 0 and out:  # bit flip
            index = rng.randrange(len(out))
            out[index] ^= 1 << rng.randrange(8)
        elif kind == 1 and out:  # truncation
            del out[rng.randrange(len(out)) :]
        elif kind == 2:  # insertion
            index = rng.randrange(len(out) + 1)
            out[index:index] = rng.randbytes(rng.randint(1, 8))
        elif kind == 3 and out:  # a byte set to an interesting value
            out[rng.randrange(len(out))] = rng.choice([0x00, 0x7F, 0xC0, 0xC2, 0xC3, 0xFF])
        elif kind == 4 and len(out) > 2:  # a slice repeated
            start = rng.randrange(len(out))
            out[start:start] = out[start : start + rng.randint(1, 16)]
    return bytes(out)


def test_mutated_packets_never_escape_decode_error() -> None:
    rng = random.Random(99)
    plain, signed = Codec(max_bytes=1400), Codec([KEY], max_bytes=1400)
    originals = [Packet("a", (m,)) for m in MESSAGES] + [PACKET, Packet("a", tuple(MESSAGES[:8]))]
    outcomes: dict[str, int] = {}
    for _ in range(6000):
        packet = rng.choice(originals)
        data = plain.encode(packet)
        decode_or_drop(plain, mutate(rng, data), outcomes)

        signed_data = signed.encode(packet)
        changed = mutate(rng, signed_data)
        if changed != signed_data:
            # With a MAC, no changed packet gets through.
            assert decode_or_drop(signed, changed, {}) is None
    assert {"ok", "truncated", "malformed"} <= set(outcomes)
    assert outcomes["ok"] > 100  # mutations that stay valid msgpack do get checked
