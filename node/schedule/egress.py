"""Where an HTTP delivery may connect: the egress policy (DESIGN.md
"Guarantees"). A tenant chooses the URL and the request leaves from inside
the cluster, so by default no address that is not on the public internet is
ever connected to: loopback, private, link-local (the cloud metadata service
at 169.254.169.254), carrier-grade NAT, multicast, unspecified, reserved,
and the IPv6 forms that embed one of those (IPv4-mapped, NAT64, 6to4,
Teredo). ``HTTP_TARGETS_ALLOW`` names CIDRs an operator opens deliberately.

Two checks, one policy:

* ``check_url``, at create and PATCH: what the URL alone shows (scheme,
  userinfo, an address literal in any spelling), refused with a 400 naming
  ``http.url``;
* ``refusal``, at every delivery attempt, on each address the host resolved
  to: the HTTP sink connects only to an address this passed (resolve,
  check, connect to that address: a DNS answer that changes between the
  check and the connection cannot change where it goes).

Pure: no IO. Resolving is the sink's (``node/delivery/sinks/http.py``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from node.errors import ValidationFailed

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_URL_LENGTH = 2048
SCHEMES = frozenset({"http", "https"})
# The host names that always mean this machine (RFC 6761), whatever DNS says.
_LOCAL_NAMES = re.compile(r"(^|\.)localhost\.?$", re.IGNORECASE)
# What inet_aton reads as an IPv4 address: one to four parts, each decimal,
# octal (0177) or hex (0x7f). Only the dotted quad of decimals is accepted as
# an address literal; any other spelling of one is refused, not read.
_IPV4_SPELLING = re.compile(r"^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}\.?$", re.I)
_DOTTED_QUAD = re.compile(r"^(0|[1-9][0-9]{0,2})(\.(0|[1-9][0-9]{0,2})){3}$")
# Characters a URL never needs and a request line must never carry.
_UNSAFE = re.compile(r"[\x00-\x20\x7f\\]")
# NAT64's well-known prefix (RFC 6052): its last 32 bits are an IPv4 address.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


@dataclass(frozen=True)
class Target:
    """A URL the policy let through, as it will be called."""

    url: str
    scheme: str
    host: str  # lower case, IDNA-encoded; no brackets around an IPv6 literal
    port: int


@dataclass(frozen=True)
class EgressPolicy:
    # Ranges an operator opened on purpose (HTTP_TARGETS_ALLOW).
    allow: tuple[Network, ...] = ()

    @classmethod
    def parse(cls, text: str) -> EgressPolicy:
        """``HTTP_TARGETS_ALLOW``: CIDRs, comma separated (empty: none)."""
        networks: list[Network] = []
        for part in (p.strip() for p in text.split(",")):
            if part:
                try:
                    networks.append(ipaddress.ip_network(part, strict=False))
                except ValueError:
                    raise ValueError(f"{part!r} is not a CIDR (like 10.0.0.0/8)") from None
        return cls(tuple(networks))

    def refusal(self, address: Address | str) -> str | None:
        """Why a delivery may not connect to ``address``, or None when it may."""
        ip = ipaddress.ip_address(address) if isinstance(address, str) else address
        if any(ip in network for network in self.allow if network.version == ip.version):
            return None
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            if self.refusal(embedded) is None:
                return None
            return f"{ip} (it embeds {embedded}: {_kind(embedded)})"
        kind = _kind(ip)
        return None if kind is None else f"{ip} ({kind})"

    def first_allowed(self, addresses: Iterable[str]) -> tuple[list[str], str | None]:
        """The addresses of a resolved host that may be connected to, and
        why the first refused one was (for a delivery's lastError)."""
        allowed: list[str] = []
        reason: str | None = None
        for address in addresses:
            why = self.refusal(address)
            if why is None:
                allowed.append(address)
            elif reason is None:
                reason = why
        return allowed, reason


def _embedded_ipv4(ip: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped, NAT64, 6to4, Teredo)."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


def _kind(ip: Address) -> str | None:
    """What kind of address no delivery may reach, or None for a public one."""
    checks = (
        (ip.is_unspecified, "unspecified"),
        (ip.is_loopback, "loopback"),
        (ip.is_link_local, "link-local, where cloud metadata lives"),
        (ip.is_multicast, "multicast"),
        (ip.is_private, "private"),
        (ip.is_reserved, "reserved"),
        (not ip.is_global, "not a public address"),
    )
    for refused, kind in checks:
        if refused:
            return kind
    return None


def check_url(url: object, policy: EgressPolicy, field: str = "http.url") -> Target:
    """``url`` as an HTTP target may be: http or https, no userinfo, a host
    that is a name or a plainly written address the policy allows. Raises
    ValidationFailed naming ``field``."""
    if not isinstance(url, str) or not url:
        raise ValidationFailed("http.url must be an http or https URL", field)
    if len(url) > MAX_URL_LENGTH:
        raise ValidationFailed(f"http.url is longer than {MAX_URL_LENGTH} characters", field)
    if _UNSAFE.search(url) or not url.isascii():
        raise ValidationFailed(
            "http.url must be ASCII without spaces, control characters or backslashes "
            "(percent-encode the rest; an international domain in its xn-- form)",
            field,
        )
    parts = _split(url, field)
    host = _host(parts, field)
    literal = _address_literal(host, field)
    if literal is not None:
        why = policy.refusal(literal)
        if why is not None:
            raise ValidationFailed(f"http.url may not reach {why} (HTTP_TARGETS_ALLOW)", field)
    elif _LOCAL_NAMES.search(host) and policy.refusal("127.0.0.1") is not None:
        raise ValidationFailed("http.url may not reach localhost (HTTP_TARGETS_ALLOW)", field)
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    return Target(url=url, scheme=parts.scheme.lower(), host=host, port=port)


def _split(url: str, field: str) -> SplitResult:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port out of range or not a number
    except ValueError as exc:
        raise ValidationFailed(f"http.url is not a URL: {exc}", field) from None
    if parts.scheme.lower() not in SCHEMES:
        raise ValidationFailed("http.url must use http or https", field)
    if "@" in parts.netloc:
        raise ValidationFailed("http.url may not hold a user name or password", field)
    if parts.port == 0:
        raise ValidationFailed("http.url may not name port 0", field)
    if parts.fragment or url.endswith("#"):
        raise ValidationFailed("http.url may not hold a fragment (#...)", field)
    return parts


def _host(parts: SplitResult, field: str) -> str:
    host = (parts.hostname or "").rstrip(".") if parts.hostname != "." else ""
    if not host:
        raise ValidationFailed("http.url has no host", field)
    if parts.netloc.startswith("[") != (":" in host):
        raise ValidationFailed("http.url has a malformed host", field)
    return host.lower()


def _address_literal(host: str, field: str) -> Address | None:
    """The address ``host`` spells, if it spells one. An IPv4 address in any
    form but the dotted quad of decimals (2130706433, 0177.0.0.1, 0x7f.1,
    127.1) is refused: resolvers and parsers disagree on what it means."""
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise ValidationFailed("http.url has a malformed IPv6 address", field) from None
    if _IPV4_SPELLING.fullmatch(host):
        if not _DOTTED_QUAD.fullmatch(host):
            raise ValidationFailed(
                "http.url spells an IPv4 address in a form other than a.b.c.d in decimal",
                field,
            )
        try:
            return ipaddress.IPv4Address(host)
        except ValueError:
            raise ValidationFailed("http.url has a malformed IPv4 address", field) from None
    return None


def allows_prefix(url: str, prefixes: tuple[str, ...]) -> bool:
    """A tenant limited to URL prefixes (like its topic prefixes) may call
    only URLs starting with one of them; none: any URL the policy allows."""
    return not prefixes or url.startswith(prefixes)
