"""The HTTP sink (node/delivery/sinks/http.py) against real HTTP servers in
this process: aiohttp web apps on free ports of 127.0.0.1 and 127.0.0.2
(both loopback on Linux, two hosts to the sink). What it signs is verified
by the Standard Webhooks reference library, not by our own code.

Nothing here waits on a clock: a hanging endpoint hangs until the test
releases it, and what happened first is read from events, not durations.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import hmac
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
import trustme
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from node.delivery.sink import Failed, Trouble
from node.delivery.sinks.breaker import State
from node.delivery.sinks.http import (
    BODY_READ,
    REFUSED_WAIT,
    EgressResolver,
    HttpSink,
    address_refusal,
)
from node.metrics import NodeMetrics
from node.schedule.egress import EgressPolicy
from node.schedule.webhook import FENCE_SIGNED, HttpCall, build_call, new_secret, secret_key
from tests.conftest import metric_samples

SECRET = new_secret()
OLD_SECRET = new_secret()
TENANT = "acme"
LOOPBACK_OPEN = EgressPolicy.parse("127.0.0.0/8")
BIG_BODY = 64 * 1024 * 1024  # far more than any socket buffer holds


# -- an endpoint that records what it receives ---------------------------------


@dataclass
class Seen:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> list[str]:
        return [v for n, v in self.headers if n.lower() == name]


@dataclass
class Receiver:
    """Routes: /ok (204), /status/{code} (?retry_after=N), /hang (until the
    test releases it), /big (a 500 whose body never ends), /redirect?to=URL."""

    host: str = "127.0.0.1"
    port: int = 0
    seen: list[Seen] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    streamed: asyncio.Future[int] | None = None
    runner: web.AppRunner | None = None

    def url(self, path: str, scheme: str = "http") -> str:
        return f"{scheme}://{self.host}:{self.port}{path}"

    async def start(self, tls: ssl.SSLContext | None = None) -> None:
        app = web.Application()
        app.router.add_route("*", "/ok", self.ok)
        app.router.add_route("*", "/status/{code}", self.status)
        app.router.add_route("*", "/hang", self.hang)
        app.router.add_route("*", "/big", self.big)
        app.router.add_route("*", "/redirect", self.redirect)
        self.runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port, ssl_context=tls)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def close(self) -> None:
        self.release.set()
        if self.runner is not None:
            await self.runner.cleanup()

    async def record(self, request: web.Request) -> None:
        body = await request.read()
        self.seen.append(Seen(request.method, request.path, list(request.headers.items()), body))

    async def ok(self, request: web.Request) -> web.Response:
        await self.record(request)
        return web.Response(status=204)

    async def status(self, request: web.Request) -> web.Response:
        await self.record(request)
        headers = {}
        if "retry_after" in request.query:
            headers["Retry-After"] = request.query["retry_after"]
        return web.Response(status=int(request.match_info["code"]), headers=headers, text="nope")

    async def hang(self, request: web.Request) -> web.Response:
        await self.record(request)
        self.entered.set()
        await self.release.wait()
        return web.Response(status=204)

    async def redirect(self, request: web.Request) -> web.Response:
        await self.record(request)
        return web.Response(status=302, headers={"Location": request.query["to"]})

    async def big(self, request: web.Request) -> web.StreamResponse:
        """A 500 with a body of BIG_BODY bytes, written until the client
        goes away; ``streamed`` says how much was written."""
        await self.record(request)
        self.streamed = asyncio.get_running_loop().create_future()
        response = web.StreamResponse(status=500, headers={"Content-Length": str(BIG_BODY)})
        await response.prepare(request)
        written, chunk = 0, b"x" * 65536
        try:
            while written < BIG_BODY:
                await response.write(chunk)
                written += len(chunk)
        except ConnectionError:
            pass
        finally:
            self.streamed.set_result(written)
        return response


Serve = Callable[..., Awaitable[Receiver]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    receivers: list[Receiver] = []

    async def start(host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> Receiver:
        receiver = Receiver(host)
        receivers.append(receiver)
        await receiver.start(tls)
        return receiver

    try:
        yield start
    finally:
        for receiver in receivers:
            await receiver.close()


@pytest.fixture
async def receiver(serve: Serve) -> Receiver:
    return await serve()


# -- the sink --------------------------------------------------------------------


async def tenant_keys(tenant: str) -> Sequence[bytes]:
    return [secret_key(SECRET)] if tenant == TENANT else []


def now() -> datetime:
    # The receiver's verifier compares webhook-timestamp with its own wall
    # clock (a five-minute tolerance), so the sink signs with the same one.
    return datetime.now(UTC)


class Clock:
    """The breakers' monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


SinkFactory = Callable[..., Awaitable[HttpSink]]


@pytest.fixture
async def make_sink() -> AsyncIterator[SinkFactory]:
    sinks: list[HttpSink] = []

    async def make(policy: EgressPolicy = LOOPBACK_OPEN, **options: Any) -> HttpSink:
        options.setdefault("keys", tenant_keys)
        sink = HttpSink(policy, clock=now, **options)
        sinks.append(sink)
        await sink.start()
        return sink

    try:
        yield make
    finally:
        for sink in sinks:
            await sink.stop()


def call(url: str, *, timeout: float = 10.0, headers: dict[str, str] | None = None) -> HttpCall:
    doc = {
        "_id": "s-1",
        "tenant": TENANT,
        "http": {"url": url, "headers": headers or {"X-Caller": "yes"}, "timeout": timeout},
        "executeAt": datetime(2030, 1, 1, 12, tzinfo=UTC),
        "createdAt": datetime(2029, 12, 31, tzinfo=UTC),
        "payload": b'{"order": 42}',
        "payloadFormat": "json",
    }
    return build_call(doc, token=7, attempt=2)


def one(results: list[Failed | None]) -> Failed:
    [result] = results
    assert result is not None
    return result


# -- signing ---------------------------------------------------------------------


async def test_a_receiver_verifies_the_signature(
    receiver: Receiver, make_sink: SinkFactory
) -> None:
    sink = await make_sink()
    sent = call(receiver.url("/ok"))
    assert await sink.publish([sent]) == [None]
    [seen] = receiver.seen
    headers = dict(seen.headers)
    assert Webhook(SECRET).verify(seen.body, headers) == {"order": 42}
    assert seen.header("webhook-id") == [sent.webhook_id]
    assert seen.header("x-caller") == ["yes"]
    assert seen.header("schedule-id") == ["s-1"]
    assert seen.header("fence-token") == ["7"]
    assert seen.header("content-type") == ["application/json"]
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(seen.body, headers)


async def test_during_a_rotation_either_secret_alone_verifies(
    receiver: Receiver, make_sink: SinkFactory
) -> None:
    async def two_keys(tenant: str) -> Sequence[bytes]:
        return [secret_key(SECRET), secret_key(OLD_SECRET)]

    sink = await make_sink(keys=two_keys)
    assert await sink.publish([call(receiver.url("/ok"))]) == [None]
    [seen] = receiver.seen
    headers = dict(seen.headers)
    assert len(headers["webhook-signature"].split(" ")) == 2
    Webhook(SECRET).verify(seen.body, headers)
    Webhook(OLD_SECRET).verify(seen.body, headers)


async def test_the_fence_signature_covers_the_signed_headers(
    receiver: Receiver, make_sink: SinkFactory
) -> None:
    sink = await make_sink()
    assert await sink.publish([call(receiver.url("/ok"))]) == [None]
    [seen] = receiver.seen
    headers = dict(seen.headers)
    # As webhook.py's docstring tells a receiver to check it.
    signed = ".".join(headers[name] for name in FENCE_SIGNED)
    content = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.{signed}".encode()
    digest = hmac.new(secret_key(SECRET), content, hashlib.sha256).digest()
    assert headers["fence-signature"] == "v1," + base64.b64encode(digest).decode()


async def test_no_secret_sends_nothing(receiver: Receiver, make_sink: SinkFactory) -> None:
    async def none(tenant: str) -> Sequence[bytes]:
        return []

    sink = await make_sink(keys=none)
    result = one(await sink.publish([call(receiver.url("/ok"))]))
    assert result.trouble is Trouble.REFUSED
    assert "no signing secret" in result.error
    assert receiver.seen == []


async def test_the_schedulers_headers_win_and_framing_headers_are_dropped(
    receiver: Receiver, make_sink: SinkFactory
) -> None:
    sink = await make_sink()
    sent = call(receiver.url("/ok"), headers={"User-Agent": "caller/1", "X-Caller": "yes"})
    forged = dataclasses.replace(
        sent,
        headers=[
            ("Schedule-Id", "forged"),
            ("Webhook-Id", "forged"),
            ("Content-Length", "1"),
            ("Transfer-Encoding", "chunked"),
            *sent.headers,
        ],
    )
    assert await sink.publish([forged]) == [None]
    [seen] = receiver.seen
    assert seen.header("schedule-id") == ["s-1"]
    assert seen.header("webhook-id") == [sent.webhook_id]
    assert seen.header("transfer-encoding") == []
    assert seen.header("user-agent") == ["caller/1"]
    assert seen.body == b'{"order": 42}'
    Webhook(SECRET).verify(seen.body, dict(seen.headers))


# -- what an answer means ----------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "trouble", "wait"),
    [
        ("/status/200", None, None),
        ("/status/400", Trouble.REFUSED, None),
        ("/status/503?retry_after=7", Trouble.DESTINATION, 7.0),
        ("/status/500", Trouble.RETRY, None),
    ],
)
async def test_statuses(
    receiver: Receiver,
    make_sink: SinkFactory,
    path: str,
    trouble: Trouble | None,
    wait: float | None,
) -> None:
    sink = await make_sink()
    [result] = await sink.publish([call(receiver.url(path))])
    if trouble is None:
        assert result is None
    else:
        assert result is not None
        assert (result.trouble, result.wait) == (trouble, wait)


async def test_results_come_in_the_order_of_the_calls(
    receiver: Receiver, make_sink: SinkFactory
) -> None:
    sink = await make_sink()
    expected = [
        ("/status/500", Trouble.RETRY),
        ("/ok", None),
        ("/status/404", Trouble.REFUSED),
        ("/status/429?retry_after=3", Trouble.DESTINATION),
        ("/ok", None),
    ]
    results = await sink.publish([call(receiver.url(path)) for path, _ in expected])
    assert [None if r is None else r.trouble for r in results] == [k for _, k in expected]


async def test_a_redirect_is_not_followed(serve: Serve, make_sink: SinkFactory) -> None:
    first, target = await serve("127.0.0.1"), await serve("127.0.0.2")
    sink = await make_sink()
    result = one(await sink.publish([call(first.url(f"/redirect?to={target.url('/ok')}"))]))
    assert result.trouble is Trouble.REFUSED
    assert "302" in result.error and "redirects are not followed" in result.error
    assert len(first.seen) == 1
    assert target.seen == []


async def test_a_hanging_endpoint_times_out_as_a_retry(
    receiver: Receiver, make_sink: SinkFactory
) -> None:
    sink = await make_sink()
    result = one(await sink.publish([call(receiver.url("/hang"), timeout=0.5)]))
    assert (result.trouble, result.error) == (Trouble.RETRY, "timed out after 0.5s")
    assert receiver.entered.is_set()


async def test_only_the_start_of_a_huge_body_is_read(
    receiver: Receiver, make_sink: SinkFactory
) -> None:
    sink = await make_sink()
    result = one(await sink.publish([call(receiver.url("/big"))]))
    assert result.trouble is Trouble.RETRY
    assert result.error.startswith("HTTP 500: xxx")
    assert len(result.error) <= len("HTTP 500: ") + 200
    # The sink hung up after its few kilobytes: the server could not write
    # the rest (64 MiB is more than the socket buffers of both ends hold).
    assert receiver.streamed is not None
    written = await receiver.streamed
    assert BODY_READ < written < BIG_BODY


async def test_a_refused_connection_waits_without_spending_an_attempt(
    make_sink: SinkFactory,
) -> None:
    # Bound and never listening: connections are refused, and no other
    # process can take the port meanwhile. Nothing was sent: the host's
    # trouble, as an unreachable broker's is; its circuit still counts it.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        sink = await make_sink()
        url = f"http://127.0.0.1:{port}/"
        result = one(await sink.publish([call(url)]))
        assert result.trouble is Trouble.DESTINATION and result.wait == REFUSED_WAIT
        assert result.error.startswith(f"could not connect to 127.0.0.1:{port}")
        for _ in range(4):  # five in a row: the circuit opens
            await sink.publish([call(url)])
        assert sink.circuit_open(url)


# -- TLS ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


async def test_an_unknown_certificate_is_a_retry_and_a_ca_bundle_trusts_it(
    serve: Serve, make_sink: SinkFactory, authority: trustme.CA, tmp_path: Any
) -> None:
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(tls)
    receiver = await serve(tls=tls)
    url = receiver.url("/ok", scheme="https")
    untrusting = await make_sink()
    result = one(await untrusting.publish([call(url)]))
    assert result.trouble is Trouble.RETRY
    assert "TLS certificate of 127.0.0.1" in result.error and "not verified" in result.error
    assert receiver.seen == []
    bundle = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(bundle))
    trusting = await make_sink(ca_bundle=str(bundle))
    assert await trusting.publish([call(url)]) == [None]
    assert len(receiver.seen) == 1


# -- one host's trouble is its own -------------------------------------------------


async def test_a_hanging_host_holds_only_its_own_calls(
    serve: Serve, make_sink: SinkFactory
) -> None:
    hanging, answering = await serve("127.0.0.1"), await serve("127.0.0.2")
    sink = await make_sink(max_per_host=1)
    # Were the slots shared, B's call would wait for A's to time out
    # (10 s), and A's publish would be done first.
    stuck = asyncio.create_task(
        sink.publish([call(hanging.url("/hang")), call(hanging.url("/hang"))])
    )
    await hanging.entered.wait()
    assert await sink.publish([call(answering.url("/ok"))]) == [None]
    assert not stuck.done()
    # One slot per host: A's second call waits for the first, unsent.
    assert len(hanging.seen) == 1
    hanging.release.set()
    assert await stuck == [None, None]
    assert len(hanging.seen) == 2
    assert len(sink.gates) == 0  # no gate kept for a host with nothing in flight


# -- the circuit breaker -----------------------------------------------------------


async def test_after_the_failures_a_host_is_not_called_until_its_probe(
    receiver: Receiver, make_sink: SinkFactory
) -> None:
    clock, metrics = Clock(), NodeMetrics()
    sink = await make_sink(
        breaker_failures=3,
        breaker_cooldown=5.0,
        breaker_cooldown_max=60.0,
        monotonic=clock,
        metrics=metrics,
    )
    failing = call(receiver.url("/status/500"))
    host = f"127.0.0.1:{receiver.port}"
    results = await sink.publish([failing] * 3)
    # The third failure (whichever call answered last) opens the circuit:
    # the host's outage, no attempt spent.
    troubles = sorted((r.trouble.value, r.wait) for r in results if r is not None)
    assert troubles == [("destination", 5.0), ("retry", None), ("retry", None)]
    assert sink.breakers.state(host) is State.OPEN

    # Open: not sent, the destination's trouble, with the time to the probe.
    blocked = one(await sink.publish([failing]))
    assert (blocked.trouble, blocked.wait) == (Trouble.DESTINATION, 5.0)
    assert blocked.error.startswith(f"circuit open for {host}")
    assert len(receiver.seen) == 3
    assert sink.circuit_open(failing.url)  # the poller leaves its schedules unclaimed

    # The cooldown over: one probe goes, the other call waits for it; the
    # probe fails, and that spends no attempt: the host is known down.
    clock.now += 5.0
    assert not sink.circuit_open(failing.url)  # a probe may go: claim
    probe, held = await sink.publish([failing, failing])
    assert probe is not None and (probe.trouble, probe.wait) == (Trouble.DESTINATION, 10.0)
    assert held is not None and held.error.startswith("circuit open")
    assert len(receiver.seen) == 4

    # The next probe succeeds and closes the circuit.
    clock.now += 10.0
    assert await sink.publish([call(receiver.url("/ok"))]) == [None]
    assert sink.breakers.state(host) is State.CLOSED
    assert one(await sink.publish([failing])).trouble is Trouble.RETRY

    counts = metric_samples(metrics, "scheduler_http_target_requests_total")
    assert counts[(host, "retry")] == 3
    assert counts[(host, "circuit_open")] == 2
    assert counts[(host, "waited")] == 2
    assert counts[(host, "delivered")] == 1
    assert metric_samples(metrics, "scheduler_http_target_circuit_open") == {(host,): 0}


async def test_an_open_circuit_shows_in_the_metrics(make_sink: SinkFactory) -> None:
    clock, metrics = Clock(), NodeMetrics()
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        sink = await make_sink(breaker_failures=2, monotonic=clock, metrics=metrics)
        dead = call(f"http://127.0.0.1:{port}/")
        await sink.publish([dead, dead])
        assert one(await sink.publish([dead])).error.startswith("circuit open")
    host = f"127.0.0.1:{port}"
    assert metric_samples(metrics, "scheduler_http_target_circuit_open") == {(host,): 1}


# -- egress: refused at delivery, nothing received -----------------------------------


class Names(AbstractResolver):
    """A DNS of our own: the names it knows, and aiohttp's resolver for the
    rest. Records what it was asked."""

    def __init__(self, names: dict[str, list[str]]) -> None:
        self.names = names
        self.asked: list[str] = []
        self.default = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked.append(host)
        if host not in self.names:
            return await self.default.resolve(host, port, family)
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in self.names[host]
        ]

    async def close(self) -> None:
        await self.default.close()


def refused_forms(port: int) -> list[str]:
    """Every refused form that could reach a server on 127.0.0.1:port."""
    return [
        f"http://127.0.0.1:{port}/ok",
        f"http://localhost:{port}/ok",
        f"http://rebind.test:{port}/ok",  # a name our DNS resolves to 127.0.0.1
        f"http://0.0.0.0:{port}/ok",  # Linux connects it to this machine
        f"http://[::ffff:127.0.0.1]:{port}/ok",
        f"http://[::1]:{port}/ok",
        f"http://2130706433:{port}/ok",
        f"http://0177.0.0.1:{port}/ok",
        f"http://0x7f.0.0.1:{port}/ok",
        f"http://127.1:{port}/ok",
        f"http://u:p@127.0.0.1:{port}/ok",
        f"ftp://127.0.0.1:{port}/ok",
        f"gopher://127.0.0.1:{port}/ok",
        "file:///etc/passwd",
    ]


async def test_every_refused_form_is_refused_at_delivery(
    receiver: Receiver, make_sink: SinkFactory
) -> None:
    metrics = NodeMetrics()
    dns = Names({"rebind.test": ["127.0.0.1"]})
    sink = await make_sink(EgressPolicy(), resolver=dns, metrics=metrics)
    urls = refused_forms(receiver.port)
    results = await sink.publish([call(url) for url in urls])
    for url, result in zip(urls, results, strict=True):
        assert result is not None, url
        assert result.trouble is Trouble.REFUSED, url
        assert result.error.startswith("egress refused: "), (url, result.error)
    assert receiver.seen == []
    # The name passed the URL check; what it resolved to did not.
    assert dns.asked == ["rebind.test"]
    rebound = results[urls.index(f"http://rebind.test:{receiver.port}/ok")]
    assert rebound is not None and "127.0.0.1 (loopback)" in rebound.error
    counts = metric_samples(metrics, "scheduler_http_target_requests_total")
    assert sum(n for (_, label), n in counts.items() if label == "egress_refused") == len(urls)


async def test_allowed_once_the_policy_names_the_range(
    receiver: Receiver, make_sink: SinkFactory
) -> None:
    dns = Names({"rebind.test": ["127.0.0.1"]})
    sink = await make_sink(LOOPBACK_OPEN, resolver=dns)
    port = receiver.port
    urls = [f"http://127.0.0.1:{port}/ok", f"http://localhost:{port}/ok"]
    urls.append(f"http://rebind.test:{port}/ok")
    assert await sink.publish([call(url) for url in urls]) == [None, None, None]
    assert len(receiver.seen) == 3
    # Still refused with loopback open: the other spellings, userinfo,
    # other schemes, and 0.0.0.0 (unspecified, not loopback).
    still = [
        f"http://0.0.0.0:{port}/ok",
        f"http://2130706433:{port}/ok",
        f"http://0177.0.0.1:{port}/ok",
        f"http://u:p@127.0.0.1:{port}/ok",
        f"ftp://127.0.0.1:{port}/ok",
    ]
    for url, result in zip(still, await sink.publish([call(u) for u in still]), strict=True):
        assert result is not None and result.trouble is Trouble.REFUSED, url
    assert len(receiver.seen) == 3


async def test_a_name_connects_only_to_the_addresses_the_policy_allows(
    serve: Serve, make_sink: SinkFactory
) -> None:
    allowed = await serve("127.0.0.2")
    # The name resolves to a refused address first and an allowed one
    # second: only the second is connected to.
    dns = Names({"mixed.test": ["127.0.0.1", "127.0.0.2"]})
    sink = await make_sink(EgressPolicy.parse("127.0.0.2/32"), resolver=dns)
    assert await sink.publish([call(f"http://mixed.test:{allowed.port}/ok")]) == [None]
    assert len(allowed.seen) == 1


async def test_the_resolver_keeps_only_allowed_addresses() -> None:
    dns = Names({"mixed.test": ["10.0.0.1", "93.184.216.34", "::1"], "inside.test": ["10.1.2.3"]})
    resolver = EgressResolver(EgressPolicy(), dns)
    [kept] = await resolver.resolve("mixed.test", 443)
    assert kept["host"] == "93.184.216.34"
    with pytest.raises(OSError, match=r"inside.test resolves to 10.1.2.3 \(private\)"):
        await resolver.resolve("inside.test", 443)
    await resolver.close()


async def test_an_address_literal_skips_the_resolver(
    receiver: Receiver, make_sink: SinkFactory
) -> None:
    """Why the sink checks an address literal itself: aiohttp connects to
    one without asking its resolver, so the resolver's check never runs."""
    dns = Names({})
    sink = await make_sink(LOOPBACK_OPEN, resolver=dns)
    assert await sink.publish([call(receiver.url("/ok"))]) == [None]
    assert dns.asked == []


@pytest.mark.parametrize(
    ("host", "refused"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("fe80::1", True),
        ("0.0.0.0", True),
        ("2130706433", True),
        ("127.1", True),
        ("127.0.0.1.", True),
        ("93.184.216.34", False),
        ("example.com", False),  # a name: the resolver's to check
    ],
)
def test_address_literals_aiohttp_would_connect_to(host: str, refused: bool) -> None:
    assert (address_refusal(host, EgressPolicy()) is not None) is refused


async def test_a_trusted_call_skips_the_policy_but_not_the_url_rules(
    receiver: Receiver, make_sink: SinkFactory
) -> None:
    sink = await make_sink(EgressPolicy())
    trusted = dataclasses.replace(call(receiver.url("/ok")), trusted=True)
    assert await sink.publish([trusted]) == [None]
    with_userinfo = dataclasses.replace(trusted, url=f"http://u:p@127.0.0.1:{receiver.port}/ok")
    assert one(await sink.publish([with_userinfo])).trouble is Trouble.REFUSED
    assert len(receiver.seen) == 1


async def test_publish_before_start_is_an_error() -> None:
    sink = HttpSink(EgressPolicy(), tenant_keys, clock=now)
    with pytest.raises(RuntimeError):
        await sink.publish([call("http://example.com/")])
