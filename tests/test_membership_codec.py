"""membership.codec: round trips, cluster keys, and every reason to drop a packet.

Hostile input must end in ``DecodeError`` with a reason the transport can
count; the fuzz tests below are seeded, so a failure replays exactly.
"""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest

from membership.codec import (
    HEADER_BYTES,
    MAC_BYTES,
    VERSION,
    Codec,
    DecodeError,
    envelope_size,
    message_size,
)
from membership.messages import (
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
REASONS = {"too_large", "truncated", "version", "mac", "malformed"}
BIG = 2**63 - 1

MESSAGES: list[Message] = [
    Ping(0, "b", "a", "10.0.0.1:7946"),
    Ping(BIG, "nœud-β", "a", "[::1]:7946"),
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
    decoded = codec.decode(data)
    assert decoded == packet
    assert type(decoded.messages[0]) is type(message)


def test_a_packet_with_many_messages_round_trips_in_order() -> None:
    codec = Codec([KEY])
    packet = Packet("sender", tuple(MESSAGES))
    assert codec.decode(codec.encode(packet), stream=True) == packet
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
        with_field(ALIVE_FIELDS, 4, [["zone", "eu"]] * 32),
        [2, 1, "c", "c:7946", "a", "a:7946", True],
        [8, "a", "a:7946", [RECORD, with_field(RECORD, 3, 3)], False, False],
        with_field(PING_FIELDS, 1, 2**63 - 1),
        with_field(PING_FIELDS, 2, "x" * 512),
    ]
    for fields in valid:
        assert len(Codec().decode(body("a", [fields])).messages) == 1


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
