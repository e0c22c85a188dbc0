"""Member addresses, checked strictly: every one read from the wire passes
``parse_address`` at decode time, and the transport parses again before any
socket call (a port of 70000 reaching ``sendto`` raises ``OverflowError``,
which asyncio treats as fatal: it closes the socket for good).

An address is ``HOST:PORT``: HOST an IPv4 address (dotted quad, no leading
zeros), an IPv6 address in brackets (no zone), or an RFC 1123 host name
(labels of letters, digits and inner hyphens, at most 63 characters each and
253 in all, the last not all digits so ``1.2.3`` is not read as an address).
PORT is 1-65535 in ASCII digits without a sign or leading zeros, so one
member has one spelling (addresses are compared as strings). Unspecified,
multicast and broadcast IPs never name one member and are refused.
"""

from __future__ import annotations

import ipaddress
import re
from typing import NamedTuple, TypeAlias

MAX_HOSTNAME = 253
# The longest host name, a colon and five digits (an IPv6 address is shorter).
MAX_ADDRESS = MAX_HOSTNAME + 6

_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_PORT = re.compile(r"[1-9][0-9]{0,4}")
_BROADCAST = ipaddress.IPv4Address("255.255.255.255")

IP: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address


class AddressError(ValueError):
    """Not a usable member address."""


class Address(NamedTuple):
    host: str  # without brackets
    port: int
    ip: IP | None  # None: a host name


def is_hostname(host: str) -> bool:
    if not 0 < len(host) <= MAX_HOSTNAME:
        return False
    labels = host.split(".")
    return all(_LABEL.fullmatch(label) for label in labels) and not labels[-1].isdigit()


def _unicast(ip: IP, text: str) -> IP:
    if ip.is_unspecified or ip.is_multicast or ip == _BROADCAST:
        raise AddressError(f"{text!r:.80} names no single member")
    return ip


def parse_address(text: object) -> Address:
    """``HOST:PORT`` as (host, port, ip); ``AddressError`` for anything else."""
    if not isinstance(text, str):
        raise AddressError("an address is a string")
    if not 0 < len(text) <= MAX_ADDRESS:
        raise AddressError(f"address of {len(text)} characters")
    host, colon, port_text = text.rpartition(":")
    if not colon or not _PORT.fullmatch(port_text) or int(port_text) > 65535:
        raise AddressError(f"{text!r:.80} has no port in 1-65535")
    if host.startswith("[") and host.endswith("]"):
        inner = host[1:-1]
        try:
            # No zone (fe80::1%eth0): its text is free-form.
            ip6 = ipaddress.IPv6Address(inner) if "%" not in inner else None
        except ValueError:
            ip6 = None
        if ip6 is None:
            raise AddressError(f"{text!r:.80}: not an IPv6 address in brackets")
        return Address(inner, int(port_text), _unicast(ip6, text))
    try:
        ip4 = ipaddress.IPv4Address(host)
    except ValueError:
        if not is_hostname(host):
            raise AddressError(f"{text!r:.80}: not an IP address or host name") from None
        return Address(host, int(port_text), None)
    return Address(host, int(port_text), _unicast(ip4, text))


def is_address(text: object) -> bool:
    try:
        parse_address(text)
    except AddressError:
        return False
    return True
