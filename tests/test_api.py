"""The HTTP API against a real node, store and broker."""

from __future__ import annotations

import base64
import json
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ring import PLACEMENT_VERSION
from tests.conftest import NodeFactory, NodeHandle, wait_until

FAR = (datetime.now(UTC) + timedelta(days=1)).isoformat().replace("+00:00", "Z")


def schedule(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"topic": "api-test", "executeAt": FAR, "payload": {"n": 1}}
    base.update(fields)
    return base


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
