"""Execution history through the real API, store and broker: every attempt
kept (time, node, token, outcome, error), capped per schedule, expired by
the TTL index, and private to the schedule's tenant."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo.errors import OperationFailure

from node.process import Node
from node.store.history import Attempt
from tests.conftest import EmbeddedServers, NodeFactory, NodeHandle, make_config, wait_until
from tests.helpers import FailingPublisher, stamp


async def history(node: NodeHandle, path: str) -> tuple[int, Any]:
    return await node.request("GET", f"/v1/schedules/{path}")


async def test_every_attempt_is_recorded_newest_first(
    start_node: NodeFactory, servers: EmbeddedServers, database_name: str, mongo: Any
) -> None:
    node = Node(make_config(servers, database_name, retry_backoff="0.05"))
    node.publisher = node.poller.publisher = FailingPublisher(node.publisher, "hist", {"flaky": 2})
    handle = await start_node(node)
    status, _ = await handle.request(
        "POST",
        "/v1/schedules",
        json={
            "id": "flaky",
            "topic": "hist",
            "payload": 1,
            "tenant": "acme",
            "executeAt": stamp(datetime.now(UTC)),
        },
    )
    assert status == 201

    async def three_kept() -> bool:
        status, body = await history(handle, "flaky/history?tenant=acme")
        return status == 200 and len(body["history"]) == 3

    await wait_until(three_kept, what="three attempts in the history")
    _, body = await history(handle, "flaky/history?tenant=acme")
    records = body["history"]
    assert [r["outcome"] for r in records] == ["delivered", "retrying", "retrying"]
    assert [r["attempt"] for r in records] == [3, 2, 1]
    assert "injected failure 1" in records[2]["error"] and records[0]["error"] is None
    lease = await mongo.buckets.find_one({"owner": "node-a"})
    assert {r["node"] for r in records} == {"node-a"}
    assert all(r["token"] >= 1 for r in records) and lease is not None
    assert records[0]["at"] >= records[1]["at"] >= records[2]["at"]
    # Another tenant's view: no such schedule, and so no history.
    status, body = await history(handle, "flaky/history?tenant=other")
    assert (status, body["error"]["code"]) == (404, "not_found")
    status, body = await history(handle, "flaky/history?tenant=acme&limit=0")
    assert (status, body["error"]["field"]) == (400, "limit")


async def test_history_is_capped_per_schedule(
    start_node: NodeFactory, servers: EmbeddedServers, database_name: str
) -> None:
    handle = await start_node(history_per_schedule="3")
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    status, _ = await handle.request(
        "POST",
        "/v1/schedules",
        json={
            "id": "ticker",
            "topic": "hist-cap",
            "payload": 1,
            "recurrence": {
                "every": "PT1S",
                "start": stamp(start),
                "end": stamp(start + timedelta(seconds=4)),
            },
        },
    )
    assert status == 201

    async def ended() -> bool:
        _, view = await handle.request("GET", "/v1/schedules/ticker")
        return bool(view["status"] == "DELIVERED")

    await wait_until(ended, what="the chain of five to end")

    async def last_kept() -> bool:
        _, body = await history(handle, "ticker/history")
        return bool(body["history"]) and body["history"][0]["executeAt"] == stamp(
            start + timedelta(seconds=4)
        )

    await wait_until(last_kept, what="the last occurrence's record")
    _, body = await history(handle, "ticker/history")
    kept = [r["executeAt"] for r in body["history"]]
    assert kept == [stamp(start + timedelta(seconds=s)) for s in (4, 3, 2)]
    assert body["perSchedule"] == 3


async def test_history_expires_after_the_retention(
    start_node: NodeFactory, servers: EmbeddedServers, database_name: str, mongo: Any
) -> None:
    node = Node(make_config(servers, database_name, history_retention="1", retry_backoff="0.05"))
    node.publisher = node.poller.publisher = FailingPublisher(
        node.publisher, "hist-ttl", {"brief": 1}
    )
    handle = await start_node(node)
    await handle.request(
        "POST",
        "/v1/schedules",
        json={
            "id": "brief",
            "topic": "hist-ttl",
            "payload": 1,
            "executeAt": stamp(datetime.now(UTC)),
        },
    )

    async def recorded() -> bool:
        _, body = await history(handle, "brief/history")
        return [r["outcome"] for r in body["history"]] == ["delivered", "retrying"]

    # The failed attempt is a record; the delivery is the schedule's own.
    await wait_until(recorded, what="the attempts' records")
    index = (await mongo.history.index_information())["expire"]
    assert index["expireAfterSeconds"] == 1

    async def expired() -> bool:
        # SecantusDB sweeps expired documents every 60 s; its admin command
        # runs a sweep now. A MongoDB server's TTL monitor needs no help.
        with contextlib.suppress(OperationFailure):
            await mongo.client.admin.command("secantusAdmin.pruneTtl")
        _, body = await history(handle, "brief/history")
        return [r["outcome"] for r in body["history"]] == ["delivered"]

    await wait_until(expired, within=90, what="the record to expire")
    _, view = await handle.request("GET", "/v1/schedules/brief")
    assert view["status"] == "DELIVERED"  # the schedule itself stays


async def test_an_id_used_again_after_retention_starts_a_history_of_its_own(
    start_node: NodeFactory, servers: EmbeddedServers, database_name: str, mongo: Any
) -> None:
    """The history of an id whose schedule ended and was removed long ago
    (its records not yet expired) is not the new schedule's: before, GET
    showed the old schedule's attempts, and the new one's first record
    collided with the old one's slot and was dropped."""
    node = Node(make_config(servers, database_name, retry_backoff="0.05"))
    node.publisher = node.poller.publisher = FailingPublisher(node.publisher, "hist", {"again": 1})
    handle = await start_node(node)
    long_ago = datetime.now(UTC) - timedelta(days=6)
    old_life = Attempt(
        "again", "default", 1, long_ago, 1, long_ago, "old-node", 3, "failed", "old error",
        life=long_ago - timedelta(hours=1),
    )  # fmt: skip
    await node.history.write([old_life])
    # The format before lives: an _id without one.
    legacy = Attempt("again", "default", 2, long_ago, 1, long_ago, "old-node", 3, "failed", "x")
    await node.history.write([legacy])
    body = {"id": "again", "topic": "hist", "payload": 1, "executeAt": stamp(datetime.now(UTC))}
    status, _ = await handle.request("POST", "/v1/schedules", json=body)
    assert status == 201

    async def its_own_attempt() -> bool:
        _, found = await history(handle, "again/history")
        return len(found["history"]) == 2  # its failed attempt, then its delivery

    await wait_until(its_own_attempt, what="the new schedule's two attempts")
    _, found = await history(handle, "again/history")
    assert {r["node"] for r in found["history"]} == {"node-a"}
    assert all(r.get("error") != "old error" for r in found["history"])
