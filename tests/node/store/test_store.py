"""node.store: start-up (the pinned bucket count, idempotent indexes,
durable writes: MongoDB's own), and the owner's fenced writes and reads over
both stores (the ``store`` fixture: memory and MongoDB)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from node.delivery.outcomes import Rules
from node.errors import BucketCountMismatch
from node.ops import embedded
from node.process import Node
from node.schedule.retry import DEFAULT_POLICY
from node.store import statements
from node.store.schedules import ScheduleStore, typed
from ring import bucket_for
from tests.conftest import HOST, EmbeddedServers, make_config, start_mongo
from tests.stores import StoreKit

RULES = Rules(DEFAULT_POLICY, timedelta(seconds=60))


async def test_prepare_is_idempotent_and_creates_the_indexes(mongo: Any) -> None:
    store = ScheduleStore(mongo, 64)
    await store.prepare(datetime.now(UTC))
    await store.prepare(datetime.now(UTC))
    indexes = await mongo.schedules.index_information()
    assert indexes["bucket_status_due"]["key"] == [("bucket", 1), ("status", 1), ("dueAt", 1)]
    assert indexes["bucket_status_host_due"]["key"] == [
        ("bucket", 1),
        ("status", 1),
        ("http.host", 1),
        ("dueAt", 1),
    ]
    assert indexes["tenant_status_bucket_due"]["key"] == [
        ("tenant", 1),
        ("status", 1),
        ("bucket", 1),
        ("dueAt", 1),
    ]
    assert indexes["by_tenant_id"]["key"] == [("tenant", 1), ("_id", 1)]
    assert indexes["expire"]["key"] == [("expireAt", 1)]
    assert indexes["expire"]["expireAfterSeconds"] == 0
    assert await mongo.cluster.count_documents({}) == 1
    assert (await mongo.cluster.find_one({}))["buckets"] == 64


async def test_prepare_replaces_the_indexes_of_earlier_versions(mongo: Any) -> None:
    # Full indexes on status, as version 1 of the store created them.
    await mongo.schedules.create_index([("status", 1), ("dueAt", 1)], name="due")
    await mongo.schedules.create_index(
        [("bucket", 1), ("status", 1), ("dueAt", 1)], name="due_by_bucket"
    )
    await mongo.schedules.create_index([("tenant", 1), ("status", 1), ("_id", 1)], name="by_tenant")
    # Partial indexes over one status, as version 2 created them.
    pending = {"partialFilterExpression": {"status": "PENDING"}}
    await mongo.schedules.create_index([("dueAt", 1)], name="due_pending", **pending)
    await mongo.schedules.create_index(
        [("tenant", 1), ("dueAt", 1)], name="due_pending_by_tenant", **pending
    )
    await ScheduleStore(mongo, 64).prepare(datetime.now(UTC))
    indexes = set(await mongo.schedules.index_information())
    assert indexes == {
        "_id_",
        "bucket_status_due",
        "bucket_status_host_due",
        "tenant_status_bucket_due",
        "by_tenant_id",
        "by_tenant_label",
        "by_tenant_key",
        "by_tenant_topic",
        "by_tenant_host",
        "by_tenant_due",
        "expire",
    }


async def test_a_node_with_another_bucket_count_refuses_to_start(
    servers: EmbeddedServers, database_name: str
) -> None:
    first = Node(make_config(servers, database_name, buckets="16"))
    assert await first.start()
    await first.stop()

    other = Node(make_config(servers, database_name, buckets="32"))
    with pytest.raises(BucketCountMismatch) as caught:
        await other.start()
    message = str(caught.value)
    assert "BUCKETS is 32" in message
    assert "created with 16 buckets" in message
    assert other.http_port is None  # nothing was started
    await other.client.close()


async def test_claim_and_mark_fence_each_schedule_by_its_own_buckets_token(
    store: StoreKit,
) -> None:
    schedules = store.schedules(16)
    await schedules.prepare(datetime.now(UTC))
    now = datetime.now(UTC).replace(microsecond=0)
    ids = [f"fence-{i}" for i in range(90)]  # more than one statement's worth per token
    docs = [
        {"_id": i, "bucket": bucket_for(i, 16), "status": "PENDING", "token": 0, "dueAt": now}
        for i in ids
    ]
    await store.seed(docs)
    # Three distinct token values across the buckets, as after a few rebalances.
    tokens = {bucket: 5 + bucket % 3 for bucket in range(16)}
    # A newer owner of one bucket already wrote its schedules: not ours to claim.
    taken = docs[0]["bucket"]
    await store.overwrite({"bucket": taken}, {"token": tokens[taken] + 1})

    claimed = await schedules.claim(docs, tokens, "me", now)

    assert {c.id for c in claimed} == {d["_id"] for d in docs if d["bucket"] != taken}
    for stored in (await store.stored()).values():
        if stored["bucket"] == taken:
            assert (stored["status"], stored["token"]) == ("PENDING", tokens[taken] + 1)
        else:
            assert (stored["status"], stored["token"]) == ("IN_FLIGHT", tokens[stored["bucket"]])

    # Another bucket changes owner while we publish: our mark must not land there.
    moved = next(c.bucket for c in claimed)
    await store.overwrite({"bucket": moved}, {"token": tokens[moved] + 1})
    marked = await schedules.complete([RULES.delivered(c, now) for c in claimed])
    assert marked == sum(1 for c in claimed if c.bucket != moved)
    in_flight = [d for d in (await store.stored()).values() if d["status"] == "IN_FLIGHT"]
    assert {d["bucket"] for d in in_flight} == {moved}
    assert len(in_flight) == sum(1 for c in claimed if c.bucket == moved)


async def test_what_the_api_acknowledges_is_journaled_on_a_majority(mongo: Any) -> None:
    # A schedule acknowledged under w:1 was lost when the database was killed
    # (the store-crash chaos scenario): inserts and cancels must wait for the
    # journal, on a majority of a replica set.
    store = ScheduleStore(mongo, 16)
    for collection in (store._inserts.collection, store._durable, store.cluster):
        assert collection.write_concern.document == {"w": "majority", "j": True, "wtimeout": 5000}


def test_lease_writes_are_journaled_on_a_majority(
    servers: EmbeddedServers, database_name: str
) -> None:
    # A lease write lost in a crash of the database could move a token back.
    node = Node(make_config(servers, database_name))
    assert node.lease_store.collection.write_concern.document == {
        "w": "majority",
        "j": True,
        "wtimeout": 5000,
    }


async def test_an_unfenced_store_writes_over_a_newer_token(store: StoreKit) -> None:
    # CHAOS_MODE=unfenced: the claim and the mark lose their token condition.
    now = datetime.now(UTC).replace(microsecond=0)
    doc = {"_id": "unfenced-1", "bucket": bucket_for("unfenced-1", 16), "status": "PENDING"}
    await store.seed([{**doc, "token": 9, "dueAt": now}])
    tokens = {doc["bucket"]: 4}
    assert await store.schedules(16).claim([doc], tokens, "me", now) == []
    [claimed] = await store.schedules(16, unfenced=True).claim([doc], tokens, "me", now)
    assert claimed.token == 4
    await store.overwrite({"_id": doc["_id"]}, {"token": 9})
    delivered = [RULES.delivered(claimed, now)]
    assert await store.schedules(16).complete(delivered) == 0
    assert await store.schedules(16, unfenced=True).complete(delivered) == 1


async def test_the_backlog_counts_pending_schedules_already_due_per_bucket(
    store: StoreKit,
) -> None:
    schedules = store.schedules(16)
    await schedules.prepare(datetime.now(UTC))
    now = datetime.now(UTC).replace(microsecond=0)
    past, future = now - timedelta(seconds=5), now + timedelta(hours=1)
    docs = [
        {"_id": "b1", "bucket": 1, "status": "PENDING", "dueAt": past},
        {"_id": "b2", "bucket": 1, "status": "PENDING", "dueAt": past},
        {"_id": "b3", "bucket": 2, "status": "PENDING", "dueAt": past},
        {"_id": "b4", "bucket": 2, "status": "PENDING", "dueAt": future},
        {"_id": "b5", "bucket": 3, "status": "DELIVERED", "dueAt": past},
        {"_id": "b6", "bucket": 3, "status": "IN_FLIGHT", "dueAt": past},
    ]
    await store.seed(docs)
    assert await schedules.due_backlog(range(16), now) == {1: 2, 2: 1}
    assert await schedules.due_backlog([2, 3], now) == {2: 1}  # its own buckets only
    assert await schedules.due_backlog(range(16), now, limit=1) == {1: 1, 2: 1}  # bounded


async def _statuses_after_a_kill(tmp_path: Path, mark: bool) -> list[str]:
    """Claim 200 due schedules (and mark them delivered, if ``mark``), SIGKILL
    the store the moment the last write is acknowledged, start it again:
    the statuses it kept."""
    data = tmp_path / "crash"
    process, port = start_mongo(data)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        embedded.mongo_uri(HOST, port), tz_aware=True
    )
    try:
        store = ScheduleStore(client["crash"], 16)
        now = datetime.now(UTC).replace(microsecond=0)
        docs = [
            {"_id": f"m{i}", "bucket": bucket_for(f"m{i}", 16), "status": "PENDING",
             "token": 0, "dueAt": now}
            for i in range(200)
        ]  # fmt: skip
        await store._durable.insert_many(docs)
        claimed = await store.claim(docs, dict.fromkeys(range(16), 3), "me", now)
        assert len(claimed) == len(docs)
        if mark:
            assert await store.complete([RULES.delivered(c, now) for c in claimed]) == len(docs)
        process.kill()  # SIGKILL at once: nothing flushed on the way out
        process.wait()
        process, _ = start_mongo(data, port)
        return list(await client["crash"].schedules.distinct("status"))
    finally:
        await client.close()
        embedded.discard(process)


@pytest.mark.servers  # a SecantusDB of its own, killed
async def test_a_mark_acknowledged_just_before_the_store_dies_survives_it(tmp_path: Path) -> None:
    """Soak seed 2 left s16692 IN_FLIGHT for good: its mark (w: 1) was
    acknowledged, the database was SIGKILLed before journaling it, and the
    claim it undid came back under a token its owner held to the end. Every
    write that takes a schedule out of IN_FLIGHT is now journaled first."""
    assert await _statuses_after_a_kill(tmp_path, mark=True) == ["DELIVERED"]


@pytest.mark.servers  # a SecantusDB of its own, killed
async def test_a_claim_acknowledged_just_before_the_store_dies_survives_it(tmp_path: Path) -> None:
    """The simulation's seed 325 of 1-1000: a claim (w: 1) rolled back in a
    failover after its schedule was published left it PENDING at its first
    version, and a cancel then answered 200 for a record already out. The
    owner publishes what it claimed only once the claim is journaled."""
    assert await _statuses_after_a_kill(tmp_path, mark=False) == ["IN_FLIGHT"]


def test_typed_names_each_typed_fields_type_beside_its_condition() -> None:
    now = datetime.now(UTC)
    query = {
        "_id": {"$in": ["a", "b"]},
        "bucket": {"$in": [1, 2]},
        "status": "PENDING",
        "dueAt": {"$lte": now},
        "version": None,  # a document stored before versions: left as it is
        "token": {"$lte": 3},
        "owner": "me",  # a field of no fixed type here
    }
    assert typed(query) == {
        "_id": {"$in": ["a", "b"]},
        "bucket": {"$in": [1, 2], "$type": "number"},
        "status": {"$eq": "PENDING", "$type": "string"},
        "dueAt": {"$lte": now, "$type": "date"},
        "version": None,
        "token": {"$lte": 3, "$type": "number"},
        "owner": "me",
    }
    assert query["status"] == "PENDING"  # not changed in place
    # A whole document to equal, and an operator on null, stay as they are.
    assert typed({"status": {"a": 1}, "token": {"$eq": None}}) == {
        "status": {"a": 1},
        "token": {"$eq": None},
    }


async def test_typed_filters_match_what_the_plain_ones_match_on_the_embedded_store(
    mongo: Any,
) -> None:
    """The owner's writes go typed to the embedded store: the same schedules
    must match, whatever their status, token or version."""
    now = datetime.now(UTC).replace(microsecond=0)
    docs = [
        {
            "_id": f"t{i}",
            "bucket": i % 4,
            "status": ("PENDING", "IN_FLIGHT", "DELIVERED")[i % 3],
            "token": i % 5,
            "version": 1 + i % 2,
            "dueAt": now + timedelta(seconds=i % 7 - 3),
        }
        for i in range(60)
    ]
    await mongo["typed"].insert_many(docs)
    statements_ = [
        statements.claimable(docs, 1, 3, now, unfenced=False),
        statements.claimable(docs, 2, 4, now, unfenced=False),
        statements.held_by(docs, 2, unfenced=False),
        statements.held_by(docs[:7], 4, unfenced=False),
    ]
    for query in statements_:
        plain = {d["_id"] async for d in mongo["typed"].find(query, {"_id": 1})}
        shaped = {d["_id"] async for d in mongo["typed"].find(typed(query), {"_id": 1})}
        assert shaped == plain and plain  # each statement matches some
        result = await mongo["typed"].update_many(typed(query), {"$inc": {"hits": 1}})
        assert result.modified_count == len(plain)
