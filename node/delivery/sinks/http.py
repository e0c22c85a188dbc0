"""The HTTP sink: each ``HttpCall`` sent as one signed request (DESIGN.md
"HTTP delivery"), the HTTP twin of ``node/delivery/publisher.py``.

Per call, in order, each step able to settle it:

1. the URL checked again (``check_url``: scheme, userinfo, an address
   literal the policy refuses) and, for an address literal, the address
   aiohttp will connect to, since aiohttp does not resolve a literal;
2. the tenant's signing secrets (none: refused, nothing is sent unsigned);
3. the host's circuit (``breaker.py``): open, the call is not sent;
4. a slot among ``max_per_host`` for its host, so a host that hangs holds
   only its own calls;
5. the request: names resolved by ``EgressResolver``, which keeps only
   the addresses the egress policy allows; aiohttp connects only to what
   its resolver returned, so the address checked is the one connected to
   (a DNS answer that changes between a check and a connect changes
   nothing). No redirect is followed, certificates are verified, the
   whole request is bounded by the call's timeout and at most
   ``BODY_READ`` bytes of the answer are read.

What an answer means is ``node/delivery/outcomes.http_result``'s to say,
never this module's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import ipaddress
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime
from urllib.parse import urlsplit

import aiohttp
import structlog
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

from node.delivery.outcomes import http_result
from node.delivery.sink import Failed, Trouble
from node.delivery.sinks.breaker import Blocked, Breakers, BreakerSettings, Pass
from node.errors import ValidationFailed
from node.metrics import NodeMetrics
from node.schedule.destination import SCHEDULER_HEADERS
from node.schedule.egress import EgressPolicy, check_url
from node.schedule.webhook import HttpCall, signed_headers
from node.tracing import OFF, Tracing

log = structlog.get_logger(__name__)

# The most of an answer's body read: enough for outcomes.excerpt, and an
# endpoint answering gigabytes costs no more than this.
BODY_READ = 4096
# How long a call waits (no attempt spent) when its tenant's signing
# secrets could not be read (the store's trouble, not the schedule's).
KEYS_WAIT = 5.0
# How long a call whose connection was refused waits before the next try
# (no attempt spent), unless its host's circuit opens and says longer.
REFUSED_WAIT = 1.0
# How long a one-line error from an exception may be.
ERROR_CHARS = 200
# Framing and hop-by-hop headers (RFC 9110 7.6.1): aiohttp writes them from
# the request itself; a caller's copy could only contradict it.
FRAMING_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "expect",
    }
)
# A trusted call (the operator's own URL) may reach any address; its URL is
# still checked for scheme, userinfo and oddly spelled addresses.
ANY_ADDRESS = EgressPolicy.parse("0.0.0.0/0, ::/0")


class EgressRefused(OSError):
    """A host resolved to no address the egress policy allows. An OSError:
    aiohttp hands a resolver's OSError back as ClientConnectorDNSError,
    with this as its ``os_error``."""


class EgressResolver(AbstractResolver):
    """Resolves with ``inner`` (aiohttp's default), then keeps only the
    addresses ``policy`` allows, in their order."""

    def __init__(self, policy: EgressPolicy, inner: AbstractResolver | None = None) -> None:
        self.policy = policy
        self.inner = inner if inner is not None else DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self.inner.resolve(host, port, family)
        allowed, reason = _allowed(self.policy, [result["host"] for result in found])
        if not allowed:
            raise EgressRefused(f"{host} resolves to {reason or 'no address'}")
        return [result for result in found if result["host"] in allowed]

    async def close(self) -> None:
        await self.inner.close()


def _allowed(policy: EgressPolicy, addresses: list[str]) -> tuple[set[str], str | None]:
    try:
        allowed, reason = policy.first_allowed(addresses)
    except ValueError:
        # A resolver answer that is not an address: nothing of it is trusted.
        return set(), f"{addresses!r} (not an address)"
    return set(allowed), reason


class Health(enum.Enum):
    """What a call's result says about its host, for the breaker."""

    ANSWERED = "answered"  # the host is up (whatever the answer meant)
    FAILED = "failed"  # a retryable failure: down, timing out, 5xx
    UNTRIED = "untried"  # nothing reached the host


@dataclasses.dataclass(frozen=True)
class _Request:
    call: HttpCall  # its headers cleaned: the scheduler's own win
    url: URL  # as aiohttp reads it (the host it connects to is url.raw_host)
    host: str  # host:port, whose slots and circuit the call takes


class _Refusal(Exception):
    def __init__(self, failed: Failed) -> None:
        super().__init__(failed.error)
        self.failed = failed


class HostGates:
    """A semaphore of ``size`` slots per host, made on first use and dropped
    when no call holds or awaits it: as many as hosts with calls in flight."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("max_per_host must be at least 1")
        self.size = size
        self._gates: dict[str, tuple[asyncio.Semaphore, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, host: str) -> AsyncIterator[None]:
        semaphore, users = self._gates.setdefault(host, (asyncio.Semaphore(self.size), [0]))
        users[0] += 1
        try:
            async with semaphore:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._gates[host]

    def __len__(self) -> int:
        return len(self._gates)


class HttpSink:
    """Sends ``HttpCall``s (the Sink protocol of ``contract.py``).

    ``keys(tenant)``: the tenant's signing keys, newest first (two during a
    rotation). ``clock``: the store's clock, for ``webhook-timestamp`` and
    Retry-After dates. ``monotonic``: the breakers' clock. ``resolver``:
    the DNS resolver the egress check wraps (aiohttp's default when None).
    ``sessions``: what makes its sessions, for the simulation's receiver
    (``chaos/sim/receiver.py``: a session that answers without a socket);
    None, aiohttp's, over TCP, behind the egress check.
    """

    def __init__(
        self,
        policy: EgressPolicy,
        keys: Callable[[str], Awaitable[Sequence[bytes]]],
        *,
        clock: Callable[[], datetime],
        monotonic: Callable[[], float] = time.monotonic,
        max_per_host: int = 16,
        breaker_failures: int = 5,
        breaker_cooldown: float = 2.0,
        breaker_cooldown_max: float = 10.0,
        max_wait: float = 300.0,
        ca_bundle: str | None = None,
        metrics: NodeMetrics | None = None,
        resolver: AbstractResolver | None = None,
        tracing: Tracing = OFF,
        sessions: Callable[[], aiohttp.ClientSession] | None = None,
    ) -> None:
        self._sessions = sessions
        self.tracing = tracing
        self.policy = policy
        self.keys = keys
        self.clock = clock
        self.max_per_host = max_per_host
        self.max_wait = max_wait
        self.ca_bundle = ca_bundle
        self.metrics = metrics
        self.breakers = Breakers(
            BreakerSettings(breaker_failures, breaker_cooldown, breaker_cooldown_max), monotonic
        )
        self.gates = HostGates(max_per_host)
        self._resolver = resolver
        # Tenants' calls go through the egress check; trusted ones (the
        # operator's dead-letter URL) through a session without it. Two
        # connectors, so no pooled connection or cached DNS answer is shared.
        self._checked: aiohttp.ClientSession | None = None
        self._trusted: aiohttp.ClientSession | None = None
        if metrics is not None:
            metrics.watch_circuits(self.breakers)

    @property
    def started(self) -> bool:
        return self._checked is not None

    async def start(self) -> None:
        """Make the sessions (here, not in __init__: a session belongs to a
        running event loop, and must be closed once made)."""
        if self._checked is not None:
            return
        if self._sessions is not None:
            self._checked, self._trusted = self._sessions(), self._sessions()
            return
        tls: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=self.ca_bundle) if self.ca_bundle else True
        )
        self._checked = self._session(EgressResolver(self.policy, self._resolver), tls)
        self._trusted = self._session(self._resolver, tls)

    def _session(
        self, resolver: AbstractResolver | None, tls: ssl.SSLContext | bool
    ) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=0,  # the per-host gates bound what is in flight
            limit_per_host=self.max_per_host,
            resolver=resolver,
            ssl=tls,
        )
        return aiohttp.ClientSession(
            connector=connector,
            # No proxy from the environment: a proxy would connect for us,
            # to an address the egress check never saw.
            trust_env=False,
            # No cookies: one tenant's endpoint must not set what another's
            # request carries.
            cookie_jar=aiohttp.DummyCookieJar(),
            # The body is read only for an excerpt: not asking for a
            # compressed one keeps it readable, and not decompressing keeps
            # a small answer from growing in memory. A caller's own
            # Accept-Encoding is still sent.
            skip_auto_headers=("Accept-Encoding",),
            auto_decompress=False,
        )

    async def stop(self) -> None:
        sessions = (self._checked, self._trusted)
        self._checked = self._trusted = None
        for session in sessions:
            if session is not None:
                await session.close()

    def circuit_open(self, url: str) -> bool:
        """Whether a call to ``url`` would wait on its host's open circuit now
        (its cooldown not over): the poller leaves such schedules unclaimed."""
        return self.breakers.blocked(_authority(url)) is not None

    async def publish(self, calls: Sequence[HttpCall]) -> list[Failed | None]:
        """Send every call at once; each settles on its own (its own
        timeout), results in the order of ``calls``."""
        if self._checked is None:
            raise RuntimeError("HttpSink.start() first")
        return list(await asyncio.gather(*(self._deliver(call) for call in calls)))

    async def _deliver(self, call: HttpCall) -> Failed | None:
        host = _authority(call.url)
        try:
            host, result, label = await self._attempt(call)
        except Exception as exc:  # a bug here must fail one call, not the batch
            log.exception("http delivery failed unexpectedly", url=call.url)
            result, label = Failed(f"unexpected error: {_line(exc)}", Trouble.RETRY), "retry"
        if self.metrics is not None:
            self.metrics.http_target(host, label)
        return result

    async def _attempt(self, call: HttpCall) -> tuple[str, Failed | None, str]:
        """The call's host, its result and the result's metric label."""
        try:
            request = self._prepare(call)
        except _Refusal as refusal:
            return _authority(call.url), refusal.failed, "egress_refused"
        host = request.host
        try:
            keys = await self.keys(call.tenant)
        except Exception as exc:
            # Our store's trouble, not the schedule's: no attempt is spent.
            log.warning("no signing secrets for a delivery", tenant=call.tenant, error=str(exc))
            unavailable = Failed(
                f"signing secrets unavailable: {_line(exc)}", Trouble.DESTINATION, KEYS_WAIT
            )
            return host, unavailable, "waited"
        if not keys:
            unsigned = Failed(f"no signing secret for tenant {call.tenant}", Trouble.REFUSED)
            return host, unsigned, "refused"
        # Checked before queueing for a slot too: a call to a host whose
        # circuit is open does not wait behind the calls that opened it.
        blocked = self.breakers.blocked(host)
        if blocked is not None:
            return host, _circuit_open(host, blocked), "circuit_open"
        async with self.gates.hold(host):
            admission = self.breakers.admit(host)
            if isinstance(admission, Blocked):
                return host, _circuit_open(host, admission), "circuit_open"
            result, label = await self._sent(request, keys, admission)
        return host, result, label

    def _prepare(self, call: HttpCall) -> _Request:
        """The request for ``call``, or _Refusal when its URL may not be called."""
        policy = ANY_ADDRESS if call.trusted else self.policy
        try:
            check_url(call.url, policy)
            url = URL(call.url)
        except (ValidationFailed, ValueError) as exc:
            raise _Refusal(_egress_refused(str(exc))) from None
        raw_host = url.raw_host or ""
        why = address_refusal(raw_host, policy)
        if why is not None:
            raise _Refusal(_egress_refused(why))
        own = dataclasses.replace(call, headers=own_headers_win(call.headers))
        return _Request(own, url, _host_key(raw_host, url.port))

    async def _sent(
        self, request: _Request, keys: Sequence[bytes], admission: Pass
    ) -> tuple[Failed | None, str]:
        """Send under ``admission`` and tell the host's breaker what came of it."""
        health = Health.UNTRIED
        try:
            result, health = await self._send(request, keys)
        finally:
            # Cancelled (health still UNTRIED) or refused before sending: a
            # probe's turn goes to the next call.
            if health is Health.UNTRIED:
                self.breakers.abandoned(request.host, admission)
        if health is Health.ANSWERED:
            self.breakers.succeeded(request.host, admission)
        elif health is Health.FAILED:
            assert result is not None
            wait = self.breakers.failed(request.host, admission)
            if wait is not None:
                error = f"{result.error} (probing {request.host}, whose circuit is open)"
                return Failed(error, Trouble.DESTINATION, wait), "waited"
        return result, _label(result, health)

    async def _send(self, request: _Request, keys: Sequence[bytes]) -> tuple[Failed | None, Health]:
        call = request.call
        session = self._trusted if call.trusted else self._checked
        assert session is not None
        signed = signed_headers(call, keys, int(self.clock().timestamp()))
        headers = own_headers_win([*call.headers, *signed])
        with self.tracing.calling(call.method, request.host, headers) as outgoing:
            try:
                async with session.request(
                    call.method,
                    request.url,
                    headers=outgoing.headers,
                    data=call.body,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=call.timeout),
                ) as response:
                    body = await _read_bounded(response.content)
                    retry_after = response.headers.get("Retry-After")
                    result = http_result(
                        response.status, retry_after, body, self.clock(), self.max_wait
                    )
            except Exception as exc:
                failure = _failure(exc, request)
                outgoing.failed(failure[0].error)
                return failure
            if result is not None:
                outgoing.failed(result.error)
        retried = result is not None and result.trouble is Trouble.RETRY
        return result, Health.FAILED if retried else Health.ANSWERED


def _failure(exc: Exception, request: _Request) -> tuple[Failed, Health]:
    """What an exception from sending a request makes of it: refused when
    nothing was sent (the egress check), the host's trouble when its
    connection was refused, else a retry (the host did not answer in time,
    or the connection failed otherwise). Raises what is none of those."""
    if isinstance(exc, aiohttp.ClientConnectorError) and isinstance(exc.os_error, EgressRefused):
        return _egress_refused(str(exc.os_error)), Health.UNTRIED
    if isinstance(exc, aiohttp.InvalidURL):
        return _egress_refused(f"not a URL aiohttp calls: {_line(exc)}"), Health.UNTRIED
    if isinstance(exc, aiohttp.ClientConnectorError) and isinstance(
        exc.os_error, ConnectionRefusedError
    ):
        # Nothing was sent: the host is down, not the schedule wrong (an
        # unreachable broker spends no attempt either). Else a lone
        # schedule to a host down for 15 s spent its five attempts before
        # any node's circuit opened: each node's breaker counts its own
        # calls, and an owner change during the outage started the count
        # again (found by ``python -m chaos simulate``). The host's
        # failures still open its circuit, and the outage bound still ends
        # a wait of days.
        refused = f"could not connect to {request.host}: {_line(exc.os_error)} (refused)"
        return Failed(refused, Trouble.DESTINATION, REFUSED_WAIT), Health.FAILED
    error = _retry_error(exc, request)
    if error is None:
        raise exc
    return Failed(error, Trouble.RETRY), Health.FAILED


def _retry_error(exc: Exception, request: _Request) -> str | None:
    host = request.host
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return f"TLS certificate of {host} not verified: {_line(exc.certificate_error)}"
    if isinstance(exc, aiohttp.ClientSSLError):
        return f"TLS with {host} failed: {_line(exc)}"
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return f"could not resolve {host}: {_line(exc.os_error)}"
    if isinstance(exc, TimeoutError):
        return f"timed out after {request.call.timeout:g}s"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"could not connect to {host}: {_line(exc.os_error)}"
    if isinstance(exc, aiohttp.ClientError | OSError):
        return f"{type(exc).__name__} from {host}: {_line(exc)}"
    return None


async def _read_bounded(content: aiohttp.StreamReader) -> bytes:
    """At most BODY_READ bytes of a body (a read returns what has arrived,
    so one is not enough for a body that came in pieces)."""
    body = b""
    while len(body) < BODY_READ:
        chunk = await content.read(BODY_READ - len(body))
        if not chunk:
            break
        body += chunk
    return body


def own_headers_win(headers: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """``headers`` without a caller's framing headers, and with one value of
    each scheduler header: the last (``build_call`` puts the scheduler's
    after the caller's, and the signing headers come last; parsing refuses
    a caller's anyway). Applied before signing too, so the fence signature
    is made over the values sent."""
    last = {name.lower(): index for index, (name, _) in enumerate(headers)}
    kept: list[tuple[str, str]] = []
    for index, (name, value) in enumerate(headers):
        lower = name.lower()
        if lower in SCHEDULER_HEADERS:
            if last[lower] == index:
                # Lower case, as signed_headers looks them up.
                kept.append((lower, value))
        elif lower not in FRAMING_HEADERS:
            kept.append((name, value))
    return kept


def address_refusal(host: str, policy: EgressPolicy) -> str | None:
    """Why the address literal ``host`` may not be connected to. aiohttp
    connects to a host that looks like an address (a ':' in it, or only
    digits and dots) without asking its resolver (TCPConnector._resolve_host,
    helpers.is_ip_address, aiohttp 3.14), so the egress check of a literal
    is made here, on the host aiohttp reads from the URL."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if ":" in host or host.replace(".", "").isdigit():
            return f"{host} (an address not plainly written)"
        return None  # a name: the resolver checks what it resolves to
    return policy.refusal(address)


def _circuit_open(host: str, blocked: Blocked) -> Failed:
    return Failed(
        f"circuit open for {host} (failing): not sent, next probe in {blocked.wait:.1f}s",
        Trouble.DESTINATION,
        blocked.wait,
    )


def _egress_refused(reason: str) -> Failed:
    return Failed(f"egress refused: {_line(reason)}", Trouble.REFUSED)


def _label(result: Failed | None, health: Health) -> str:
    if result is None:
        return "delivered"
    if health is Health.UNTRIED:
        return "egress_refused"  # refused before anything was sent
    return {Trouble.RETRY: "retry", Trouble.REFUSED: "refused", Trouble.DESTINATION: "waited"}[
        result.trouble
    ]


def _authority(url: str) -> str:
    """host:port of ``url`` as best it can be read, for a metric's label."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    except ValueError:
        return "invalid"
    return _host_key(parts.hostname or "invalid", port)


def _host_key(host: str, port: int | None) -> str:
    """host:port, whose slots and circuit a call takes (an IPv6 address in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _line(value: object) -> str:
    return " ".join(str(value).split())[:ERROR_CHARS] or type(value).__name__
