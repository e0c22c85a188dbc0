"""The wire format: a version byte, a flags byte, an optional HMAC-SHA256,
then a msgpack body ``[sender, [[code, field, ...], ...]]``.

Decoding trusts nothing, as it is the trust boundary: every field's type is
checked, sizes are bounded before msgpack allocates, every address parses
(``membership.address``: a port of 70000 must never reach a socket call),
member ids and metadata keep to the characters and lengths a node id may
have, sequence numbers and incarnations stay in their ranges, each message
comes on its channel (a ``PushPull`` alone in a stream frame, everything else
in datagrams), and any fault raises ``DecodeError`` with a reason the
transport counts ("address" for an address, "channel" for a message on the
wrong channel, "malformed" for any other field). The header alone can be
judged (``check_header``), so the transport refuses a stream frame before it
reads the body. With cluster keys configured, a packet is sent with the
first key and accepted under any of them, so keys rotate without downtime:
add the new key second, then move it first, then drop the old one.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from membership.address import AddressError, parse_address
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

VERSION = 1
FLAG_MAC = 0x01
MAC_BYTES = 32
HEADER_BYTES = 2
# A stream frame (push-pull) holds the whole member table; a datagram may
# not. A node's record (an id of 25 characters, an IPv4 address, an
# incarnation near 2^31 and its four metadata pairs) is 114 bytes on the wire;
# the largest one the decoder accepts (every field at its limit, 32 metadata
# pairs of 256 characters) is about 10.7 KB. Allow 1 KiB a member, nine
# times a node's, for MAX_MEMBERS (SwimConfig.max_members' ceiling): 4 MiB,
# which is also what one connection can make the node buffer before the MAC
# is checked.
MAX_MEMBERS = 4096
STREAM_BYTES_PER_MEMBER = 1024
MAX_STREAM_BYTES = MAX_MEMBERS * STREAM_BYTES_PER_MEMBER
MAX_STR_BYTES = 1024


class DecodeError(ValueError):
    """A packet was dropped; ``reason`` is the counter it goes to."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


_PING, _PING_REQ, _ACK, _NACK, _ALIVE, _SUSPECT, _DEAD, _PUSH_PULL = range(1, 9)


def _meta_out(meta: tuple[tuple[str, str], ...]) -> list[list[str]]:
    return [[k, v] for k, v in meta]


def _fields(message: Message) -> list[Any]:
    match message:
        case Ping(seq, target, source, address):
            return [_PING, seq, target, source, address]
        case PingReq(seq, target, target_address, source, source_address, nack):
            return [_PING_REQ, seq, target, target_address, source, source_address, nack]
        case Ack(seq, source):
            return [_ACK, seq, source]
        case Nack(seq, source):
            return [_NACK, seq, source]
        case Alive(member, incarnation, address, meta):
            return [_ALIVE, member, incarnation, address, _meta_out(meta)]
        case Suspect(member, incarnation, source):
            return [_SUSPECT, member, incarnation, source]
        case Dead(member, incarnation, source):
            return [_DEAD, member, incarnation, source]
        case PushPull(source, address, members, join, reply):
            records = [
                [r.member, r.address, r.incarnation, int(r.state), _meta_out(r.meta)]
                for r in members
            ]
            return [_PUSH_PULL, source, address, records, join, reply]
    raise TypeError(f"not a message: {message!r}")


def message_size(message: Message) -> int:
    """Bytes the message adds to a packet body (for packing piggybacks)."""
    packed: bytes = msgpack.packb(_fields(message))
    return len(packed)


# Envelope around the messages: header, MAC, the array headers and the sender.
def envelope_size(sender: str) -> int:
    packed: bytes = msgpack.packb([sender, []])
    return HEADER_BYTES + MAC_BYTES + len(packed) + 4


# A member id is what a node id may be (node.config): it names the member in
# logs, metrics, the console's cluster view and the leases it holds.
MEMBER_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
# Metadata: at most 32 pairs, keys shaped like ids, each once; values are
# printable ASCII (host:port, version numbers), at most 256 characters.
MAX_META_PAIRS = 32
META_KEY = MEMBER_ID
META_VALUE = re.compile(r"[\x20-\x7e]{0,256}")


def is_member_id(value: object) -> bool:
    return isinstance(value, str) and MEMBER_ID.fullmatch(value) is not None


def is_meta(pairs: object) -> bool:
    """True for metadata a peer accepts: a sequence of (key, value) string pairs."""
    if not isinstance(pairs, list | tuple) or len(pairs) > MAX_META_PAIRS:
        return False
    keys: set[str] = set()
    for pair in pairs:
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            return False
        key, value = pair
        if not isinstance(key, str) or META_KEY.fullmatch(key) is None or key in keys:
            return False
        if not isinstance(value, str) or META_VALUE.fullmatch(value) is None:
            return False
        keys.add(key)
    return True


def _member(value: Any) -> str:
    if not is_member_id(value):
        raise DecodeError("malformed", f"bad member id {value!r:.80}")
    result: str = value
    return result


def _address(value: Any) -> str:
    if not isinstance(value, str):
        raise DecodeError("malformed", "an address is a string")
    try:
        parse_address(value)
    except AddressError as exc:
        raise DecodeError("address", str(exc)) from None
    return value


def _int(value: Any, top: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= top:
        raise DecodeError("malformed", f"expected an integer in 0-{top}")
    return value


def _seq(value: Any) -> int:
    return _int(value, MAX_SEQ)


def _incarnation(value: Any) -> int:
    return _int(value, MAX_INCARNATION)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise DecodeError("malformed", "expected a boolean")
    return value


def _meta_in(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not is_meta(value):
        raise DecodeError("malformed", "bad metadata")
    return tuple((key, text) for key, text in value)


def _state(value: Any) -> State:
    try:
        return State(_int(value, max(State)))
    except ValueError:
        raise DecodeError("malformed", "unknown state") from None


def _record(value: Any) -> MemberRecord:
    if not isinstance(value, list) or len(value) != 5:
        raise DecodeError("malformed", "bad member record")
    return MemberRecord(
        _member(value[0]),
        _address(value[1]),
        _incarnation(value[2]),
        _state(value[3]),
        _meta_in(value[4]),
    )


def _records(value: Any) -> tuple[MemberRecord, ...]:
    if not isinstance(value, list):
        raise DecodeError("malformed", "bad member list")
    return tuple(_record(v) for v in value)


_DECODERS: dict[int, tuple[int, Callable[[list[Any]], Message]]] = {
    _PING: (4, lambda f: Ping(_seq(f[0]), _member(f[1]), _member(f[2]), _address(f[3]))),
    _PING_REQ: (
        6,
        lambda f: PingReq(
            _seq(f[0]), _member(f[1]), _address(f[2]), _member(f[3]), _address(f[4]), _bool(f[5])
        ),
    ),
    _ACK: (2, lambda f: Ack(_seq(f[0]), _member(f[1]))),
    _NACK: (2, lambda f: Nack(_seq(f[0]), _member(f[1]))),
    _ALIVE: (
        4,
        lambda f: Alive(_member(f[0]), _incarnation(f[1]), _address(f[2]), _meta_in(f[3])),
    ),
    _SUSPECT: (3, lambda f: Suspect(_member(f[0]), _incarnation(f[1]), _member(f[2]))),
    _DEAD: (3, lambda f: Dead(_member(f[0]), _incarnation(f[1]), _member(f[2]))),
    _PUSH_PULL: (
        5,
        lambda f: PushPull(_member(f[0]), _address(f[1]), _records(f[2]), _bool(f[3]), _bool(f[4])),
    ),
}


def _message(value: Any) -> Message:
    if not isinstance(value, list) or not value:
        raise DecodeError("malformed", "message is not a list")
    code = value[0]
    # bool is an int subclass, and True == 1 would read as a Ping.
    if not isinstance(code, int) or isinstance(code, bool) or code not in _DECODERS:
        raise DecodeError("malformed", f"unknown message type {code!r}")
    arity, build = _DECODERS[code]
    if len(value) != arity + 1:
        raise DecodeError("malformed", f"message type {code} needs {arity} fields")
    return build(value[1:])


class Codec:
    def __init__(self, keys: Sequence[bytes] = (), *, max_bytes: int = 1400) -> None:
        for key in keys:
            if len(key) not in (16, 24, 32):
                raise ValueError("cluster keys must be 16, 24 or 32 bytes")
        self.keys = tuple(keys)
        self.max_bytes = max_bytes

    def encode(self, packet: Packet) -> bytes:
        body: bytes = msgpack.packb([packet.sender, [_fields(m) for m in packet.messages]])
        if not self.keys:
            return bytes((VERSION, 0)) + body
        header = bytes((VERSION, FLAG_MAC))
        mac = hmac.new(self.keys[0], header + body, hashlib.sha256).digest()
        return header + mac + body

    def check_header(self, header: bytes) -> None:
        """Judge a packet by its first ``HEADER_BYTES`` bytes, as ``decode``
        would: the version, and whether it is signed as we expect. Raises
        ``DecodeError`` ("truncated", "version" or "mac")."""
        if len(header) < HEADER_BYTES:
            raise DecodeError("truncated", "no header")
        version, flags = header[0], header[1]
        if version != VERSION:
            raise DecodeError("version", f"version {version}")
        if self.keys and not flags & FLAG_MAC:
            raise DecodeError("mac", "packet is not signed")
        if not self.keys and flags & FLAG_MAC:
            raise DecodeError("mac", "signed packet but no cluster key configured")

    def decode(self, data: bytes, *, stream: bool = False) -> Packet:
        """``data`` as a packet from a datagram, or with ``stream`` from a
        stream frame; ``DecodeError`` with the reason to drop it."""
        limit = MAX_STREAM_BYTES if stream else self.max_bytes
        if len(data) > limit:
            raise DecodeError("too_large", f"{len(data)} bytes")
        self.check_header(data[:HEADER_BYTES])
        body = data[HEADER_BYTES:]
        if self.keys:
            if len(body) < MAC_BYTES:
                raise DecodeError("mac", "packet is not signed")
            mac, body = body[:MAC_BYTES], body[MAC_BYTES:]
            signed = data[:HEADER_BYTES] + body
            if not any(
                hmac.compare_digest(mac, hmac.new(k, signed, hashlib.sha256).digest())
                for k in self.keys
            ):
                raise DecodeError("mac", "no key matches")
        try:
            raw = msgpack.unpackb(
                body,
                raw=False,
                strict_map_key=True,
                # No valid string is near this long (ids, addresses, metadata).
                max_str_len=MAX_STR_BYTES,
                max_bin_len=0,
                max_array_len=limit,
                max_map_len=0,
                max_ext_len=0,
            )
        except msgpack.ExtraData:
            raise DecodeError("malformed", "trailing bytes") from None
        except (ValueError, msgpack.UnpackException) as exc:
            reason = (
                "truncated"
                if "Insufficient" in str(exc) or "incomplete" in str(exc)
                else "malformed"
            )
            raise DecodeError(reason, str(exc)) from None
        except Exception as exc:  # msgpack raises assorted errors on hostile input
            raise DecodeError("malformed", type(exc).__name__) from None
        if not isinstance(raw, list) or len(raw) != 2 or not isinstance(raw[1], list):
            raise DecodeError("malformed", "bad envelope")
        if not raw[1]:
            raise DecodeError("malformed", "empty packet")
        try:
            packet = Packet(_member(raw[0]), tuple(_message(m) for m in raw[1]))
        except DecodeError:
            raise
        except Exception as exc:  # a check above missed a case: still only a drop
            raise DecodeError("malformed", type(exc).__name__) from None
        _check_channel(packet, stream=stream)
        return packet


def _check_channel(packet: Packet, *, stream: bool) -> None:
    """A push-pull travels alone on the stream channel (our sender sends
    exactly that), everything else in datagrams. A PushPull in a datagram
    would make us open a TCP connection to whatever address one unsigned
    datagram names, to send it our whole member table."""
    if stream:
        if len(packet.messages) != 1 or not isinstance(packet.messages[0], PushPull):
            raise DecodeError("channel", "a stream frame carries one push-pull and nothing else")
    elif any(isinstance(m, PushPull) for m in packet.messages):
        raise DecodeError("channel", "a push-pull in a datagram")
