"""Tenants: API keys, isolation between tenants, topics, rate and pending quotas.

The limits' arithmetic is tested with virtual time; everything else through
the real HTTP API of a node with auth on, on the embedded store and broker.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from node.errors import QuotaExceeded, RateLimited, TenantError
from node.schedule.model import Limits
from node.schedule.parse import parse_schedule_object
from node.store.tenants import TenantStore
from node.tenants.admission import NEW_TOPICS_PER_CALL, Admission
from node.tenants.directory import (
    CACHE_SECONDS,
    NEW_KEY_LOOKUP_BURST,
    TENANTS_KEPT,
    UNKNOWN_KEYS_KEPT,
    TenantDirectory,
)
from node.tenants.model import Tenant, key_digest, validate_name
from node.tenants.quotas import PendingQuota, RateLimiter, TokenBucket
from tests.conftest import EmbeddedServers, NodeFactory, NodeHandle, TopicReader, unique, wait_until

FAR = (datetime.now(UTC) + timedelta(days=1)).isoformat().replace("+00:00", "Z")


def schedule(**fields: Any) -> dict[str, Any]:
    return {"topic": "tenant-test", "executeAt": FAR, "payload": {"n": 1}, **fields}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# -- the limits, in virtual time ------------------------------------------------


def test_token_bucket_admits_the_burst_then_the_rate() -> None:
    bucket = TokenBucket(rate=2.0, capacity=3.0, tokens=3.0, updated=0.0)
    assert bucket.take(5, now=0.0) == (3, 0.5)  # the burst; the next token in 1/rate
    assert bucket.take(1, now=0.25) == (0, 0.25)
    assert bucket.take(1, now=0.5) == (1, 0.0)
    assert bucket.take(10, now=100.0)[0] == 3  # never more than the capacity


def test_rate_is_shared_among_the_alive_nodes() -> None:
    limiter = RateLimiter()
    tenant = Tenant(name="t", rate=10.0, burst=10)
    taken, retry_after = limiter.admit(tenant, 100, now=0.0, nodes=2)
    assert (taken, retry_after) == (5, pytest.approx(0.2))
    # A node joins: the share shrinks, the fill is kept up to the new capacity.
    taken, _ = limiter.admit(tenant, 100, now=10.0, nodes=5)
    assert taken == 2
    assert limiter.admit(Tenant(name="free"), 1000, now=0.0, nodes=1) == (1000, 0.0)


class KeySource:
    """A tenant store of one key, counting lookups."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.lookups = 0

    async def tenant_for_key(self, key: str) -> Tenant | None:
        self.lookups += 1
        return Tenant(name="good") if key == self.key else None

    async def get(self, name: str) -> Tenant | None:
        return None

    async def names(self) -> list[str]:
        return []


async def test_made_up_keys_never_evict_a_good_one_and_cost_a_bounded_number_of_lookups() -> None:
    """10,001 made-up keys used to clear the cache (the good key's entry
    with them) and each cost a store read. Now the good key stays cached
    and the store is asked at most the new-key budget, the rest told 429."""
    now = [0.0]
    source = KeySource("sk_good")
    directory = TenantDirectory(source, clock=lambda: now[0])
    assert (await directory.authenticate("sk_good")) == Tenant(name="good")
    refused = 0
    for i in range(10_001):
        try:
            assert await directory.authenticate(f"sk_made_up_{i}") is None
        except RateLimited as exc:
            refused += 1
            assert exc.retry_after is not None and exc.retry_after > 0
    # The good key was new once too: it and the made-up ones share the burst.
    assert source.lookups == NEW_KEY_LOOKUP_BURST
    assert refused == 10_001 - (NEW_KEY_LOOKUP_BURST - 1)
    lookups = source.lookups
    assert (await directory.authenticate("sk_good")) == Tenant(name="good")
    assert source.lookups == lookups  # still cached: no store read
    # Past its cache time a known key is looked up again whatever the flood.
    now[0] = CACHE_SECONDS + 0.01
    for i in range(1000):
        with contextlib.suppress(RateLimited):
            await directory.authenticate(f"sk_more_{i}")
    assert (await directory.authenticate("sk_good")) == Tenant(name="good")
    assert len(directory._unknown) <= UNKNOWN_KEYS_KEPT


async def test_policies_of_made_up_tenant_names_are_kept_within_a_bound() -> None:
    """With auth off a call may name any tenant: the policies kept for the
    names asked grew with every name made up."""
    directory = TenantDirectory(KeySource("sk_good"))
    for i in range(TENANTS_KEPT + 100):
        assert (await directory.policy(f"made-up-{i}")).name == f"made-up-{i}"
    assert len(directory._by_name) == TENANTS_KEPT


class Policies:
    """A tenant directory of fixed policies."""

    def __init__(self, *tenants: Tenant) -> None:
        self.tenants = {t.name: t for t in tenants}

    async def policy(self, name: str) -> Tenant:
        return self.tenants.get(name, Tenant(name=name))


def new_schedules(tenant: str, topics: list[str]) -> list[Any]:
    now = datetime.now(UTC)
    limits = Limits(max_payload_bytes=1024, horizon=timedelta(days=1))
    return [
        parse_schedule_object(
            {"topic": topic, "executeAt": FAR, "payload": 1, "tenant": tenant}, limits, now
        )
        for topic in topics
    ]


async def test_the_broker_is_asked_about_topics_only_for_what_the_limits_let_through() -> None:
    """Asking the broker about a topic may create it: a schedule the rate or
    the pending cap refuses must not cost one, and one call asks about at
    most NEW_TOPICS_PER_CALL topics (before, one batch made 300)."""
    probed: list[str] = []

    async def topic_known(topic: str) -> bool | None:
        probed.append(topic)
        return True

    async def no_pending(tenant: str) -> int:
        return 0

    slow = Tenant(name="slow", rate=1.0, burst=2)
    capped = Tenant(name="capped", max_pending=3)
    admission = Admission(
        Policies(slow, capped),  # type: ignore[arg-type]
        PendingQuota(no_pending),
        alive_nodes=lambda: 1,
        topic_known=topic_known,
        clock=lambda: 0.0,
    )
    answers = await admission.check(new_schedules("slow", [f"s{i}" for i in range(300)]))
    assert [a for a in answers if a is None] == [None, None]  # the burst
    assert {type(a) for a in answers[2:]} == {RateLimited}
    assert probed == ["s0", "s1"]

    probed.clear()
    answers = await admission.check(new_schedules("capped", [f"c{i}" for i in range(300)]))
    assert answers[:3] == [None, None, None]
    assert {type(a) for a in answers[3:]} == {QuotaExceeded}
    assert probed == ["c0", "c1", "c2"]

    probed.clear()
    answers = await admission.check(new_schedules("free", [f"f{i}" for i in range(300)]))
    assert answers[:NEW_TOPICS_PER_CALL] == [None] * NEW_TOPICS_PER_CALL
    assert {type(a) for a in answers[NEW_TOPICS_PER_CALL:]} == {RateLimited}
    assert len(probed) == NEW_TOPICS_PER_CALL
    # Topics already known cost no probe and count against no cap.
    again = await admission.check(new_schedules("free", [f"f{i}" for i in range(16)] * 3))
    assert again == [None] * 48 and len(probed) == NEW_TOPICS_PER_CALL


async def test_pending_room_counts_the_store_and_what_was_accepted_since() -> None:
    counted: list[str] = []

    async def count(tenant: str) -> int:
        counted.append(tenant)
        return 7

    quota = PendingQuota(count)
    tenant = Tenant(name="t", max_pending=10)
    assert await quota.room(tenant, now=0.0) == 3
    quota.accepted("t", 2)
    assert await quota.room(tenant, now=0.5) == 1  # cached count + accepted here
    assert await quota.room(tenant, now=1.5) == 3  # recounted: the store knows them now
    assert counted == ["t", "t"]
    assert await quota.room(Tenant(name="free"), now=0.0) is None


# -- through the API, auth on ---------------------------------------------------


@pytest.fixture
async def tenants(servers: EmbeddedServers, database_name: str) -> Any:
    from pymongo import AsyncMongoClient

    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(servers.mongo_uri, tz_aware=True)
    store = TenantStore(client[database_name])
    await store.prepare()
    yield store
    await client.close()


async def make_tenant(store: TenantStore, name: str, **limits: Any) -> str:
    return await store.add(Tenant(name=name, **limits), datetime.now(UTC))


@pytest.fixture
async def secured(start_node: NodeFactory) -> NodeHandle:
    return await start_node(auth="on")


async def test_calls_need_a_known_key_but_probes_do_not(
    secured: NodeHandle, tenants: TenantStore, mongo: Any
) -> None:
    status, body = await secured.request("POST", "/v1/schedules", json=schedule())
    assert status == 401 and body["error"]["code"] == "unauthorized"
    async with secured.session.get(secured.url + "/v1/schedules/x") as response:
        assert response.status == 401
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    status, _ = await secured.request("GET", "/v1/schedules/x", headers=bearer("sk_made_up"))
    assert status == 401
    for open_route in ("/healthz", "/v1/openapi.json", "/metrics"):
        async with secured.session.get(secured.url + open_route) as response:
            assert response.status == 200, open_route
    assert await mongo.schedules.count_documents({}) == 0


async def test_a_tenant_never_sees_another_tenants_schedule(
    secured: NodeHandle, tenants: TenantStore, mongo: Any
) -> None:
    alice, bob = await make_tenant(tenants, "alice"), await make_tenant(tenants, "bob")
    status, mine = await secured.request(
        "POST", "/v1/schedules", json=schedule(id="order-1"), headers=bearer(alice)
    )
    assert status == 201 and mine["tenant"] == "alice" and mine["id"] == "order-1"

    # Bob reads, changes, pauses, cancels and lists: for him it does not exist.
    for method, path, body in [
        ("GET", "/v1/schedules/order-1", None),
        ("DELETE", "/v1/schedules/order-1", None),
        ("PATCH", "/v1/schedules/order-1", {"key": "bob"}),
        *[("POST", f"/v1/schedules/order-1:{verb}", None)
          for verb in ("pause", "resume", "trigger", "retry")],
    ]:  # fmt: skip
        status, answer = await secured.request(method, path, json=body, headers=bearer(bob))
        assert (status, answer["error"]["code"]) == (404, "not_found"), (method, path)
    status, answer = await secured.request(
        "POST", "/v1/schedules:cancel", json={"idPrefix": "order-"}, headers=bearer(bob)
    )
    assert (status, answer["cancelled"]) == (200, 0)
    _, listed = await secured.request("GET", "/v1/schedules", headers=bearer(bob))
    assert listed["schedules"] == []
    status, _ = await secured.request("GET", "/v1/schedules?tenant=alice", headers=bearer(bob))
    assert status == 403
    # The same id is free for him (ids are per tenant): no 409 that would reveal it.
    status, his = await secured.request(
        "POST", "/v1/schedules", json=schedule(id="order-1", topic="other"), headers=bearer(bob)
    )
    assert status == 201 and his["tenant"] == "bob"
    # A key acts only for its own tenant.
    status, body = await secured.request(
        "POST", "/v1/schedules", json=schedule(tenant="alice"), headers=bearer(bob)
    )
    assert (status, body["error"]["field"]) == (403, "tenant")

    status, still = await secured.request("GET", "/v1/schedules/order-1", headers=bearer(alice))
    assert (status, still["status"], still["topic"]) == (200, "PENDING", "tenant-test")
    assert await mongo.schedules.count_documents({}) == 2


async def test_operator_routes_need_an_admin_key(secured: NodeHandle, tenants: TenantStore) -> None:
    user, admin = await make_tenant(tenants, "user"), await make_tenant(tenants, "ops", admin=True)
    for path in ("/v1/cluster", "/v1/cluster/backlog"):
        status, body = await secured.request("GET", path, headers=bearer(user))
        assert (status, body["error"]["code"]) == (403, "forbidden"), path
        status, _ = await secured.request("GET", path, headers=bearer(admin))
        assert status == 200, path
    status, _ = await secured.request("POST", "/v1/admin/drain", headers=bearer(user))
    assert status == 403


async def test_topics_outside_the_allowed_prefixes_are_refused(
    secured: NodeHandle, tenants: TenantStore, mongo: Any
) -> None:
    key = await make_tenant(tenants, "billing", topic_prefixes=("billing.",))
    status, body = await secured.request(
        "POST", "/v1/schedules", json=schedule(topic="payments.due"), headers=bearer(key)
    )
    assert (status, body["error"]["code"], body["error"]["field"]) == (
        403,
        "topic_not_allowed",
        "topic",
    )
    status, _ = await secured.request(
        "POST", "/v1/schedules", json=schedule(topic="billing.due"), headers=bearer(key)
    )
    assert status == 201
    assert await mongo.schedules.count_documents({}) == 1


async def test_rate_limit_answers_429_with_retry_after(
    secured: NodeHandle, tenants: TenantStore, mongo: Any
) -> None:
    # 0.01/s: the burst of 2 is all the test can get, however slow the machine.
    key = await make_tenant(tenants, "bursty", rate=0.01, burst=2)
    for _ in range(2):
        status, _ = await secured.request(
            "POST", "/v1/schedules", json=schedule(), headers=bearer(key)
        )
        assert status == 201
    async with secured.session.post(
        secured.url + "/v1/schedules", json=schedule(), headers=bearer(key)
    ) as response:
        assert response.status == 429
        assert (await response.json())["error"]["code"] == "rate_limited"
        assert 1 <= int(response.headers["Retry-After"]) <= 100
    # A batch is admitted item by item.
    _, batch = await secured.request(
        "POST", "/v1/schedules:batch", json={"schedules": [schedule()] * 3}, headers=bearer(key)
    )
    assert [r["status"] for r in batch["results"]] == [429, 429, 429]
    assert await mongo.schedules.count_documents({"tenant": "bursty"}) == 2


async def test_a_tenants_delivery_rate_limits_its_schedules_that_name_no_key(
    secured: NodeHandle, tenants: TenantStore, mongo: Any
) -> None:
    key = await make_tenant(tenants, "paced", delivery_rate=7)
    status, plain = await secured.request(
        "POST", "/v1/schedules", json=schedule(id="plain"), headers=bearer(key)
    )
    assert status == 201 and plain["flowControl"] == {"key": "*tenant", "rate": 7, "period": "PT1S"}
    # A repeat is the same request: the default is no part of it.
    status, again = await secured.request(
        "POST", "/v1/schedules", json=schedule(id="plain"), headers=bearer(key)
    )
    assert status == 200 and again == plain
    own = {"key": "crm", "parallelism": 2}
    _, batch = await secured.request(
        "POST",
        "/v1/schedules:batch",
        json={"schedules": [schedule(id="own", flowControl=own), schedule(id="b")]},
        headers=bearer(key),
    )
    assert [r["status"] for r in batch["results"]] == [201, 201]
    stored = {
        d["_id"]: d["flow"] for d in await mongo.schedules.find({"tenant": "paced"}).to_list()
    }
    assert stored["paced/own"] == {"key": "crm", "parallelism": 2}
    assert stored["paced/b"] == {"key": "*tenant", "rate": 7, "periodMs": 1000}


async def test_pending_quota_refuses_above_the_cap_and_frees_on_cancel(
    secured: NodeHandle, tenants: TenantStore, mongo: Any
) -> None:
    key = await make_tenant(tenants, "capped", max_pending=3)
    _, batch = await secured.request(
        "POST",
        "/v1/schedules:batch",
        json={"schedules": [schedule(id=f"c{i}") for i in range(5)]},
        headers=bearer(key),
    )
    assert [r["status"] for r in batch["results"]] == [201, 201, 201, 429, 429]
    assert batch["results"][3]["error"]["code"] == "quota_exceeded"
    status, _ = await secured.request("POST", "/v1/schedules", json=schedule(), headers=bearer(key))
    assert status == 429
    assert await mongo.schedules.count_documents({"tenant": "capped"}) == 3

    status, _ = await secured.request("DELETE", "/v1/schedules/c0", headers=bearer(key))
    assert status == 200

    async def room_again() -> bool:
        status, _ = await secured.request(
            "POST", "/v1/schedules", json=schedule(id="c5"), headers=bearer(key)
        )
        return status == 201

    await wait_until(room_again, what="the cancelled schedule's room to be counted")


async def test_ctl_sends_the_api_key(secured: NodeHandle, tenants: TenantStore) -> None:
    from tests.helpers import ctl

    admin = await make_tenant(tenants, "ctl-ops", admin=True)
    code, _ = await ctl(secured, "members")
    assert code == 1  # refused: 401
    code, out = await ctl(secured, "--api-key", admin, "members")
    assert (code, "node-a" in out) == (0, True)


async def test_revoked_key_stops_working(secured: NodeHandle, tenants: TenantStore) -> None:
    key = await make_tenant(tenants, "rotating")
    status, _ = await secured.request("GET", "/v1/schedules", headers=bearer(key))
    assert status == 200
    assert await tenants.revoke_key(key) == 1

    async def refused() -> bool:
        status, _ = await secured.request("GET", "/v1/schedules", headers=bearer(key))
        return status == 401

    await wait_until(refused, what="the revoked key to be refused")


async def test_delivery_carries_the_tenant_and_its_own_id(
    secured: NodeHandle, tenants: TenantStore, servers: EmbeddedServers
) -> None:
    topic = unique("tenant-delivery")
    key = await make_tenant(tenants, "acme")
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    status, _ = await secured.request(
        "POST",
        "/v1/schedules",
        json=schedule(id="reminder-1", topic=topic, executeAt=now),
        headers=bearer(key),
    )
    assert status == 201
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        [record] = await reader.wait_for(1)
    headers = dict(record.headers)
    assert (headers["schedule-id"], headers["tenant"], record.key) == (
        b"reminder-1",
        b"acme",
        b"reminder-1",
    )


def test_cli_prints_the_key_once_and_stores_only_its_digest(
    servers: EmbeddedServers, database_name: str
) -> None:
    env = {"MONGO_URI": servers.mongo_uri, "MONGO_DATABASE": database_name}
    argv = [sys.executable, "-m", "node", "tenants"]
    added = subprocess.run(
        [
            *argv,
            "add",
            "cli-tenant",
            "--rate",
            "5",
            "--topic-prefix",
            "cli.",
            "--delivery-rate",
            "12",
        ],
        env={**env, "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    key = added.stdout.strip()
    assert key.startswith("sk_") and len(key) > 40
    listed = subprocess.run(
        [*argv, "list"], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert '"name": "cli-tenant"' in listed.stdout and '"rate": 5.0' in listed.stdout
    assert '"deliveryRate": 12' in listed.stdout
    assert key not in listed.stdout
    again = subprocess.run(
        [*argv, "add", "cli-tenant"], env=env, capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 1 and "exists" in again.stderr

    from pymongo import MongoClient

    client: MongoClient[dict[str, Any]]
    with MongoClient(servers.mongo_uri) as client:
        stored: list[dict[str, Any]] = list(client[database_name].api_keys.find())
        assert [k["_id"] for k in stored] == [key_digest(key)]
        assert key not in repr(stored)


# -- a path id names a schedule of the caller's tenant, and nothing else (issue 17) --

# Every way we know to spell "billing/order-1" (or a part of it) in a path.
# Stored ids are "tenant/id", but the default tenant's are bare: a '/' that
# survived into the id named tenant billing's document.
ENCODINGS = (
    "billing%2Forder-1",  # the finding
    "billing%2forder-1",
    "billing%252Forder-1",  # encoded twice
    "billing%25252Forder-1",
    "%2e%2e%2Fbilling%2Forder-1",
    "billing%5Corder-1",  # a backslash
    "billing%C0%AForder-1",  # an overlong UTF-8 '/'
    "billing%E2%88%95order-1",  # U+2215 division slash
    "billing%EF%BC%8Forder-1",  # U+FF0F fullwidth solidus
    "billing%E2%81%84order-1",  # U+2044 fraction slash
    "billing%2F%2E%2E%2Forder-1",
    "order-1%00",  # NUL
    "billing%00order-1",
    "billing%2Forder-1%0A",
    "order-1%0A",  # a trailing newline, which a `$` lets through
    "x" * 129,
    "x" * 4000,
)


async def read_by_path(node: NodeHandle, path: str, **kwargs: Any) -> list[tuple[int, Any]]:
    """GET, DELETE and GET /history of ``path``, sent exactly as written."""
    from yarl import URL

    answers = []
    for method, suffix in (("GET", ""), ("GET", "/history"), ("DELETE", "")):
        url = URL(f"{node.url}/v1/schedules/{path}{suffix}", encoded=True)
        async with node.session.request(method, url, **kwargs) as response:
            answers.append((response.status, await response.json()))
    return answers


async def test_a_path_id_cannot_name_another_tenants_schedule_by_any_encoding(
    secured: NodeHandle, tenants: TenantStore, mongo: Any
) -> None:
    billing = await make_tenant(tenants, "billing")
    default = await make_tenant(tenants, "default")
    status, _ = await secured.request(
        "POST",
        "/v1/schedules",
        json=schedule(id="order-1", payload={"card": "4242"}, headers={"secret": "s"}),
        headers=bearer(billing),
    )
    assert status == 201
    before = await mongo.schedules.find_one({"_id": "billing/order-1"})
    for path in ENCODINGS:
        for status, body in await read_by_path(secured, path, headers=bearer(default)):
            assert (status, body["error"]["code"], body["error"]["field"]) == (
                400,
                "invalid_request",
                "id",
            ), path
    # A raw '/' is another route: none there (404), and still no lookup.
    for status, body in await read_by_path(secured, "billing/order-1", headers=bearer(default)):
        assert status in (404, 405) and set(body) == {"error"}
    # The store is as it was: nothing read out, nothing cancelled.
    assert await mongo.schedules.find_one({"_id": "billing/order-1"}) == before
    assert await mongo.schedules.count_documents({}) == 1
    _, mine = await secured.request("GET", "/v1/schedules/order-1", headers=bearer(billing))
    assert (mine["status"], mine["payload"]) == ("PENDING", {"card": "4242"})


async def test_with_auth_off_a_path_id_is_held_to_the_id_pattern_too(
    start_node: NodeFactory, mongo: Any
) -> None:
    node = await start_node()
    status, _ = await node.request(
        "POST", "/v1/schedules", json=schedule(id="order-1", tenant="billing")
    )
    assert status == 201
    for path in ENCODINGS:
        for query in ("", "?tenant=default"):
            for status, body in await read_by_path(node, path + query):
                assert (status, body["error"]["field"]) == (400, "id"), path
    assert (await mongo.schedules.find_one({"_id": "billing/order-1"}))["status"] == "PENDING"
    # Acting for billing by name (what auth off allows) still finds it by its own id.
    status, found = await node.request("GET", "/v1/schedules/order-1?tenant=billing")
    assert (status, found["tenant"]) == (200, "billing")


async def test_a_key_that_is_not_text_is_a_401(secured: NodeHandle, tenants: TenantStore) -> None:
    # aiohttp hands undecodable header bytes over as lone surrogates: the key's
    # digest raised on them, a plain-text 500.
    import asyncio

    reader, writer = await asyncio.open_connection("127.0.0.1", secured.node.http_port)
    writer.write(
        b"GET /v1/schedules HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Authorization: Bearer sk_\xff\xfe\r\n\r\n"
    )
    answer = await reader.read()
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 401") and b"application/json" in head
    assert json.loads(body)["error"]["code"] == "unauthorized"


@pytest.mark.parametrize("name", ["", "a b", "a/b", "x" * 65, "acme\n", "acme\x00"])
def test_a_tenant_name_outside_the_alphabet_is_refused(name: str) -> None:
    # "acme\n": the name pattern ends in $, which matches before a final newline.
    with pytest.raises(TenantError):
        validate_name(name)


# -- HTTP targets: signing secrets and URL prefixes ------------------------------------


def test_cli_rotates_and_retires_signing_secrets(
    servers: EmbeddedServers, database_name: str
) -> None:
    env = {"MONGO_URI": servers.mongo_uri, "MONGO_DATABASE": database_name}
    argv = [sys.executable, "-m", "node", "tenants"]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*argv, *args], env=env, capture_output=True, text=True, timeout=60)

    assert cli("add", "signer", "--url-prefix", "https://signer.example/").returncode == 0
    assert "no older secret" in cli("retire-secret", "signer").stderr
    first = cli("rotate-secret", "signer").stdout.strip()
    second = cli("rotate-secret", "signer").stdout.strip()
    assert first.startswith("whsec_") and second.startswith("whsec_") and first != second
    [listed] = [json.loads(line) for line in cli("list").stdout.splitlines()]
    assert listed["signingSecrets"] == 2 and first not in cli("list").stdout
    assert listed["urlPrefixes"] == ["https://signer.example/"]

    from pymongo import MongoClient

    client: MongoClient[dict[str, Any]]
    with MongoClient(servers.mongo_uri) as client:
        doc = client[database_name].tenants.find_one({"_id": "signer"})
        assert doc is not None and doc["signingSecrets"] == [second, first]
        assert cli("retire-secret", "signer").returncode == 0
        doc = client[database_name].tenants.find_one({"_id": "signer"})
        assert doc is not None and doc["signingSecrets"] == [second]
    assert cli("rotate-secret", "nobody").returncode == 1


async def test_during_a_rotation_both_secrets_sign_and_urls_keep_to_the_prefixes(
    start_node: NodeFactory, tenants: TenantStore
) -> None:
    from aiohttp import web
    from standardwebhooks.webhooks import Webhook

    from node.schedule.webhook import new_secret

    old, new = new_secret(), new_secret()
    seen: list[tuple[bytes, dict[str, str]]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append((await request.read(), dict(request.headers)))
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hooks/in", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        node = await start_node(auth="on", http_targets_allow="127.0.0.0/8")
        key = await make_tenant(
            tenants, "rotating", url_prefixes=(f"{base}/hooks/",), signing_secrets=(new, old)
        )
        body = {"http": {"url": f"{base}/other"}, "executeAt": FAR, "payload": 1}
        status, answer = await node.request("POST", "/v1/schedules", json=body, headers=bearer(key))
        assert (status, answer["error"]["field"]) == (403, "http.url")
        body = {"id": "r1", "http": {"url": f"{base}/hooks/in"}, "executeAt": FAR, "payload": 1}
        status, _ = await node.request("POST", "/v1/schedules", json=body, headers=bearer(key))
        assert status == 201
        status, answer = await node.request(
            "PATCH",
            "/v1/schedules/r1",
            json={"http": {"url": f"{base}/elsewhere"}},
            headers=bearer(key),
        )
        assert (status, answer["error"]["field"]) == (403, "http.url")
        status, _ = await node.request("POST", "/v1/schedules/r1:trigger", headers=bearer(key))
        assert status == 200

        async def called() -> bool:
            return bool(seen)

        await wait_until(called, what="the call")
    finally:
        await runner.cleanup()
    payload, headers = seen[0]
    assert len(headers["webhook-signature"].split()) == 2
    for secret in (old, new):  # a receiver knowing either one accepts it
        Webhook(secret).verify(payload, headers)
