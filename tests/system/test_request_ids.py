"""A request id from the POST to what it became (docs/observability.md, "Following one
request"): echoed in the answer, on the access log line and the delivery's
log line, in the Kafka record's and the HTTP call's headers, and in the
schedule's history; made here when the caller gives none; taken from a W3C
``traceparent`` and passed on with it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from node.errors import ValidationFailed
from node.schedule.changes import Change, traced
from node.schedule.record import build_record
from node.schedule.trace import (
    HTTP_REQUEST_ID,
    KAFKA_REQUEST_ID,
    MAX_REQUEST_ID,
    RequestTrace,
    request_trace,
    valid_traceparent,
)
from node.schedule.webhook import build_call, new_secret
from tests.conftest import (
    EmbeddedServers,
    NodeFactory,
    TopicReader,
    unique,
    wait_until,
)
from tests.helpers import serving
from tests.node_process import NodeProcess

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"

# -- pure: what a call's headers make of its trace ----------------------------


def test_the_callers_request_id_is_kept_with_a_valid_traceparent() -> None:
    assert request_trace("r-123", None) == RequestTrace("r-123")
    assert request_trace("r-123", TRACEPARENT) == RequestTrace("r-123", TRACEPARENT)


def test_without_a_request_id_the_traceparents_trace_id_is_the_id() -> None:
    assert request_trace(None, TRACEPARENT) == RequestTrace(TRACE_ID, TRACEPARENT)


def test_without_either_an_id_is_made_and_each_call_gets_its_own() -> None:
    first, second = request_trace(None, None), request_trace(None, None)
    assert len(first.request_id) == 32 and int(first.request_id, 16) >= 0
    assert first.request_id != second.request_id
    assert first.traceparent is None


@pytest.mark.parametrize(
    "hostile",
    [
        "",
        "has space",
        "line\r\nX-Injected: 1",
        "nul\x00",
        "caf\u00e9",
        "\ud800",
        "x" * (MAX_REQUEST_ID + 1),
        "tab\tinside",
    ],
)
def test_a_malformed_request_id_is_refused_naming_the_header(hostile: str) -> None:
    with pytest.raises(ValidationFailed) as refused:
        request_trace(hostile, None)
    assert refused.value.field == "X-Request-ID"


@given(st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1))
def test_any_visible_ascii_id_up_to_the_bound_is_taken(given_id: str) -> None:
    if len(given_id) <= MAX_REQUEST_ID:
        assert request_trace(given_id, None).request_id == given_id
    else:
        with pytest.raises(ValidationFailed):
            request_trace(given_id, None)


@pytest.mark.parametrize(
    "traceparent",
    [
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
        f"00-{'0' * 32}-00f067aa0ba902b7-01",  # all-zero trace id
        f"00-{TRACE_ID}-{'0' * 16}-01",  # all-zero parent id
        f"ff-{TRACE_ID}-00f067aa0ba902b7-01",  # the forbidden version
        f"{TRACEPARENT}-extra",  # version 00 has four fields exactly
        f"00-{TRACE_ID}-00f067aa0ba902b7",
        "garbage",
        f"{TRACEPARENT}\r\nX-Injected: 1",
        "x" * 1000,
    ],
)
def test_a_malformed_traceparent_is_ignored(traceparent: str) -> None:
    assert valid_traceparent(traceparent) is None
    made = request_trace(None, traceparent)
    assert made.traceparent is None and made.request_id != TRACE_ID


def test_a_later_versions_traceparent_is_passed_on_as_version_00() -> None:
    later = f"01-{TRACE_ID}-00f067aa0ba902b7-01-more-fields"
    assert valid_traceparent(later) == TRACEPARENT


def _doc(**fields: Any) -> dict[str, Any]:
    return {
        "_id": "s-1",
        "tenant": "default",
        "topic": "t",
        "executeAt": datetime(2030, 1, 1, tzinfo=UTC),
        "createdAt": datetime(2029, 1, 1, tzinfo=UTC),
        "payload": b"1",
        "payloadFormat": "json",
        "http": {"url": "https://example.com/hook"},
        **fields,
    }


def test_a_delivery_carries_the_stored_trace_before_the_callers_headers() -> None:
    doc = _doc(requestId="r-1", traceparent=TRACEPARENT, headers={"mine": "x"})
    record = build_record(doc, token=3, attempt=1)
    names = [name for name, _ in record.headers]
    assert dict(record.headers)[KAFKA_REQUEST_ID] == b"r-1"
    assert dict(record.headers)["traceparent"] == TRACEPARENT.encode()
    assert names.index(KAFKA_REQUEST_ID) < names.index("mine")
    call = build_call(doc, token=3, attempt=1)
    assert call.header(HTTP_REQUEST_ID) == "r-1" and call.header("traceparent") == TRACEPARENT


def test_a_schedule_stored_before_request_ids_delivers_without_them() -> None:
    record = build_record(_doc(), token=1, attempt=1)
    assert KAFKA_REQUEST_ID not in dict(record.headers)
    assert build_call(_doc(), token=1, attempt=1).header(HTTP_REQUEST_ID) is None


def test_a_change_is_stamped_with_its_calls_trace_and_drops_an_older_traceparent() -> None:
    change = Change({"payload": b"2"})
    stamped = traced(change, RequestTrace("r-2"))
    assert stamped is not None
    assert stamped.set == {"payload": b"2", "requestId": "r-2"}
    assert "traceparent" in stamped.unset
    with_parent = traced(change, RequestTrace("r-3", TRACEPARENT))
    assert with_parent is not None and with_parent.set["traceparent"] == TRACEPARENT
    assert "traceparent" not in with_parent.unset
    assert traced(None, RequestTrace("r-4")) is None


# -- the API: echo, refusal, storage, PATCH -----------------------------------


def _soon(seconds: float = 0.3) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


async def test_every_answer_echoes_the_id_even_a_refusal_and_a_404(
    start_node: NodeFactory,
) -> None:
    node = await start_node()
    for method, path in (("GET", "/healthz"), ("GET", "/v1/nowhere"), ("GET", "/metrics")):
        async with node.session.request(
            method, node.url + path, headers={"X-Request-ID": "r-echo"}
        ) as response:
            assert response.headers["X-Request-ID"] == "r-echo", path
    async with node.session.post(
        node.url + "/v1/schedules", json={"topic": "t"}, headers={"X-Request-ID": "r-bad-body"}
    ) as response:
        assert response.status == 400
        assert response.headers["X-Request-ID"] == "r-bad-body"


@pytest.mark.parametrize(
    "hostile", ["has space", "x" * (MAX_REQUEST_ID + 1), "caf\u00e9", "tab\tinside", "%0d%0a x"]
)
async def test_a_malformed_request_id_is_a_400_and_stores_nothing(
    start_node: NodeFactory, hostile: str
) -> None:
    node = await start_node()
    body = {"id": "never-stored", "topic": "t", "executeAt": _soon(60), "payload": 1}
    async with node.session.post(
        node.url + "/v1/schedules", json=body, headers={"X-Request-ID": hostile}
    ) as response:
        refusal = await response.json()
        assert response.status == 400
        assert refusal["error"]["field"] == "X-Request-ID"
        made = response.headers["X-Request-ID"]
        assert made and made != hostile
    status, _ = await node.request("GET", "/v1/schedules/never-stored")
    assert status == 404


async def test_a_patch_stamps_its_own_id_and_the_record_carries_it(
    start_node: NodeFactory, servers: EmbeddedServers
) -> None:
    node = await start_node()
    topic = unique("rid-patch")
    body = {"id": "p-1", "topic": topic, "executeAt": _soon(3600), "payload": 1}
    async with node.session.post(
        node.url + "/v1/schedules", json=body, headers={"X-Request-ID": "r-create"}
    ) as response:
        created = await response.json()
        assert response.status == 201 and created["requestId"] == "r-create"
    async with node.session.patch(
        node.url + "/v1/schedules/p-1",
        json={"executeAt": _soon()},
        headers={"X-Request-ID": "r-patch", "traceparent": TRACEPARENT},
    ) as response:
        patched = await response.json()
        assert response.status == 200, patched
    assert patched["requestId"] == "r-patch" and patched["traceparent"] == TRACEPARENT
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        [record] = await reader.wait_for(1)
    headers = dict(record.headers)
    assert headers["request-id"] == b"r-patch"
    assert headers["traceparent"] == TRACEPARENT.encode()


async def test_an_idempotent_repeat_keeps_the_first_calls_id(start_node: NodeFactory) -> None:
    node = await start_node()
    body = {"id": "rep-1", "topic": "t", "executeAt": _soon(3600), "payload": 1}
    for request_id, status in (("r-first", 201), ("r-again", 200)):
        async with node.session.post(
            node.url + "/v1/schedules", json=body, headers={"X-Request-ID": request_id}
        ) as response:
            answer = await response.json()
            assert response.status == status
            assert response.headers["X-Request-ID"] == request_id
        assert answer["requestId"] == "r-first"


# -- end to end, in the node's own log stream ------------------------------------


class Hooks:
    """An HTTP destination that keeps each call's headers."""

    def __init__(self) -> None:
        self.calls: list[dict[str, str]] = []

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.calls.append({name.lower(): value for name, value in request.headers.items()})
        return web.Response(status=204)


@pytest.fixture
async def hooks() -> AsyncIterator[tuple[Hooks, str]]:
    hooks = Hooks()
    app = web.Application()
    app.router.add_post("/hook", hooks.handle)
    async with serving(app) as url:
        yield hooks, url + "/hook"


async def _post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[dict[str, Any], str]:
    async with session.post(url + "/v1/schedules", json=body, headers=headers) as response:
        answer = await response.json()
        assert response.status == 201, answer
        return answer, response.headers["X-Request-ID"]


async def _history(session: aiohttp.ClientSession, url: str, schedule_id: str) -> list[Any]:
    async with session.get(f"{url}/v1/schedules/{schedule_id}/history") as response:
        return list((await response.json())["history"])


async def test_one_request_id_from_the_post_to_the_record_the_call_and_the_history(
    servers: EmbeddedServers,
    database_name: str,
    tmp_path: Path,
    hooks: tuple[Hooks, str],
) -> None:
    receiver, hook_url = hooks
    topic = unique("rid")
    node = NodeProcess(
        tmp_path / "node.log",
        MONGO_URI=servers.mongo_uri,
        MONGO_DATABASE=database_name,
        KAFKA_BOOTSTRAP=servers.kafka_bootstrap,
        HTTP_TARGETS_ALLOW="127.0.0.0/8",
        HTTP_SIGNING_SECRET=new_secret(),
    )
    await node.start()
    try:
        async with (
            aiohttp.ClientSession() as session,
            TopicReader(servers.kafka_bootstrap, topic) as reader,
        ):
            await node.wait_ready(session)
            given = {"X-Request-ID": "r-123"}
            kafka, echoed = await _post(
                session, node.url, {"topic": topic, "executeAt": _soon(), "payload": 1}, given
            )
            assert echoed == "r-123"
            http, _ = await _post(
                session,
                node.url,
                {"http": {"url": hook_url}, "executeAt": _soon(), "payload": 1},
                given,
            )
            chain, _ = await _post(
                session,
                node.url,
                {"topic": topic, "recurrence": {"every": "PT1S"}, "payload": 1},
                given,
            )
            made, made_id = await _post(
                session, node.url, {"topic": topic, "executeAt": _soon(), "payload": 2}, {}
            )
            traced_made, _ = await _post(
                session,
                node.url,
                {"topic": topic, "executeAt": _soon(), "payload": 3},
                {"traceparent": TRACEPARENT},
            )
            await reader.wait_for(4)

            async def called() -> bool:
                return bool(receiver.calls)

            await wait_until(called, 60, "the HTTP delivery")

            async def chain_recorded() -> bool:
                return any(h["requestId"] for h in await _history(session, node.url, chain["id"]))

            await wait_until(chain_recorded, 60, "a recorded occurrence of the chain")
            by_id = reader.by_id()
            histories = {
                s["id"]: await _history(session, node.url, s["id"])
                for s in (kafka, http, made, traced_made)
            }
    finally:
        assert await node.stop() == 0
    # The Kafka record, the HTTP call and every history entry.
    assert dict(by_id[kafka["id"]][0].headers)["request-id"] == b"r-123"
    assert receiver.calls[0]["x-request-id"] == "r-123"
    assert receiver.calls[0]["schedule-id"] == http["id"]
    assert histories[kafka["id"]][0]["requestId"] == "r-123"
    assert histories[http["id"]][0]["requestId"] == "r-123"
    # No header: an id made here goes the same way.
    assert len(made_id) == 32 and made["requestId"] == made_id
    assert dict(by_id[made["id"]][0].headers)["request-id"] == made_id.encode()
    assert histories[made["id"]][0]["requestId"] == made_id
    # A traceparent: its trace id is the request id, and it is passed on.
    traced_headers = dict(by_id[traced_made["id"]][0].headers)
    assert traced_headers["request-id"] == TRACE_ID.encode()
    assert traced_headers["traceparent"] == TRACEPARENT.encode()
    # The node's own log: the access line and each delivery's line.
    lines = node.lines()
    access = [
        line for line in lines if line["event"] == "request" and line.get("request_id") == "r-123"
    ]
    assert len(access) == 3
    assert {line["route"] for line in access} == {"/v1/schedules"}
    assert all(line["status"] == 201 and line["method"] == "POST" for line in access)
    delivered = {
        line["schedule_id"]: line
        for line in lines
        if line["event"] == "schedule delivered" and line.get("request_id") == "r-123"
    }
    assert {kafka["id"], http["id"]} <= set(delivered)
    assert any(
        line["event"] == "schedule delivered" and line.get("request_id") == made_id
        for line in lines
    )
