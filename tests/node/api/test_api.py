"""The HTTP API against a real node, store and broker."""

from __future__ import annotations

import base64
import json
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from node.api.openapi import ERROR_CODES
from ring import PLACEMENT_VERSION
from tests.conftest import TEST_CLUSTER_KEY, NodeFactory, NodeHandle, wait_until
from tests.helpers import FAR, schedule


@pytest.fixture
async def api(start_node: NodeFactory) -> NodeHandle:
    return await start_node(max_payload_bytes="2048")


async def count(mongo: Any) -> int:
    return int(await mongo.schedules.count_documents({}))


async def test_create_get_and_idempotent_repeat(api: NodeHandle, mongo: Any) -> None:
    status, created = await api.request("POST", "/v1/schedules", json=schedule(id="order-1"))
    assert status == 201
    assert created["id"] == "order-1"
    assert created["status"] == "PENDING"
    assert created["payload"] == {"n": 1}
    assert 0 <= created["bucket"] < 16

    status, again = await api.request("POST", "/v1/schedules", json=schedule(id="order-1"))
    assert (status, again) == (200, created)

    status, got = await api.request("GET", "/v1/schedules/order-1")
    assert (status, got) == (200, created)
    assert await count(mongo) == 1


async def test_same_id_other_body_is_409_and_keeps_the_original(
    api: NodeHandle, mongo: Any
) -> None:
    await api.request("POST", "/v1/schedules", json=schedule(id="dup"))
    status, body = await api.request(
        "POST", "/v1/schedules", json=schedule(id="dup", topic="other")
    )
    assert status == 409
    assert body["error"]["code"] == "conflict"
    assert body["error"]["field"] == "id"
    _, stored = await api.request("GET", "/v1/schedules/dup")
    assert stored["topic"] == "api-test"


async def test_server_assigns_ids_when_none_given(api: NodeHandle) -> None:
    _, a = await api.request("POST", "/v1/schedules", json=schedule())
    _, b = await api.request("POST", "/v1/schedules", json=schedule())
    assert a["id"] != b["id"]


@pytest.mark.parametrize(
    ("raw", "status", "field"),
    [
        (b"{", 400, None),
        (json.dumps(schedule(bogus=True)).encode(), 400, "bogus"),
        (json.dumps(schedule(topic="no spaces")).encode(), 400, "topic"),
        (json.dumps(schedule(executeAt="2030-01-01T00:00:00")).encode(), 400, "executeAt"),
        (json.dumps(schedule(executeAt="2999-01-01T00:00:00Z")).encode(), 400, "executeAt"),
        (json.dumps(schedule(payload="x" * 3000)).encode(), 413, "payload"),
        (
            json.dumps(
                schedule(payload=None, payloadBase64=base64.b64encode(b"x" * 3000).decode())
            ).encode(),
            400,
            "payload",
        ),
        (json.dumps(schedule(id="bad id")).encode(), 400, "id"),
        (json.dumps(schedule(headers={"attempt": "1"})).encode(), 400, "headers"),
    ],
    # Named, not drawn from the bodies: one holds a time made at collection,
    # and every worker of a parallel run must collect the same ids.
    ids=[
        "not-json",
        "unknown-member",
        "bad-topic",
        "naive-time",
        "past-horizon",
        "payload-too-large",
        "base64-payload-too-large",
        "bad-id",
        "reserved-header",
    ],
)
async def test_bad_input_is_a_4xx_and_changes_nothing(
    api: NodeHandle, mongo: Any, raw: bytes, status: int, field: str | None
) -> None:
    got_status, body = await api.request(
        "POST", "/v1/schedules", data=raw, headers={"Content-Type": "application/json"}
    )
    assert got_status == status
    assert set(body) == {"error"}
    assert body["error"]["message"]
    assert body["error"].get("field") == field
    assert await count(mongo) == 0


async def test_body_far_over_the_limit_is_413_in_the_error_shape(
    api: NodeHandle, mongo: Any
) -> None:
    huge = json.dumps(schedule(payload="x" * 200_000)).encode()
    status, body = await api.request("POST", "/v1/schedules", data=huge)
    assert status == 413
    assert body["error"]["code"] == "payload_too_large"
    assert await count(mongo) == 0


async def test_cancel(api: NodeHandle) -> None:
    await api.request("POST", "/v1/schedules", json=schedule(id="c1"))
    status, body = await api.request("DELETE", "/v1/schedules/c1")
    assert (status, body["status"]) == (200, "CANCELLED")
    # Cancelling again answers the same: the schedule is cancelled.
    status, body = await api.request("DELETE", "/v1/schedules/c1")
    assert (status, body["status"]) == (200, "CANCELLED")
    status, body = await api.request("DELETE", "/v1/schedules/nope")
    assert status == 404
    assert body["error"]["code"] == "not_found"


async def test_cancel_after_delivery_is_409(api: NodeHandle, mongo: Any) -> None:
    await api.request("POST", "/v1/schedules", json=schedule(id="gone"))
    await mongo.schedules.update_one({"_id": "gone"}, {"$set": {"status": "DELIVERED"}})
    status, body = await api.request("DELETE", "/v1/schedules/gone")
    assert status == 409
    assert body["error"]["code"] == "not_cancellable"
    _, stored = await api.request("GET", "/v1/schedules/gone")
    assert stored["status"] == "DELIVERED"


async def test_unknown_schedule_and_route_are_json_404(api: NodeHandle) -> None:
    status, body = await api.request("GET", "/v1/schedules/missing")
    assert status == 404 and body["error"]["code"] == "not_found"
    status, body = await api.request("GET", "/v2/whatever")
    assert status == 404 and body["error"]["code"] == "not_found"
    status, body = await api.request("PUT", "/v1/schedules/x")
    assert status == 405 and body["error"]["code"] == "method_not_allowed"


async def test_list_pages_through_everything_once(api: NodeHandle) -> None:
    ids = {f"list-{i:02d}" for i in range(7)}
    for schedule_id in ids:
        await api.request("POST", "/v1/schedules", json=schedule(id=schedule_id, tenant="t1"))
    await api.request("POST", "/v1/schedules", json=schedule(id="other-tenant", tenant="t2"))
    await api.request("DELETE", "/v1/schedules/list-03?tenant=t1")

    seen: list[str] = []
    cursor = None
    while True:
        query = "?tenant=t1&limit=3" + (f"&after={cursor}" if cursor else "")
        status, page = await api.request("GET", "/v1/schedules" + query)
        assert status == 200
        assert len(page["schedules"]) <= 3
        seen.extend(s["id"] for s in page["schedules"])
        cursor = page["next"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids)

    _, cancelled = await api.request("GET", "/v1/schedules?tenant=t1&status=CANCELLED")
    assert [s["id"] for s in cancelled["schedules"]] == ["list-03"]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("?status=DONE", "status"),
        ("?limit=0", "limit"),
        ("?limit=abc", "limit"),
        ("?after=!!!", "after"),
        ("?colour=red", "colour"),
        ("?limit=%C2%B2", "limit"),  # a digit to str.isdigit(), not to int()
        ("?tenant=t1%0A", "tenant"),
        ("?tenant=t%00", "tenant"),
        # cursors this API never returned: not a stored id, NUL, a lone surrogate
        ("?after=" + base64.urlsafe_b64encode(b'{"after": "a/b/c"}').decode(), "after"),
        ("?after=" + base64.urlsafe_b64encode(b'{"after": "a\\u0000b"}').decode(), "after"),
        ("?after=" + base64.urlsafe_b64encode(b'{"after": "\\ud800"}').decode(), "after"),
        ("?after=%F0%9F%98%80", "after"),
    ],
)
async def test_list_rejects_bad_parameters(api: NodeHandle, query: str, field: str) -> None:
    status, body = await api.request("GET", "/v1/schedules" + query)
    assert status == 400
    assert body["error"]["field"] == field


async def test_health_readiness_metrics_and_cluster(api: NodeHandle) -> None:
    status, body = await api.request("GET", "/healthz")
    assert status == 200 and body["status"] == "ok"
    status, body = await api.request("GET", "/readyz")
    assert status == 200
    assert body["checks"] == {"started": True, "gossip": True, "store": True, "broker": True}

    await api.request("POST", "/v1/schedules", json=schedule())
    status, text = await api.request("GET", "/metrics")
    assert status == 200
    assert "scheduler_schedules_created_total 1.0" in text
    assert (
        'scheduler_http_requests_total{method="POST",route="/v1/schedules",status="201"} 1.0'
        in text
    )

    async def all_leased() -> bool:
        _, view = await api.request("GET", "/v1/cluster")
        return bool(view["buckets"]["held"] == 16)

    await wait_until(all_leased, what="the node to lease every bucket")
    status, cluster = await api.request("GET", "/v1/cluster")
    assert status == 200
    assert cluster["self"] == "node-a"
    [me] = cluster["members"]
    assert (me["id"], me["state"]) == ("node-a", "alive")
    assert me["http"] == f"127.0.0.1:{api.node.http_port}"
    assert me["address"] == api.node.membership.address
    assert isinstance(me["incarnation"], int)
    # It advertises the placement it runs, and uses it (no older member).
    assert me["placementVersion"] == PLACEMENT_VERSION
    assert cluster["buckets"]["placementVersion"] == PLACEMENT_VERSION
    assert cluster["buckets"]["count"] == 16
    # One lease-token series per bucket held, matching the store's tokens.
    _, text = await api.request("GET", "/metrics")
    tokens = dict(re.findall(r'^scheduler_bucket_lease_token\{bucket="(\d+)"\} (\S+)$', text, re.M))
    assert {int(b): float(t) for b, t in tokens.items()} == {
        o["bucket"]: float(o["token"]) for o in cluster["buckets"]["owners"]
    }
    # An idle store answers lease writes quickly: the term is the configured TTL.
    [term] = re.findall(r"^scheduler_lease_term_seconds (\S+)$", text, re.M)
    assert float(term) == api.node.config.lease_ttl
    owners = cluster["buckets"]["owners"]
    assert [o["bucket"] for o in owners] == list(range(16))
    assert {o["owner"] for o in owners} == {"node-a"}
    assert all(o["token"] >= 1 for o in owners)


async def test_a_blocked_event_loop_counts_as_a_stall(api: NodeHandle) -> None:
    def stalls() -> tuple[float, float]:
        found = dict(re.findall(r"^scheduler_process_(stall\w+)_total (\S+)$", text, re.M))
        return float(found["stalls"]), float(found["stalled_seconds"])

    _, text = await api.request("GET", "/metrics")
    count, seconds = stalls()
    time.sleep(1.5)  # noqa: ASYNC251 - on purpose: the node stands still, as if paused

    async def counted() -> bool:
        nonlocal text
        _, text = await api.request("GET", "/metrics")
        return stalls()[0] > count

    await wait_until(counted, what="the stall to be counted")
    assert stalls()[1] - seconds >= 1.3


async def test_every_log_line_about_a_schedule_names_its_id_bucket_and_token(
    api: NodeHandle,
) -> None:
    import structlog

    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    with structlog.testing.capture_logs() as logs:
        await api.request("POST", "/v1/schedules", json=schedule(id="log-due", executeAt=now))
        await api.request("POST", "/v1/schedules", json=schedule(id="log-cancel"))
        await api.request("DELETE", "/v1/schedules/log-cancel")

        async def delivered() -> bool:
            return (await api.request("GET", "/v1/schedules/log-due"))[1]["status"] == "DELIVERED"

        await wait_until(delivered, what="the due schedule to be delivered")
    about = [entry for entry in logs if "schedule_id" in entry]
    events = {(e["event"], e["schedule_id"]) for e in about}
    assert {
        ("schedule accepted", "log-due"),
        ("schedule delivered", "log-due"),
        ("schedule cancelled", "log-cancel"),
    } <= events
    assert all({"bucket", "token"} <= set(entry) for entry in about), about
    [done] = [e for e in about if e["event"] == "schedule delivered"]
    assert done["token"] > 0 and done["attempt"] == 1


# -- the batch API ------------------------------------------------------------------


async def test_a_batch_answers_each_item_as_a_single_post_would(
    api: NodeHandle, mongo: Any
) -> None:
    await api.request("POST", "/v1/schedules", json=schedule(id="b-old", payload={"v": 1}))
    items = [
        schedule(id="b-new"),
        schedule(id="b-twice", payload={"v": 2}),
        schedule(id="b-twice", payload={"v": 2}),  # the same id twice in one batch
        schedule(id="b-bad", topic="no spaces allowed"),
        schedule(id="b-old", payload={"v": 1}),  # a repeat of what is stored
        schedule(id="b-old", payload={"v": 99}),  # the stored id, another body
        "not an object",
        schedule(),  # server-assigned id
    ]
    status, body = await api.request("POST", "/v1/schedules:batch", json={"schedules": items})
    assert status == 200
    statuses = [r["status"] for r in body["results"]]
    assert [r["index"] for r in body["results"]] == list(range(len(items)))
    assert statuses[0] == 201 and sorted(statuses[1:3]) == [200, 201]
    assert statuses[3:] == [400, 200, 409, 400, 201]
    assert body["results"][3]["error"]["field"] == "topic"
    assert body["results"][5]["error"]["code"] == "conflict"
    assert (body["created"], body["existing"], body["rejected"]) == (3, 2, 3)
    assigned = body["results"][7]["schedule"]["id"]
    stored = {d["_id"] for d in await mongo.schedules.find({}, {"_id": 1}).to_list()}
    assert stored == {"b-old", "b-new", "b-twice", assigned}
    assert (await api.request("GET", "/v1/schedules/b-old"))[1]["payload"] == {"v": 1}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([schedule()], "body must be"),
        ({"schedules": []}, "1 to 1000 items, got 0"),
        ({"schedules": [schedule()] * 1001}, "1 to 1000 items, got 1001"),
        ({"schedules": [schedule()], "extra": 1}, "body must be"),
        ({"items": [schedule()]}, "body must be"),
    ],
)
async def test_a_bad_batch_envelope_is_a_400_and_stores_nothing(
    api: NodeHandle, mongo: Any, body: Any, message: str
) -> None:
    status, answer = await api.request("POST", "/v1/schedules:batch", json=body)
    assert status == 400 and message in answer["error"]["message"]
    assert await count(mongo) == 0


async def test_a_full_batch_is_stored_in_a_few_group_commits(api: NodeHandle, mongo: Any) -> None:
    inserter = api.node.store._inserts
    before = inserter.round_trips
    items = [schedule(id=f"bulk-{i}", payload={"i": i}) for i in range(1000)]
    status, body = await api.request("POST", "/v1/schedules:batch", json={"schedules": items})
    assert status == 200 and body["created"] == 1000
    assert await count(mongo) == 1000
    # Shared insert_many round trips (at most 500 documents each), not 1,000.
    assert inserter.round_trips - before <= 4


# -- hostile input (issue 17): a 4xx in the error shape, and nothing stored --------


def as_json(body: Any) -> bytes:
    """JSON text as a client writes it: json.dumps escapes a lone surrogate
    as \\udXXX, which a JSON parser turns back into one."""
    return json.dumps(body).encode()


async def post_raw(api: NodeHandle, path: str, raw: bytes) -> tuple[int, Any]:
    return await api.request("POST", path, data=raw, headers={"Content-Type": "application/json"})


def assert_error_shape(status: int, body: Any, expected: int, field: str | None = ...) -> None:  # type: ignore[assignment]
    assert status == expected, body
    assert set(body) == {"error"} and body["error"]["code"] in ERROR_CODES, body
    assert body["error"]["message"]
    if field is not ...:
        assert body["error"].get("field") == field, body


async def test_a_nul_in_a_header_name_is_a_400_and_stores_nothing(
    api: NodeHandle, mongo: Any
) -> None:
    # NUL made bson raise inside the shared group insert: the caller got no
    # answer at all. '$' and '.' the embedded store took, as MongoDB 5+ does,
    # but its operators cannot address such fields: refused too.
    for name in ("a\x00b", "\x00", "$set", "a.b", "", "a b", "caf\u00e9", "x" * 257):
        status, body = await api.request(
            "POST", "/v1/schedules", json=schedule(headers={name: "v"})
        )
        assert_error_shape(status, body, 400, "headers")
    status, body = await api.request(
        "POST", "/v1/schedules", json=schedule(headers={"trace": "v\x00"})
    )
    assert_error_shape(status, body, 400, "headers")
    assert await count(mongo) == 0
    # In a batch the item is refused on its own, and its neighbours stored.
    status, body = await api.request(
        "POST",
        "/v1/schedules:batch",
        json={"schedules": [schedule(id="nul-1", headers={"a\x00b": "v"}), schedule(id="fine")]},
    )
    assert status == 200 and [r["status"] for r in body["results"]] == [400, 201]
    assert body["results"][0]["error"]["field"] == "headers"
    assert [d["_id"] async for d in mongo.schedules.find({}, {"_id": 1})] == ["fine"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"payload": "\ud800"}, "payload"),
        ({"payload": {"note": ["ok", "half an emoji \ud83d"]}}, "payload"),
        ({"payload": {"\udc00": 1}}, "payload"),
        ({"headers": {"trace": "\udfff"}}, "headers"),
        ({"headers": {"\ud800": "v"}}, "headers"),
        ({"key": "\ud800"}, "key"),
        ({"topic": "orders\ud800"}, "topic"),
        ({"id": "\ud800"}, "id"),
        ({"tenant": "\ud800"}, "tenant"),
        ({"executeAt": "2030-01-01T00:00:00Z\ud800"}, "executeAt"),
        ({"retry": {"initialBackoff": "\ud800"}}, "retry"),
    ],
)
async def test_a_lone_surrogate_is_a_400(
    api: NodeHandle, mongo: Any, fields: dict[str, Any], field: str
) -> None:
    raw = as_json(schedule(**fields))
    status, body = await post_raw(api, "/v1/schedules", raw)
    assert_error_shape(status, body, 400, field)
    # A batch holding it is not valid Unicode either: refused whole, like bad JSON.
    status, body = await post_raw(
        api, "/v1/schedules:batch", as_json({"schedules": [schedule(), schedule(**fields)]})
    )
    assert_error_shape(status, body, 400, "schedules")
    assert "$.schedules[1]" in body["error"]["message"]
    assert await count(mongo) == 0


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


async def test_deep_nesting_is_a_400(api: NodeHandle, mongo: Any) -> None:
    # The body is an object: a payload may nest 63 levels, the body 64.
    status, _ = await api.request("POST", "/v1/schedules", json=schedule(payload=nested(63)))
    assert status == 201
    for depth in (64, 1000, 20_000):  # past the bound, past the recursion limit
        raw = b'{"topic": "t", "executeAt": "%s", "payload": %s}' % (
            FAR.encode(),
            b"[" * depth + b"]" * depth,
        )
        status, body = await post_raw(api, "/v1/schedules", raw)
        assert_error_shape(status, body, 400)
        status, body = await post_raw(api, "/v1/schedules:batch", b'{"schedules": [%s]}' % raw)
        assert_error_shape(status, body, 400)
    # Far deeper is over the body's limit before it is parsed at all.
    status, body = await post_raw(api, "/v1/schedules", b"[" * 100_000 + b"]" * 100_000)
    assert_error_shape(status, body, 413)
    # A cursor is JSON too.
    cursor = base64.urlsafe_b64encode(b'{"after": ' + b"[" * 3000 + b"]" * 3000 + b"}")
    status, body = await api.request("GET", "/v1/schedules?after=" + cursor.decode())
    assert_error_shape(status, body, 400, "after")
    assert await count(mongo) == 1


async def test_every_error_is_json(api: NodeHandle, mongo: Any) -> None:
    import gzip

    import structlog

    from node.errors import BrokerUnavailable

    async def refused(method: str, path: str, expected: int, **kwargs: Any) -> dict[str, Any]:
        async with api.session.request(method, api.url + path, **kwargs) as response:
            assert response.content_type == "application/json", (path, await response.text())
            body = await response.json()
            assert_error_shape(response.status, body, expected)
            return dict(body["error"])

    await refused("GET", "/v2/nothing", 404)
    async with api.session.put(api.url + "/v1/schedules/x") as response:
        assert response.headers["Allow"]  # a 405 still says what the route takes
    await refused("PUT", "/v1/schedules/x", 405)
    await refused("POST", "/v1/schedules", 413, data=b"x" * 200_000)
    await refused("POST", "/v1/schedules", 400, data=b"{")
    # A digit to str.isdigit(), but not to int(): was a plain-text 500.
    assert (await refused("GET", "/v1/schedules?limit=%C2%B2", 400))["field"] == "limit"
    assert (await refused("GET", "/v1/schedules/x/history?limit=%C2%B2", 400))["field"] == "limit"
    # A body that says it is gzip and is not: was a plain-text 500.
    await refused(
        "POST", "/v1/schedules", 400, data=b"not gzip", headers={"Content-Encoding": "gzip"}
    )
    gzipped = gzip.compress(as_json(schedule(id="zipped")))
    async with api.session.post(
        api.url + "/v1/schedules", data=gzipped, headers={"Content-Encoding": "gzip"}
    ) as response:
        assert response.status == 201
    # Times that leave datetime's range once made UTC: were OverflowErrors.
    # (A hint is signed with the cluster's key, or refused before it is read.)
    from node.delivery.hints import SIGNATURE_HEADER, sign

    wake = json.dumps(
        {
            "bucket": 1,
            "dueAt": "9999-12-31T23:59:59-01:00",
            "sentAt": datetime.now(UTC).isoformat(),
        }
    ).encode()
    signed = {SIGNATURE_HEADER: sign(base64.b64decode(TEST_CLUSTER_KEY), wake)}
    assert (await refused("POST", "/v1/internal/wake", 400, data=wake, headers=signed))[
        "field"
    ] == "dueAt"
    await refused(
        "POST", "/v1/schedules", 400, json=schedule(executeAt="0001-01-01T00:00:00+01:00")
    )
    # A drain takes no body.
    await refused("POST", "/v1/admin/drain", 413, data=b"{}")

    # A bug in a handler: a 500 in the error shape, its traceback in the log.
    async def broken(*_args: Any) -> Any:
        raise RuntimeError("a bug")

    api.node.store.get = broken  # type: ignore[method-assign]
    with structlog.testing.capture_logs() as logs:
        error = await refused("GET", "/v1/schedules/x", 500)
    assert error["code"] == "internal" and "a bug" not in error["message"]
    [logged] = [e for e in logs if e["event"] == "unexpected error"]
    assert logged["log_level"] == "error" and logged["exc_info"] is True
    assert logged["route"] == "/v1/schedules/{schedule_id}"

    # An error never meant for a caller (no status hint) is one too.
    async def unavailable(*_args: Any) -> Any:
        raise BrokerUnavailable("broker down")

    api.node.store.get = unavailable  # type: ignore[method-assign]
    assert (await refused("GET", "/v1/schedules/x", 500))["code"] == "internal"
    assert await count(mongo) == 1  # only the gzipped one


# -- the node-to-node wake-up hint -------------------------------------------------

CLUSTER_KEY, OLD_CLUSTER_KEY = b"k" * 32, b"o" * 32


def hint_body(sent_at: datetime, **fields: Any) -> bytes:
    due = datetime.now(UTC) + timedelta(seconds=1)
    body = {"bucket": 3, "dueAt": due.isoformat(), "from": "node-b", "sentAt": sent_at.isoformat()}
    return json.dumps({**body, **fields}).encode()


async def test_the_wake_route_refuses_big_bodies_and_unsigned_hints_when_keyed(
    start_node: NodeFactory,
) -> None:
    from node.api.cluster import SIGNATURE_HEADER as READ_FROM
    from node.delivery.hints import SIGNATURE_HEADER, WakeHints, sign
    from node.metrics import NodeMetrics

    assert READ_FROM == SIGNATURE_HEADER
    keys = ",".join(base64.b64encode(k).decode() for k in (CLUSTER_KEY, OLD_CLUSTER_KEY))
    keyed = await start_node(cluster_keys=keys)

    async def wake(body: bytes, signature: str | None = None) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if signature is not None:
            headers[SIGNATURE_HEADER] = signature
        return await keyed.request("POST", "/v1/internal/wake", data=body, headers=headers)

    now = datetime.now(UTC)
    fresh = hint_body(now)
    stale, early = hint_body(now - timedelta(seconds=90)), hint_body(now + timedelta(seconds=90))
    timeless = b'{"bucket": 3, "dueAt": "2030-01-01T00:00:00Z"}'
    refusals = [
        await wake(fresh),  # unsigned
        await wake(fresh, ""),
        await wake(fresh, "sha256=" + "0" * 64),
        await wake(fresh, sign(b"x" * 32, fresh)),  # not a cluster key
        await wake(hint_body(now, bucket=4), sign(CLUSTER_KEY, fresh)),  # another body
        await wake(fresh, sign(CLUSTER_KEY, fresh) + "\u00e9"),
        # signed, but replayed later (or sent by a clock far off)
        await wake(stale, sign(CLUSTER_KEY, stale)),
        await wake(early, sign(CLUSTER_KEY, early)),
        # signed, but without a time: no telling a replay
        await wake(timeless, sign(CLUSTER_KEY, timeless)),
    ]
    for status, body in refusals:
        assert_error_shape(status, body, 401)
    # Signed by the first key or by an older one (rotation): taken.
    status, body = await wake(fresh, sign(CLUSTER_KEY, fresh))
    assert (status, set(body)) == (202, {"woken"})
    status, _ = await wake(fresh, sign(OLD_CLUSTER_KEY, fresh))
    assert status == 202
    # What a node sends is what a node takes.
    sender = WakeHints("node-b", NodeMetrics(), (OLD_CLUSTER_KEY,))
    body_bytes, headers = sender.encode(3, now + timedelta(seconds=1))
    status, _ = await keyed.request("POST", "/v1/internal/wake", data=body_bytes, headers=headers)
    assert status == 202
    # Big bodies are refused before anything else, signed or not.
    big = hint_body(now, padding="x" * 5000)
    assert_error_shape(*await wake(big), 413)
    assert_error_shape(*await wake(big, sign(CLUSTER_KEY, big)), 413)

    # Without cluster keys (GOSSIP_UNSIGNED) the route is open, and still small.
    open_node = await start_node(node_id="node-open", cluster_keys="", gossip_unsigned="on")
    status, _ = await open_node.request("POST", "/v1/internal/wake", data=fresh)
    assert status == 202
    status, body = await open_node.request(
        "POST", "/v1/internal/wake", data=b'{"bucket": 3, "dueAt": "' + b"x" * (1 << 20) + b'"}'
    )
    assert_error_shape(status, body, 413)
    for bad in (b"[" * 1500 + b"]" * 1500, b'{"bucket": 3, "dueAt": "\\ud800"}', b"\xff"):
        assert_error_shape(*await open_node.request("POST", "/v1/internal/wake", data=bad), 400)


async def test_the_chaos_route_refuses_hostile_bodies(start_node: NodeFactory) -> None:
    node = await start_node(chaos_mode="on")

    async def partition(raw: bytes) -> tuple[int, Any]:
        return await node.request("PUT", "/v1/chaos/partition", data=raw)

    for raw in (
        as_json({"blocked": ["\ud800"]}),  # echoed back, it was not JSON a client could read
        as_json({"blocked": ["127.0.0.1:1"], "\udc00": 1}),
        as_json({"blocked": ["127.0.0.1\x00:1"]}),
        b'{"blocked": ' + b"[" * 1500 + b"]" * 1500 + b"}",
        b"[" * 20_000 + b"]" * 20_000,
    ):
        assert_error_shape(*await partition(raw), 400)
    assert_error_shape(*await partition(as_json({"blocked": ["x" * 70_000]})), 413)
    status, body = await partition(as_json({"blocked": ["127.0.0.1:1"]}))
    assert (status, body) == (200, {"blocked": ["127.0.0.1:1"]})
    status, body = await partition(as_json({"blocked": []}))
    assert (status, body) == (200, {"blocked": []})


# -- flow control on a schedule ----------------------------------------------------


async def test_flow_control_is_stored_shown_patched_and_cleared(
    api: NodeHandle, mongo: Any
) -> None:
    limit = {"key": "crm", "rate": 20, "period": "PT1S", "parallelism": 3}
    status, created = await api.request(
        "POST", "/v1/schedules", json=schedule(id="fc", flowControl=limit)
    )
    assert status == 201 and created["flowControl"] == limit
    stored = await mongo.schedules.find_one({"_id": "fc"})
    assert stored["flow"] == {"key": "crm", "rate": 20, "periodMs": 1000, "parallelism": 3}
    headers = {"If-Match": f'"{created["version"]}"'}
    status, patched = await api.request(
        "PATCH", "/v1/schedules/fc", json={"flowControl": {"key": "crm", "rate": 5}},
        headers=headers,
    )  # fmt: skip
    assert status == 200 and patched["flowControl"] == {"key": "crm", "rate": 5, "period": "PT1S"}
    headers = {"If-Match": f'"{patched["version"]}"'}
    status, cleared = await api.request(
        "PATCH", "/v1/schedules/fc", json={"flowControl": None}, headers=headers
    )
    assert status == 200 and "flowControl" not in cleared
    assert "flow" not in await mongo.schedules.find_one({"_id": "fc"})


@pytest.mark.parametrize(
    ("limit", "field"),
    [
        ({"key": "k" * 10_000, "rate": 1}, "flowControl.key"),
        ({"key": "k", "rate": 0}, "flowControl.rate"),
        ({"key": "k", "rate": 10**12}, "flowControl.rate"),
        ({"key": "k", "rate": 1, "period": "P100Y"}, "flowControl.period"),
        ({"key": "k", "parallelism": -1}, "flowControl.parallelism"),
        ({"key": "k\ud800", "rate": 1}, "flowControl"),
        ("fast", "flowControl"),
    ],
)
async def test_a_hostile_flow_control_is_a_400_and_stores_nothing(
    api: NodeHandle, mongo: Any, limit: Any, field: str
) -> None:
    status, body = await post_raw(api, "/v1/schedules", as_json(schedule(flowControl=limit)))
    assert_error_shape(status, body, 400)
    assert body["error"]["field"].startswith(field), body
    assert await count(mongo) == 0


async def test_priority_is_shown_patched_and_refused_out_of_range(
    api: NodeHandle, mongo: Any
) -> None:
    status, plain = await api.request("POST", "/v1/schedules", json=schedule(id="p5"))
    assert status == 201 and plain["priority"] == 5
    assert "priority" not in await mongo.schedules.find_one({"_id": "p5"})
    status, urgent = await api.request("POST", "/v1/schedules", json=schedule(id="p9", priority=9))
    assert status == 201 and urgent["priority"] == 9
    headers = {"If-Match": f'"{urgent["version"]}"'}
    status, lowered = await api.request(
        "PATCH", "/v1/schedules/p9", json={"priority": 5}, headers=headers
    )
    assert status == 200 and lowered["priority"] == 5
    assert "priority" not in await mongo.schedules.find_one({"_id": "p9"})
    for bad in (10, -1, 5.5, True, "9", None):
        status, body = await api.request("POST", "/v1/schedules", json=schedule(priority=bad))
        assert_error_shape(status, body, 400, "priority")
    assert await count(mongo) == 2
