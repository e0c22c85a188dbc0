"""The production data path (DESIGN.md): every command on ``schedules``
names its bucket, so a sharded cluster sends it to the shard that holds it;
and a schedule that has ended is removed after RETENTION.

Recorded with pymongo's command monitoring, through a whole life: POST, the
batch API, GET, list, DELETE, delivery, a retry, a dead letter, a recurring
chain's advance, and recovery of work an older owner left in flight.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import monitoring
from pymongo.errors import OperationFailure

from node.process import Node
from node.store.contract import BULK_FIELDS
from node.store.schedules import ScheduleStore
from ring import bucket_for
from tests.conftest import (
    EmbeddedServers,
    NodeFactory,
    TopicReader,
    make_config,
    unique,
    wait_until,
)
from tests.helpers import FailingPublisher, stamp

BUCKETS = 16
# The queries that span every bucket by nature, and why: a tenant's
# schedules hash to every bucket. Listing them (GET /v1/schedules pages by
# tenant, in _id or due order, filtered), counting its live ones (its
# max-pending quota, and a listing's counts per status), and finding the
# ones a bulk cancel's selector matches (the cancel itself names buckets).
# And each node's change stream (node/store/due_changes.py): one cursor per
# node that the server feeds every shard's writes through, which is what
# spares the owners a read of every idle bucket.
SPANNING = (
    "list a tenant's schedules",
    "count a tenant's schedules",
    "find a tenant's schedules a selector matches",
    "follow the writes that make work due",
)
_LISTING_FIELDS = {
    "tenant", "status", "_id", "labels", "key", "topic", "http.host", "http", "dueAt", "$or"
}  # fmt: skip


class Recorder(monitoring.CommandListener):
    """Every command a client sends to one database's ``schedules``."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.active = True
        self.commands: list[tuple[str, dict[str, Any]]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.active and event.database_name == self.database:
            command = dict(event.command)
            if command.get(event.command_name) == "schedules":
                self.commands.append((event.command_name, command))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def filters(name: str, command: dict[str, Any]) -> list[dict[str, Any]]:
    """The filters (or inserted documents) a command carries."""
    if name == "insert":
        return list(command["documents"])
    if name in ("update", "delete"):
        return [statement["q"] for statement in command[f"{name}s"]]
    if name in ("find", "count"):
        return [command.get("filter", command.get("query", {}))]
    if name == "aggregate":
        return [stage["$match"] for stage in command["pipeline"] if "$match" in stage]
    return []


def spanning(name: str, command: dict[str, Any]) -> str | None:
    """Which of the SPANNING queries this is, if one."""
    if name not in ("find", "aggregate"):
        return None
    if name == "aggregate" and "$changeStream" in command["pipeline"][0]:
        return SPANNING[3]
    [query] = filters(name, command) or [{}]
    if not set(query) <= _LISTING_FIELDS:
        return None
    if name == "find" and command.get("sort") in ({"_id": 1}, {"dueAt": 1, "_id": 1}):
        return SPANNING[0]  # an operator's listing (auth off) may span every tenant too
    if "tenant" not in query:
        return None
    if name == "aggregate" and "status" in query:
        return SPANNING[1]
    if name == "find" and command.get("projection") in (BULK_FIELDS, {"_id": 1}):
        return SPANNING[2]  # a bulk verb's batch, or whether it left a match in flight
    return None


async def test_every_command_on_schedules_names_its_bucket(
    start_node: NodeFactory, servers: EmbeddedServers, database_name: str, mongo: Any
) -> None:
    # Left in flight by an older owner (token 0) before this node started.
    orphan = "orphan-1"
    await mongo.schedules.insert_one(
        {
            "_id": orphan,
            "tenant": "default",
            "topic": "life",
            "executeAt": datetime.now(UTC),
            "dueAt": datetime.now(UTC),
            "bucket": bucket_for(orphan, BUCKETS),
            "status": "IN_FLIGHT",
            "token": 0,
            "attempts": 1,
            "payload": b"1",
            "payloadFormat": "json",
            "headers": {},
        }
    )
    recorder = Recorder(database_name)
    monitoring.register(recorder)
    try:
        node = Node(
            make_config(
                servers,
                database_name,
                buckets=str(BUCKETS),
                retry_backoff="0.05",
                max_attempts="2",
                dead_letter_topic=unique("dead"),
            )
        )
        topic = unique("life")
        node.publisher = node.poller.publisher = FailingPublisher(
            node.publisher, topic, {"retried": 1, "dead": 2}
        )
        handle = await start_node(node)
        # The owner's store knows the server as the API's does (the embedded
        # one gets statements it can bound, from both).
        assert isinstance(node.store, ScheduleStore)
        assert node.delivery_store.sliced and node.store.sliced
        now = datetime.now(UTC)

        async def post(body: dict[str, Any]) -> dict[str, Any]:
            status, answer = await handle.request("POST", "/v1/schedules", json=body)
            assert status == 201, answer
            return dict(answer)

        for schedule_id in ("plain", "retried", "dead"):
            await post({"id": schedule_id, "topic": topic, "executeAt": stamp(now), "payload": 1})
        later = stamp(now + timedelta(hours=1))
        await post({"id": "to-cancel", "topic": topic, "executeAt": later, "payload": 1})
        start = stamp(now + timedelta(seconds=1))
        await post(
            {"id": "chain", "topic": topic, "payload": 1,
             "recurrence": {"every": "PT1S", "start": start}}
        )  # fmt: skip
        status, batch = await handle.request(
            "POST",
            "/v1/schedules:batch",
            json={"schedules": [{"id": "b1", "topic": topic, "executeAt": later, "payload": 1}]},
        )
        assert status == 200 and batch["created"] == 1
        assert (await handle.request("GET", "/v1/schedules/plain"))[0] == 200
        assert (await handle.request("GET", "/v1/schedules/plain/history"))[0] == 200
        assert (await handle.request("GET", "/v1/schedules?limit=2"))[0] == 200
        assert (await handle.request("DELETE", "/v1/schedules/to-cancel"))[0] == 200
        # The verbs after "schedule it", each on one schedule (and so its bucket).
        await post({"id": "verbs", "topic": topic, "executeAt": later, "payload": 1,
                    "labels": {"group": "g1"}})  # fmt: skip
        for method, path, body in [
            ("PATCH", "/v1/schedules/verbs", {"executeAt": stamp(now + timedelta(hours=2))}),
            ("POST", "/v1/schedules/verbs:pause", None),
            ("POST", "/v1/schedules/verbs:resume", None),
            ("GET", "/v1/schedules?tenant=default&label=group=g1&counts=true", None),
            ("GET", "/v1/schedules?tenant=default&status=PENDING&dueBefore=" + later, None),
            ("POST", "/v1/schedules:cancel", {"labels": {"group": "g1"}}),
        ]:
            status, answer = await handle.request(method, path, json=body)
            assert status == 200, (method, path, answer)

        async def lived() -> bool:
            docs = {d["_id"]: d for d in await mongo.schedules.find({}).to_list()}
            return (
                docs["plain"]["status"] == "DELIVERED"
                and docs["retried"]["status"] == "DELIVERED"
                and docs["dead"]["status"] == "DELIVERY_FAILED"
                and docs[orphan]["status"] == "DELIVERED"
                and docs["chain"].get("occurrences", 0) >= 2
            )

        await wait_until(
            lived, within=60, what="delivery, a retry, a dead letter, a recovery, a chain"
        )
        node.publisher.failures = {}  # type: ignore[attr-defined]
        assert (await handle.request("POST", "/v1/schedules/dead:retry"))[0] == 200
        assert (await handle.request("POST", "/v1/schedules/chain:trigger"))[0] == 200

        async def redriven() -> bool:
            doc = await mongo.schedules.find_one({"_id": "dead"})
            return bool(doc["status"] == "DELIVERED")

        await wait_until(redriven, what="the redriven schedule to be delivered")
    finally:
        recorder.active = False
    kinds = {name for name, _ in recorder.commands}
    assert {"insert", "find", "update"} <= kinds, kinds
    unnamed = []
    seen_spanning = set()
    for name, command in recorder.commands:
        why = spanning(name, command)
        if why is not None:
            seen_spanning.add(why)
            continue
        for query in filters(name, command):
            if "bucket" not in query:
                unnamed.append((name, query))
    assert unnamed == [], unnamed
    assert seen_spanning == set(SPANNING)


async def test_an_ended_schedule_is_removed_after_the_retention_a_live_one_never(
    start_node: NodeFactory, servers: EmbeddedServers, mongo: Any
) -> None:
    handle = await start_node(retention="1")
    topic = unique("retention")
    now = datetime.now(UTC)
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        bodies = [
            {"id": "sent", "topic": topic, "executeAt": stamp(now), "payload": 1},
            {"id": "cancelled", "topic": topic, "payload": 1,
             "executeAt": stamp(now + timedelta(hours=1))},
            {"id": "waiting", "topic": topic, "payload": 1,
             "executeAt": stamp(now + timedelta(hours=1))},
            {"id": "chain", "topic": topic, "payload": 1,
             "recurrence": {"every": "PT1H", "start": stamp(now + timedelta(seconds=1))}},
        ]  # fmt: skip
        for body in bodies:
            assert (await handle.request("POST", "/v1/schedules", json=body))[0] == 201
        assert (await handle.request("DELETE", "/v1/schedules/cancelled"))[0] == 200
        await reader.wait_for(2)  # "sent", and the chain's first occurrence

    async def ended_marked() -> bool:
        docs = {d["_id"]: d for d in await mongo.schedules.find({}).to_list()}
        return "expireAt" in docs.get("sent", {}) or "sent" not in docs

    await wait_until(ended_marked, what="the delivered schedule to get its expireAt")
    kept = await mongo.schedules.find({"_id": {"$in": ["waiting", "chain"]}}).to_list()
    assert all("expireAt" not in d for d in kept)  # a live one, and a chain still going

    async def removed() -> bool:
        # SecantusDB sweeps expired documents every 60 s; its admin command
        # runs a sweep now. A MongoDB server's TTL monitor needs no help.
        with contextlib.suppress(OperationFailure):
            await mongo.client.admin.command("secantusAdmin.pruneTtl")
        ids = {d["_id"] for d in await mongo.schedules.find({}, {"_id": 1}).to_list()}
        return ids == {"waiting", "chain"}

    await wait_until(removed, within=30, what="the ended schedules to be removed")
    status, _ = await handle.request("GET", "/v1/schedules/sent")
    assert status == 404  # past the retention, and so past the idempotency window
