"""The Python client (clients/python) against real nodes: a create's ETag,
the surface a script uses (create, get, patch with the create's ETag, the
verbs, a listing across pages, errors by code), the same from a fresh
virtualenv with only the client installed, the same awaited, a 503
of a store cut from the node retried until the store is back, and the
webhook verifier against the node's own signing and the standardwebhooks
package."""

from __future__ import annotations

import asyncio
import base64
import builtins
import os
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import standardwebhooks
from aiohttp import web
from bucket_scheduler_client import (
    ApiError,
    AsyncClient,
    Client,
    ClientError,
    InvalidRequest,
    InvalidState,
    NotFound,
    RateLimited,
    Retry,
    TransportError,
    Verifier,
    VersionMismatch,
    WebhookVerificationError,
)
from bucket_scheduler_client._core import create_body, retry_after_seconds
from bucket_scheduler_client.models import HttpTarget, Schedule, decode

from node.ops import embedded
from node.schedule.webhook import HttpCall, new_secret, secret_key, signed_headers
from tests.conftest import HOST, EmbeddedServers, NodeFactory, unique, wait_until
from tests.helpers import ROOT, serving
from tests.tcp_cut import CuttableRelay


def later(seconds: float = 3600) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


def stamp(when: datetime) -> str:
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- the server: a create's answer carries the ETag --------------------------------


async def test_a_create_answers_with_the_etag_a_patch_can_name(start_node: NodeFactory) -> None:
    node = await start_node()
    url = node.url + "/v1/schedules"
    body = {"id": unique("etag"), "topic": unique("etag-topic"), "executeAt": stamp(later()),
            "payload": 1}  # fmt: skip
    async with node.session.post(url, json=body) as created:
        assert created.status == 201 and created.headers["ETag"] == '"1"'
    async with node.session.post(url, json=body) as again:  # the same id and body
        assert again.status == 200 and again.headers["ETag"] == '"1"'
    one = f"{url}/{body['id']}"
    change = {"json": {"payload": 2}, "headers": {"If-Match": created.headers["ETag"]}}
    async with node.session.patch(one, **change) as patched:
        assert patched.status == 200 and patched.headers["ETag"] == '"2"'
    async with node.session.patch(one, **change) as stale:
        assert stale.status == 412


# -- the surface, blocking and awaited ----------------------------------------------


def sync_script(url: str, topic: str, label: str) -> list[int]:
    """What a script does with the client; the sizes of the listing's pages."""
    with Client(url) as c:
        s = c.create(topic=topic, execute_at=later(), payload={"order": 42},
                     labels={"order": label})  # fmt: skip
        assert (s.status, s.version, s.etag) == ("PENDING", 1, '"1"') and s.id
        assert c.get(s.id) == s and c.get(s).raw == s.raw
        changed = c.patch(s, payload={"order": 43})  # If-Match from the create
        assert changed.version == 2 and changed.payload == {"order": 43}
        with pytest.raises(VersionMismatch) as stale:
            c.patch(s, payload={"order": 44})  # s is at version 1 no longer
        assert stale.value.status == 412 and stale.value.error_code == "version_mismatch"
        assert c.pause(changed).status == "PAUSED"
        for n in range(5):
            c.create(topic=topic, execute_at=later(), payload=n, labels={"order": label})
        pages = [len(p.schedules) for p in c.pages(label=f"order={label}", limit=2)]
        listed = [x.id for x in c.list(label=f"order={label}", limit=2)]
        assert len(set(listed)) == 6 and s.id in listed
        assert c.resume(s).status == "PENDING"
        assert c.trigger(s).status in {"PENDING", "IN_FLIGHT", "DELIVERED"}
        with pytest.raises(InvalidState):
            c.retry(s)  # not DELIVERY_FAILED
        other = c.create(topic=topic, execute_at=later(), payload=0)
        assert c.cancel(other).status == "CANCELLED"
        assert c.cancel(other).status == "CANCELLED"  # again: the same answer
        with pytest.raises(NotFound) as missing:
            c.get(unique("missing"))
        assert missing.value.status == 404
        with pytest.raises(InvalidRequest) as invalid:
            c.create(topic="no spaces", execute_at=later(), payload=1)
        assert invalid.value.field == "topic"
        return pages


async def test_a_script_creates_patches_pauses_lists_and_cancels(start_node: NodeFactory) -> None:
    node = await start_node()
    # Blocking calls: in a thread, so that the node in this loop answers them.
    pages = await asyncio.to_thread(sync_script, node.url, unique("client"), unique("o"))
    assert pages == [2, 2, 2]


async def test_the_example_script_runs_against_a_node(start_node: NodeFactory) -> None:
    """clients/python/examples/round_trip.py, as a user runs it: its own process."""
    node = await start_node()
    script = ROOT / "clients" / "python" / "examples" / "round_trip.py"
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(script), node.url, unique("example"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 120)  # a hang guard
    assert process.returncode == 0, err.decode()
    assert out.decode().split("]", 1)[1].split() == ["6", "3", "PAUSED", "CANCELLED"]
    assert out.decode().startswith("[2, 2, 2]")


async def test_pip_install_into_a_fresh_virtualenv_then_the_example_runs(
    start_node: NodeFactory, tmp_path: Path
) -> None:
    """As a service team installs it: `pip install ./clients/python` into a
    virtualenv of its own (httpx from the package index, nothing of the
    scheduler's), then the example against a node, from outside the checkout."""
    venv = tmp_path / "venv"
    python = str(venv / "bin" / "python")
    await run_checked(sys.executable, "-m", "venv", str(venv), cwd=tmp_path)
    install = ("-m", "pip", "install", "--quiet", "--disable-pip-version-check")
    await run_checked(python, *install, str(ROOT / "clients" / "python"), cwd=tmp_path)
    where = "import bucket_scheduler_client as c; print(c.__file__)"
    where = await run_checked(python, "-c", where, cwd=tmp_path)
    assert where.startswith(str(venv))  # the installed copy, not the checkout's
    installed = await run_checked(python, "-m", "pip", "list", "--format=freeze", cwd=tmp_path)
    assert "bucket-scheduler-client" in installed and "aiohttp" not in installed
    node = await start_node()
    script = ROOT / "clients" / "python" / "examples" / "round_trip.py"
    out = await run_checked(python, str(script), node.url, unique("fresh"), cwd=tmp_path)
    assert out.startswith("[2, 2, 2]")
    assert out.split("]", 1)[1].split() == ["6", "3", "PAUSED", "CANCELLED"]


async def run_checked(*argv: str, cwd: Path) -> str:
    """``argv``'s output; fails with its error output if it fails."""
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 600)  # a hang guard
    assert process.returncode == 0, (argv, err.decode()[-3000:])
    return out.decode()


async def test_the_async_client_does_the_same(start_node: NodeFactory) -> None:
    node = await start_node()
    topic, label = unique("aclient"), unique("o")
    async with AsyncClient(node.url) as c:
        s = await c.create(topic=topic, execute_at=later(), payload={"order": 42},
                           labels={"order": label})  # fmt: skip
        assert (s.version, s.etag) == (1, '"1"')
        assert await c.get(s) == s
        changed = await c.patch(s, payload={"order": 43})
        assert changed.version == 2
        with pytest.raises(VersionMismatch):
            await c.patch(s, payload={"order": 44})
        assert (await c.pause(changed)).status == "PAUSED"
        batch = await c.create_batch(
            [{"topic": topic, "execute_at": later(), "payload": n, "labels": {"order": label}}
             for n in range(5)]
        )  # fmt: skip
        assert batch.created == 5 and all(r.schedule and r.schedule.version == 1
                                          for r in batch.results)  # fmt: skip
        pages = [len(p.schedules) async for p in c.pages(label={"order": label}, limit=2)]
        assert pages == [2, 2, 2]
        listed = [x.id async for x in c.list(label=f"order={label}", limit=2)]
        assert len(set(listed)) == 6
        dry = await c.bulk("cancel", labels={"order": label}, dry_run=True)
        assert (dry.matched, dry.changed, dry.dry_run) == (6, 0, True)
        done = await c.bulk("cancel", labels={"order": label})
        assert (done.changed, done.more) == (6, False)
        assert (await c.get(s)).status == "CANCELLED"
        assert (await c.history(s)).id == s.id
        assert (await c.healthz()).ok and "members" in await c.cluster()
        assert "paths" in await c.openapi()


# -- retries ------------------------------------------------------------------------


@pytest.fixture
async def relay(servers: EmbeddedServers) -> AsyncIterator[CuttableRelay]:
    # Requested before start_node, so it outlives the node (teardown runs in reverse).
    relay = CuttableRelay((servers.mongo_host, servers.mongo_port))
    await relay.start(HOST)
    try:
        yield relay
    finally:
        await relay.stop()


# A hang guard, not a measure: far more tries than a store coming back takes.
PATIENT = Retry(attempts=300, backoff=0.2, max_backoff=1.0)


async def test_a_503_of_a_cut_store_is_retried_until_the_store_is_back(
    relay: CuttableRelay, start_node: NodeFactory
) -> None:
    via_relay = embedded.mongo_uri(HOST, relay.port) + "&connectTimeoutMS=120000"
    node = await start_node(mongo_uri=via_relay, store_timeout="1")
    retried: list[tuple[float, ClientError]] = []
    label = unique("cut")

    def refused_with_503() -> Any:
        async def condition() -> bool:
            return any(isinstance(e, ApiError) and e.status == 503 for _, e in retried)

        return condition

    async with AsyncClient(
        node.url, retry=PATIENT, on_retry=lambda n, wait, error: retried.append((wait, error))
    ) as c:
        first = await c.create(topic=unique("cut-topic"), execute_at=later(), payload=1)
        relay.cut()
        second = c.create(
            topic=unique("cut-topic"), execute_at=later(), payload=2, labels={"run": label}
        )
        create = asyncio.create_task(second)
        await wait_until(refused_with_503(), 60, "a 503 from the cut store, and a retry")
        relay.heal()
        made = await create
        assert made.status == "PENDING" and made.version == 1
        # Sent more than once, made once: the id the client gave it.
        assert [x.id async for x in c.list(label=f"run={label}")] == [made.id]
        # Each wait was the one the node asked for, when it asked.
        asked = [(w, e.retry_after) for w, e in retried if isinstance(e, ApiError)]
        assert asked and all(w == after for w, after in asked if after is not None)

        # Blocking: a GET while cut, answered once the store is back.
        retried.clear()
        relay.cut()
        with Client(node.url, retry=PATIENT, on_retry=lambda n, w, e: retried.append((w, e))) as s:
            read = asyncio.create_task(asyncio.to_thread(s.get, first.id))
            await wait_until(refused_with_503(), 60, "a 503 of the GET, and a retry")
            relay.heal()
            assert (await read) == first


async def test_a_429_is_retried_after_its_retry_after(
    relay: CuttableRelay, start_node: NodeFactory
) -> None:
    """A listing holds the tenant's one read slot on the node while the
    store is cut (up to STORE_TIMEOUT); another listing meanwhile is a 429
    with Retry-After: 1, waited out and tried again until the store is back."""
    via_relay = embedded.mongo_uri(HOST, relay.port) + "&connectTimeoutMS=120000"
    node = await start_node(mongo_uri=via_relay, store_timeout="10")
    retried: list[tuple[float, ClientError]] = []
    async with AsyncClient(
        node.url,
        retry=PATIENT,
        on_retry=lambda n, wait, error: retried.append((wait, error)),
        timeout=60,  # longer than the store's: the node answers first
    ) as c:
        await c.create(topic=unique("slot"), execute_at=later(), payload=1)
        # The node reads a listing's tenant policy now and keeps it a few
        # seconds: cut, the listings then reach the read slot, not the store.
        await c.list_page(limit=1)
        relay.cut()
        pages = [asyncio.create_task(c.list_page(limit=1)) for _ in range(2)]

        async def rate_limited() -> bool:
            return any(isinstance(e, RateLimited) for _, e in retried)

        await wait_until(rate_limited, 60, "a 429 while the other listing holds the slot")
        relay.heal()
        answers = await asyncio.gather(*pages)
    assert all(len(page.schedules) == 1 for page in answers)
    limited = [(wait, e.retry_after) for wait, e in retried if isinstance(e, RateLimited)]
    assert limited and all(wait == after == 1.0 for wait, after in limited)


def test_a_node_that_does_not_answer_is_a_transport_error_after_the_retries() -> None:
    import socket

    with socket.socket() as unused:  # a port nobody listens on
        unused.bind((HOST, 0))
        port = unused.getsockname()[1]
    waits: list[float] = []
    retry = Retry(attempts=3, backoff=0.01, max_backoff=0.02)
    url = f"http://{HOST}:{port}"
    with (
        Client(url, retry=retry, on_retry=lambda n, w, e: waits.append(w)) as c,
        pytest.raises(TransportError),
    ):
        c.get("x")
    assert waits == [0.01, 0.02]  # nothing was sent: retried, within the bound


def test_the_retry_policy_honours_retry_after_within_its_bound() -> None:
    retry = Retry(attempts=5, backoff=0.5, max_backoff=2.0, max_wait=10.0)
    assert [retry.delay(n, None) for n in range(1, 6)] == [0.5, 1.0, 2.0, 2.0, None]
    assert retry.delay(1, 3.0) == 3.0  # the node's Retry-After, not the backoff
    assert retry.delay(1, 11.0) is None  # longer than it waits: raised to the caller
    refused = ApiError(409, "in flight", retry_after=1.0)
    assert retry.wait_after(1, refused) is None  # only 429 and 503
    assert retry.wait_after(1, ApiError(503, "down", retry_after=1.0)) == 1.0


# -- webhook verification -------------------------------------------------------------


def delivery(secrets: list[str], timestamp: int, token: int = 7) -> tuple[dict[str, str], bytes]:
    """A delivery as the node signs it (node/schedule/webhook.py)."""
    call = HttpCall(
        url="https://hooks.example/orders",
        method="POST",
        headers=[("x-caller", "a"), ("schedule-id", "order-1"),
                 ("execute-at", "2030-01-01T00:00:00.000Z"), ("fence-token", str(token)),
                 ("attempt", "1"), ("tenant", "default"), ("content-type", "application/json")],
        body=b'{"order": 42}',
        timeout=10.0,
        tenant="default",
        webhook_id="msg_0123456789abcdef",
    )  # fmt: skip
    signed = signed_headers(call, [secret_key(s) for s in secrets], timestamp)
    return dict([*call.headers, *signed]), call.body


async def test_a_receiver_verifies_what_a_node_delivered(start_node: NodeFactory) -> None:
    secret = new_secret()
    node = await start_node(http_targets_allow="127.0.0.0/8", http_signing_secret=secret)
    arrived: list[tuple[dict[str, str], bytes]] = []

    async def receive(request: web.Request) -> web.Response:
        arrived.append((dict(request.headers), await request.read()))
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", receive)
    async with serving(app, HOST) as url, AsyncClient(node.url) as c:
        s = await c.create(http={"url": f"{url}/hook"},
                           execute_at=datetime.now(UTC), payload={"order": 42})  # fmt: skip

        async def delivered() -> bool:
            return bool(arrived) and (await c.get(s)).status == "DELIVERED"

        await wait_until(delivered, 60, "the delivery, and its mark")
    [(headers, body)] = arrived
    checked = Verifier(secret).verify(headers, body)
    assert (checked.schedule_id, checked.attempt, checked.tenant) == (s.id, 1, "default")
    assert checked.fence_token is not None and checked.fence_token >= 1
    assert standardwebhooks.Webhook(secret).verify(body, headers) == {"order": 42}
    forged = {**headers, "fence-token": str(checked.fence_token + 1)}
    with pytest.raises(WebhookVerificationError):
        Verifier(secret).verify(forged, body)


def test_the_verifier_takes_what_the_node_signs_and_standardwebhooks_agrees() -> None:
    secret = new_secret()
    now = int(time.time())
    headers, body = delivery([secret], now)
    checked = Verifier(secret).verify(headers, body)
    assert (checked.schedule_id, checked.fence_token, checked.attempt) == ("order-1", 7, 1)
    assert checked.webhook_id == "msg_0123456789abcdef" and checked.timestamp == now
    assert standardwebhooks.Webhook(secret).verify(body, headers) == {"order": 42}

    # What standardwebhooks signs, the client verifies (it has no fence signature).
    hook = standardwebhooks.Webhook(secret)
    signature = hook.sign("msg_x", datetime.fromtimestamp(now, UTC), "{}")
    theirs = {"webhook-id": "msg_x", "webhook-timestamp": str(now), "webhook-signature": signature}
    assert Verifier(secret, fence=False).verify(theirs, b"{}").fence_token is None
    with pytest.raises(WebhookVerificationError):
        Verifier(secret).verify(theirs, b"{}")  # no fence-signature to trust the token by


def test_the_verifier_refuses_a_changed_body_fence_old_timestamp_or_other_secret() -> None:
    secret, other = new_secret(), new_secret()
    now = int(time.time())
    headers, body = delivery([secret], now)
    verifier = Verifier(secret, tolerance=300, clock=lambda: float(now))
    verifier.verify(headers, body)
    with pytest.raises(WebhookVerificationError):
        verifier.verify(headers, b'{"order": 43}')
    with pytest.raises(WebhookVerificationError):
        verifier.verify({**headers, "fence-token": "8"}, body)
    with pytest.raises(WebhookVerificationError):
        Verifier(secret, clock=lambda: float(now + 301)).verify(headers, body)
    with pytest.raises(WebhookVerificationError):
        Verifier(other).verify(headers, body)
    # During a rotation the node signs with both; a receiver knowing either takes it.
    rotated, _ = delivery([other, secret], now)
    Verifier(other, clock=lambda: float(now)).verify(rotated, body)
    Verifier(base64.b64decode(secret.removeprefix("whsec_")), clock=lambda: float(now)).verify(
        rotated, body
    )
    assert builtins.len(rotated["webhook-signature"].split()) == 2


# -- what the client sends and reads, without a node ---------------------------------


def test_a_create_gets_an_id_and_its_fields_in_the_apis_spelling() -> None:
    body = create_body(
        {"topic": "t", "execute_at": datetime(2030, 1, 1), "payload": None,
         "expire_after": timedelta(seconds=1.5), "http": HttpTarget(url="https://h.example/x"),
         "flow_control": {"key": "k", "rate": 1}}
    )  # fmt: skip
    assert body.pop("id").startswith("c-")
    assert body == {"topic": "t", "executeAt": "2030-01-01T00:00:00.000Z", "payload": None,
                    "expireAfter": "PT1.500S", "http": {"url": "https://h.example/x"},
                    "flowControl": {"key": "k", "rate": 1}}  # fmt: skip
    assert create_body({"id": "mine", "topic": "t"})["id"] == "mine"
    with pytest.raises(TypeError):
        create_body({"execute_at": "2030-01-01T00:00:00Z", "executeAt": "x"})


def test_an_answer_keeps_what_the_client_does_not_know_yet() -> None:
    s = decode(Schedule, {"id": "a", "version": 3, "snoozedAt": "later",
                          "executeAt": "2030-01-01T00:00:00.000Z"})  # fmt: skip
    assert s.raw["snoozedAt"] == "later" and s.version == 3
    assert s.execute_at == datetime(2030, 1, 1, tzinfo=UTC)
    assert s.if_match == '"3"'  # no ETag header: the version, quoted


def test_retry_after_as_seconds_or_an_http_date() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    assert retry_after_seconds("2", now) == 2.0
    assert retry_after_seconds("Tue, 01 Jan 2030 00:00:05 GMT", now) == 5.0
    assert retry_after_seconds("soon", now) is None and retry_after_seconds(None, now) is None
