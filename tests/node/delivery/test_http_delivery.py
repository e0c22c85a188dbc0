"""HTTP targets end to end: a node on the embedded store and broker calls a
receiver built on another stack than its own client (an aiohttp server
that verifies with the Standard Webhooks library), and what the receiver
says decides the schedule: delivered once and signed, retried under one
webhook-id, waited out without an attempt, refused at once to the dead
letter; the verbs and PATCH's switch of destination race the poller as
they do for Kafka; a URL or an address the egress policy refuses is never
called."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import web
from standardwebhooks.webhooks import Webhook

from node.schedule.webhook import FENCE_SIGNED, new_secret
from tests.conftest import EmbeddedServers, NodeFactory, NodeHandle, TopicReader, unique, wait_until

SECRET = new_secret()
LOOPBACK = {"http_targets_allow": "127.0.0.0/8", "http_signing_secret": SECRET}


@dataclass
class Arrival:
    headers: dict[str, str]
    body: bytes
    at: float  # this machine's clock when it arrived


@dataclass
class Receiver:
    """Answers what ``answer`` says (default 204) and keeps every request;
    ``delivered``: those it answered 2xx, each verified first."""

    answer: Callable[[Arrival], tuple[int, dict[str, str]]] = lambda _a: (204, {})
    requests: list[Arrival] = field(default_factory=list)
    delivered: list[Arrival] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 0
    runner: web.AppRunner | None = None

    def url(self, path: str = "/hook") -> str:
        return f"http://{self.host}:{self.port}{path}"

    async def handle(self, request: web.Request) -> web.Response:
        headers = {name.lower(): value for name, value in request.headers.items()}
        arrival = Arrival(headers, await request.read(), time.time())
        # Someone else's verifier: raises on a bad or missing signature.
        Webhook(SECRET).verify(arrival.body, arrival.headers)
        self.requests.append(arrival)
        status, headers = self.answer(arrival)
        if 200 <= status < 300:
            self.delivered.append(arrival)
        return web.Response(status=status, headers=headers, text="answer")

    def ids(self) -> list[str]:
        return [a.headers["schedule-id"] for a in self.delivered]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    receiver = Receiver()
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", receiver.handle)
    receiver.runner = web.AppRunner(app, shutdown_timeout=1.0)
    await receiver.runner.setup()
    site = web.TCPSite(receiver.runner, receiver.host, 0)
    await site.start()
    receiver.port = receiver.runner.addresses[0][1]
    yield receiver
    await receiver.runner.cleanup()


def at(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


async def create(node: NodeHandle, **body: Any) -> dict[str, Any]:
    status, created = await node.request("POST", "/v1/schedules", json={"payload": 1, **body})
    assert status == 201, created
    return created


async def get(node: NodeHandle, schedule_id: str) -> dict[str, Any]:
    status, doc = await node.request("GET", f"/v1/schedules/{schedule_id}")
    assert status == 200, doc
    return doc


async def reaches(node: NodeHandle, schedule_id: str, status: str) -> dict[str, Any]:
    async def there() -> bool:
        return (await get(node, schedule_id))["status"] == status

    await wait_until(there, 60, f"{schedule_id} to be {status}")
    return await get(node, schedule_id)


def fence_signature_valid(arrival: Arrival) -> bool:
    """The fence header set, verified as docs/api.md tells a receiver to."""
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    h = arrival.headers
    signed = ".".join([h["webhook-id"], h["webhook-timestamp"], *(h[n] for n in FENCE_SIGNED)])
    digest = hmac.new(key, signed.encode(), hashlib.sha256).digest()
    expected = "v1," + base64.b64encode(digest).decode()
    return any(hmac.compare_digest(expected, s) for s in h["fence-signature"].split())


async def test_delivered_once_signed_and_never_early(
    start_node: NodeFactory, receiver: Receiver
) -> None:
    node = await start_node(**LOOPBACK)
    execute_at = at(1.5)
    created = await create(
        node,
        id="hook-1",
        http={"url": receiver.url(), "headers": {"Authorization": "Bearer t0ken"}},
        executeAt=execute_at,
        payload={"order": 7, "text": "héllo"},
    )
    assert created["http"] == {
        "url": receiver.url(),
        "method": "POST",
        "headers": {"Authorization": "Bearer t0ken"},
        "timeout": "PT10S",
    }
    assert "topic" not in created
    done = await reaches(node, "hook-1", "DELIVERED")
    [arrival] = receiver.delivered
    assert arrival.body == '{"order":7,"text":"héllo"}'.encode()
    assert arrival.headers["content-type"] == "application/json"
    assert arrival.headers["authorization"] == "Bearer t0ken"
    assert arrival.headers["schedule-id"] == "hook-1"
    assert arrival.headers["execute-at"] == done["executeAt"]
    assert arrival.headers["attempt"] == "1" and arrival.headers["tenant"] == "default"
    assert int(arrival.headers["fence-token"]) >= 1
    assert fence_signature_valid(arrival)
    assert arrival.at >= datetime.fromisoformat(execute_at).timestamp()
    assert done["attempts"] == 1 and len(receiver.requests) == 1


async def test_a_forged_fence_token_fails_its_signature(
    start_node: NodeFactory, receiver: Receiver
) -> None:
    node = await start_node(**LOOPBACK)
    await create(node, id="hook-f", http={"url": receiver.url()}, executeAt=at(0))
    await reaches(node, "hook-f", "DELIVERED")
    [arrival] = receiver.delivered
    token = int(arrival.headers["fence-token"])
    forged = Arrival({**arrival.headers, "fence-token": str(token + 1)}, arrival.body, arrival.at)
    assert fence_signature_valid(arrival) and not fence_signature_valid(forged)


async def test_a_retry_is_sent_under_the_same_webhook_id(
    start_node: NodeFactory, receiver: Receiver
) -> None:
    answers = iter([(500, {})])
    receiver.answer = lambda _a: next(answers, (204, {}))
    node = await start_node(**LOOPBACK, retry_backoff="0.2")
    await create(node, id="hook-r", http={"url": receiver.url(), "method": "PUT"}, executeAt=at(0))
    done = await reaches(node, "hook-r", "DELIVERED")
    first, second = receiver.requests
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert (first.headers["attempt"], second.headers["attempt"]) == ("1", "2")
    assert done["attempts"] == 2


async def test_a_recurring_http_schedule_delivers_each_occurrence(
    start_node: NodeFactory, receiver: Receiver
) -> None:
    node = await start_node(**LOOPBACK)
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    stamp = lambda t: t.isoformat().replace("+00:00", "Z")  # noqa: E731
    await create(
        node,
        id="tick",
        http={"url": receiver.url()},
        recurrence={"every": "PT1S", "start": stamp(start), "end": stamp(start + timedelta(2))},
    )
    await wait_until(
        lambda: asyncio.sleep(0, len(receiver.delivered) >= 3), 60, "three occurrences"
    )
    times = [a.headers["execute-at"] for a in receiver.delivered[:3]]
    assert times == sorted(set(times))
    assert len({a.headers["webhook-id"] for a in receiver.delivered}) == len(receiver.delivered)


async def test_retry_after_is_waited_out_without_spending_attempts(
    start_node: NodeFactory, receiver: Receiver
) -> None:
    """The receiver answers each schedule's first three calls 503 with
    Retry-After: 1 (more than the one attempt each has): all are
    delivered, none failed, each on its first attempt."""
    count = 20
    refusals: dict[str, int] = {}

    def busy(arrival: Arrival) -> tuple[int, dict[str, str]]:
        schedule = arrival.headers["schedule-id"]
        if refusals.get(schedule, 0) < 3:
            refusals[schedule] = refusals.get(schedule, 0) + 1
            return 503, {"Retry-After": "1"}
        return 204, {}

    receiver.answer = busy
    node = await start_node(**LOOPBACK, max_attempts="1")
    for n in range(count):
        await create(node, id=f"w{n}", http={"url": receiver.url()}, executeAt=at(0))
    for n in range(count):
        done = await reaches(node, f"w{n}", "DELIVERED")
        assert done["attempts"] == 1, done
    assert sorted(refusals.values()) == [3] * count
    status, history = await node.request("GET", "/v1/schedules/w0/history")
    assert status == 200
    outcomes = [h["outcome"] for h in history["history"]]
    assert outcomes.count("deferred") == 3, outcomes


async def test_a_400_fails_after_one_attempt_and_is_dead_lettered(
    start_node: NodeFactory, receiver: Receiver
) -> None:
    receiver.answer = lambda a: (400, {}) if a.headers.get("error") is None else (204, {})
    node = await start_node(**LOOPBACK, dead_letter_url=receiver.url("/dead"))
    await create(node, id="bad", http={"url": receiver.url("/orders")}, executeAt=at(0))
    failed = await reaches(node, "bad", "DELIVERY_FAILED")
    assert failed["attempts"] == 1
    assert failed["lastError"] == "HTTP 400: answer"
    [dead] = receiver.delivered
    assert dead.headers["original-url"] == receiver.url("/orders")
    assert dead.headers["error"] == "HTTP 400: answer"
    assert dead.headers["schedule-id"] == "bad"


async def test_patch_switches_between_kafka_and_http(
    start_node: NodeFactory, receiver: Receiver, servers: EmbeddedServers
) -> None:
    topic = unique("switch")
    node = await start_node(**LOOPBACK)
    await create(node, id="to-http", topic=topic, executeAt=at(3600))
    await create(node, id="to-kafka", http={"url": receiver.url()}, executeAt=at(3600))
    status, patched = await node.request(
        "PATCH",
        "/v1/schedules/to-http",
        json={"http": {"url": receiver.url()}, "executeAt": at(0)},
    )
    assert status == 200 and "topic" not in patched and patched["http"]["url"] == receiver.url()
    status, patched = await node.request(
        "PATCH", "/v1/schedules/to-kafka", json={"topic": topic, "executeAt": at(0)}
    )
    assert status == 200 and patched["topic"] == topic and "http" not in patched
    await reaches(node, "to-http", "DELIVERED")
    await reaches(node, "to-kafka", "DELIVERED")
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        await reader.wait_for(1)
        await reader.poll()
    assert list(reader.by_id()) == ["to-kafka"]
    assert receiver.ids() == ["to-http"]


async def test_cancel_and_pause_race_the_poller_without_a_delivery_they_denied(
    start_node: NodeFactory, receiver: Receiver
) -> None:
    """Schedules falling due now, cancelled and paused while the poller takes
    them: whatever a verb answered 200 to is never called; what it answered
    409 to (in flight, delivered) was, once."""
    node = await start_node(**LOOPBACK)
    ids = [f"race{n}" for n in range(40)]
    due = at(1.0)
    for schedule_id in ids:
        await create(node, id=schedule_id, http={"url": receiver.url()}, executeAt=due)
    await asyncio.sleep(max(0.0, datetime.fromisoformat(due).timestamp() - time.time() - 0.03))
    answers = await asyncio.gather(
        *(
            node.request("DELETE", f"/v1/schedules/{i}")
            if n % 2
            else node.request("POST", f"/v1/schedules/{i}:pause")
            for n, i in enumerate(ids)
        )
    )
    stopped = {i for i, (status, _body) in zip(ids, answers, strict=True) if status == 200}
    assert {status for status, _ in answers} <= {200, 409}

    async def settled() -> bool:
        docs = [await get(node, i) for i in ids]
        return all(d["status"] in {"DELIVERED", "CANCELLED", "PAUSED"} for d in docs)

    await wait_until(settled, 60, "every schedule delivered, cancelled or paused")
    delivered = receiver.ids()
    assert not stopped & set(delivered)
    assert sorted(delivered) == sorted(set(ids) - stopped)
    assert len(delivered) == len(set(delivered))


async def test_a_bulk_pause_racing_the_poller_lets_nothing_through_after_its_last_answer(
    start_node: NodeFactory, receiver: Receiver
) -> None:
    """A pause by label while the poller takes the same schedules: called
    again until ``more`` is false (nothing matched in flight); after that
    answer no schedule of the label is called (a later one proves the
    poller went on), and a resume by the same label delivers each of the
    rest once."""
    node = await start_node(**LOOPBACK)
    ids = [f"bulk{n}" for n in range(60)]
    due = at(1.0)
    for schedule_id in ids:
        await create(node, id=schedule_id, http={"url": receiver.url()}, executeAt=due,
                     labels={"wave": "w1"})  # fmt: skip
    await asyncio.sleep(max(0.0, datetime.fromisoformat(due).timestamp() - time.time() - 0.03))
    selector = {"labels": {"wave": "w1"}}
    paused = 0
    while True:
        status, answer = await node.request("POST", "/v1/schedules:pause", json=selector)
        assert status == 200, answer
        paused += answer["changed"]
        if not answer["more"]:
            break
    called = receiver.ids()
    docs = {i: await get(node, i) for i in ids}
    assert {d["status"] for d in docs.values()} <= {"PAUSED", "DELIVERED"}
    assert sorted(i for i, d in docs.items() if d["status"] == "DELIVERED") == sorted(called)
    assert paused == sum(d["status"] == "PAUSED" for d in docs.values())
    await create(node, id="later", http={"url": receiver.url()}, executeAt=at(0))
    await reaches(node, "later", "DELIVERED")
    assert receiver.ids() == [*called, "later"]  # nothing of the wave since its last answer
    status, answer = await node.request("POST", "/v1/schedules:resume", json=selector)
    assert (status, answer["changed"], answer["more"]) == (200, paused, False)

    async def all_called() -> bool:
        return len(receiver.ids()) == len(ids) + 1

    await wait_until(all_called, 60, "the rest of the wave called once resumed")
    assert sorted(receiver.ids()) == sorted([*ids, "later"])


async def test_the_failed_of_an_outage_are_redriven_by_one_selector_each_once(
    start_node: NodeFactory, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receiver refusing everything fails each schedule after its one
    attempt; once it is back, ``:retry`` by its host (called again while
    ``more``: two per call here) makes every one due again, and each is
    delivered once. A dry run counts and changes nothing."""
    from node.store import schedules as schedule_store

    monkeypatch.setattr(schedule_store, "BULK_BATCH", 2)
    monkeypatch.setattr(schedule_store, "BULK_LIMIT", 4)
    receiver.answer = lambda _a: (400, {})
    node = await start_node(**LOOPBACK)
    ids = [f"out{n}" for n in range(10)]
    for schedule_id in ids:
        await create(node, id=schedule_id, http={"url": receiver.url()}, executeAt=at(0),
                     retry={"maxAttempts": 1})  # fmt: skip
    for schedule_id in ids:
        await reaches(node, schedule_id, "DELIVERY_FAILED")
    assert receiver.ids() == []
    receiver.answer = lambda _a: (204, {})
    selector = {"host": "127.0.0.1"}
    status, answer = await node.request(
        "POST", "/v1/schedules:retry", json={**selector, "dryRun": True}
    )
    assert (status, answer) == (200, {"matched": 10, "changed": 0, "more": False, "dryRun": True})
    assert {(await get(node, i))["status"] for i in ids} == {"DELIVERY_FAILED"}
    calls = 0
    while True:
        status, answer = await node.request("POST", "/v1/schedules:retry", json=selector)
        assert status == 200, answer
        calls += 1
        if not answer["more"]:
            break
    assert calls >= 3  # ten, four a call at most
    for schedule_id in ids:
        await reaches(node, schedule_id, "DELIVERED")
    assert sorted(receiver.ids()) == sorted(ids)
    status, answer = await node.request("POST", "/v1/schedules:retry", json=selector)
    assert (status, answer) == (200, {"matched": 0, "changed": 0, "more": False})


REFUSED_URLS = [
    "http://127.0.0.1:9/x",
    "http://[::1]:9/x",
    "http://10.0.0.1/x",
    "http://169.254.169.254/latest/meta-data",
    "http://[::ffff:127.0.0.1]/x",
    "http://0.0.0.0/x",
    "http://2130706433/x",
    "http://0177.0.0.1/x",
    "http://user:pass@example.com/x",
    "ftp://example.com/x",
    "http://localhost:9/x",
]


@pytest.mark.parametrize("url", REFUSED_URLS)
async def test_a_url_the_policy_refuses_is_a_400_naming_http_url(
    start_node: NodeFactory, url: str
) -> None:
    node = await start_node(http_signing_secret=SECRET)
    status, answer = await node.request(
        "POST", "/v1/schedules", json={"http": {"url": url}, "executeAt": at(0), "payload": 1}
    )
    assert status == 400, answer
    assert answer["error"]["field"] == "http.url"
    status, page = await node.request("GET", "/v1/schedules")
    assert page["schedules"] == []


async def test_a_name_resolving_to_a_refused_address_is_never_called(
    start_node: NodeFactory,
) -> None:
    """This machine's host name resolves to a loopback or private address:
    accepted at create (a name shows nothing), refused at the delivery
    attempt with nothing sent, and the schedule ends at once."""
    name = socket.gethostname()
    listening = Receiver(host="0.0.0.0")
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", listening.handle)
    listening.runner = web.AppRunner(app)
    await listening.runner.setup()
    site = web.TCPSite(listening.runner, "0.0.0.0", 0)
    await site.start()
    port = listening.runner.addresses[0][1]
    try:
        node = await start_node(http_signing_secret=SECRET)
        await create(node, id="rebind", http={"url": f"http://{name}:{port}/x"}, executeAt=at(0))
        failed = await reaches(node, "rebind", "DELIVERY_FAILED")
        assert failed["attempts"] == 1 and "egress" in failed["lastError"], failed
        assert listening.requests == []
    finally:
        await listening.runner.cleanup()


async def test_listing_by_destination_and_host(start_node: NodeFactory, receiver: Receiver) -> None:
    node = await start_node(**LOOPBACK)
    await create(node, id="k", topic="t", executeAt=at(3600))
    await create(node, id="h", http={"url": receiver.url()}, executeAt=at(3600))
    await create(node, id="e", http={"url": "https://hooks.example.com/x"}, executeAt=at(3600))

    async def listed(**query: str) -> list[str]:
        status, page = await node.request("GET", "/v1/schedules", params=query)
        assert status == 200, page
        return [s["id"] for s in page["schedules"]]

    assert await listed(destination="http") == ["e", "h"]
    assert await listed(destination="kafka") == ["k"]
    assert await listed(host="hooks.example.com") == ["e"]
    assert await listed(host="HOOKS.example.com", destination="http") == ["e"]
    status, answer = await node.request("GET", "/v1/schedules", params={"destination": "ftp"})
    assert status == 400 and answer["error"]["field"] == "destination"


async def test_a_switch_to_kafka_racing_the_claim_goes_to_one_destination_once(
    start_node: NodeFactory, receiver: Receiver, servers: EmbeddedServers
) -> None:
    """HTTP schedules falling due while each is PATCHed to a topic and a
    later time: one PATCHed (200) goes to the topic only, at the new time;
    one claimed first (409) is called only, at its first time; each once."""
    topic = unique("race-switch")
    node = await start_node(**LOOPBACK, batch_size="5")
    ids = [f"sw{n}" for n in range(40)]
    due, later = at(1.0), at(3.5)
    for schedule_id in ids:
        await create(node, id=schedule_id, http={"url": receiver.url()}, executeAt=due)
    # The race: the PATCHes land around the due time.
    await asyncio.sleep(max(0.0, datetime.fromisoformat(due).timestamp() - time.time() - 0.03))
    answers = await asyncio.gather(
        *(
            node.request("PATCH", f"/v1/schedules/{i}", json={"topic": topic, "executeAt": later})
            for i in ids
        )
    )
    switched = {i for i, (status, _body) in zip(ids, answers, strict=True) if status == 200}
    assert {status for status, _ in answers} <= {200, 409}
    for schedule_id in ids:
        await reaches(node, schedule_id, "DELIVERED")
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        if switched:
            await reader.wait_for(len(switched))
        await reader.poll()
    by_id = reader.by_id()
    assert set(by_id) == switched
    for schedule_id in switched:
        [record] = by_id[schedule_id]
        assert record.timestamp / 1000 >= datetime.fromisoformat(later).timestamp() - 0.05
    called = receiver.ids()
    assert sorted(called) == sorted(set(ids) - switched)
    assert len(called) == len(set(called))


async def test_a_batch_takes_http_items_each_on_its_own(
    start_node: NodeFactory, receiver: Receiver
) -> None:
    node = await start_node(**LOOPBACK)
    items = [
        {"id": "b-ok", "http": {"url": receiver.url()}, "executeAt": at(0), "payload": 1},
        {"id": "b-meta", "http": {"url": "http://169.254.169.254/"}, "executeAt": at(0),
         "payload": 1},
        {"id": "b-both", "topic": "t", "http": {"url": receiver.url()}, "executeAt": at(0),
         "payload": 1},
        {"id": "b-hdr", "http": {"url": receiver.url(), "headers": {"x": "a\r\nb: c"}},
         "executeAt": at(0), "payload": 1},
    ]  # fmt: skip
    status, answer = await node.request("POST", "/v1/schedules:batch", json={"schedules": items})
    assert status == 200, answer
    assert [r["status"] for r in answer["results"]] == [201, 400, 400, 400]
    fields = [r.get("error", {}).get("field") for r in answer["results"]]
    assert fields == [None, "http.url", "topic", "http.headers"]
    await reaches(node, "b-ok", "DELIVERED")
    assert receiver.ids() == ["b-ok"]
